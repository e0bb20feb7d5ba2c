"""Curating two real PyPI projects from structured `curate.repos` entries, each in its own environment:
itsdangerous (src layout; its tests need freezegun) and toolz (flat, tests inside the package).

Every kept task is graded again here, independently of curation: its reference fix (the bug patch reversed) must
be graded resolved for >= 90% of the valid tasks, and the untouched bug unresolved. The figures
are in docs/benchmarks.md ("Curating real repositories")."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from swerl.config.data import CurateConfig, RepoSource
from swerl.data.diffs import reverse_patch
from swerl.data.repoenv import fetch_sdist
from swerl.data.taskio import tasks_from_parquet
from swerl.grading.grader import RESOLVED_FULL, grade_patch
from swerl.stages.common import run_async, sandbox_provider
from swerl.stages.curate import content_key, run_curate
from swerl.stages.runner import run_stage
from swerl.storage import Store
from swerl.tracking import Tracker

CACHE = Path.home() / ".cache" / "swerl-test-sdists"
PROJECTS = {
    # name: (version, extra test requirements)
    "itsdangerous": ("2.2.0", ["freezegun"]),
    "toolz": ("1.0.0", []),
}


def sdist(package: str, version: str) -> Path:
    """The sdist, downloaded once into the cache."""
    return fetch_sdist(package, version, CACHE)


@pytest.mark.slow
@pytest.mark.network
def test_curate_two_real_pypi_projects(tmp_path: Path):
    cfg = CurateConfig(
        repos=[
            RepoSource(path=str(sdist(name, version)), name=name, install=install)
            for name, (version, install) in PROJECTS.items()
        ],
        max_candidates_per_repo=12,
        validation_workers=2,
        decontaminate=False,
    )
    store = Store(str(tmp_path / "store"))
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "curate-pypi")
    t0 = time.monotonic()
    outcome = run_stage(
        "curate", run_curate, cfg, store=store, tracker=tracker, parent=None, seed=0, content=content_key(cfg)
    )
    wall_s = time.monotonic() - t0
    prefix = f"stages/curate/{outcome.manifest.key}/{outcome.manifest.attempt}"
    report = json.loads(store.read_bytes(f"{prefix}/curate_report.json"))
    tasks = tasks_from_parquet(store.read_bytes(f"{prefix}/train.parquet"))
    figures = {"wall_s": round(wall_s, 1)}
    for name in PROJECTS:
        repo = report["synthesis"]["by_repo"][name]
        mine = [t for t in tasks if t.repo == f"local/{name}"]
        provider = sandbox_provider(cfg.sandbox.model_copy(update={"python": repo["environment"]["python"]}))
        gold = bug_unresolved = 0
        for task in mine:
            # The reference fix of a bug-kind task: its patch reversed, graded over the bug like any attempt.
            gold += run_async(grade_patch(provider, task, reverse_patch(task.patch), 120)).status == RESOLVED_FULL
            bug_unresolved += run_async(grade_patch(provider, task, "", 120)).status != RESOLVED_FULL
        figures[name] = {
            "candidates": sum(repo["candidates"].values()),
            "valid": len(mine),
            "gold_resolved": gold,
            "bug_unresolved": bug_unresolved,
            "curate_s": repo["duration_s"],
            "clean_passing": repo["clean_passing"],
            "skipped_tests": repo["skipped_tests"],
            "dropped_ids": repo["dropped_ids"],
            "rejections": repo["rejections"],
        }
        assert repo["skipped"] is None, repo
        assert mine, repo
        assert gold >= 0.9 * len(mine) and bug_unresolved == len(mine), figures
    print(json.dumps(figures, indent=2))


@pytest.mark.network
def test_an_sdist_is_downloaded_once_and_found_as_the_index_spells_it(tmp_path: Path) -> None:
    first = fetch_sdist("toolz", "1.0.0", tmp_path)
    assert first.name == "toolz-1.0.0.tar.gz" and first.stat().st_size > 10_000
    stamp = first.stat().st_mtime_ns
    assert fetch_sdist("TOOLZ", "1.0.0", tmp_path) == first and first.stat().st_mtime_ns == stamp
