"""pass@1 and pass@k over tasks with k attempts each, bootstrap CIs over tasks, strata, paired comparisons.

Tasks, not attempts, are the unit of resampling: attempts of one task are correlated, and the question asked is
how the score would move on another draw of tasks from the same distribution.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
        return {
            "pass@1": self.value,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "tasks": float(self.tasks),
            "attempts": float(self.attempts),
            "missing": float(self.missing),
        }


def per_task_rates(rewards: Mapping[str, Sequence[float | None]]) -> dict[str, float]:
    """Task id -> mean reward over its scored attempts (None = infrastructure error, left out)."""
    rates = {}
    for task, values in rewards.items():
        scored = [float(v) for v in values if v is not None]
        if scored:
            rates[task] = sum(scored) / len(scored)
    return rates


def bootstrap_ci(values: Sequence[float], samples: int, confidence: float, seed: int = 0) -> tuple[float, float]:
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


# ----------------------------------------------------------------------------------------------------------------
# pass@k, strata, paired comparison


def pass_at_k_unbiased(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one task with c successes in n attempts: 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k / i), which never forms the (huge) binomials.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


@dataclass(frozen=True)
class PassAtK:
    """Mean over tasks of the unbiased pass@k, with its bootstrap CI and denominator."""

    k: int
    value: float
    ci_low: float
    ci_high: float
    tasks: int
    """Tasks with at least k scored attempts: the denominator."""
    excluded: int
    """Tasks with fewer than k scored attempts (infrastructure errors ate some): left out of this pass@k."""


def pass_at_k(
    rewards: Mapping[str, Sequence[float | None]],
    k: int,
    samples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> PassAtK:
    """pass@k over tasks from per-task attempt rewards (None: lost to the infrastructure, not scored)."""
    values = []
    excluded = 0
    for task in sorted(rewards):
        scored = [float(v) for v in rewards[task] if v is not None]
        if len(scored) < k:
            excluded += 1
            continue
        values.append(pass_at_k_unbiased(len(scored), int(sum(v == 1.0 for v in scored)), k))
    low, high = bootstrap_ci(values, samples, confidence, seed)
    mean = float(np.mean(values)) if values else float("nan")
    return PassAtK(k, mean, low, high, len(values), excluded)


def stratum_table(
    rewards: Mapping[str, Sequence[float | None]],
    stratum_of: Mapping[str, str],
    population: Mapping[str, int],
    samples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One row per stratum: pass@1, CI, denominator, missing tasks; a stratum with no scored task says so."""
    groups: dict[str, dict[str, Sequence[float | None]]] = {name: {} for name in population}
    for task, values in rewards.items():
        groups.setdefault(stratum_of[task], {})[task] = values
    rows = []
    for name in sorted(groups):
        chosen = groups[name]
        score = pass_at_1(chosen, samples, confidence, seed) if chosen else None
        rows.append(
            {
                "stratum": name,
                "population": int(population.get(name, 0)),
                "chosen": len(chosen),
                "tasks": score.tasks if score else 0,
                "missing": score.missing if score else 0,
                "pass@1": score.value if score else float("nan"),
                "ci_low": score.ci_low if score else float("nan"),
                "ci_high": score.ci_high if score else float("nan"),
            }
        )
    return rows


@dataclass(frozen=True)
class PairedComparison:
    """B minus A on the tasks both have scored: mean difference, paired bootstrap CI, sign-flip p-value."""

    difference: float
    """mean over common tasks of (rate_B - rate_A)."""
    ci_low: float
    ci_high: float
    p_value: float
    """Two-sided permutation (sign-flip) test of 'no difference' on the paired per-task differences."""
    significant: bool
    """p_value < 1 - confidence."""
    confidence: float
    tasks: int
    """Common tasks: the denominator."""
    only_a: int
    only_b: int
    """Tasks scored for one checkpoint only (left out of the comparison)."""
    a_better: int
    b_better: int
    ties: int
    exact: bool
    """The p-value enumerates every sign pattern (else Monte Carlo with `samples` draws)."""

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


EXACT_SIGN_FLIPS = 16
"""Up to this many non-zero differences the permutation test enumerates all 2^m sign patterns."""


def sign_flip_p_value(differences: Sequence[float], samples: int, seed: int = 0) -> tuple[float, bool]:
    """Two-sided p-value of mean(differences) under random sign flips (exact for few non-zero differences)."""
    d = np.asarray([x for x in differences if x != 0.0], dtype=np.float64)
    if d.size == 0:
        return 1.0, True
    observed = abs(d.sum())
    tolerance = 1e-12 * max(1.0, observed)
    if d.size <= EXACT_SIGN_FLIPS:
        patterns = ((np.arange(2**d.size)[:, None] >> np.arange(d.size)) & 1) * 2 - 1  # (2^m, m) of +-1
        sums = np.abs(patterns @ d)
        return float(np.mean(sums >= observed - tolerance)), True
    rng = np.random.default_rng(seed)
    signs = rng.choice(np.array([-1.0, 1.0]), size=(samples, d.size))
    extreme = int(np.sum(np.abs(signs @ d) >= observed - tolerance))
    return (1 + extreme) / (1 + samples), False


def paired_comparison(
    rewards_a: Mapping[str, Sequence[float | None]],
    rewards_b: Mapping[str, Sequence[float | None]],
    samples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedComparison:
    """Compare two checkpoints on the same tasks: each task's success rate under B minus under A."""
    rates_a, rates_b = per_task_rates(rewards_a), per_task_rates(rewards_b)
    common = sorted(set(rates_a) & set(rates_b))
    diffs = [rates_b[t] - rates_a[t] for t in common]
    low, high = bootstrap_ci(diffs, samples, confidence, seed)
    p_value, exact = sign_flip_p_value(diffs, samples, seed)
    return PairedComparison(
        difference=float(np.mean(diffs)) if diffs else float("nan"),
        ci_low=low,
        ci_high=high,
        p_value=p_value if diffs else float("nan"),
        significant=bool(diffs) and p_value < 1.0 - confidence,
        confidence=confidence,
        tasks=len(common),
        only_a=len(set(rates_a) - set(rates_b)),
        only_b=len(set(rates_b) - set(rates_a)),
        a_better=sum(d < 0 for d in diffs),
        b_better=sum(d > 0 for d in diffs),
        ties=sum(d == 0 for d in diffs),
        exact=exact,
    )


def describe_comparison(name_a: str, name_b: str, c: PairedComparison) -> str:
    """A few lines a person reads: the difference, its CI, the p-value and the verdict, with denominators."""
    pct = int(round(c.confidence * 100))
    if c.tasks == 0:
        return f"{name_b} vs {name_a}: no task scored for both; nothing to compare"
    verdict = "significant" if c.significant else "not significant"
    test = "exact" if c.exact else "Monte Carlo"
    lines = [
        f"{name_b} - {name_a}: pass@1 difference {c.difference:+.4f} over {c.tasks} common tasks, "
        f"{pct}% paired bootstrap CI [{c.ci_low:+.4f}, {c.ci_high:+.4f}]",
        f"sign-flip permutation test ({test}): p = {c.p_value:.4g} -> {verdict} at the {100 - pct}% level",
        f"per task: {name_b} better on {c.b_better}, {name_a} better on {c.a_better}, tied on {c.ties}",
    ]
    if c.only_a or c.only_b:
        lines.append(f"left out (scored for one side only): {c.only_a} {name_a}-only, {c.only_b} {name_b}-only")
    return "\n".join(lines)
