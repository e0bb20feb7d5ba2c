"""Synthesis on a real project: the toolz sdist from PyPI (flat layout, its tests inside the package)."""

from __future__ import annotations

import asyncio
import tarfile
from pathlib import Path

import pytest

from swerl.data.bugs import MODIFIERS
from swerl.data.repoenv import fetch_sdist
from swerl.data.repos import directory_repo
from swerl.data.synth import synthesize_repo
from tests.sandbox_helpers import local_provider

PACKAGE, VERSION = "toolz", "1.0.0"
CACHE = Path.home() / ".cache" / "swerl-test-sdists"


def sdist() -> Path:
    """The sdist, downloaded once into the cache."""
    return fetch_sdist(PACKAGE, VERSION, CACHE)


@pytest.mark.network
def test_synthesize_from_a_real_pypi_project(tmp_path: Path):
    with tarfile.open(sdist()) as tar:
        tar.extractall(tmp_path, filter="data")
    spec = directory_repo(tmp_path / f"{PACKAGE}-{VERSION}")
    provider = local_provider()
    tasks, report = asyncio.run(
        synthesize_repo(
            spec,
            provider,
            modifiers=list(MODIFIERS),
            max_candidates=6,
            max_tasks=100,
            seed=0,
            workers=2,
            test_timeout_s=120,
            clean_runs=1,
            bugged_timeout_factor=5.0,
            min_bugged_timeout_s=10.0,
        )
    )
    assert report.skipped is None and report.clean_passing >= 100
    assert len(tasks) >= 1, report.to_dict()
    for task in tasks:
        assert task.FAIL_TO_PASS and task.PASS_TO_PASS
        assert all("toolz/tests/" in t for t in task.FAIL_TO_PASS)
