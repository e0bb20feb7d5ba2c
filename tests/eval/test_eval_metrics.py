"""pass@1, pass@k, bootstrap CIs, strata and paired comparisons, checked against direct computation, brute-force
counts and coverage on simulated data."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from swerl.eval.metrics import (
    bootstrap_ci,
    describe_comparison,
    paired_comparison,
    pass_at_1,
    pass_at_k,
    pass_at_k_unbiased,
    per_task_rates,
    sign_flip_p_value,
    stratum_table,
)


def test_pass_at_1_is_the_mean_of_per_task_rates_and_skips_infra_attempts() -> None:
    rewards = {"a": [1.0, 0.0], "b": [None, 1.0], "c": [0.0, 0.0], "d": [None, None]}
    score = pass_at_1(rewards, samples=500, seed=3)
    # a: 0.5, b: 1.0 (its infra attempt is left out, not scored 0), c: 0.0; d has no scored attempt: missing.
    assert per_task_rates(rewards) == {"a": 0.5, "b": 1.0, "c": 0.0}
    assert score.value == pytest.approx(0.5)
    assert (score.tasks, score.attempts, score.missing) == (3, 5, 1)
    assert 0.0 <= score.ci_low <= score.value <= score.ci_high <= 1.0


def test_bootstrap_ci_is_deterministic_by_seed_and_degenerate_on_constant_data() -> None:
    values = [random.Random(1).random() for _ in range(40)]
    assert bootstrap_ci(values, 1000, 0.95, seed=7) == bootstrap_ci(values, 1000, 0.95, seed=7)
    assert bootstrap_ci([1.0] * 10, 200, 0.95) == (1.0, 1.0)
    assert all(math.isnan(x) for x in bootstrap_ci([], 200, 0.95))
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci(values, 100, 1.5)


def test_bootstrap_ci_covers_the_true_pass_rate_about_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(0)
    true_rate, tasks, attempts, trials = 0.3, 100, 2, 300
    covered = 0
    for trial in range(trials):
        # Each task has its own difficulty around the true rate; attempts are Bernoulli draws of it.
        difficulty = rng.beta(true_rate * 4, (1 - true_rate) * 4, size=tasks)
        rewards = {f"t{i}": list(rng.random(attempts) < p) for i, p in enumerate(difficulty)}
        score = pass_at_1({k: [float(x) for x in v] for k, v in rewards.items()}, samples=400, seed=trial)
        covered += score.ci_low <= true_rate <= score.ci_high
    assert 0.90 <= covered / trials <= 0.99, covered / trials


# ----------------------------------------------------------------------------------------------------------------
# pass@k, strata, paired comparison


def brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    """Share of the k-subsets of n attempts (c of them successes) that hold at least one success."""
    attempts = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(attempts[i] for i in s) for s in subsets) / len(subsets)


def test_unbiased_pass_at_k_equals_a_brute_force_count() -> None:
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k_unbiased(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12)
    assert pass_at_k_unbiased(200, 3, 1) == pytest.approx(3 / 200)
    assert pass_at_k_unbiased(200, 0, 50) == 0.0 and pass_at_k_unbiased(200, 151, 50) == 1.0
    with pytest.raises(ValueError):
        pass_at_k_unbiased(4, 1, 5)


def test_pass_at_k_over_tasks_states_its_denominator() -> None:
    rewards = {
        "a": [1.0, 0.0, 0.0, 0.0],
        "b": [0.0] * 4,
        "c": [1.0, None, 1.0, 0.0],
        "d": [None, None, None, 1.0],
    }
    at1 = pass_at_k(rewards, 1, samples=200)
    assert at1.value == pytest.approx(np.mean([0.25, 0.0, 2 / 3, 1.0])) and at1.tasks == 4
    at1_direct = pass_at_1(rewards, samples=200)
    assert at1.value == pytest.approx(at1_direct.value)
    at2 = pass_at_k(rewards, 2, samples=200)
    # d has one scored attempt: left out of pass@2 and counted as excluded
    assert (at2.tasks, at2.excluded) == (3, 1)
    assert at2.value == pytest.approx(np.mean([brute_force_pass_at_k(4, 1, 2), 0.0, brute_force_pass_at_k(3, 2, 2)]))


def test_stratum_table_rows_have_denominators_and_name_empty_strata() -> None:
    rewards = {"a1": [1.0], "a2": [0.0], "b1": [None]}
    rows = stratum_table(rewards, {"a1": "A", "a2": "A", "b1": "B"}, {"A": 10, "B": 4, "C": 1}, samples=200)
    by_name = {r["stratum"]: r for r in rows}
    assert by_name["A"]["pass@1"] == 0.5 and by_name["A"]["tasks"] == 2 and by_name["A"]["population"] == 10
    assert by_name["B"]["tasks"] == 0 and by_name["B"]["missing"] == 1 and math.isnan(by_name["B"]["pass@1"])
    assert by_name["C"]["chosen"] == 0 and math.isnan(by_name["C"]["pass@1"])


def test_sign_flip_p_value_on_constructed_cases() -> None:
    # 10 tasks all improved by 1: only 2 of 2^10 sign patterns reach |sum| = 10.
    p, exact = sign_flip_p_value([1.0] * 10, samples=1000)
    assert exact and p == pytest.approx(2 / 1024)
    assert sign_flip_p_value([0.0, 0.0], samples=10) == (1.0, True)
    # symmetric differences: every pattern is at least as extreme as |sum| = 0
    assert sign_flip_p_value([1.0, -1.0, 1.0, -1.0], samples=10)[0] == 1.0
    # many differences: Monte Carlo, close to the exact binomial answer
    diffs = [1.0] * 30 + [-1.0] * 10  # |sum| = 20 of 40 +-1 flips: P(|2X-40| >= 20) with X ~ Bin(40, 1/2)
    exact_p = sum(math.comb(40, x) for x in range(41) if abs(2 * x - 40) >= 20) / 2**40
    p, exact = sign_flip_p_value(diffs, samples=20000, seed=1)
    assert not exact and p == pytest.approx(exact_p, abs=0.004)


def test_paired_comparison_detects_a_real_gain_and_not_a_null_one() -> None:
    rng = np.random.default_rng(0)
    tasks = [f"t{i}" for i in range(100)]
    base = {t: [float(rng.random() < 0.2)] for t in tasks}
    better = {t: [1.0] if (v[0] == 1.0 or i % 3 == 0) else [0.0] for i, (t, v) in enumerate(base.items())}
    gain = paired_comparison(base, better, samples=4000, seed=0)
    assert gain.significant and gain.difference > 0 and gain.ci_low > 0 and gain.p_value < 0.001
    assert (gain.tasks, gain.a_better, gain.only_a) == (100, 0, 0)
    assert gain.b_better + gain.ties == 100
    same = paired_comparison(base, {t: list(v) for t, v in base.items()}, samples=4000)
    assert not same.significant and same.difference == 0.0 and same.p_value == 1.0
    # Same marginal rate, shuffled per-task outcomes: a difference of exactly zero, not significant.
    swapped = {t: [1.0 - v[0]] if i < 10 else v for i, (t, v) in enumerate(base.items())}
    noise = paired_comparison(base, swapped, samples=4000)
    assert noise.tasks == 100 and noise.a_better + noise.b_better == 10

    text = describe_comparison("sft", "grpo", gain)
    assert "grpo - sft" in text and "significant" in text and "100 common tasks" in text


def test_paired_comparison_uses_common_tasks_and_reports_the_rest() -> None:
    a = {"x": [1.0], "y": [0.0], "z": [None]}
    b = {"x": [1.0], "y": [1.0], "w": [0.0]}
    c = paired_comparison(a, b, samples=500)
    assert (c.tasks, c.only_a, c.only_b) == (2, 0, 1)  # z has no scored attempt for a: not a task of a
    assert c.difference == 0.5 and c.exact and not c.significant  # one improvement in two tasks proves nothing


def test_paired_bootstrap_ci_covers_the_true_difference() -> None:
    rng = np.random.default_rng(5)
    trials, covered = 200, 0
    for trial in range(trials):
        p = rng.beta(1.2, 3.0, size=80)
        lift = 0.1
        a = {f"t{i}": [float(x) for x in rng.random(2) < q] for i, q in enumerate(p)}
        b = {f"t{i}": [float(x) for x in rng.random(2) < min(1.0, q + lift)] for i, q in enumerate(p)}
        true_diff = float(np.mean(np.minimum(1.0, p + lift) - p))
        c = paired_comparison(a, b, samples=400, seed=trial)
        covered += c.ci_low <= true_diff <= c.ci_high
    assert 0.88 <= covered / trials <= 0.99, covered / trials
