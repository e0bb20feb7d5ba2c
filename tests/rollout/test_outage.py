"""Infrastructure outages are not "nothing to train" (swerl.rollout.step.StepGuard, both loops): a batch that
infrastructure errors emptied is waited out with a backoff and sampled again, within grpo.schedule's outage
budget; only policy-side emptiness counts towards max_empty_steps.

Time here is an injected clock (the guard's waits advance it, nothing sleeps): the engine double is unreachable
until the clock reaches its recovery time, so what the loops train does not depend on the machine's speed.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any, cast

import pytest

from swerl.engine.base import Engine
from swerl.rollout.async_loop import AsyncSettings, train_async
from swerl.rollout.journal import Ledger, RolloutJournal
from swerl.rollout.manager import RolloutManager
from swerl.rollout.staleness import StalenessPolicy
from swerl.rollout.step import (
    InfraOutage,
    NothingTrainable,
    OutageRule,
    StepGuard,
    emptied_by_infra,
    trainable,
)
from swerl.rollout.sync_loop import SyncProgress, SyncSettings, train_sync
from swerl.trajectory import EpisodeStatus, Trajectory
from tests.doubles import CountingTrainer, VersionEngine

RULE = OutageRule(budget_s=30.0, first_wait_s=1.0, max_wait_s=8.0, factor=2.0)


class FakeClock:
    """An outage clock whose sleeps only advance it (and let other tasks run once)."""

    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds
        await asyncio.sleep(0)


class RecoveringEngine(VersionEngine):
    """An engine unreachable until `clock` reaches `back_at` (math.inf: never back); a policy that resolves odd
    attempts, or only emits malformed output."""

    def __init__(self, clock: FakeClock, back_at: float, malformed: bool = False) -> None:
        super().__init__()
        self.clock, self.back_at, self.malformed = clock, back_at, malformed
        self.refused = 0

    def attempt(self, task: int, attempt: int, group_id: str) -> Trajectory:
        if self.clock.now() < self.back_at:
            self.refused += 1
            return make(task, attempt, group_id, None, EpisodeStatus.INFRA_ERROR, "engine_unreachable")
        if self.malformed:
            return make(task, attempt, group_id, 0.0, EpisodeStatus.MALFORMED)
        reward = float(attempt % 2)
        return make(task, attempt, group_id, reward, EpisodeStatus.RESOLVED if reward else EpisodeStatus.UNRESOLVED)


def make(
    task: int, attempt: int, group_id: str, reward: float | None, status: EpisodeStatus, cause: str | None = None
) -> Trajectory:
    return Trajectory(
        task_id=str(task),
        attempt=attempt,
        group_id=group_id,
        status=status,
        reward=reward,
        prompt_tokens=1,
        token_ids=[5, 5],
        loss_mask=[0, 1],
        behaviour_logprobs=[0.0, -0.5],
        token_weight_versions=[-1, 0],
        infra_cause=cause,
    )


async def episode(engine: Any, task: int, *, attempt: int, group_id: str) -> Trajectory:
    await asyncio.sleep(0)
    return engine.attempt(task, attempt, group_id)


def trained_tasks(trainer: CountingTrainer) -> list[list[list[tuple[str, float | None]]]]:
    return [[[(t.task_id, t.reward) for t in group] for group in batch] for batch in trainer.trained]


# ----------------------------------------------------------------------------------------------------------------
# The rule


def test_the_guard_tells_outage_batches_from_policy_side_ones_and_counts_only_the_latter() -> None:
    infra = make(0, 0, "g", None, EpisodeStatus.INFRA_ERROR, "engine_unreachable")
    bad = make(0, 1, "g", 0.0, EpisodeStatus.MALFORMED)
    good = make(0, 1, "g", 1.0, EpisodeStatus.RESOLVED)
    assert emptied_by_infra([infra, bad]) and emptied_by_infra([infra, infra])
    assert not emptied_by_infra([bad]) and not emptied_by_infra([infra]) and not emptied_by_infra([bad, good])
    clock = FakeClock()
    guard = StepGuard("grpo", 5, max_empty_steps=2, deadline=None, outage=RULE, clock=clock)

    async def judge(*groups: list[Trajectory]) -> Any:
        return await guard.empty_batch(list(groups), 0, "here")

    policy = asyncio.run(judge([bad]))
    assert policy is not None and not policy.outage and guard.empty_in_a_row == 1
    # A batch with a policy-side empty group and an infra-emptied one is an outage: waited out, not counted.
    mixed = asyncio.run(judge([bad], [infra, bad]))
    assert mixed is not None and mixed.outage and guard.empty_in_a_row == 1 and clock.slept == [1.0]
    assert asyncio.run(judge([infra, infra])).outage and clock.slept == [1.0, 2.0]
    assert guard.outage_causes == {"engine_unreachable": 3}
    # A policy-side empty batch ends the outage (the next one starts from the first wait again)...
    with pytest.raises(NothingTrainable, match=r"2 batches in a row .*max_empty_steps = 2"):
        asyncio.run(judge([bad]))
    assert guard.outage_batches == 0
    # ...and a trainable batch resets both counts.
    assert asyncio.run(judge([bad, good])) is None and guard.empty_in_a_row == 0
    assert asyncio.run(judge([infra, bad])).outage and clock.slept[-1] == 1.0
    assert guard.stats() == {"infra_outage/waits": 3.0, "infra_outage/waited_s": 4.0}
    # never past the stage's time budget: with it spent, the wait is none (the loop then ends at its budget check)
    spent = StepGuard("grpo", 5, 2, deadline=time.monotonic() - 1.0, outage=RULE, clock=(late := FakeClock()))
    waited = asyncio.run(spent.empty_batch([[infra, infra]], 0, "here"))
    assert waited is not None and waited.outage and late.slept == [0.0]


def test_the_backoff_grows_to_its_cap_and_the_config_names_every_limit() -> None:
    assert [RULE.wait(i) for i in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert OutageRule(10, 3, 3, 1).wait(100) == 3 and OutageRule(10, 1, 60, 10).wait(10_000) == 60
    from swerl.config import ConfigError, load_config
    from swerl.stages.grpo_async import outage_rule

    cfg = load_config(None, ["grpo.schedule.infra_outage_budget_s=120", "grpo.schedule.infra_backoff_max_s=5"])
    assert outage_rule(cfg.grpo.schedule) == OutageRule(120.0, 1.0, 5.0, 2.0)
    for bad in [
        "grpo.schedule.infra_outage_budget_s=0",
        "grpo.schedule.infra_backoff_first_s=0",
        "grpo.schedule.infra_backoff_factor=0.5",
        "grpo.schedule.infra_backoff_max_s=0.5",  # below the first wait
    ]:
        with pytest.raises(ConfigError, match="infra_"):
            load_config(None, [bad])


# ----------------------------------------------------------------------------------------------------------------
# The synchronous loop


def run_sync(
    engine: RecoveringEngine, steps: int, export_dir: Path, attempts: int = 2
) -> tuple[CountingTrainer, SyncProgress, list]:
    trainer, progress, outcomes = CountingTrainer(), SyncProgress(), []
    settings = SyncSettings(
        steps=steps,
        tasks_per_step=2,
        attempts_per_task=attempts,
        concurrency=4,
        checkpoint_every=0,
        deadline=None,
        max_empty_steps=3,
        outage=RULE,
    )

    async def run() -> None:
        async for outcome in train_sync(
            trainer,
            engine,  # type: ignore[arg-type]
            list(range(10)),
            episode,
            settings,
            export_dir=export_dir,
            progress=progress,
            clock=engine.clock,
        ):
            outcomes.append(outcome)

    asyncio.run(run())
    return trainer, progress, outcomes


def test_sync_waits_out_an_engine_outage_and_trains_the_same_steps_as_undisturbed(
    tmp_path: Path,
) -> None:
    calm = RecoveringEngine(FakeClock(), back_at=0.0)
    undisturbed, calm_progress, _ = run_sync(calm, steps=3, export_dir=tmp_path)
    clock = FakeClock()
    engine = RecoveringEngine(clock, back_at=10.0)  # down for the first 10 s of the clock
    disturbed, progress, outcomes = run_sync(engine, steps=3, export_dir=tmp_path)
    assert engine.refused == 4 * 4  # four batches of 2 tasks x 2 attempts met the outage
    assert clock.slept == [1.0, 2.0, 4.0, 8.0]  # waited until the clock passed 10 s
    assert disturbed.step == undisturbed.step == 3 and progress.skipped_batches == calm_progress.skipped_batches == 0
    # the same tasks, attempts and group ids at every step: the outage only delayed them
    assert trained_tasks(disturbed) == trained_tasks(undisturbed)
    assert [[t.group_id for g in b for t in g] for b in disturbed.trained] == [
        [t.group_id for g in b for t in g] for b in undisturbed.trained
    ]
    assert outcomes[0].stats["infra_outage/waits"] == 4.0 and outcomes[0].stats["infra_outage/waited_s"] == 15.0


def test_sync_fails_after_the_outage_budget_naming_the_cause(tmp_path: Path) -> None:
    clock = FakeClock()
    engine = RecoveringEngine(clock, back_at=math.inf)
    with pytest.raises(InfraOutage, match=r"infra_outage_budget_s = 30\).*engine_unreachable: 28"):
        run_sync(engine, steps=3, export_dir=tmp_path)
    assert clock.slept == [1.0, 2.0, 4.0, 8.0, 8.0, 7.0] and clock.t == 30.0  # the last wait cut to the budget


def test_sync_policy_that_only_emits_malformed_output_still_ends_after_max_empty_steps(tmp_path: Path) -> None:
    """With one attempt per task a malformed-only policy leaves every group short of a baseline on the policy's side
    (with two or more, its graded attempts are valid: trained, without signal)."""
    clock = FakeClock()
    engine = RecoveringEngine(clock, back_at=0.0, malformed=True)
    with pytest.raises(NothingTrainable, match=r"3 batches in a row .*'malformed': 2"):
        run_sync(engine, steps=3, export_dir=tmp_path, attempts=1)
    assert clock.slept == []


# ----------------------------------------------------------------------------------------------------------------
# The asynchronous loop


def run_async(
    engine: RecoveringEngine, steps: int, export_dir: Path, n_attempts: int = 2, left: list[Any] | None = None
) -> tuple[CountingTrainer, Ledger]:
    """Train `steps` async steps; `left` gets the groups left open or buffered at the end and the data position."""
    trainer, ledger = CountingTrainer(), Ledger()
    settings = AsyncSettings(
        steps=steps,
        tasks_per_step=2,
        max_staleness=100,
        staleness_policy=StalenessPolicy.DROP,
        max_requeues=1,
        dynamic_sampling=False,
        max_extra_groups_per_step=0,
        checkpoint_every=0,
        time_budget_s=None,
        max_empty_steps=3,
        outage=RULE,
    )

    async def run() -> None:
        served = cast(Engine, engine)
        manager = RolloutManager(
            served,
            episode,
            lambda seq: seq,
            n_attempts=n_attempts,
            max_in_flight=n_attempts,  # one group at a time
            max_buffered_groups=1,
            journal=RolloutJournal(None, "x"),
        )
        async for _ in train_async(
            trainer, served, manager, settings, ledger, export_dir=export_dir, clock=engine.clock
        ):
            pass
        if left is not None:
            left.extend([set(manager._open) | {group.seq for group in manager.buffer}, manager.next_seq])

    asyncio.run(run())
    return trainer, ledger


def test_async_waits_out_an_engine_outage_requeues_its_groups_and_trains_every_step(
    tmp_path: Path,
) -> None:
    undisturbed, calm_ledger = run_async(RecoveringEngine(FakeClock(), back_at=0.0), steps=3, export_dir=tmp_path)
    clock = FakeClock()
    engine = RecoveringEngine(clock, back_at=10.0)
    manager_left: list[Any] = []
    disturbed, ledger = run_async(engine, steps=3, export_dir=tmp_path, left=manager_left)
    assert engine.refused > 0 and clock.slept[:4] == [1.0, 2.0, 4.0, 8.0] and clock.t >= 10.0
    assert disturbed.step == undisturbed.step == 3
    # every step had a trainable group (a batch emptied by the outage never reached the trainer; a group the outage
    # emptied beside a trainable one is consumed as before, left out of the loss), none discarded
    assert all(any(trainable(g) for g in batch) for batch in disturbed.trained)
    assert [reason for _, _, reason in ledger.entries] == ["trained"] * 6 == [r for _, _, r in calm_ledger.entries]
    # every group opened is in the ledger once or still to be run (requeued): none skipped, none trained twice
    trained = [seq for seq, _, _ in ledger.entries]
    assert len(set(trained)) == 6 and set(trained) | manager_left[0] == set(range(manager_left[1]))


def test_async_fails_after_the_outage_budget_naming_the_cause(tmp_path: Path) -> None:
    clock = FakeClock()
    engine = RecoveringEngine(clock, back_at=math.inf)
    with pytest.raises(InfraOutage, match=r"infra_outage_budget_s = 30\).*infra_error causes counted: engine_unre"):
        run_async(engine, steps=3, export_dir=tmp_path)
    assert clock.slept == [1.0, 2.0, 4.0, 8.0, 8.0, 7.0] and clock.t == 30.0


def test_async_policy_that_only_emits_malformed_output_still_ends_after_max_empty_steps(tmp_path: Path) -> None:
    clock = FakeClock()
    engine = RecoveringEngine(clock, back_at=0.0, malformed=True)
    with pytest.raises(NothingTrainable, match=r"3 batches in a row .*'malformed': 2"):
        run_async(engine, steps=3, export_dir=tmp_path, n_attempts=1)
    assert clock.slept == []
