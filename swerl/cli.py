"""`swerl`: run the pipeline, start local services, serve deployments.

The commands that run flows (run, serve) import them from flows/ (the Prefect project beside the library); no
other part of swerl imports Prefect.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from swerl import services
from swerl.config import STAGES, ConfigError, PipelineConfig, ServicesConfig, dump_config, load_config

log = logging.getLogger("swerl")

PREFECT_DEFAULTS = {
    # The ephemeral API migrates its database on first use; 20 s (Prefect's default) is too short on 2 cores.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    "PREFECT_LOGGING_EXTRA_LOGGERS": "swerl",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
}


def _prefect_env() -> None:
    for key, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(key, value)


def _prefect_project() -> Path:
    """Make the Prefect project (flows/ and tasks/, beside the swerl package in its checkout) importable here and
    in the flow-run processes `swerl serve` starts; returns its directory.

    flows/ and tasks/ are not installed packages: Prefect names flows by file (`flows/pipeline.py:pipeline`), and
    the flows must be the ones of the library that runs them, so the checkout swerl was installed from comes first.
    """
    for root in (Path(__file__).resolve().parent.parent, Path.cwd()):
        if (root / "flows" / "pipeline.py").is_file() and (root / "tasks" / "stages.py").is_file():
            if str(root) not in sys.path:
                sys.path.insert(0, str(root))
            paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
            if str(root) not in paths:
                os.environ["PYTHONPATH"] = os.pathsep.join([str(root), *paths])
            return root
    raise ConfigError(
        "this command runs the Prefect flows in flows/ and tasks/ of a swerl checkout, and none was found beside "
        f"the installed swerl ({Path(__file__).resolve().parent}) or in {Path.cwd()}: install swerl editable from "
        "its checkout (`make setup`) or run from the checkout's directory"
    )


def _load(args: argparse.Namespace) -> PipelineConfig:
    return load_config(args.config, args.set or [])


def _warm_tracking(cfg: PipelineConfig) -> None:
    from swerl.tracking import get_tracker

    try:
        get_tracker(cfg.tracking.uri, cfg.tracking.experiment)
    except Exception as exc:  # noqa: BLE001 - the flow opens it again and reports the error properly
        log.debug("tracking warm-up failed: %s", exc)


def by_phase(problems: dict[str, list[str]]) -> list[str]:
    """Problems found per GRPO phase (stage -> lines), each line once: as it is when every phase has it, else
    followed by the phases that have it."""
    stages = list(problems)
    seen: dict[str, list[str]] = {}
    for stage, lines in problems.items():
        for line in lines:
            seen.setdefault(line, []).append(stage)
    return [
        line if where == stages else f"{line} (GRPO phase {', '.join(where)})" for line, where in seen.items()
    ]


def doctor_refusal(cfg: PipelineConfig, ignore: bool) -> str | None:
    """`swerl doctor` before a run: the refusal (failed checks named, with their numbers) that stops it, or None
    (it passed, or --ignore-doctor was given: then it is only a warning)."""
    from swerl.doctor import diagnose

    variants = cfg.phase_variants()  # every GRPO phase as it runs (its caps, concurrency)
    found = by_phase(
        {stage: [f"{c.name}: {c.detail}" for c in diagnose(v).checks if not c.ok] for stage, v in variants}
    )
    if not found:
        return None
    message = "swerl doctor refuses this config on this machine:\n  " + "\n  ".join(found)
    if ignore:
        log.warning("%s\n(--ignore-doctor: running anyway; the run may hit a cap)", message)
        return None
    return message + "\nfix the config (see `swerl doctor`) or pass --ignore-doctor to run anyway"


def plan_refusal(cfg: PipelineConfig) -> str | None:
    """`swerl plan` before a run: the refusal (the failed checks, with their numbers), or None when it passes.
    A plan cannot be ignored (--ignore-doctor does not skip it): what does not fit in memory fails later anyway."""
    from swerl.plan import make_plan

    plans = {stage: make_plan(v) for stage, v in cfg.phase_variants()}  # every GRPO phase as it runs
    refusals = by_phase({stage: [] if plan.ok else [plan.refusal()] for stage, plan in plans.items()})
    if not refusals:
        return None
    return (
        "\n".join(refusals)
        + "\nsee `swerl plan` for the whole placement; fix the config's cluster, engine or distributed"
    )


def cmd_run(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from swerl.pipeline import stages_to_force

    stages_to_force(args.force or [], cfg)  # an unknown stage is a ConfigError before anything starts
    refusal = plan_refusal(cfg)
    if refusal is not None:
        print(f"swerl run: {refusal}", file=sys.stderr)
        return 1
    refusal = doctor_refusal(cfg, args.ignore_doctor)
    if refusal is not None:
        print(f"swerl run: {refusal}", file=sys.stderr)
        return 1
    _prefect_env()
    t0 = time.monotonic()
    # Open the MLflow store while Prefect imports and starts its API (both take seconds; there are 2 cores).
    warm = threading.Thread(target=_warm_tracking, args=(cfg,), name="swerl-warm-tracking", daemon=True)
    warm.start()
    _prefect_project()
    from flows.pipeline import pipeline

    summary = pipeline(config=cfg, force=args.force or [])
    summary["wall_s"] = round(time.monotonic() - t0, 2)
    print(json.dumps(summary, indent=2))
    return 0


def cmd_curate(args: argparse.Namespace) -> int:
    """Only the curate stage, through the same pipeline session and stage runner as `swerl run`."""
    cfg = _load(args)
    _prefect_env()
    t0 = time.monotonic()
    _prefect_project()
    from flows.pipeline import curate_only

    summary = curate_only(config=cfg, force=args.force)
    summary["wall_s"] = round(time.monotonic() - t0, 2)
    print(json.dumps(summary, indent=2))
    return 0


def _s3_credentials(path: Path) -> tuple[str, str]:
    """Credentials of the local S3 server: made once, kept in a 0600 file, never printed or logged."""
    if path.exists():
        values = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
        return values["export AWS_ACCESS_KEY_ID"], values["export AWS_SECRET_ACCESS_KEY"]
    access, secret = "swerl-" + secrets.token_hex(6), secrets.token_urlsafe(24)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"export AWS_ACCESS_KEY_ID={access}\nexport AWS_SECRET_ACCESS_KEY={secret}\n")
    return access, secret


def _local_services(sc: ServicesConfig, root: Path, access: str, secret: str) -> list[services.Service]:
    """SeaweedFS (every port explicit), the MLflow server and the Prefect server, in the order `swerl up` starts them."""
    weed_ports = services.SeaweedPorts(
        s3=sc.s3_port,
        master=sc.seaweed_master_port,
        volume=sc.seaweed_volume_port,
        filer=sc.seaweed_filer_port,
        webdav=services.free_port(sc.host),
        admin=services.free_port(sc.host),
    )
    return [
        services.seaweedfs(root / "seaweedfs", weed_ports, host=sc.host, access_key=access, secret_key=secret,
                           startup_timeout_s=sc.startup_timeout_s),
        services.mlflow_server(root / "mlflow", sc.mlflow_port, host=sc.host, startup_timeout_s=sc.startup_timeout_s),
        services.prefect_server(root / "prefect", sc.prefect_port, host=sc.host,
                                startup_timeout_s=sc.startup_timeout_s),
    ]  # fmt: skip


def cmd_up(args: argparse.Namespace) -> int:
    cfg = _load(args)
    sc = cfg.services
    root = Path(args.data_dir).resolve()
    env_file = root / "s3.env"
    access, secret = _s3_credentials(env_file)
    started: list[services.Service] = []

    def stop_all(*_: Any) -> None:
        for svc in reversed(started):
            svc.stop()

    # Ctrl-C and SIGTERM stop everything, even when the parent started us with SIGINT ignored (an ignored
    # disposition is inherited across exec, and Python then installs no KeyboardInterrupt handler).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        for svc in _local_services(sc, root, access, secret):
            svc.start()
            started.append(svc)
        print(
            "\nLocal services are up (Ctrl-C stops them):\n"
            f"  Prefect UI   http://{sc.host}:{sc.prefect_port}\n"
            f"  MLflow UI    http://{sc.host}:{sc.mlflow_port}\n"
            f"  S3 endpoint  http://{sc.host}:{sc.s3_port} (bucket 'swerl')\n\n"
            "To use them from another shell:\n"
            f"  export PREFECT_API_URL=http://{sc.host}:{sc.prefect_port}/api\n"
            f"  source {env_file}   # S3 credentials\n"
            f"  swerl run configs/local.yaml --set tracking.uri=http://{sc.host}:{sc.mlflow_port} "
            f"--set storage.root=s3://swerl/store --set storage.s3_endpoint_url=http://{sc.host}:{sc.s3_port}\n",
            flush=True,
        )
        while all(s.proc is not None and s.proc.poll() is None for s in started):
            time.sleep(1)
        dead = [s.name for s in started if s.proc is not None and s.proc.poll() is not None]
        print(f"service(s) exited: {', '.join(dead)}; stopping the rest", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping services...", flush=True)
        return 0
    finally:
        stop_all()


def cmd_serve(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _prefect_env()
    _prefect_project()
    from flows.deploy import serve_deployments

    serve_deployments(cfg)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Paired comparison of two MLflow eval runs from their saved per-task results."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from swerl.eval.report import compare_runs
    from swerl.tracking import _prepare_uri

    uri = args.tracking_uri or load_config(args.config, args.set or []).tracking.uri
    client = MlflowClient(tracking_uri=_prepare_uri(uri))
    try:
        print(compare_runs(client, args.run_a, args.run_b, samples=args.samples, confidence=args.confidence))
    except (ValueError, MlflowException) as exc:  # an unknown run id, a run that is not an eval run
        print(f"swerl compare: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from swerl.doctor import diagnose, load_task_file

    cfg = _load(args)
    tasks = None
    if args.tasks:
        try:
            tasks = [task for path in args.tasks for task in load_task_file(path)]
        except ValueError as exc:
            print(f"swerl doctor: {exc}", file=sys.stderr)
            return 2
    report = diagnose(cfg, tasks=tasks)
    print(report.text())
    return 0 if report.ok else 1


def cmd_plan(args: argparse.Namespace) -> int:
    from swerl.plan import make_plan

    cfg = _load(args)
    ok = True
    for stage, variant in cfg.phase_variants():
        if cfg.grpo.phases is not None:
            print(f"== GRPO phase {stage} (its grpo, agent and engine settings) ==")
        plan = make_plan(variant, source=args.config)
        print(plan.text())
        ok = ok and plan.ok
    return 0 if ok else 1


def cmd_config(args: argparse.Namespace) -> int:
    print(dump_config(_load(args)), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swerl", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument("config", nargs="?", default="configs/local.yaml", help="YAML run config")
        p.add_argument(
            "--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)"
        )

    p_run = sub.add_parser("run", help="run the pipeline (finished stages are skipped)")
    with_config(p_run)
    p_run.add_argument(
        "--force",
        action="append",
        metavar="STAGE",
        help=f"rerun this stage and all after it ({', '.join(STAGES)}, or a GRPO phase's grpo-NAME)",
    )
    p_run.add_argument("--ignore-doctor", action="store_true",
                       help="run even when `swerl doctor` refuses the config on this machine")  # fmt: skip
    p_run.set_defaults(func=cmd_run)

    p_cur = sub.add_parser("curate", help="run only the curate stage (skipped when already done)")
    with_config(p_cur)
    p_cur.add_argument("--force", action="store_true", help="rerun curation even when it is already done")
    p_cur.set_defaults(func=cmd_curate)

    p_up = sub.add_parser("up", help="start Prefect server, MLflow UI and SeaweedFS on loopback until Ctrl-C")
    with_config(p_up)
    p_up.add_argument("--data-dir", default="runs/services", help="where the services keep their data")
    p_up.set_defaults(func=cmd_up)

    p_serve = sub.add_parser("serve", help="register and serve the pipeline and the scheduled evaluation")
    with_config(p_serve)
    p_serve.set_defaults(func=cmd_serve)

    p_cmp = sub.add_parser("compare", help="paired comparison of two MLflow eval runs (same tasks)")
    p_cmp.add_argument("run_a", help="MLflow run id of an eval run (the baseline)")
    p_cmp.add_argument("run_b", help="MLflow run id of another eval run")
    p_cmp.add_argument("--config", default="configs/local.yaml", help="config whose tracking.uri is used")
    p_cmp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key")
    p_cmp.add_argument("--tracking-uri", help="MLflow tracking URI (overrides the config's)")
    p_cmp.add_argument("--samples", type=int, default=10_000, help="bootstrap resamples and sign flips")
    p_cmp.add_argument("--confidence", type=float, default=0.95, help="confidence level of the CI and test")
    p_cmp.set_defaults(func=cmd_compare)

    p_doc = sub.add_parser("doctor", help="check machine limits against the config (non-zero: refused)")
    with_config(p_doc)
    p_doc.add_argument("--tasks", action="append", metavar="FILE",
                       help="also check the images of these tasks (curate's train/eval.parquet, or a SWE-smith or "
                            "SWE-bench .parquet/.jsonl/.json): present, missing, pulls, disk (repeatable)")  # fmt: skip
    p_doc.set_defaults(func=cmd_doctor)

    p_plan = sub.add_parser("plan", help="place engines and trainer ranks on the cluster and check their memory "
                            "(non-zero: refused)")  # fmt: skip
    with_config(p_plan)
    p_plan.set_defaults(func=cmd_plan)

    p_cfg = sub.add_parser("config", help="print the resolved config")
    with_config(p_cfg)
    p_cfg.set_defaults(func=cmd_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpcore", "alembic", "botocore", "urllib3"):
        logging.getLogger(noisy).setLevel(
            logging.WARNING
        )  # one line per HTTP request buries the run's own log
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"swerl: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
