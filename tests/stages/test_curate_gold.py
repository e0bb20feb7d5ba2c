"""curate.gold_check: loaded SWE-bench-style rows are graded in their own images before they are kept.

Real parts: toolz instance images (tests/swebench_instances.py), the curate stage loading a SWE-bench JSONL file,
swerl's grader in Docker sandboxes, MLflow. Rows: a good one (kept); one whose reference fix applies and fixes
nothing (dropped: gold_unresolved); one whose image is the project without the bug, so the empty patch already
passes (dropped: empty_resolved); one whose test patch names a file the repository lacks, so it does not apply (an
infrastructure error: kept, counted apart); one whose image is not on the engine (kept, unchecked).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from swerl.config.data import CurateConfig, DatasetSource
from swerl.config.sandbox import SandboxLimits
from swerl.data.loaders import swebench_image
from swerl.data.taskio import tasks_from_parquet
from swerl.sandbox.docker import DockerSandboxProvider
from swerl.stages.curate import run_curate
from swerl.storage import Store
from swerl.tracking import Tracker
from tests.sandbox_backends import docker_unavailable
from tests.sandbox_helpers import docker_provider
from tests.stage_helpers import Env
from tests.swebench_instances import TOOLZ, new_file_patch, toolz_instances


@pytest.fixture(scope="module")
def provider() -> DockerSandboxProvider:
    if reason := docker_unavailable():
        pytest.skip(reason)
    return docker_provider(git_baseline=True, memory_mb=1024, start_timeout_s=120)


def tagged(source: str, instance_id: str) -> str:
    """`source` also named as swebench names `instance_id`'s image (the row's loader finds it by that name)."""
    name = swebench_image(instance_id)
    subprocess.run(["docker", "tag", source, name], check=True, capture_output=True, timeout=120)
    return name


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.network
def test_gold_check_drops_broken_rows_by_cause_and_keeps_good_ones(
    provider: DockerSandboxProvider, tmp_path: Path
) -> None:
    (good,) = toolz_instances(provider, tmp_path / "toolz", [7201])
    base = good.row
    wrong = new_file_patch("gold_check_wrong.py", "WRONG = True\n")  # applies, fixes nothing
    broken_fix = {**base, "instance_id": "pytoolz__toolz-7202", "patch": wrong}
    broken_fix["image"] = tagged(base["image"], "pytoolz__toolz-7202")
    # The project image without the bug: the FAIL_TO_PASS tests already pass on the empty patch.
    empty_passes = {**base, "instance_id": "pytoolz__toolz-7203", "patch": wrong}
    empty_passes["image"] = tagged(TOOLZ.image, "pytoolz__toolz-7203")
    bad_test_patch = {
        **base,
        "instance_id": "pytoolz__toolz-7204",
        "test_patch": base["test_patch"].replace("tests/", "no_such_dir/"),
    }
    bad_test_patch["image"] = tagged(base["image"], "pytoolz__toolz-7204")
    no_image = {**base, "instance_id": "pytoolz__toolz-7299", "image": swebench_image("pytoolz__toolz-7299")}
    subprocess.run(["docker", "rmi", "-f", swebench_image("pytoolz__toolz-7299")], capture_output=True, timeout=120)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in (base, broken_fix, empty_passes, bad_test_patch, no_image)))

    env = Env(Store(f"file://{tmp_path}/store"), Tracker(f"sqlite:///{tmp_path}/mlflow.db", "gold-check"))
    cfg = CurateConfig(
        repos=[],
        datasets=[DatasetSource(schema="swebench", path=str(rows))],
        decontaminate=False,
        eval_repos=["pytoolz/toolz"],
        validation_workers=2,
        sandbox=SandboxLimits(backend="docker", memory_mb=1024, start_timeout_s=180, timeout_s=300),
    )
    assert cfg.gold_check  # on by default
    manifest = env.run("curate", run_curate, cfg).manifest
    report = env.json(manifest, "curate_report.json")["gold_check"]
    print(json.dumps(report, indent=1))
    kept = {t.instance_id for t in tasks_from_parquet(env.artifact(manifest, "eval.parquet"))}
    assert kept == {"pytoolz__toolz-7201", "pytoolz__toolz-7204", "pytoolz__toolz-7299"}
    assert report["checked"] == 4 and report["dropped"] == 2 and report["no_image"] == 1
    assert report["causes"] == {"gold_unresolved": 1, "empty_resolved": 1}
    assert report["infra_causes"] == {"start_failed": 1} and report["infra_errors"] == 1
    by_id = {r["instance_id"]: r for r in report["rows"]}
    assert by_id["pytoolz__toolz-7201"] == {
        "instance_id": "pytoolz__toolz-7201",
        "gold": "RESOLVED_FULL",
        "empty": "RESOLVED_NO",
        "causes": [],
    }
    assert by_id["pytoolz__toolz-7202"]["causes"] == ["gold_unresolved"]
    assert by_id["pytoolz__toolz-7203"]["causes"] == ["empty_resolved"]
    assert by_id["pytoolz__toolz-7204"]["infra"] == "start_failed"
    metrics = env.tracker.client.get_run(manifest.mlflow_run_id).data.metrics
    assert metrics["gold_check.dropped.gold_unresolved"] == 1 and metrics["gold_check.dropped.empty_resolved"] == 1
    assert metrics["gold_check.infra.start_failed"] == 1 and metrics["gold_check.checked"] == 4


def test_gold_check_off_keeps_every_row_unchecked(tmp_path: Path) -> None:
    """With gold_check false nothing is graded (no Docker needed): the report says so."""
    row = {
        "instance_id": "nobody__nothing-1",
        "repo": "nobody/nothing",
        "base_commit": "0",
        "patch": "x",
        "problem_statement": "p",
        "FAIL_TO_PASS": ["t.py::t"],
    }
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(row) + "\n")
    env = Env(Store(f"file://{tmp_path}/store"), Tracker(f"sqlite:///{tmp_path}/mlflow.db", "gold-off"))
    cfg = CurateConfig(
        repos=[], datasets=[DatasetSource(schema="swebench", path=str(rows))], decontaminate=False, gold_check=False
    )
    manifest = env.run("curate", run_curate, cfg).manifest
    assert env.json(manifest, "curate_report.json")["gold_check"] == {"enabled": False}
    assert [t.instance_id for t in tasks_from_parquet(env.artifact(manifest, "train.parquet"))] == [row["instance_id"]]
