"""The fully asynchronous GRPO loop: rollouts never stop; the trainer takes B finished groups and steps.

    manager.start()                                   # max_in_flight attempts, refilled as they finish
    while steps remain and the time budget lasts:
        batch = await collect_batch(...)              # B usable groups: staleness policy, dynamic sampling
        ledger += batch
        stats = await train_and_sync(...)             # update in a thread: rollouts continue on the event loop;
                                                      # export, engine.update_weights_from_disk(version): in-flight
                                                      # attempts continue
        yield StepOutcome(...)                        # the stage logs, evaluates the export, checkpoints (the
                                                      # ledger with it) when due

Time per step is split into waiting for rollouts, the actor update, log-prob recomputation and weight sync.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swerl.engine.base import Engine
from swerl.rollout.curriculum import has_signal
from swerl.rollout.journal import FinishedGroup, Ledger
from swerl.rollout.longtail import longtail_stats
from swerl.rollout.manager import RolloutManager
from swerl.rollout.staleness import StalenessPolicy, staleness_stats, triage_group
from swerl.rollout.step import (
    DistributedWeights,
    MonotonicClock,
    OutageClock,
    OutageRule,
    PolicyTrainer,
    StepGuard,
    StepOutcome,
    emptied_by_infra,
    step_outcome,
    train_and_sync,
)
from swerl.trajectory import Trajectory

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AsyncSettings:
    """The asynchronous loop's knobs (GRPOConfig maps onto them)."""

    steps: int
    tasks_per_step: int
    max_staleness: int
    staleness_policy: StalenessPolicy
    max_requeues: int
    dynamic_sampling: bool
    max_extra_groups_per_step: int
    checkpoint_every: int
    time_budget_s: float | None
    max_empty_steps: int
    """Consecutive batches with nothing trainable on the policy's side before NothingTrainable is raised."""
    outage: OutageRule = field(default_factory=OutageRule)
    """How batches emptied by infrastructure errors are waited out (grpo.schedule.infra_*)."""


@dataclass
class Batch:
    """What one step took from the buffer."""

    groups: list[list[Trajectory]] = field(default_factory=list)  # to train on (after the staleness policy)
    taken: list[FinishedGroup] = field(default_factory=list)  # every group taken, discarded ones included
    discarded: collections.Counter[str] = field(default_factory=collections.Counter)
    stale_attempts: int = 0
    stale_left_out: int = 0
    requeued: int = 0
    trained_groups: list[FinishedGroup] = field(default_factory=list)  # the taken groups behind `groups`


class BudgetSpent(Exception):
    """The time budget ran out while a batch was being collected (its groups were given back untrained)."""


def give_back(batch: Batch, manager: RolloutManager[Any], ledger: Ledger, step: int) -> int:
    """Undo the 'trained' marks of a batch that will not be trained and return its groups to the buffer's front.

    The groups stay finished and journaled: a resumed run trains them. Discard decisions stay in the ledger.
    Returns how many groups were given back.
    """
    for group in batch.trained_groups:
        ledger.remove(group.seq, step, "trained")
    manager.put_back(batch.trained_groups)
    count = len(batch.trained_groups)
    batch.groups, batch.trained_groups = [], []
    return count


def discard_untrainable(batch: Batch, ledger: Ledger, step: int) -> None:
    """A batch none of whose groups can be trained (each has fewer than two valid attempts) is not a step: its
    groups' 'trained' marks become 'few_valid' discards, and nothing goes to the trainer."""
    for group in batch.trained_groups:
        ledger.remove(group.seq, step, "trained")
        ledger.add(group.seq, step, "few_valid")
        batch.discarded["few_valid"] += 1
    batch.groups, batch.trained_groups = [], []


def requeue_outage(batch: Batch, manager: RolloutManager[Any], ledger: Ledger, step: int) -> None:
    """A batch infrastructure errors emptied (after the guard's wait): its groups emptied by infrastructure lose
    their 'trained' marks and run again under their next generation (manager.requeue; journaled as any group, so
    nothing is skipped and a resumed run finds them); its other groups become 'few_valid' discards."""
    for kept, group in zip(batch.groups, batch.trained_groups, strict=True):
        ledger.remove(group.seq, step, "trained")
        if emptied_by_infra(kept):
            manager.requeue(group)
        else:
            ledger.add(group.seq, step, "few_valid")
            batch.discarded["few_valid"] += 1
    batch.groups, batch.trained_groups = [], []


def set_aside(batch: Batch, outage: bool, manager: RolloutManager[Any], ledger: Ledger, step: int) -> None:
    """A batch with nothing trainable: requeue_outage after an outage's wait, else discard_untrainable."""
    if outage:
        requeue_outage(batch, manager, ledger, step)
    else:
        discard_untrainable(batch, ledger, step)


def no_gradient_reason(trajectories: list[Trajectory]) -> str | None:
    """Why a group cannot contribute a gradient: fewer than two valid attempts, or all equal rewards."""
    rewards = [trajectory.reward for trajectory in trajectories if trajectory.reward is not None]
    if len(rewards) < 2:
        return "few_valid"
    if max(rewards) == min(rewards):
        return "no_signal"
    return None


async def collect_batch(
    manager: RolloutManager[Any],
    version: int,
    settings: AsyncSettings,
    ledger: Ledger,
    deadline: float | None = None,
) -> Batch:
    """Take finished groups until B can be trained on; discarded groups go to the ledger with their reason.

    deadline (time.monotonic()): BudgetSpent if B trainable groups are not in by then; the ones already taken for
    training are given back (give_back), so nothing finished is lost.
    """
    batch = Batch()
    extra = 0
    step = version + 1  # the step these groups are consumed by
    while len(batch.groups) < settings.tasks_per_step:
        try:
            group = await manager.get(deadline)
        except TimeoutError:
            returned = give_back(batch, manager, ledger, step)
            raise BudgetSpent(f"{returned} trainable groups of {settings.tasks_per_step} by the deadline") from None
        triage = triage_group(
            group.trajectories,
            version,
            settings.max_staleness,
            settings.staleness_policy,
            group.generation,
            settings.max_requeues,
        )
        batch.stale_attempts += triage.stale
        if triage.action == "requeue":
            manager.requeue(group)
            batch.requeued += 1
            continue
        batch.taken.append(group)
        if group.stopped_early:  # its probe settled it: never trainable, not one of the extra groups either
            ledger.add(group.seq, step, "probe_stopped")
            batch.discarded["probe_stopped"] += 1
            continue
        if triage.action == "drop":
            ledger.add(group.seq, step, "stale")
            batch.discarded["stale"] += 1
            continue
        batch.stale_left_out += triage.left_out
        reason = no_gradient_reason(triage.kept)
        if settings.dynamic_sampling and reason is not None and extra < settings.max_extra_groups_per_step:
            extra += 1
            ledger.add(group.seq, step, reason)
            batch.discarded[reason] += 1
            continue
        ledger.add(group.seq, step, "trained")
        batch.groups.append(triage.kept)
        batch.trained_groups.append(group)
    return batch


async def train_async(
    trainer: PolicyTrainer,
    engine: Engine,
    manager: RolloutManager[Any],
    settings: AsyncSettings,
    ledger: Ledger,
    *,
    export_dir: Path,
    infra_counts: dict[str, int] | None = None,
    weights: DistributedWeights | None = None,
    clock: OutageClock | None = None,
) -> AsyncGenerator[StepOutcome]:
    """Run asynchronous GRPO until trainer.step reaches settings.steps (or the time budget is spent), yielding each
    step's outcome (with failures/CAUSE from infra_counts); the rollouts are closed when it ends.

    A batch with nothing trainable is not a step (StepGuard): after an outage's wait (`clock`: how it is timed and
    slept; monotonic by default) its groups emptied by infrastructure are requeued, else its groups are discarded
    (set_aside); settings.max_empty_steps policy-side ones in a row raise NothingTrainable. A step's export is
    loaded by the engine before it is yielded; with `weights` (the weights go over a process group) nothing is
    exported.
    """
    started = time.monotonic()
    deadline = None if settings.time_budget_s is None else started + settings.time_budget_s
    guard = StepGuard(
        "grpo async", settings.steps, settings.max_empty_steps, deadline, settings.outage, clock or MonotonicClock()
    )
    last_update_s: float | None = None  # the previous step's update: what the next one is expected to take
    totals: collections.Counter[str] = collections.Counter()
    manager.start()
    try:
        while trainer.step < settings.steps and not guard.budget_spent(trainer.step):
            step_started, version = time.monotonic(), trainer.step
            try:
                batch = await collect_batch(manager, version, settings, ledger, deadline)
            except BudgetSpent as spent:
                why = f", waiting for the next batch ({spent}; given back untrained)"
                _budget_ended(trainer.step, settings.steps, why)
                return
            empty = await guard.empty_batch(batch.groups, version, f"for step {version + 1}")
            if empty is not None:
                set_aside(batch, empty.outage, manager, ledger, version + 1)
                continue
            if last_update_s is not None and _update_would_overrun(deadline, last_update_s):
                returned = give_back(batch, manager, ledger, version + 1)
                why = f": an update (~{last_update_s:.0f} s) would end past it; {returned} groups given back untrained"
                _budget_ended(trainer.step, settings.steps, why)
                return
            waited = time.monotonic() - step_started
            update = await train_and_sync(trainer, engine, batch.groups, export_dir, weights)
            ledger.record_scored(trainer.step, update.scored)
            last_update_s = update.update_s
            total_s = time.monotonic() - step_started
            timings = dict(time_wait_rollouts_s=waited, time_weight_sync_s=update.sync_s, time_total_s=total_s)
            stats = update.stats | guard.stats() | step_stats(update.stats, timings, batch, manager, totals, version)
            discarded = sum(batch.discarded.values())
            yield step_outcome(
                trainer.step, batch.groups, stats, update, settings, infra_counts, batch.taken, discarded
            )
    finally:
        await manager.close()


def _budget_ended(step: int, steps: int, how: str) -> None:
    """Say that the time budget ended the loop at `step`, and how."""
    logger.warning("grpo async: the time budget ended the stage at step %d of %d%s", step, steps, how)


def _update_would_overrun(deadline: float | None, last_update_s: float | None) -> bool:
    """Whether an update as long as the previous one would end past the time budget (none before the first)."""
    return deadline is not None and last_update_s is not None and time.monotonic() + last_update_s > deadline


def signal_stats(taken: list[FinishedGroup], totals: collections.Counter[str]) -> dict[str, float]:
    """How much of the rolling taught: groups with signal (mixed valid rewards) per 100 episodes rolled in the
    groups taken (probe-stopped ones count their probe's episodes), and per group; this step and since the start
    (in `totals`, which this updates). Infra-error attempts count as rolled."""
    signal = sum(has_signal(t.reward for t in group.trajectories) for group in taken)
    episodes = sum(len(group.attempts) for group in taken)
    totals.update(
        signal_groups=signal,
        groups_taken=len(taken),
        episodes_taken=episodes,
        probe_stopped=sum(group.stopped_early for group in taken),
    )
    return {
        "signal/groups_per_100_episodes": _per_100(signal, episodes),
        "signal/group_share": signal / len(taken) if taken else 0.0,
        "signal/groups_per_100_episodes_total": _per_100(totals["signal_groups"], totals["episodes_taken"]),
    }


def _per_100(groups: int, episodes: int) -> float:
    return 100.0 * groups / episodes if episodes else 0.0


def step_stats(
    trainer_stats: dict[str, float],
    timings: dict[str, float],
    batch: Batch,
    manager: RolloutManager[Any],
    totals: collections.Counter[str],
    version: int,
) -> dict[str, float]:
    """What the async loop adds to the trainer's statistics of a step: where its time went (waiting for rollouts,
    update, log-prob recompute, weight sync, and their shares), the rollouts' state, what the batch discarded and
    left stale (this step and, in `totals`, which this updates, since the start), staleness and long-tail shape."""
    totals.update({f"groups_discarded/{k}": v for k, v in batch.discarded.items()})
    totals.update(
        stale_attempts=batch.stale_attempts,
        stale_left_out=batch.stale_left_out,
        stale_requeued=batch.requeued,
        groups_dropped_few_valid=int(trainer_stats["groups_dropped"]),
    )
    total = timings["time_total_s"]
    stats = timings | {
        "share_wait_rollouts": timings["time_wait_rollouts_s"] / total,
        "share_update": trainer_stats["time_update_s"] / total,
        "share_logprob_recompute": trainer_stats["time_logprob_recompute_s"] / total,
        "share_weight_sync": timings["time_weight_sync_s"] / total,
        "in_flight": float(manager.in_flight),
        "buffered_groups": float(len(manager.buffer)),
        "data_position": float(manager.next_seq),
        "stale_attempts": float(batch.stale_attempts),
        "stale_requeued": float(batch.requeued),
    }
    stats |= {f"discarded/{k}": float(v) for k, v in batch.discarded.items()}
    stats |= signal_stats(batch.taken, totals)
    if manager.curriculum is not None:
        stats |= manager.curriculum.stats()
    stats |= {f"totals/{k}": float(v) for k, v in totals.items()}
    trained = [trajectory for group in batch.groups for trajectory in group]
    return stats | staleness_stats(trained, version) | longtail_stats(batch.taken)
