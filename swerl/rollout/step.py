"""One GRPO step after sampling, the same in both loops: the update on finished groups, then the new weights to
the engine under the step's version (the synchronous loop between rollouts, the asynchronous one while rollouts
continue)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from swerl.engine.base import Engine
from swerl.trajectory import Trajectory


class PolicyTrainer(Protocol):
    """What the GRPO loops need of a trainer (swerl.train: GRPOTrainer, or a TrainerProcess serving one)."""

    step: int
    """Updates done so far: the version of the weights they produced."""

    def train_step(self, groups: Sequence[Sequence[Trajectory]]) -> dict[str, float]: ...

    def scored_attempts(self) -> list[tuple[str, int]]:
        """(group_id, attempt) of the trajectories the last train_step scored: in a baseline and the loss."""
        ...

    def export_weights(self, out_dir: str | Path, version: int | None = None) -> Path: ...


@dataclass(frozen=True)
class StepOutcome:
    """The trainer's statistics of one update, where its weights went, and how long the two parts took."""

    stats: dict[str, float]
    scored: list[tuple[str, int]]
    """(group_id, attempt) of the trajectories the update put in a baseline and the loss (the trainer's word)."""
    export: Path
    update_s: float
    """Wall-clock seconds of train_step."""
    sync_s: float
    """Wall-clock seconds of the export and the engine's load."""


def _train_step(
    trainer: PolicyTrainer, groups: Sequence[Sequence[Trajectory]]
) -> tuple[dict[str, float], list[tuple[str, int]]]:
    """The update and the trainer's account of what it scored, in one hop off the event loop."""
    return trainer.train_step(groups), trainer.scored_attempts()


async def train_and_sync(
    trainer: PolicyTrainer, engine: Engine, groups: Sequence[Sequence[Trajectory]], export_dir: Path
) -> StepOutcome:
    """Update on `groups` in a thread (the event loop keeps serving episodes), export, load into the engine."""
    update_started = time.monotonic()
    stats, scored = await asyncio.to_thread(_train_step, trainer, groups)
    update_s = time.monotonic() - update_started
    sync_started = time.monotonic()
    export = await asyncio.to_thread(trainer.export_weights, export_dir)
    await engine.update_weights_from_disk(str(export), trainer.step)
    return StepOutcome(stats, scored, export, update_s, time.monotonic() - sync_started)
