"""pass@1 over tasks with k attempts each, and a percentile bootstrap confidence interval over tasks.

Tasks, not attempts, are the unit of resampling: attempts of one task are correlated, and the question asked is
how the score would move on another draw of tasks from the same distribution.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PassAt1:
    """pass@1 = mean over tasks of each task's success rate; with its bootstrap CI and its denominator."""

    value: float
    ci_low: float
    ci_high: float
    tasks: int
    """Tasks with at least one scored attempt: the denominator."""
    attempts: int
    """Scored attempts (infrastructure errors excluded)."""
    missing: int
    """Tasks with no scored attempt (every try ended in an infrastructure error): reported, never counted as 0."""

    def to_dict(self) -> dict[str, float]:
        return {"pass@1": self.value, "ci_low": self.ci_low, "ci_high": self.ci_high, "tasks": float(self.tasks),
                "attempts": float(self.attempts), "missing": float(self.missing)}  # fmt: skip


def per_task_rates(rewards: Mapping[str, Sequence[float | None]]) -> dict[str, float]:
    """Task id -> mean reward over its scored attempts (None = infrastructure error, left out)."""
    rates = {}
    for task, values in rewards.items():
        scored = [float(v) for v in values if v is not None]
        if scored:
            rates[task] = sum(scored) / len(scored)
    return rates


def bootstrap_ci(
    values: Sequence[float], samples: int, confidence: float, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of `values` (resampling them with replacement)."""
    if not values:
        return float("nan"), float("nan")
    if not 0 < confidence < 1 or samples < 1:
        raise ValueError(f"need 0 < confidence < 1 ({confidence}) and samples >= 1 ({samples})")
    data = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(samples, len(data)))].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1.0 - alpha))


def pass_at_1(
    rewards: Mapping[str, Sequence[float | None]],
    samples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> PassAt1:
    """pass@1 of per-task attempt rewards (1/0, None for an attempt lost to the infrastructure)."""
    rates = per_task_rates(rewards)
    values = [rates[t] for t in sorted(rates)]
    low, high = bootstrap_ci(values, samples, confidence, seed)
    return PassAt1(
        value=float(np.mean(values)) if values else float("nan"),
        ci_low=low,
        ci_high=high,
        tasks=len(values),
        attempts=sum(sum(v is not None for v in attempts) for attempts in rewards.values()),
        missing=len(rewards) - len(values),
    )
