"""One GRPO step after sampling, the same in both loops: the update on finished groups, then the new weights to
the engine under the step's version (the synchronous loop between rollouts, the asynchronous one while rollouts
continue)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

from swerl.engine.base import Engine
from swerl.engine.weight_sync import SyncStats, TensorSpec, plan_buckets, update_engine_from_distributed
from swerl.services import free_port
from swerl.trajectory import Trajectory

logger = logging.getLogger(__name__)


class PolicyTrainer(Protocol):
    """What the GRPO loops need of a trainer (swerl.train: GRPOTrainer, or a TrainerProcess serving one)."""

    step: int
    """Updates done so far: the version of the weights they produced."""

    def train_step(self, groups: Sequence[Sequence[Trajectory]]) -> dict[str, float]: ...

    def scored_attempts(self) -> list[tuple[str, int]]:
        """(group_id, attempt) of the trajectories the last train_step scored: in a baseline and the loss."""
        ...

    def export_weights(self, out_dir: str | Path, version: int | None = None) -> Path: ...


class BroadcastingTrainer(PolicyTrainer, Protocol):
    """A trainer that can also send its weights over a process group (engine.weight_sync.method: distributed)."""

    def weight_specs(self, dtype: str) -> list[TensorSpec]: ...

    def open_weight_group(
        self, master_addr: str, master_port: int, world_size: int, backend: str, timeout_s: float, group_name: str,
        socket_ifname: str | None,
    ) -> None: ...  # fmt: skip

    def broadcast_weights(self, names: Sequence[str], dtype: str) -> int: ...


@dataclass
class DistributedWeights:
    """New weights to the engines over a process group instead of disk: trainer rank 0 is rank 0 of a group every
    engine rank joins (SGLang's init_weights_update_group), then each sync sends the planned buckets in order
    (update_weights_from_distributed per bucket inside one begin/end session; the last carries the version).

    The group is formed at the first sync: the engines' rank count is asked then (a router: its live engines), the
    port is master_port or a free one, and the trainer's rank 0 and the engines join at once (each waits for the
    others). A failed sync leaves the group closed on both sides; the next sync forms a new one.
    """

    master_addr: str
    master_port: int
    backend: str
    group_name: str
    bucket_bytes: int
    dtype: str
    """The dtype the weights travel and load in (the engines')."""
    timeout_s: float
    socket_ifname: str | None = None
    _buckets: list[list[TensorSpec]] | None = None

    async def _open(self, trainer: BroadcastingTrainer, engine: Engine) -> list[list[TensorSpec]]:
        world_size = 1 + await engine.weight_group_ranks()
        port = self.master_port or free_port(self.master_addr)
        logger.info("weight sync: forming %s (%d ranks, %s) at %s:%d", self.group_name, world_size, self.backend,
                    self.master_addr, port)  # fmt: skip
        await asyncio.gather(
            asyncio.to_thread(trainer.open_weight_group, self.master_addr, port, world_size, self.backend,
                              self.timeout_s, self.group_name, self.socket_ifname),
            engine.init_weights_update_group(self.master_addr, port, 1, world_size, self.group_name, self.backend),
        )  # fmt: skip
        specs = await asyncio.to_thread(trainer.weight_specs, self.dtype)
        return plan_buckets(specs, self.bucket_bytes)

    async def sync(self, trainer: BroadcastingTrainer, engine: Engine, version: int) -> SyncStats:
        """One sync of the trainer's current weights as `version`; its seconds, bytes, buckets and tensors."""
        started = time.perf_counter()
        if self._buckets is None:
            self._buckets = await self._open(trainer, engine)
        buckets = self._buckets
        sent = 0

        async def send(index: int) -> None:
            nonlocal sent
            sent += await asyncio.to_thread(
                trainer.broadcast_weights, [spec.name for spec in buckets[index]], self.dtype
            )

        try:
            await update_engine_from_distributed(engine, buckets, self.group_name, version, True, send)
        except BaseException:
            self._buckets = None  # formed again at the next sync
            raise
        tensors = sum(len(bucket) for bucket in buckets)
        return SyncStats(time.perf_counter() - started, sent, len(buckets), tensors)


@dataclass(frozen=True)
class StepOutcome:
    """The trainer's statistics of one update, where its weights went, and how long the two parts took."""

    stats: dict[str, float]
    scored: list[tuple[str, int]]
    """(group_id, attempt) of the trajectories the update put in a baseline and the loss (the trainer's word)."""
    export: Path | None
    """The exported HF folder (disk sync); None when the weights went over a process group."""
    update_s: float
    """Wall-clock seconds of train_step."""
    sync_s: float
    """Wall-clock seconds of the export and the engine's load (or of the process-group sync)."""


def _train_step(
    trainer: PolicyTrainer, groups: Sequence[Sequence[Trajectory]]
) -> tuple[dict[str, float], list[tuple[str, int]]]:
    """The update and the trainer's account of what it scored, in one hop off the event loop."""
    return trainer.train_step(groups), trainer.scored_attempts()


async def train_and_sync(
    trainer: PolicyTrainer,
    engine: Engine,
    groups: Sequence[Sequence[Trajectory]],
    export_dir: Path,
    weights: DistributedWeights | None = None,
) -> StepOutcome:
    """Update on `groups` in a thread (the event loop keeps serving episodes), then the new weights to the engine:
    exported and loaded from disk, or over the weight group when `weights` is given. The step's stats gain
    weight_sync/seconds and weight_sync/bytes (and buckets, tensors, GB/s over a group)."""
    update_started = time.monotonic()
    stats, scored = await asyncio.to_thread(_train_step, trainer, groups)
    update_s = time.monotonic() - update_started
    sync_started = time.monotonic()
    export: Path | None = None
    if weights is None:
        export = await asyncio.to_thread(trainer.export_weights, export_dir)
        await engine.update_weights_from_disk(str(export), trainer.step)
        size = sum(path.stat().st_size for path in export.iterdir() if path.suffix == ".safetensors")
        stats = stats | {
            "weight_sync/seconds": time.monotonic() - sync_started,
            "weight_sync/bytes": float(size),
        }
    else:
        synced = await weights.sync(cast(BroadcastingTrainer, trainer), engine, trainer.step)
        stats = stats | synced.metrics()
    return StepOutcome(stats, scored, export, update_s, time.monotonic() - sync_started)
