"""Plots of a stage as PNG bytes (matplotlib, Agg): logged to the stage's MLflow run under plots/ and shown by the
Prefect task as image artifacts (StageResult.images)."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

PLOT_DPI = 80
"""Small enough to inline in a Prefect artifact (tens of kB), sharp enough to read."""

STEP_TIME_PARTS = (
    ("time_update_s", "actor update"),
    ("time_wait_rollouts_s", "waiting for rollouts"),
    ("time_logprob_recompute_s", "log-prob recompute"),
    ("time_weight_sync_s", "weight sync"),
)
"""The parts of a GRPO step's time (the recipe reports 63% update / 29% waiting / 8% recompute)."""


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=PLOT_DPI)
    _pyplot().close(fig)
    return buf.getvalue()


def _series(history: Sequence[Mapping[str, float]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `key`; a row without its step counts as the one after the previous row."""
    rows, step = [], 0
    for h in history:
        step = int(h.get("step", step + 1))
        if key in h and not math.isnan(float(h[key])):
            rows.append((step, float(h[key])))
    return [s for s, _ in rows], [v for _, v in rows]


def grpo_curves(history: Sequence[Mapping[str, float]]) -> bytes | None:
    """Training reward (mean, with the share of groups with signal) and staleness (mean and max policy versions
    behind) per GRPO step; None without a step."""
    steps, reward = _series(history, "reward_mean")
    if not steps:
        return None
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    top.plot(steps, reward, "o-", label="reward (mean)")
    s_steps, signal = _series(history, "signal/groups_per_100_episodes")
    if s_steps:
        twin = top.twinx()
        twin.plot(s_steps, signal, "s--", color="tab:green", label="groups with signal / 100 episodes")
        twin.set_ylabel("signal groups / 100 episodes")
        twin.legend(loc="upper right", fontsize=8)
    top.set_ylabel("training reward")
    top.set_ylim(-0.02, 1.02)
    top.grid(alpha=0.3)
    top.legend(loc="upper left", fontsize=8)
    drawn = False
    for key, label, style in (("staleness/mean", "mean", "o-"), ("staleness/max", "max", "^:")):
        k_steps, values = _series(history, key)
        if k_steps:
            bottom.plot(k_steps, values, style, label=f"staleness ({label})")
            drawn = True
    if drawn:
        bottom.legend(loc="upper left", fontsize=8)
    else:
        bottom.text(
            0.5,
            0.5,
            "synchronous GRPO: every trajectory on-policy (staleness 0)",
            ha="center",
            va="center",
            transform=bottom.transAxes,
            fontsize=9,
        )
    bottom.set_ylabel("policy versions behind")
    bottom.set_xlabel("GRPO step")
    bottom.grid(alpha=0.3)
    return _png(fig)


def step_time_shares(history: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Share of the GRPO steps' total time spent in each STEP_TIME_PARTS part, and `other`; {} without time."""
    total = sum(float(h.get("time_total_s", 0.0)) for h in history)
    if total <= 0:
        return {}
    shares = {label: sum(float(h.get(key, 0.0)) for h in history) / total for key, label in STEP_TIME_PARTS}
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


def step_time_breakdown(history: Sequence[Mapping[str, float]]) -> bytes | None:
    """One stacked bar: where the GRPO steps' time went (actor update / waiting for rollouts / log-prob recompute
    / weight sync / other), percentages labelled; None without timings."""
    shares = step_time_shares(history)
    if not shares:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 2.4))
    left = 0.0
    for label, share in shares.items():
        ax.barh([0], [share], left=left, label=f"{label} {share:.0%}")
        if share >= 0.06:
            ax.text(left + share / 2, 0, f"{share:.0%}", ha="center", va="center", fontsize=9, color="white")
        left += share
    ax.set_xlim(0, 1)
    ax.set_yticks([])
    ax.set_xlabel(f"share of {len(history)} GRPO steps' time")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.6), ncol=5, fontsize=8, frameon=False)
    return _png(fig)


def duration_histogram(durations: Sequence[float], turns: Sequence[int]) -> bytes | None:
    """The long tail of trajectory durations (p50 / p90 / max marked) beside the turns per trajectory."""
    if not durations:
        return None
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    left.hist(durations, bins=30)
    ordered = sorted(durations)
    for q, style in ((0.5, "--"), (0.9, ":")):
        value = ordered[max(0, math.ceil(q * len(ordered)) - 1)]
        left.axvline(value, color="black", linestyle=style, linewidth=1, label=f"p{int(q * 100)} {value:.1f} s")
    left.axvline(ordered[-1], color="red", linewidth=1, label=f"max {ordered[-1]:.1f} s")
    left.set_xlabel("trajectory duration (s)")
    left.set_ylabel("trajectories")
    left.legend(fontsize=8)
    right.hist(turns, bins=range(0, max(turns, default=0) + 2))
    right.set_xlabel("turns")
    return _png(fig)
