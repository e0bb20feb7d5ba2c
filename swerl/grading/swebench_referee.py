"""SWE-bench's own harness, run as the referee of swerl's grader: `swebench.harness.run_evaluation` unchanged but
for one thing, every container it creates runs with network "none".

    python -m swerl.grading.swebench_referee --dataset ROWS.json --predictions PREDS.jsonl --run-id ID \
        --out VERDICTS.json [--workers N] [--timeout S]

Run it in a working directory of its own: swebench writes `logs/run_evaluation/RUN_ID/MODEL/INSTANCE/` (its
report.json, test_output.txt, run_instance.log) relative to the working directory, and its run report
(`MODEL.RUN_ID.json`) to --report-dir. It runs in a process of its own because run_evaluation.main sets the
process's open-file limit and starts threads and loggers of its own.

What is swebench's, what is swerl's:
- The predictions with a patch run through `run_evaluation.main`, exactly as `python -m
  swebench.harness.run_evaluation -d ROWS.json -p PREDS.jsonl -id RUN_ID` runs them (images must be present: no
  registry is reachable, and an absent image is reported, never pulled).
- swebench's main() does not run an empty patch (its report counts it among `empty_patch_ids`, unresolved). So
  that its verdict on the task's starting state is a verdict of its harness and not of that rule, empty
  predictions also run through `run_evaluation.run_instances(..., skip_patch=True)`, swebench's own "no patch"
  mode: the same container, eval script, parser and report as any other prediction.
- The only change to swebench: `docker.models.containers.ContainerCollection.create` is wrapped so that a
  container created without a network gets network_mode "none" (swebench 5.0.2's create_container passes none,
  and Docker's default is its bridge network, which swerl never uses: DESIGN.md, "Machine notes"); a call that
  names any other network is refused.

Output (--out): one verdict per prediction, {instance_id, model, resolved (true/false, null when swebench gave
no verdict), status, detail}, and the run report's resolved/unresolved/error ids.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path
from typing import Any

NETWORK = "none"
"""The only network a referee container may have."""
CREATED_NETWORKS: list[str] = []
"""The network mode of every container created since force_network_none (what the output reports)."""


def force_network_none() -> None:
    """Make every container this process creates through docker-py run with network "none" (idempotent)."""
    from docker.models.containers import ContainerCollection

    create = ContainerCollection.create
    if getattr(create, "_swerl_network_none", False):
        return

    def create_without_network(self: Any, image: Any, command: Any = None, **kwargs: Any) -> Any:
        asked = kwargs.get("network_mode") or kwargs.get("network")
        if asked not in (None, NETWORK):
            raise RuntimeError(f"the referee runs containers with network {NETWORK!r} only, not {asked!r}")
        kwargs.pop("network", None)
        kwargs["network_mode"] = NETWORK
        container = create(self, image, command, **kwargs)
        CREATED_NETWORKS.append(str(container.attrs.get("HostConfig", {}).get("NetworkMode")))
        return container

    create_without_network._swerl_network_none = True  # type: ignore[attr-defined]
    ContainerCollection.create = create_without_network  # type: ignore[method-assign]


def _instance_dir(run_id: str, model: str, instance_id: str) -> Path:
    from swebench.harness.constants import RUN_EVALUATION_LOG_DIR

    return Path(RUN_EVALUATION_LOG_DIR) / run_id / model.replace("/", "__") / instance_id


def verdict_of(run_id: str, model: str, instance_id: str) -> dict[str, Any]:
    """swebench's verdict on one prediction, read from the files its harness wrote for it."""
    from swebench.harness.constants import APPLY_PATCH_FAIL, LOG_INSTANCE, LOG_REPORT
    from swebench.harness.grading import get_resolution_status

    where = _instance_dir(run_id, model, instance_id)
    out: dict[str, Any] = {"instance_id": instance_id, "model": model, "log_dir": str(where.resolve())}
    report_file = where / LOG_REPORT
    if not report_file.is_file():
        log = (where / LOG_INSTANCE).read_text(errors="replace") if (where / LOG_INSTANCE).is_file() else ""
        # swebench's EvaluationError for a patch that none of its apply commands applied
        if APPLY_PATCH_FAIL in log:
            return out | {
                "resolved": False,
                "status": "PATCH_APPLY_FAILED",
                "detail": "no git apply/patch applied it",
            }
        tail = log.strip().splitlines()[-3:] if log.strip() else ["no run_instance.log"]
        return out | {"resolved": None, "status": "ERROR", "detail": " | ".join(tail)[-500:]}
    entry = json.loads(report_file.read_text())[instance_id]
    if not entry.get("patch_successfully_applied"):
        reason = entry.get("infra_failure_reason")
        if entry.get("infra_failure"):  # swebench 5: an environment failure, not the patch's
            return out | {"resolved": None, "status": "INFRA_FAILURE", "detail": str(reason)}
        why = f"no gradable test output{f' ({reason}, ambiguous)' if reason else ''}"
        return out | {"resolved": False, "status": "LOG_INVALID", "detail": why}
    status = str(get_resolution_status(entry["tests_status"]))
    return out | {"resolved": bool(entry["resolved"]), "status": status, "detail": ""}


def _missing_images(rows: dict[str, dict[str, Any]], preds: list[dict[str, Any]]) -> dict[str, str]:
    """Instance id -> image, for the predictions whose instance's image is not on the Docker engine."""
    import docker

    client = docker.from_env()
    missing: dict[str, str] = {}
    for pred in preds:
        try:
            client.images.get(rows[pred["instance_id"]]["image"])
        except docker.errors.ImageNotFound:
            missing[pred["instance_id"]] = rows[pred["instance_id"]]["image"]
    client.close()
    return missing


def _run_patched(
    dataset: Path,
    predictions: Path,
    patched: list[dict[str, Any]],
    run_id: str,
    workers: int,
    timeout: int,
    report_dir: Path,
) -> dict[str, Any]:
    """swebench's run_evaluation on the predictions with a patch; its run report."""
    from swebench.harness import run_evaluation

    kept = predictions.with_name(f"{predictions.stem}.patched.jsonl")
    kept.write_text("".join(json.dumps(p) + "\n" for p in patched))
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limit = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    report_path = run_evaluation.main(
        dataset_name=str(dataset),
        split="test",
        instance_ids=[p["instance_id"] for p in patched],
        predictions_path=str(kept),
        max_workers=workers,
        open_file_limit=limit,
        run_id=run_id,
        timeout=timeout,
        rewrite_reports=False,
        modal=False,
        report_dir=str(report_dir),
    )
    report: dict[str, Any] = json.loads(Path(report_path).read_text())
    return report


def referee(
    dataset: Path, predictions: Path, run_id: str, workers: int, timeout: int, report_dir: Path
) -> dict[str, Any]:
    """Run swebench's harness on `predictions` (at most one per instance) and read back its verdicts."""
    from swebench.harness import run_evaluation

    force_network_none()
    rows = {r["instance_id"]: r for r in json.loads(dataset.read_text())}
    preds = [json.loads(line) for line in predictions.read_text().splitlines() if line.strip()]
    missing = _missing_images(rows, preds)
    runnable = [p for p in preds if p["instance_id"] not in missing]
    patched = [p for p in runnable if p.get("model_patch")]
    empty = [p for p in runnable if not p.get("model_patch")]
    report: dict[str, Any] = {}
    if patched:
        report = _run_patched(dataset, predictions, patched, run_id, workers, timeout, report_dir)
    if empty:
        instances = [rows[p["instance_id"]] for p in empty]
        by_id = {p["instance_id"]: {**p, "model_patch": ""} for p in empty}
        run_evaluation.run_instances(by_id, instances, workers, run_id, timeout, skip_patch=True)
    verdicts = [verdict_of(run_id, p.get("model_name_or_path", "None"), p["instance_id"]) for p in runnable]
    for instance_id, image in missing.items():
        model = next(p.get("model_name_or_path", "None") for p in preds if p["instance_id"] == instance_id)
        verdicts.append(
            {
                "instance_id": instance_id,
                "model": model,
                "resolved": None,
                "status": "IMAGE_MISSING",
                "detail": f"image {image} is not on the Docker engine",
            }
        )
    official = {k: report.get(k, []) for k in ("resolved_ids", "unresolved_ids", "error_ids", "empty_patch_ids")}
    for verdict in verdicts:  # the run report and the instance's own report.json must say the same
        listed = verdict["instance_id"] in official["resolved_ids"]
        was_patched = any(p["instance_id"] == verdict["instance_id"] for p in patched)
        if was_patched and verdict["resolved"] is not None and verdict["resolved"] != listed:
            verdict |= {
                "resolved": None,
                "status": "REPORT_MISMATCH",
                "detail": f"report.json says resolved={verdict['resolved']}, the run report {listed}",
            }
    return {
        "run_id": run_id,
        "verdicts": verdicts,
        "run_report": official,
        "container_networks": sorted(set(CREATED_NETWORKS)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m swerl.grading.swebench_referee", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dataset", type=Path, required=True, help="a JSON list of SWE-bench 5 rows")
    parser.add_argument("--predictions", type=Path, required=True, help="JSONL: instance_id, model_patch, ...")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds for one instance's eval script")
    parser.add_argument("--report-dir", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    result = referee(args.dataset, args.predictions, args.run_id, args.workers, args.timeout, args.report_dir)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
