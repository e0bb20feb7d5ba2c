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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from swerl.engine.base import Engine
from swerl.rollout.groups import EpisodeFn, rollout_groups
from swerl.rollout.step import PolicyTrainer, train_and_sync
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
) -> None:
    """Sample, update and sync until trainer.step reaches settings.steps (or the deadline passes)."""
    while trainer.step < settings.steps:
        if settings.deadline is not None and time.monotonic() > settings.deadline:
            logger.info("grpo: time budget spent after %d steps", trainer.step)
            break
        step_started = time.monotonic()
        batch = step_tasks(order, trainer.step, settings.tasks_per_step)
        groups = await rollout_groups(engine, batch, settings.attempts_per_task, episode, settings.concurrency,
                                      group_prefix=f"s{trainer.step}-")  # fmt: skip
        rollout_s = time.monotonic() - step_started
        outcome = await train_and_sync(trainer, engine, groups, export_dir)
        stats = outcome.stats | {
            "time_rollout_s": rollout_s,
            "time_weight_sync_s": outcome.sync_s,
            "time_total_s": time.monotonic() - step_started,
        }
        on_step(stats, groups)
        due = settings.checkpoint_every > 0 and trainer.step % settings.checkpoint_every == 0
        if due and trainer.step < settings.steps:
            save()
