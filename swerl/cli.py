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
import shlex
import signal
import sys
import threading
import time
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

from swerl import services
from swerl.config import ConfigError, PipelineConfig, load_config
from swerl.config.load import dump_config
from swerl.config.pipeline import STAGES
from swerl.config.services import ServicesConfig

log = logging.getLogger("swerl")

WORK_POOL = "swerl"  # the work pool `swerl up` runs a worker on and `swerl serve` registers the deployments with

PREFECT_DEFAULTS = {
    # The ephemeral API migrates its database on first use; 20 s (Prefect's default) is too short on 2 cores.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
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


# The services `swerl up` started, as it writes them to DATA_DIR/services.env: each variable, when set, overrides the
# config file's key (a --set overrides it in turn), so `source runs/services/services.env` points every command at them.
ENV_KEYS = {
    "SWERL_TRACKING_URI": "tracking.uri",
    "SWERL_STORAGE_ROOT": "storage.root",
    "SWERL_S3_ENDPOINT_URL": "storage.s3_endpoint_url",
}


def env_overrides() -> list[str]:
    """--set items from the SWERL_* variables that are set (values quoted: a URL stays a string)."""
    return [f"{key}={json.dumps(os.environ[var])}" for var, key in ENV_KEYS.items() if os.environ.get(var)]


def _load(args: argparse.Namespace) -> PipelineConfig:
    from_env = env_overrides()
    if from_env:
        log.info("from the environment: %s", ", ".join(item.split("=", 1)[0] for item in from_env))
    return load_config(args.config, [*from_env, *(args.set or [])])


def by_phase(problems: dict[str, dict[str, str]]) -> list[str]:
    """Problems found per GRPO phase (stage -> {check: line}), each check once: its first phase's line alone when
    every phase fails it (a machine measured again per phase differs by a few MB), else each failing phase's line
    followed by the phase."""
    stages = list(problems)
    by_check: dict[str, dict[str, str]] = {}
    for stage, found in problems.items():
        for check, line in found.items():
            by_check.setdefault(check, {})[stage] = line
    out = []
    for lines in by_check.values():
        if list(lines) == stages:
            out.append(next(iter(lines.values())))
        else:
            out += [f"{line} (GRPO phase {stage})" for stage, line in lines.items()]
    return out


def doctor_refusal(variants: list[tuple[str, PipelineConfig]], ignore: bool) -> str | None:
    """`swerl doctor` before a run, on every GRPO phase as it runs (its caps, concurrency: the config's
    phase_variants): the refusal (failed checks named, with their numbers) that stops it, or None (it passed, or
    --ignore-doctor was given: then it is only a warning)."""
    from swerl.doctor import diagnose

    found = by_phase(
        {stage: {c.name: f"{c.name}: {c.detail}" for c in diagnose(v).checks if not c.ok} for stage, v in variants}
    )
    if not found:
        return None
    message = "swerl doctor refuses this config on this machine:\n  " + "\n  ".join(found)
    if ignore:
        log.warning("%s\n(--ignore-doctor: running anyway; the run may hit a cap)", message)
        return None
    return message + "\nfix the config (see `swerl doctor`) or pass --ignore-doctor to run anyway"


def plan_refusal(variants: list[tuple[str, PipelineConfig]]) -> str | None:
    """`swerl plan` before a run, on every GRPO phase as it runs (the config's phase_variants): the refusal (the
    failed checks, with their numbers), or None when it passes. A plan cannot be ignored (--ignore-doctor does not
    skip it): what does not fit in memory fails later anyway."""
    from swerl.plan import make_plan

    plans = {stage: make_plan(v) for stage, v in variants}
    refusals = by_phase({stage: {} if plan.ok else {plan.refusal(): plan.refusal()} for stage, plan in plans.items()})
    if not refusals:
        return None
    return (
        "\n".join(refusals)
        + "\nsee `swerl plan` for the whole placement; fix the config's cluster, engine or distributed"
    )


def cmd_run(args: argparse.Namespace) -> int:
    cfg = _load(args)
    from swerl.pipeline import stages_to_force

    variants = cfg.phase_variants()  # the GRPO phases, resolved once for the checks before the run
    # an unknown stage is a ConfigError before anything starts
    stages_to_force(args.force or [], grpo_stages=[stage for stage, _ in variants])
    refusal = plan_refusal(variants)
    if refusal is not None:
        print(f"swerl run: {refusal}", file=sys.stderr)
        return 1
    refusal = doctor_refusal(variants, args.ignore_doctor)
    if refusal is not None:
        print(f"swerl run: {refusal}", file=sys.stderr)
        return 1
    _prefect_env()
    t0 = time.monotonic()
    # No thread opens the MLflow store while Prefect starts: both import sqlalchemy.orm, whose modules import each
    # other, and two threads importing it at once gave "cannot import name ... from partially initialized module
    # 'sqlalchemy.orm.util'" in 11 of 31 runs (issue 36). Opening it in the flow costs 1.5-4 s of a 16-28 s start.
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
    """SeaweedFS (every port explicit), the MLflow server and the Prefect server; `swerl up` starts them at once."""
    weed_ports = services.SeaweedPorts(
        s3=sc.s3_port,
        master=sc.seaweed_master_port,
        volume=sc.seaweed_volume_port,
        filer=sc.seaweed_filer_port,
        webdav=services.free_seaweed_port(sc.host),  # their grpc ports are +10000: below 65536
        admin=services.free_seaweed_port(sc.host),
    )
    return [
        services.seaweedfs(
            root / "seaweedfs",
            weed_ports,
            host=sc.host,
            access_key=access,
            secret_key=secret,
            startup_timeout_s=sc.startup_timeout_s,
        ),
        services.mlflow_server(root / "mlflow", sc.mlflow_port, host=sc.host, startup_timeout_s=sc.startup_timeout_s),
        services.prefect_server(
            root / "prefect", sc.prefect_port, host=sc.host, startup_timeout_s=sc.startup_timeout_s
        ),
    ]


def services_env(sc: ServicesConfig, s3_env: Path, bucket: str = "swerl") -> str:
    """The environment a run needs to use `swerl up`'s services (no secret: the credentials file is sourced)."""
    return (
        f"export PREFECT_API_URL=http://{sc.host}:{sc.prefect_port}/api\n"
        f"export SWERL_TRACKING_URI=http://{sc.host}:{sc.mlflow_port}\n"
        f"export SWERL_STORAGE_ROOT=s3://{bucket}/store\n"
        f"export SWERL_S3_ENDPOINT_URL=http://{sc.host}:{sc.s3_port}\n"
        f". {shlex.quote(str(s3_env))}   # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (0600, never logged)\n"
    )


def _up_banner(sc: ServicesConfig, pool: str, env_file: Path) -> str:
    """What `swerl up` prints once its services are up: where they are and how to use them."""
    return (
        "\nLocal services are up (Ctrl-C stops them):\n"
        f"  Prefect UI   http://{sc.host}:{sc.prefect_port} (worker on work pool '{pool}')\n"
        f"  MLflow UI    http://{sc.host}:{sc.mlflow_port}\n"
        f"  S3 endpoint  http://{sc.host}:{sc.s3_port} (bucket 'swerl')\n\n"
        "To use them from another shell (tracking URI, storage root, S3 credentials, Prefect API):\n"
        f"  source {env_file}\n"
        f"  swerl serve configs/local.yaml     # deployments on work pool '{pool}': run them from the UI\n"
        "  swerl run configs/local.yaml       # or run here, into the same services\n"
    )


def cmd_up(args: argparse.Namespace) -> int:
    cfg = _load(args)
    sc = cfg.services
    root = Path(args.data_dir).resolve()
    cred_file = root / "s3.env"
    access, secret = _s3_credentials(cred_file)
    env_file = root / "services.env"
    env_file.write_text(services_env(sc, cred_file))
    project = _prefect_project()  # the worker's flow runs import flows/ and tasks/ from here
    api_url = f"http://{sc.host}:{sc.prefect_port}/api"
    started: list[services.Service] = []

    # Ctrl-C and SIGTERM stop everything, even when the parent started us with SIGINT ignored (an ignored
    # disposition is inherited across exec, and Python then installs no KeyboardInterrupt handler).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        group = _local_services(sc, root, access, secret)
        started += group  # stop_all stops what is running, whatever start_all got to
        services.start_all(group)
        os.environ["PREFECT_API_URL"] = api_url  # before Prefect is imported: its settings are read then
        from flows.deploy import ensure_work_pool

        ensure_work_pool(args.pool)  # the worker's pool, ready when `swerl up` says so
        worker = services.prefect_worker(
            root / "prefect",
            api_url,
            args.pool,
            services.free_port(sc.host),
            host=sc.host,
            limit=cfg.serve.max_concurrent_runs,
            cwd=project,
            startup_timeout_s=sc.startup_timeout_s,
            env={
                "AWS_ACCESS_KEY_ID": access,
                "AWS_SECRET_ACCESS_KEY": secret,
                "PYTHONPATH": os.environ["PYTHONPATH"],
                **{k: v for k, v in PREFECT_DEFAULTS.items() if k not in os.environ},
            },
        )
        started.append(worker)
        worker.start()
        print(_up_banner(sc, args.pool, env_file), flush=True)
        while all(s.proc is not None and s.proc.poll() is None for s in started):
            time.sleep(1)
        dead = [s.name for s in started if s.proc is not None and s.proc.poll() is not None]
        print(f"service(s) exited: {', '.join(dead)}; stopping the rest", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping services...", flush=True)
        return 0
    except RuntimeError as exc:  # a service that did not start: its log's tail says why
        print(f"swerl up: {exc}", file=sys.stderr)
        return 1
    finally:
        for svc in reversed(started):
            svc.stop()


def cmd_serve(args: argparse.Namespace) -> int:
    cfg = _load(args)
    _prefect_env()
    _prefect_project()
    from flows.deploy import register_deployments, serve_deployments

    if args.foreground:
        serve_deployments(cfg)
        return 0
    names = register_deployments(cfg, args.pool)
    print(
        f"registered on work pool '{args.pool}': {', '.join(names)}\n"
        f"its worker (`swerl up` runs one, or `prefect worker start --pool {args.pool}`) runs them: from the UI, "
        f"`prefect deployment run '{names[0]}'`, and the evaluation on '{cfg.serve.eval_cron}' ({cfg.serve.timezone})"
    )
    return 0


def compare_uri(args: argparse.Namespace) -> str:
    """The MLflow store `swerl compare` reads: --tracking-uri, else SWERL_TRACKING_URI, else the config's
    tracking.uri. A ConfigError when it is a local store that does not exist (reading must not create one)."""
    if args.tracking_uri:
        uri, source = args.tracking_uri, "--tracking-uri"
    elif os.environ.get("SWERL_TRACKING_URI"):
        uri, source = os.environ["SWERL_TRACKING_URI"], "SWERL_TRACKING_URI"
    else:
        uri, source = load_config(args.config, args.set or []).tracking.uri, f"tracking.uri of {args.config}"
    path = None
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///") :])  # sqlite:////abs keeps its leading slash
    elif uri.startswith("file:"):
        path = Path(uri.removeprefix("file://").removeprefix("file:"))
    elif "://" not in uri:
        path = Path(uri)
    if path is not None and not path.resolve().exists():
        raise ConfigError(
            f"no MLflow store at {path.resolve()} ({source}: {uri}): point --tracking-uri, SWERL_TRACKING_URI or the "
            "config's tracking.uri at the store the eval runs were logged to (e.g. http://127.0.0.1:5000 for "
            "`swerl up`'s MLflow server)"
        )
    if path is not None and uri.startswith("sqlite:///"):
        return f"sqlite:///{path.resolve()}"
    return uri


def cmd_compare(args: argparse.Namespace) -> int:
    """Paired comparison of two MLflow eval runs from their saved per-task results."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from swerl.eval.report import compare_runs

    uri = compare_uri(args)
    client = MlflowClient(tracking_uri=uri)
    try:
        print(compare_runs(client, args.run_a, args.run_b, samples=args.samples, confidence=args.confidence))
    except (ValueError, MlflowException) as exc:  # an unknown run id, a run that is not an eval run
        print(f"swerl compare: {exc} (tracking URI {uri})", file=sys.stderr)
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


def cmd_crosscheck(args: argparse.Namespace) -> int:
    """swerl's grader and swebench's run_evaluation on the same predictions (swerl/grading/crosscheck.py)."""
    from swerl.grading.crosscheck import crosscheck, read_predictions, read_tasks, standard_predictions
    from swerl.sandbox.pool import release_provider
    from swerl.stages.common import sandbox_provider

    cfg = _load(args)
    try:
        tasks = read_tasks(Path(args.tasks))
        if args.instance:
            tasks = [t for t in tasks if t.instance_id in set(args.instance)]
        predictions = standard_predictions(tasks, gold=args.gold, empty=args.empty)
        predictions += [p for path in args.predictions or [] for p in read_predictions(Path(path))]
    except ValueError as exc:
        print(f"swerl crosscheck: {exc}", file=sys.stderr)
        return 2
    if args.instance:
        predictions = [p for p in predictions if p.instance_id in set(args.instance)]
    if not predictions:
        print("swerl crosscheck: nothing to grade: give --predictions, --gold or --empty", file=sys.stderr)
        return 2
    limits = cfg.agent.sandbox
    if args.backend != "config":
        limits = limits.model_copy(update={"backend": args.backend})
    provider = sandbox_provider(limits, git_baseline=True)
    try:
        timeout = args.timeout or cfg.agent.test_timeout_s
        report = crosscheck(provider, tasks, predictions, Path(args.out), timeout, args.workers)
    except ValueError as exc:
        print(f"swerl crosscheck: {exc}", file=sys.stderr)
        return 2
    finally:
        release_provider(provider)
    print(report.table(), end="")
    print(f"written: {Path(args.out) / 'crosscheck.json'}, {Path(args.out) / 'crosscheck.md'}")
    return 0 if report.ok else 1


SET_HELP = "override a config key (repeatable); YAML-typed: --set sft.max_steps=50"
CONFIG_NOTE = (
    "The config is a YAML file (default configs/local.yaml); --set KEY=VALUE overrides a key, and the variables "
    "that `swerl up` writes (SWERL_TRACKING_URI, SWERL_STORAGE_ROOT, SWERL_S3_ENDPOINT_URL) override the file's "
    "tracking.uri, storage.root and storage.s3_endpoint_url (a --set wins over them)."
)
COMMANDS: dict[str, tuple[str, str, str]] = {
    # name: (one-line help, description, examples)
    "run": (
        "run the pipeline (finished stages are skipped)",
        "Run curate -> traces -> sft -> grpo -> evaluate as the Prefect flow swerl-pipeline (on PREFECT_API_URL's "
        "server, else an ephemeral API). A stage whose manifest exists for the same config and inputs is skipped; "
        "Ctrl-C stops the run and keeps every finished stage: the same command resumes it.",
        "swerl run configs/local.yaml\n"
        "swerl run configs/local.yaml --set sft.max_steps=50 --force sft\n"
        "source runs/services/services.env && swerl run   # into `swerl up`'s MLflow server and S3 bucket",
    ),
    "curate": (
        "run only the curate stage (skipped when already done)",
        "Curate tasks (train.parquet, eval.parquet) in the same pipeline session as `swerl run`.",
        "swerl curate configs/mine.yaml\nswerl curate configs/local.yaml --force",
    ),
    "up": (
        "start the Prefect server and worker, MLflow and SeaweedFS S3 on loopback until Ctrl-C",
        "Start the Prefect server (UI and API), the MLflow tracking server (UI) and a SeaweedFS S3 server at once, "
        "then a Prefect worker on a work pool of type process (it runs the deployments' flow runs: UI runs and "
        "schedules), all bound to services.host. Writes DATA_DIR/s3.env (generated S3 credentials, 0600) and "
        "DATA_DIR/services.env (PREFECT_API_URL, SWERL_TRACKING_URI, SWERL_STORAGE_ROOT, SWERL_S3_ENDPOINT_URL and "
        "the credentials file): `source` it in another shell. Ports come from the config's services section.",
        "swerl up\nswerl up configs/local.yaml --set services.prefect_port=4300 --data-dir /tmp/svc",
    ),
    "serve": (
        "register the pipeline and the scheduled evaluation as deployments",
        "Register two deployments with the Prefect API in PREFECT_API_URL (refused without one): CONFIG-pipeline "
        "(on demand) and CONFIG-evaluate (cron serve.eval_cron), on the work pool that `swerl up`'s worker serves. "
        "Their parameters are the config (less serve and services): a run from the UI form, or `prefect deployment "
        "run --param config=...` with only some keys, is merged onto it. --foreground serves them from this process "
        "instead (no worker needed) until Ctrl-C.",
        "source runs/services/services.env\n"
        "swerl serve configs/local.yaml\n"
        "swerl serve configs/local.yaml --set serve.eval_cron='0 */6 * * *'\n"
        'prefect deployment run swerl-pipeline/local-pipeline --param config=\'{"sft": {"max_steps": 50}}\'',
    ),
    "compare": (
        "paired comparison of two MLflow eval runs (same tasks)",
        "Paired bootstrap CI of the pass@1 difference and a sign-flip permutation test between two eval runs "
        "(MLflow runs eval-MODEL). The store is --tracking-uri, else SWERL_TRACKING_URI, else the config's "
        "tracking.uri; a local store that does not exist is an error (nothing is created).",
        "swerl compare RUN_ID_SFT RUN_ID_GRPO                  # tracking.uri of configs/local.yaml\n"
        "swerl compare RUN_A RUN_B configs/mine.yaml\n"
        "swerl compare RUN_A RUN_B --tracking-uri http://127.0.0.1:5000",
    ),
    "doctor": (
        "check machine limits against the config (non-zero: refused)",
        "Measure what this machine allows (open files, processes, memory, disk, sandbox runtimes, Docker) against "
        "the peak the config asks for; exit 1 naming each failed check.",
        "swerl doctor configs/local.yaml\nswerl doctor configs/local.yaml --tasks runs/store/.../eval.parquet",
    ),
    "plan": (
        "place engines and trainer ranks on the cluster and check their memory (non-zero: refused)",
        "Print the placement (GPUs, processes, ports) and memory per GPU of the config's cluster; exit 1 with the "
        "numbers when something does not fit.",
        "swerl plan configs/qwen3-30b-a3b.yaml",
    ),
    "crosscheck": (
        "grade predictions with swerl's grader and swebench's run_evaluation; compare (non-zero: a difference)",
        "Grade each prediction (SWE-bench predictions JSONL, an evaluate stage's episodes_MODEL.jsonl, and/or "
        "each task's reference fix and empty patch) twice: with swerl's grader in the sandbox backend --backend "
        "names, and with swebench's own harness (run_evaluation, its containers on network none). Tasks are "
        "SWE-bench-style rows with an eval_script whose instance images are on the Docker engine. Prints and "
        "writes (OUT/crosscheck.json, crosscheck.md) one row per prediction; exit 1 when any prediction's verdicts "
        "differ or either grader gave none. docs/operations.md, 'Cross-checking the grader'.",
        "swerl crosscheck --tasks rows.jsonl --gold --empty\n"
        "swerl crosscheck --tasks rows.jsonl --predictions preds.jsonl --out runs/crosscheck\n"
        "swerl crosscheck configs/local.yaml --tasks rows.jsonl --predictions runs/store/.../episodes_sft.jsonl",
    ),
    "config": (
        "print the resolved config",
        "Print the config after the file, the environment and every --set, as YAML (what a run saves).",
        "swerl config configs/local.yaml --set curate.validation_workers=4",
    ),
}


def _version() -> str:
    try:
        return package_version("swerl")
    except PackageNotFoundError:  # run from a checkout that was not installed
        return "unknown (not installed)"


_Subparsers = argparse._SubParsersAction  # what add_subparsers returns: the subcommands are added to it


def _command(sub: _Subparsers, name: str) -> argparse.ArgumentParser:
    short, description, examples = COMMANDS[name]
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=short,
        description=f"{description}\n\n{CONFIG_NOTE}" if name != "plan" else description,
        epilog="examples:\n" + "\n".join(f"  {line}" for line in examples.splitlines()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser


def _with_config(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", default="configs/local.yaml", help="YAML run config (default: %(default)s)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help=SET_HELP)


def _add_pipeline_commands(sub: _Subparsers) -> None:
    """swerl run and swerl curate: the pipeline, or its first stage alone."""
    p_run = _command(sub, "run")
    _with_config(p_run)
    p_run.add_argument(
        "--force",
        action="append",
        metavar="STAGE",
        help=f"rerun this stage and all after it ({', '.join(STAGES)}, or a GRPO phase's grpo-NAME)",
    )
    p_run.add_argument(
        "--ignore-doctor", action="store_true", help="run even when `swerl doctor` refuses the config on this machine"
    )
    p_run.set_defaults(func=cmd_run)

    p_cur = _command(sub, "curate")
    _with_config(p_cur)
    p_cur.add_argument("--force", action="store_true", help="rerun curation even when it is already done")
    p_cur.set_defaults(func=cmd_curate)


def _add_service_commands(sub: _Subparsers) -> None:
    """swerl up and swerl serve: the services and the deployments."""
    p_up = _command(sub, "up")
    _with_config(p_up)
    p_up.add_argument(
        "--data-dir",
        default="runs/services",
        help="where the services keep their data (default: %(default)s)",
    )
    p_up.add_argument("--pool", default=WORK_POOL, help="work pool its worker serves (default: %(default)s)")
    p_up.set_defaults(func=cmd_up)

    p_serve = _command(sub, "serve")
    _with_config(p_serve)
    p_serve.add_argument("--pool", default=WORK_POOL, help="work pool of the deployments (default: %(default)s)")
    p_serve.add_argument(
        "--foreground",
        action="store_true",
        help="serve the deployments from this process until Ctrl-C instead of a work pool",
    )
    p_serve.set_defaults(func=cmd_serve)


def _add_inspection_commands(sub: _Subparsers) -> None:
    """swerl compare, doctor, plan and config: they look at runs, the machine and the config; they train nothing."""
    p_cmp = _command(sub, "compare")
    p_cmp.add_argument("run_a", help="MLflow run id of an eval run (the baseline)")
    p_cmp.add_argument("run_b", help="MLflow run id of another eval run")
    _with_config(p_cmp)
    p_cmp.add_argument("--config", dest="config_option", help=argparse.SUPPRESS)  # the old spelling
    p_cmp.add_argument("--tracking-uri", help="MLflow tracking URI (overrides SWERL_TRACKING_URI and the config's)")
    p_cmp.add_argument("--samples", type=int, default=10_000, help="bootstrap resamples and sign flips")
    p_cmp.add_argument("--confidence", type=float, default=0.95, help="confidence level of the CI and test")
    p_cmp.set_defaults(func=cmd_compare)

    p_doc = _command(sub, "doctor")
    _with_config(p_doc)
    p_doc.add_argument(
        "--tasks",
        action="append",
        metavar="FILE",
        help="also check the images of these tasks (curate's train/eval.parquet, or a SWE-smith or "
        "SWE-bench .parquet/.jsonl/.json): present, missing, pulls, disk (repeatable)",
    )
    p_doc.set_defaults(func=cmd_doctor)

    p_plan = _command(sub, "plan")
    _with_config(p_plan)
    p_plan.set_defaults(func=cmd_plan)

    p_cfg = _command(sub, "config")
    _with_config(p_cfg)
    p_cfg.set_defaults(func=cmd_config)


def _add_crosscheck_command(sub: _Subparsers) -> None:
    """swerl crosscheck: swerl's grader against SWE-bench's on the same predictions."""
    p_xc = _command(sub, "crosscheck")
    _with_config(p_xc)
    p_xc.add_argument("--tasks", required=True, help="SWE-bench rows with eval_script (jsonl, json, parquet)")
    p_xc.add_argument(
        "--predictions",
        action="append",
        metavar="FILE",
        help="SWE-bench predictions (instance_id, model_patch) or episodes_MODEL.jsonl (repeatable)",
    )
    p_xc.add_argument("--gold", action="store_true", help="also grade each task's reference fix")
    p_xc.add_argument("--empty", action="store_true", help="also grade each task's empty patch")
    p_xc.add_argument("--instance", action="append", metavar="ID", help="only these instances (repeatable)")
    p_xc.add_argument("--out", default="runs/crosscheck", help="its work directory (default: %(default)s)")
    p_xc.add_argument(
        "--backend",
        choices=["docker", "local", "config"],
        default="docker",
        help="swerl's sandbox backend (default: %(default)s; config: agent.sandbox.backend)",
    )
    p_xc.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds for one test run, both graders (default: agent.test_timeout_s)",
    )
    p_xc.add_argument("--workers", type=int, default=2, help="predictions graded at once by each grader")
    p_xc.set_defaults(func=cmd_crosscheck)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="swerl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"swerl {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # The order here is the order `swerl --help` lists the commands in.
    _add_pipeline_commands(sub)
    _add_service_commands(sub)
    _add_inspection_commands(sub)
    _add_crosscheck_command(sub)
    return parser


def _mute_terminal() -> None:
    """After Ctrl-C: no more log lines or tracebacks on the terminal (Prefect's crash report, stages' threads);
    the flow run's logs on the Prefect API keep them."""
    loggers = [
        logging.getLogger(),
        *(v for v in logging.root.manager.loggerDict.values() if isinstance(v, logging.Logger)),
    ]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                handler.addFilter(lambda _record: False)
    threading.excepthook = lambda _args: None


def _interrupt(_signum: int, _frame: Any) -> None:
    _mute_terminal()
    raise KeyboardInterrupt


RESUMES = {
    "run": "every finished stage is kept; the same command resumes from the stage that was running",
    "curate": "a finished curation is kept; the same command resumes it",
    "serve": "stopped serving",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if getattr(args, "config_option", None):
        args.config = args.config_option
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpcore", "alembic", "botocore", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)  # one line per HTTP request buries the run's own log
    interruptible = args.command in RESUMES and threading.current_thread() is threading.main_thread()
    if interruptible:
        signal.signal(signal.SIGINT, _interrupt)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"swerl: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.command not in RESUMES:
            raise
        _mute_terminal()
        again = "swerl " + " ".join(shlex.quote(a) for a in argv)
        print(
            f"\nswerl {args.command}: interrupted; {RESUMES[args.command]}: {again}",
            file=sys.stderr,
            flush=True,
        )
        return 130
    finally:
        if interruptible:
            signal.signal(signal.SIGINT, signal.default_int_handler)


if __name__ == "__main__":
    sys.exit(main())
