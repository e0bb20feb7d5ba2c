"""The curate stage through run_stage: parquet files, report, metrics, table, split by repository, skip."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from swerl.config.data import CurateConfig
from swerl.data.schema import TaskInstance
from swerl.data.taskio import tasks_from_parquet
from swerl.stages.curate import NoTasksError, run_curate, split_by_repo
from swerl.stages.runner import run_stage
from swerl.storage import Store
from swerl.tracking import Tracker


def task(instance_id: str, repo: str) -> TaskInstance:
    return TaskInstance(
        instance_id=instance_id,
        repo=repo,
        base_commit="c",
        problem_statement="p",
        patch="d",
        patch_kind="bug",
        FAIL_TO_PASS=["t::a"],
        source="test",
    )


def test_split_by_repo_matches_full_and_short_names():
    tasks = [task("a", "swerl-builtin/money"), task("b", "o/textkit"), task("c", "swesmith/x__y.abcdef1")]
    train, held_out, unmatched = split_by_repo(tasks, ["money", "x/y", "absent"])
    assert [t.instance_id for t in train] == ["b"] and [t.instance_id for t in held_out] == ["a", "c"]
    assert {t.split for t in train} == {"train"} and {t.split for t in held_out} == {"eval"}
    assert unmatched == ["absent"]


def test_run_curate_writes_split_task_files(tmp_path: Path):
    cfg = CurateConfig(
        repos=["builtin:intervals", "builtin:money"],
        eval_repos=["money"],
        max_candidates_per_repo=5,
        validation_workers=2,
    )
    store = Store(str(tmp_path / "store"))
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "curate-test")
    outcome = run_stage("curate", run_curate, cfg, store=store, tracker=tracker, parent=None, seed=3)
    manifest, result = outcome.manifest, outcome.result
    assert not outcome.skipped and result is not None
    assert set(manifest.artifacts) == {"train.parquet", "eval.parquet", "curate_report.json"}

    prefix = f"stages/curate/{manifest.key}/{manifest.attempt}"
    train = tasks_from_parquet(store.read_bytes(f"{prefix}/train.parquet"))
    held_out = tasks_from_parquet(store.read_bytes(f"{prefix}/eval.parquet"))
    assert train and held_out
    assert {t.repo for t in train} == {"swerl-builtin/intervals"} and {t.repo for t in held_out} == {
        "swerl-builtin/money"
    }
    report = json.loads(store.read_bytes(f"{prefix}/curate_report.json"))
    assert report["synthesis"]["candidates"] == 10 == result.metrics["candidates"]
    assert report["synthesis"]["valid"] == len(train) + len(held_out) == result.metrics["valid"]
    assert report["decontamination"]["train"]["input"] == len(train)
    rows = result.tables["yield"]
    assert {r["repo"] for r in rows} == {"intervals", "money"} and sum(r["valid"] for r in rows) == result.metrics[
        "valid"
    ]
    assert "| modifier |" in result.markdown["curate"]

    again = run_stage("curate", run_curate, cfg, store=store, tracker=tracker, parent=None, seed=3)
    assert again.skipped and again.manifest.key == manifest.key


def _repo(root: Path, test_body: str) -> Path:
    """A one-module repository with one test file."""
    root.mkdir(parents=True)
    (root / "calc.py").write_text("def add(a, b):\n    if a < b:\n        return a + b\n    return b + a\n")
    (root / "test_calc.py").write_text(f"from calc import add\n\n\ndef test_add():\n    {test_body}\n")
    return root


def test_a_repository_that_yields_no_task_fails_with_the_clean_runs_output(tmp_path: Path):
    broken = _repo(tmp_path / "broken", "assert add(1, 2) == 4, 'CLEAN-RUN-MARKER'")  # fails on clean code
    cfg = CurateConfig(repos=[str(broken)], max_candidates_per_repo=2, validation_workers=1, decontaminate=False)
    store = Store(str(tmp_path / "store"))
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "curate-test")
    with pytest.raises(NoTasksError, match="none of the 1 repositories yielded a task") as caught:
        run_stage("curate", run_curate, cfg, store=store, tracker=tracker, parent=None, seed=0)
    message = str(caught.value)
    assert "broken: skipped: clean_suite_fails" in message and "CLEAN-RUN-MARKER" in message, message


def test_several_repositories_warn_per_repository_without_a_task(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    broken = _repo(tmp_path / "broken", "assert add(1, 2) == 4")
    cfg = CurateConfig(
        repos=[str(broken), "builtin:intervals"], max_candidates_per_repo=3, validation_workers=2, decontaminate=False
    )
    store = Store(str(tmp_path / "store"))
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "curate-test")
    with caplog.at_level(logging.WARNING):
        outcome = run_stage("curate", run_curate, cfg, store=store, tracker=tracker, parent=None, seed=0)
    assert outcome.result is not None and outcome.result.metrics["valid"] > 0
    assert "repository broken yielded no task (skipped: clean_suite_fails)" in caplog.text
