"""pass@1 and its bootstrap CI, checked against direct computation and by coverage on simulated data."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from swerl.eval.metrics import bootstrap_ci, pass_at_1, per_task_rates


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
