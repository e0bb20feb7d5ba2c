"""Bounded staleness: how far a trajectory's policy lags the trainer, and what to do with a group that lags too far.

Every sampled token carries the weight version that produced it (Trajectory.token_weight_versions, -1 off the
loss mask). With partial rollouts a trajectory spans several versions; its staleness is the trainer's version
minus its OLDEST sampled token's version. A trajectory is stale when that exceeds max_staleness; the policy says:
- drop: leave the stale attempts out of the group (out of loss and baseline, like an infra-error attempt); a
  group left with fewer than two attempts is dropped;
- requeue: rerun the whole group (up to max_requeues times, then it is dropped);
- keep: train it anyway; the importance weights (TIS/MIS) correct for the lag.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from swerl.trajectory import Trajectory


class StalenessPolicy(enum.StrEnum):
    DROP = "drop"
    REQUEUE = "requeue"
    KEEP = "keep"


def oldest_version(trajectory: Trajectory) -> int | None:
    """Version of the trajectory's oldest sampled token; None when it sampled nothing."""
    versions = [version for version in trajectory.token_weight_versions if version >= 0]
    return min(versions) if versions else None


def staleness(trajectory: Trajectory, trainer_version: int) -> int:
    """Versions the oldest sampled token lags the trainer (0 for a trajectory that sampled nothing)."""
    oldest = oldest_version(trajectory)
    return 0 if oldest is None else max(0, trainer_version - oldest)


@dataclass(frozen=True)
class Triage:
    """What the staleness policy made of one group."""

    action: str  # "train" (possibly with some attempts left out), "requeue" or "drop"
    kept: list[Trajectory]  # the attempts to train on (action "train")
    stale: int  # stale attempts in the group
    left_out: int  # stale attempts left out (policy drop)


def triage_group(
    attempts: Sequence[Trajectory],
    trainer_version: int,
    max_staleness: int,
    policy: StalenessPolicy,
    requeues_done: int = 0,
    max_requeues: int = 1,
) -> Triage:
    """Apply the staleness policy to one finished group (see the module docstring)."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    stale = [staleness(attempt, trainer_version) > max_staleness for attempt in attempts]
    count = sum(stale)
    if count == 0 or policy is StalenessPolicy.KEEP:
        return Triage("train", list(attempts), count, 0)
    if policy is StalenessPolicy.REQUEUE:
        if requeues_done < max_requeues:
            return Triage("requeue", [], count, 0)
        return Triage("drop", [], count, count)
    kept = [attempt for attempt, is_stale in zip(attempts, stale, strict=True) if not is_stale]
    valid = sum(attempt.reward is not None for attempt in kept)
    if valid < 2:
        return Triage("drop", [], count, count)
    return Triage("train", kept, count, count)


def staleness_stats(trajectories: Sequence[Trajectory], trainer_version: int) -> dict[str, float]:
    """Distribution of trajectory staleness (oldest token) and mean token staleness over sampled tokens."""
    if not trajectories:
        return {}
    per_trajectory = [staleness(trajectory, trainer_version) for trajectory in trajectories]
    token_lags = [
        trainer_version - version
        for trajectory in trajectories
        for version in trajectory.token_weight_versions
        if version >= 0
    ]
    counts = Counter(per_trajectory)
    stats = {
        "staleness/mean": sum(per_trajectory) / len(per_trajectory),
        "staleness/max": float(max(per_trajectory)),
        "staleness/token_mean": sum(token_lags) / max(1, len(token_lags)),
        "staleness/fresh_share": counts[0] / len(per_trajectory),
    }
    for lag in range(0, max(per_trajectory) + 1):
        stats[f"staleness/count_{lag}"] = float(counts[lag])
    return stats
