"""The evaluate stage's journal (swerl.stages.evaluate_journal): what it keeps, what it refuses to reuse, and how
evaluate_model takes its attempts from it instead of running them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from swerl.config.agent import AgentConfig
from swerl.config.engine import EngineConfig
from swerl.config.evaluate import EvaluateConfig
from swerl.data.schema import TaskInstance
from swerl.stages import evaluate
from swerl.stages.evaluate import EvaluateStage, evaluate_model
from swerl.stages.evaluate_journal import EvalJournal, identity_digest
from swerl.storage import Store
from swerl.trajectory import EpisodeStatus, Trajectory

IDENTITY = {"model": "sft", "checkpoint": "f" * 64, "config": "c" * 64, "seed": 0}


def trajectory(task: str, attempt: int, reward: float | None = 1.0, status: str = "resolved") -> Trajectory:
    cause = "engine" if status == "infra_error" else None
    return Trajectory(
        task_id=task,
        attempt=attempt,
        group_id=task,
        status=EpisodeStatus(status),
        reward=reward,
        patch="diff",
        infra_cause=cause,
    )


def journal(tmp_path: Path, identity: dict[str, Any] = IDENTITY, ran_by: str = "a1") -> EvalJournal:
    return EvalJournal(Store(f"file://{tmp_path}/store"), "stages/evaluate/KEY/eval_journal/sft", identity, ran_by)


def test_finished_attempts_read_back_with_their_grade_failures_and_runner(tmp_path: Path) -> None:
    j = journal(tmp_path)
    grade = {"task_id": "t/1", "attempt": 0, "reward": 1.0, "status": "RESOLVED_FULL"}
    assert j.record("t/1", 0, trajectory("t/1", 0), grade, {"infra_error.sandbox": 1})
    assert j.record("t/1", 1, trajectory("t/1", 1, 0.0, "unresolved"), None, {})
    assert j.written == 2
    read = journal(tmp_path, ran_by="a2").load([("t/1", 0), ("t/1", 1), ("t/2", 0)])
    assert sorted(read.attempts) == [("t/1", 0), ("t/1", 1)] and not read.damaged and not read.foreign
    first = read.attempts[("t/1", 0)]
    assert first.trajectory == trajectory("t/1", 0) and first.grade == grade
    assert first.failures == {"infra_error.sandbox": 1} and first.ran_by == "a1"
    assert first.identity == identity_digest(IDENTITY)


def test_an_attempt_lost_to_the_infrastructure_is_not_journaled_so_a_rerun_tries_it_again(tmp_path: Path) -> None:
    j = journal(tmp_path)
    assert not j.record("t", 0, trajectory("t", 0, None, "infra_error"), None, {"infra_error.engine": 2})
    assert j.load([("t", 0)]).attempts == {} and j.written == 0


def test_a_truncated_entry_is_skipped_and_its_attempt_runs_again(tmp_path: Path) -> None:
    j = journal(tmp_path)
    j.record("t", 0, trajectory("t", 0), None, {})
    j.record("t", 1, trajectory("t", 1), None, {})
    path = tmp_path / "store" / j.entry_path("t", 1)
    path.write_bytes(path.read_bytes()[:-40])  # killed mid-write
    read = j.load([("t", 0), ("t", 1)])
    assert list(read.attempts) == [("t", 0)]
    assert read.damaged == [j.store.uri(j.entry_path("t", 1))]


@pytest.mark.parametrize("key", ["model", "checkpoint", "config", "seed"])
def test_an_entry_written_under_another_identity_is_never_reused(tmp_path: Path, key: str) -> None:
    journal(tmp_path, IDENTITY | {key: "other"}).record("t", 0, trajectory("t", 0), None, {})
    read = journal(tmp_path).load([("t", 0)])
    assert read.attempts == {} and len(read.foreign) == 1


def test_an_entry_for_an_attempt_not_asked_for_is_not_reused(tmp_path: Path) -> None:
    j = journal(tmp_path)
    j.record("t", 3, trajectory("t", 3), None, {})
    assert j.load([("t", 0)]).attempts == {}
    # an entry copied to another attempt's name does not pass for it
    store = j.store
    store.write_bytes(j.entry_path("t", 0), store.read_bytes(j.entry_path("t", 3)))
    read = j.load([("t", 0), ("t", 3)])
    assert list(read.attempts) == [("t", 3)] and read.foreign == [store.uri(j.entry_path("t", 0))]


def task(instance_id: str) -> TaskInstance:
    return TaskInstance(
        instance_id=instance_id,
        repo="micro/r",
        base_commit="0" * 40,
        problem_statement="fix it",
        patch="--- a/mod.py\n+++ b/mod.py\n@@ -1 +1 @@\n-a\n+b\n",
        patch_kind="bug",
        source="micro",
        image="micro://train/0/0",
        FAIL_TO_PASS=["tests/test_mod.py::test_a"],
        PASS_TO_PASS=[],
    )


def test_evaluate_model_takes_journaled_attempts_and_runs_only_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every attempt journaled no engine starts; otherwise only the missing ones run, results in task order."""
    cfg = EvaluateStage(
        evaluate=EvaluateConfig(attempts=2, grader="episode", temperature=0.0),
        agent=AgentConfig(),
        engine=EngineConfig(),
    )
    tasks = [task("a"), task("b")]
    ran: list[tuple[str, int]] = []

    async def fake_run(path: Path, jobs: list[tuple[TaskInstance, int]], *args: Any) -> list[Trajectory]:
        journal_ = args[-1]
        out = []
        for t, attempt in jobs:
            ran.append((t.instance_id, attempt))
            out.append(trajectory(t.instance_id, attempt, 0.0, "unresolved"))
            journal_.record(t.instance_id, attempt, out[-1], None, {})
        return out

    monkeypatch.setattr(evaluate, "_run_attempts", fake_run)
    j = journal(tmp_path)
    j.record("a", 1, trajectory("a", 1), None, {"infra_error.sandbox": 1})
    counts: dict[str, int] = {}
    trajectories, grades = asyncio.run(evaluate_model(tmp_path, tasks, cfg, 0, counts, j))
    assert sorted(ran) == [("a", 0), ("b", 0), ("b", 1)] and j.reused == 1
    assert [(t.task_id, t.attempt, t.reward) for t in trajectories] == [
        ("a", 0, 0.0),
        ("a", 1, 1.0),
        ("b", 0, 0.0),
        ("b", 1, 0.0),
    ]
    assert counts == {"infra_error.sandbox": 1} and grades == []

    ran.clear()
    again, _ = asyncio.run(evaluate_model(tmp_path, tasks, cfg, 0, {}, journal(tmp_path, ran_by="a3")))
    assert ran == [] and again == trajectories  # everything journaled: nothing runs, no engine opens
