"""The synchronous GRPO loop (grpo.mode: sync, the baseline the asynchronous loop is measured against):

    while steps remain and the time budget lasts:
        groups = await rollout_groups(B tasks x n attempts)   # every attempt of the step, then nothing runs
        stats = await train_and_sync(trainer, engine, groups) # update, export, engine.update_weights (version)
        yield StepOutcome(...)                                # the stage logs, evaluates, checkpoints

The tasks of step s are the next B of a seeded order (`step_tasks`): the data position is s x B, so a resumed run
continues exactly where its checkpoint was taken.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from swerl.engine.base import Engine
from swerl.rollout.groups import EpisodeFn, rollout_groups
from swerl.rollout.step import (
    DistributedWeights,
    MonotonicClock,
    OutageClock,
    OutageRule,
    PolicyTrainer,
    StepGuard,
    StepOutcome,
    step_outcome,
    train_and_sync,
)

logger = logging.getLogger(__name__)
TaskT = TypeVar("TaskT")


@dataclass(frozen=True)
class SyncSettings:
    """The synchronous loop's knobs (GRPOConfig maps onto them)."""

    steps: int
    tasks_per_step: int
    attempts_per_task: int
    concurrency: int
    """Episodes running at once."""
    checkpoint_every: int
    deadline: float | None
    """time.monotonic() past which no new step starts (the stage's time budget); None: no budget."""
    max_empty_steps: int = 3
    """Consecutive batches with nothing trainable on the policy's side before NothingTrainable is raised."""
    outage: OutageRule = field(default_factory=OutageRule)
    """How batches emptied by infrastructure errors are waited out (grpo.schedule.infra_*)."""


@dataclass
class SyncProgress:
    """What the loop carries besides trainer.step: batches skipped (nothing trainable; they move the data position
    on without counting as steps; a checkpoint keeps the count) and why each was."""

    skipped_batches: int = 0
    skipped_reasons: list[str] = field(default_factory=list)


def step_tasks(order: Sequence[TaskT], step: int, per_step: int) -> list[TaskT]:
    """The tasks of a step: the next `per_step` of a seeded order, wrapping around (the data position is
    step * per_step, so a resumed run continues exactly where the checkpoint was taken)."""
    start = step * per_step
    return [order[(start + i) % len(order)] for i in range(per_step)]


async def train_sync(
    trainer: PolicyTrainer,
    engine: Engine,
    order: Sequence[TaskT],
    episode: EpisodeFn[TaskT],
    settings: SyncSettings,
    *,
    export_dir: Path,
    progress: SyncProgress | None = None,
    infra_counts: dict[str, int] | None = None,
    weights: DistributedWeights | None = None,
    clock: OutageClock | None = None,
) -> AsyncGenerator[StepOutcome]:
    """Sample, update and sync until trainer.step reaches settings.steps (or the deadline passes), yielding each
    step's outcome (with failures/CAUSE from infra_counts).

    A batch with nothing trainable is not a step: no update, trainer.step stays (StepGuard). Emptied by
    infrastructure errors, it is sampled again at the same data position (the same tasks and group ids) after the
    guard's wait (`clock`: how the wait is timed and slept; monotonic by default), so an outage only delays what is
    trained; empty on the policy's side, the data position moves on (progress.skipped_batches) and
    settings.max_empty_steps of them in a row raise NothingTrainable.
    """
    progress = progress if progress is not None else SyncProgress()
    guard = StepGuard(
        "grpo", settings.steps, settings.max_empty_steps, settings.deadline, settings.outage, clock or MonotonicClock()
    )
    while trainer.step < settings.steps and not guard.budget_spent(trainer.step):
        step_started = time.monotonic()
        position = trainer.step + progress.skipped_batches
        skipped = f"x{progress.skipped_batches}-" if progress.skipped_batches else ""
        tasks = step_tasks(order, position, settings.tasks_per_step)
        groups = await rollout_groups(
            engine,
            tasks,
            settings.attempts_per_task,
            episode,
            settings.concurrency,
            f"s{trainer.step}-{skipped}",
        )
        rollout_s = time.monotonic() - step_started
        empty = await guard.empty_batch(groups, trainer.step, f"at data position {position}")
        if empty is not None:
            if not empty.outage:
                progress.skipped_batches += 1
                progress.skipped_reasons.append(empty.reason)
            continue
        update = await train_and_sync(trainer, engine, groups, export_dir, weights)
        total_s = time.monotonic() - step_started
        stats = (
            update.stats
            | guard.stats()
            | {
                "time_rollout_s": rollout_s,
                "time_weight_sync_s": update.sync_s,
                "time_total_s": total_s,
            }
        )
        yield step_outcome(trainer.step, groups, stats, update, settings, infra_counts)
