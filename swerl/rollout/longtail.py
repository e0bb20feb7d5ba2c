"""Long-tail diagnostics of rollouts: how much of the rollout time passes after most trajectories have finished,
how often caps end them, how unequal a group's attempts are, the slowest one; histograms as an artifact."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from swerl.rollout.journal import FinishedGroup
from swerl.trajectory import EpisodeStatus


def tail_share(starts: Sequence[float], finishes: Sequence[float], quantile: float = 0.9) -> float:
    """Share of the span [first start, last finish] after `quantile` of the trajectories had finished."""
    if not finishes:
        return 0.0
    ordered = sorted(finishes)
    span = ordered[-1] - min(starts)
    if span <= 0:
        return 0.0
    at_quantile = ordered[max(0, math.ceil(quantile * len(ordered)) - 1)]
    return (ordered[-1] - at_quantile) / span


def longtail_stats(groups: Sequence[FinishedGroup]) -> dict[str, float]:
    """Per-step long-tail diagnostics over the finished groups a step took (trained or discarded)."""
    attempts = [attempt for group in groups for attempt in group.attempts]
    if not attempts:
        return {}
    statuses = [attempt.trajectory.status for attempt in attempts]
    spreads = []
    for group in groups:
        durations = [attempt.duration_s for attempt in group.attempts]
        if min(durations) > 0:
            spreads.append(max(durations) / min(durations))
    slowest = max(attempts, key=lambda attempt: attempt.duration_s)
    return {
        "longtail/tail_share_after_p90": tail_share(
            [attempt.started_at for attempt in attempts], [attempt.finished_at for attempt in attempts]
        ),
        "longtail/turn_cap_rate": statuses.count(EpisodeStatus.TURN_CAP) / len(attempts),
        "longtail/length_cap_rate": statuses.count(EpisodeStatus.LENGTH_CAP) / len(attempts),
        "longtail/group_spread_mean": sum(spreads) / len(spreads) if spreads else 1.0,
        "longtail/group_spread_max": max(spreads) if spreads else 1.0,
        "longtail/slowest_s": slowest.duration_s,
        "longtail/slowest_turns": float(slowest.trajectory.num_turns),
        "longtail/duration_mean_s": sum(attempt.duration_s for attempt in attempts) / len(attempts),
    }


def write_histograms(durations: Sequence[float], turns: Sequence[int], out_dir: Path) -> list[Path]:
    """trajectory_histograms.png (the long tail of durations, p50/p90/max marked, and turns) and the raw values as
    JSON; returns the files."""
    from swerl.plots import duration_histogram

    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / "trajectory_durations_turns.json"
    raw.write_text(json.dumps({"duration_s": list(durations), "turns": list(turns)}))
    png = duration_histogram(durations, turns)
    if png is None:
        return [raw]
    image = out_dir / "trajectory_histograms.png"
    image.write_bytes(png)
    return [image, raw]
