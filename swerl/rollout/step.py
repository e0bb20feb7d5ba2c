"""One GRPO step after sampling, the same in both loops: the update on finished groups, then the new weights to
the engine under the step's version (the synchronous loop between rollouts, the asynchronous one while rollouts
continue); the rule both loops stop or skip a batch by (StepGuard); what each loop yields per step (StepOutcome)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, cast

from swerl.engine.base import Engine
from swerl.engine.weight_sync import SyncStats, TensorSpec, plan_buckets, update_engine_from_distributed
from swerl.rollout.journal import FinishedGroup
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
        self,
        master_addr: str,
        master_port: int,
        world_size: int,
        backend: str,
        timeout_s: float,
        group_name: str,
        socket_ifname: str | None,
    ) -> None: ...

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
        logger.info(
            "weight sync: forming %s (%d ranks, %s) at %s:%d",
            self.group_name,
            world_size,
            self.backend,
            self.master_addr,
            port,
        )
        await asyncio.gather(
            asyncio.to_thread(
                trainer.open_weight_group,
                self.master_addr,
                port,
                world_size,
                self.backend,
                self.timeout_s,
                self.group_name,
                self.socket_ifname,
            ),
            engine.init_weights_update_group(self.master_addr, port, 1, world_size, self.group_name, self.backend),
        )
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
class UpdateOutcome:
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
) -> UpdateOutcome:
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
    return UpdateOutcome(stats, scored, export, update_s, time.monotonic() - sync_started)


class NothingTrainable(RuntimeError):
    """Batch after batch had no group to train on (fewer than two valid attempts in every group) on the policy's
    side: no group of theirs was emptied by infrastructure errors."""


class InfraOutage(RuntimeError):
    """Batches emptied by infrastructure errors kept coming for longer than the outage budget."""


def trainable(group: Sequence[Trajectory]) -> bool:
    """Whether a group gives the trainer anything: at least two valid (scored) attempts, its GRPO baseline."""
    return sum(trajectory.reward is not None for trajectory in group) >= 2


def emptied_by_infra(group: Sequence[Trajectory]) -> bool:
    """Whether infrastructure errors made a group untrainable: it has fewer than two valid attempts, and would have
    had two had its infra_error attempts been scored (a group of one attempt stays the policy's side)."""
    infra = sum(trajectory.infra_cause is not None for trajectory in group)
    return infra > 0 and not trainable(group) and len(group) >= 2


def nothing_trainable_reason(groups: Sequence[Sequence[Trajectory]]) -> str:
    """Why a batch had no trainable group: the attempts' statuses and infrastructure causes, counted."""
    counts: dict[str, int] = {}
    for group in groups:
        for trajectory in group:
            cause = trajectory.infra_cause
            name = trajectory.status.value + (f"({cause})" if cause else "")
            counts[name] = counts.get(name, 0) + 1
    return f"{len(groups)} groups, every one with fewer than two valid attempts: statuses {counts}"


class OutageClock(Protocol):
    """The clock an outage is timed and waited out by (monotonic seconds and asyncio.sleep; tests inject one)."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """time.monotonic and asyncio.sleep."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass(frozen=True)
class OutageRule:
    """How long the loops wait out batches emptied by infrastructure errors (grpo.schedule.infra_*)."""

    budget_s: float = 900.0
    """An outage (from its first infra-emptied batch) lasting this long fails the stage (InfraOutage)."""
    first_wait_s: float = 1.0
    max_wait_s: float = 60.0
    factor: float = 2.0

    def wait(self, index: int) -> float:
        """The wait after the outage's `index`-th infra-emptied batch (0: its first)."""
        return min(self.max_wait_s, self.first_wait_s * self.factor ** min(index, 64))


@dataclass(frozen=True)
class EmptyBatch:
    """A batch with nothing trainable: why, and whether infrastructure emptied it (an outage, waited out)."""

    reason: str
    outage: bool


@dataclass
class StepGuard:
    """The one rule both loops stop and skip by: no step starts once the time budget is spent, and a batch with
    nothing trainable is not a step.

    Such a batch is an outage batch when some group of it was emptied by infrastructure errors (emptied_by_infra:
    an engine restarting, sandboxes failing to start): the guard waits (exponential backoff, OutageRule) and the
    loop samples the same data again (sync: the same data position; async: those groups requeued), so an outage
    only delays what is trained; InfraOutage, naming the infra_error causes counted, once the outage has lasted
    outage.budget_s. Otherwise it is empty on the policy's side (every group short of two valid attempts for the
    policy's reasons, none for infrastructure's): max_empty_steps of those in a row raise NothingTrainable. An
    outage batch neither counts towards nor resets that count; a policy-side empty batch ends an outage (the
    infrastructure served it); a trainable batch resets both.
    """

    name: str
    """How the loop names itself in what it logs and raises: grpo (sync) or grpo async."""
    steps: int
    max_empty_steps: int
    deadline: float | None
    """time.monotonic() from which no new step starts; None: no time budget."""
    outage: OutageRule = field(default_factory=OutageRule)
    clock: OutageClock = field(default_factory=MonotonicClock)
    empty_in_a_row: int = 0
    outage_batches: int = 0
    """Infra-emptied batches in the current outage (0: none going on)."""
    outage_started: float | None = None
    outage_causes: dict[str, int] = field(default_factory=dict)
    """infra_error causes counted over the current outage's batches."""
    waited_s: float = 0.0
    """Seconds waited out in outages since the loop started."""
    waits: int = 0

    def budget_spent(self, step: int) -> bool:
        """Whether the time budget is spent (said as a warning): the loop ends at `step`."""
        if self.deadline is None or time.monotonic() < self.deadline:
            return False
        logger.warning("%s: the time budget ended the stage at step %d of %d", self.name, step, self.steps)
        return True

    async def empty_batch(self, groups: Sequence[Sequence[Trajectory]], step: int, where: str) -> EmptyBatch | None:
        """None when some group of the batch is trainable (both counts start again). Else why not (a warning
        naming the batch by `where`): an outage batch after its wait (InfraOutage once the budget is spent), or a
        policy-side one (NothingTrainable once max_empty_steps are in a row)."""
        if any(trainable(group) for group in groups):
            self.empty_in_a_row = 0
            self._end_outage()
            return None
        reason = nothing_trainable_reason(groups)
        if any(emptied_by_infra(group) for group in groups):
            await self._wait_out(groups, step, where, reason)
            return EmptyBatch(reason, True)
        self._end_outage()
        self.empty_in_a_row += 1
        logger.warning(
            "%s: nothing trainable in the batch %s (%s): not a step (%d in a row, at most %d)",
            self.name,
            where,
            reason,
            self.empty_in_a_row,
            self.max_empty_steps,
        )
        if self.empty_in_a_row >= self.max_empty_steps:
            raise NothingTrainable(
                f"{self.name}: {self.empty_in_a_row} batches in a row had nothing to train on (grpo.schedule."
                f"max_empty_steps = {self.max_empty_steps}) at step {step} of {self.steps}; the last: {reason}"
            )
        return EmptyBatch(reason, False)

    def _end_outage(self) -> None:
        if self.outage_batches:
            logger.warning("%s: the infrastructure is back after %d emptied batches", self.name, self.outage_batches)
        self.outage_batches, self.outage_started, self.outage_causes = 0, None, {}

    async def _wait_out(self, groups: Sequence[Sequence[Trajectory]], step: int, where: str, reason: str) -> None:
        """Count an infra-emptied batch into the outage and wait before the loop samples again; InfraOutage once
        the outage has lasted the budget (the last wait is cut to end at it)."""
        now = self.clock.now()
        if self.outage_started is None:
            self.outage_started = now
        for group in groups:
            for trajectory in group:
                if trajectory.infra_cause is not None:
                    cause = trajectory.infra_cause
                    self.outage_causes[cause] = self.outage_causes.get(cause, 0) + 1
        elapsed = now - self.outage_started
        causes = ", ".join(f"{cause}: {count}" for cause, count in sorted(self.outage_causes.items()))
        if elapsed >= self.outage.budget_s:
            raise InfraOutage(
                f"{self.name}: infrastructure errors emptied every batch for {elapsed:.0f} s ({self.outage_batches + 1}"
                f" batches, grpo.schedule.infra_outage_budget_s = {self.outage.budget_s:g}) at step {step} of "
                f"{self.steps}; infra_error causes counted: {causes}; the last batch: {reason}"
            )
        wait = min(self.outage.wait(self.outage_batches), self.outage.budget_s - elapsed)
        if self.deadline is not None:  # never waits past the stage's time budget (the loop then ends there)
            wait = max(0.0, min(wait, self.deadline - time.monotonic()))
        self.outage_batches += 1
        logger.warning(
            "%s: infrastructure errors emptied the batch %s (%s): not a step; waiting %.1f s before sampling it "
            "again (outage batch %d, %.0f s of %g s; causes %s)",
            self.name,
            where,
            reason,
            wait,
            self.outage_batches,
            elapsed,
            self.outage.budget_s,
            causes,
        )
        await self.clock.sleep(wait)
        self.waited_s += wait
        self.waits += 1

    def stats(self) -> dict[str, float]:
        """What the guard adds to a step's statistics: outage waits since the loop started."""
        return {"infra_outage/waits": float(self.waits), "infra_outage/waited_s": self.waited_s}


@dataclass(frozen=True)
class StepOutcome:
    """One trained step, as both loops yield it to the stage (which logs it, evaluates and checkpoints)."""

    step: int
    """trainer.step after the update: the version of the weights it produced."""
    groups: list[list[Trajectory]]
    """The groups the update was given."""
    stats: dict[str, float]
    """The trainer's statistics, the loop's (timings, weight sync, ...) and the infrastructure failures so far."""
    export: Path | None
    """The exported weights the engine loaded (None when they went over a process group)."""
    checkpoint_due: bool
    """Every checkpoint_every steps, the last step excepted (the stage saves its final state at its end)."""
    taken: list[FinishedGroup] = field(default_factory=list)
    """Async: every group the step took from the buffer, the discarded ones included."""
    discarded: int = 0
    """Async: how many of the taken groups were discarded (stale, no signal, probe-stopped)."""


class LoopSettings(Protocol):
    """What step_outcome needs of a loop's settings (SyncSettings, AsyncSettings)."""

    @property
    def steps(self) -> int: ...

    @property
    def checkpoint_every(self) -> int: ...


def step_outcome(
    step: int,
    groups: list[list[Trajectory]],
    stats: dict[str, float],
    update: UpdateOutcome,
    settings: LoopSettings,
    infra_counts: dict[str, int] | None,
    taken: list[FinishedGroup] | None = None,
    discarded: int = 0,
) -> StepOutcome:
    """A loop's StepOutcome: its stats with the infrastructure-failure counts so far (failures/CAUSE)."""
    stats = stats | {f"failures/{k}": float(v) for k, v in (infra_counts or {}).items()}
    every = settings.checkpoint_every
    due = every > 0 and step % every == 0 and step < settings.steps
    return StepOutcome(step, groups, stats, update.export, due, taken or [], discarded)
