"""The synchronous GRPO loop (grpo.mode: sync, the baseline the asynchronous loop is measured against):

    while steps remain:
        groups = await rollout_groups(B tasks x n attempts)   # every attempt of the step, then nothing runs
        stats = await train_and_sync(trainer, engine, groups) # update, export, engine.update_weights (version)
        on_step(stats, groups); checkpoint when due

The tasks of step s are the next B of a seeded order (`step_tasks`): the data position is s x B, so a resumed run
continues exactly where its checkpoint was taken.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from swerl.engine.base import Engine
from swerl.rollout.groups import EpisodeFn, rollout_groups
from swerl.rollout.step import DistributedWeights, PolicyTrainer, train_and_sync
from swerl.trajectory import Trajectory

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
    """Consecutive batches with nothing trainable (every group dropped) before NothingTrainable is raised."""


class NothingTrainable(RuntimeError):
    """Batch after batch had no group to train on (fewer than two valid attempts in every group)."""


@dataclass
class SyncProgress:
    """What the loop carries besides trainer.step: batches skipped (nothing trainable; they move the data position
    on without counting as steps; a checkpoint keeps the count) and how the budget ended the loop."""

    skipped_batches: int = 0
    empty_in_a_row: int = 0
    ended_by_budget: bool = False
    skipped_reasons: list[str] = field(default_factory=list)


def trainable(group: Sequence[Trajectory]) -> bool:
    """Whether a group gives the trainer anything: at least two valid (scored) attempts, its GRPO baseline."""
    return sum(trajectory.reward is not None for trajectory in group) >= 2


def nothing_trainable_reason(groups: Sequence[Sequence[Trajectory]]) -> str:
    """Why a batch had no trainable group: the attempts' statuses and infrastructure causes, counted."""
    counts: dict[str, int] = {}
    for group in groups:
        for trajectory in group:
            cause = trajectory.infra_cause
            name = trajectory.status.value + (f"({cause})" if cause else "")
            counts[name] = counts.get(name, 0) + 1
    return f"{len(groups)} groups, every one with fewer than two valid attempts: statuses {counts}"


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
    on_step: Callable[[dict[str, float], list[list[Trajectory]]], None],
    save: Callable[[], Any],
    progress: SyncProgress | None = None,
    weights: DistributedWeights | None = None,
) -> None:
    """Sample, update and sync until trainer.step reaches settings.steps (or the deadline passes).

    A batch whose groups were all dropped is not a step: no update, trainer.step stays, the data position moves
    on (progress.skipped_batches); settings.max_empty_steps of them in a row raise NothingTrainable.
    """
    progress = progress if progress is not None else SyncProgress()
    while trainer.step < settings.steps:
        if settings.deadline is not None and time.monotonic() > settings.deadline:
            progress.ended_by_budget = True
            logger.warning(
                "grpo: the time budget ended the stage at step %d of %d", trainer.step, settings.steps
            )
            break
        step_started = time.monotonic()
        position = trainer.step + progress.skipped_batches
        batch = step_tasks(order, position, settings.tasks_per_step)
        prefix = (
            f"s{trainer.step}-"
            if not progress.skipped_batches
            else f"s{trainer.step}-x{progress.skipped_batches}-"
        )
        groups = await rollout_groups(engine, batch, settings.attempts_per_task, episode, settings.concurrency,
                                      group_prefix=prefix)  # fmt: skip
        rollout_s = time.monotonic() - step_started
        if not any(trainable(group) for group in groups):
            reason = nothing_trainable_reason(groups)
            progress.skipped_batches += 1
            progress.empty_in_a_row += 1
            progress.skipped_reasons.append(reason)
            logger.warning("grpo: nothing trainable in the batch at data position %d (%s): not a step (%d in a "
                           "row, at most %d)", position, reason, progress.empty_in_a_row,
                           settings.max_empty_steps)  # fmt: skip
            if progress.empty_in_a_row >= settings.max_empty_steps:
                raise NothingTrainable(
                    f"grpo: {progress.empty_in_a_row} batches in a row had nothing to train on (grpo.schedule."
                    f"max_empty_steps = {settings.max_empty_steps}) at step {trainer.step} of {settings.steps}; "
                    f"the last: {reason}"
                )
            continue
        progress.empty_in_a_row = 0
        outcome = await train_and_sync(trainer, engine, groups, export_dir, weights)
        stats = outcome.stats | {
            "time_rollout_s": rollout_s,
            "time_weight_sync_s": outcome.sync_s,
            "time_total_s": time.monotonic() - step_started,
        }
        on_step(stats, groups)
        due = settings.checkpoint_every > 0 and trainer.step % settings.checkpoint_every == 0
        if due and trainer.step < settings.steps:
            save()
