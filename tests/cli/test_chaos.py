"""Smoke run of benchmarks/chaos.py: a few faults of every kind against a short async GRPO stage (its store on a
real SeaweedFS S3 server that the faults restart), then the books.

Tiny settings (3 steps, up to 15 faults); the full run (>= 200 faults) and its figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.chaos import main


@pytest.mark.slow
def test_chaos_smoke_loses_nothing_and_trains_nothing_twice(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    assert (
        main(
            [
                "--steps",
                "3",
                "--faults",
                "15",
                "--interval-s",
                "0.5",
                "--kill-every-s",
                "12",
                "--root",
                str(tmp_path / "work"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    summary = json.loads(out.read_text())["summary"]
    assert summary["finished"], summary
    assert summary["faults_total"] >= 1, summary
    assert summary["trajectories_lost"] == 0 and summary["groups_trained_twice"] == 0, summary
    assert summary["infra_errors_in_loss"] == 0 and not summary["steps_without_b_groups"], summary
    # the trainer's account was there to audit: every step's scored attempts, each found in the journal
    assert summary["scored_attempts"] > 0 and summary["scored_not_in_journal"] == 0, summary
    assert summary["trainer_crashes"] == 0, summary
