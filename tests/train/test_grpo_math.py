"""GRPO math checked against float64 references written as explicit Python loops."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from swerl.train.grpo import LossSettings, gather_logprobs, group_advantages, policy_loss, token_entropy
from swerl.train.grpo_step import sequence_mean_scales

# --- advantages ---------------------------------------------------------------------------------------------


def reference_advantages(rewards: list[float], valid: list[bool], scale_by_std: bool, eps: float) -> list[float]:
    kept = [reward for reward, ok in zip(rewards, valid, strict=True) if ok]
    if len(kept) < 2:
        return [0.0] * len(rewards)
    mean = math.fsum(kept) / len(kept)
    scale = statistics.stdev(kept) + eps if scale_by_std else 1.0
    return [(reward - mean) / scale if ok else 0.0 for reward, ok in zip(rewards, valid, strict=True)]


@pytest.mark.parametrize("scale_by_std", [False, True])
@pytest.mark.parametrize(
    "rewards, valid",
    [
        ([1.0, 0.0, 0.0, 1.0], [True] * 4),
        ([0.0, 0.0, 1.0, 0.0, 0.5, 0.25], [True] * 6),
        (
            [1.0, 0.0, float("nan"), 1.0, 0.0],
            [True, True, False, True, True],
        ),  # an infra error's reward is junk
        ([0.0, 1.0, 0.0, 0.0], [False, True, True, False]),
        ([3.5, -1.0, 2.0], [True, True, True]),
    ],
)
def test_group_advantages_match_reference(rewards: list[float], valid: list[bool], scale_by_std: bool) -> None:
    result = group_advantages(rewards, valid, scale_by_std=scale_by_std, eps=1e-6)
    expected = reference_advantages(rewards, valid, scale_by_std, eps=1e-6)
    assert not result.dropped
    assert result.advantages.dtype == torch.float32
    assert result.advantages.tolist() == pytest.approx(expected, abs=1e-6)
    assert result.valid.tolist() == valid
    assert all(value == 0.0 for value, ok in zip(result.advantages.tolist(), valid, strict=True) if not ok)
    kept = [value for value, ok in zip(result.advantages.tolist(), valid, strict=True) if ok]
    assert math.fsum(kept) == pytest.approx(0.0, abs=1e-6)  # a baseline over valid attempts only


@pytest.mark.parametrize(
    "rewards, valid", [([1.0, 0.0, 1.0], [False, True, False]), ([0.0, 0.0], [False, False]), ([1.0], None)]
)
def test_group_with_fewer_than_two_valid_attempts_is_dropped(rewards: list[float], valid: list[bool] | None) -> None:
    result = group_advantages(rewards, valid, scale_by_std=True)
    assert result.dropped and not result.has_signal
    assert result.advantages.tolist() == [0.0] * len(rewards)


def test_equal_rewards_give_zero_advantages_without_dividing_by_zero() -> None:
    result = group_advantages(torch.tensor([1.0, 1.0, 1.0]), scale_by_std=True, eps=1e-6)
    assert not result.dropped and not result.has_signal
    assert torch.equal(result.advantages, torch.zeros(3))


def test_group_advantages_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="differ"):
        group_advantages([1.0, 0.0], [True])


# --- log-probs and entropy ----------------------------------------------------------------------------------


def test_gather_logprobs_matches_brute_force_loop() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=generator) * 3  # (B, T, V)
    tokens = torch.randint(0, 7, (2, 5), generator=generator)  # (B, T)
    for temperature in (1.0, 0.7):
        result = gather_logprobs(logits, tokens, temperature=temperature)
        assert result.shape == (2, 4)
        for batch in range(2):
            for position in range(4):
                row = [float(value) / temperature for value in logits[batch, position].double()]
                log_normaliser = math.log(math.fsum(math.exp(value) for value in row))
                expected = row[int(tokens[batch, position + 1])] - log_normaliser
                assert float(result[batch, position]) == pytest.approx(expected, abs=1e-5)
    half = gather_logprobs(logits.to(torch.bfloat16), tokens)
    assert half.dtype == torch.float32


def test_token_entropy_matches_brute_force_loop() -> None:
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [5.0, -1.0, 0.5, 2.0]]])  # (1, 2, 4)
    entropy = token_entropy(logits)
    assert entropy.shape == (1, 2)
    for position in range(2):
        row = [float(value) for value in logits[0, position].double()]
        total = math.fsum(math.exp(value) for value in row)
        probabilities = [math.exp(value) / total for value in row]
        expected = -math.fsum(p * math.log(p) for p in probabilities)
        assert float(entropy[0, position]) == pytest.approx(expected, abs=1e-6)
    assert float(entropy[0, 0]) == pytest.approx(math.log(4), abs=1e-6)


# --- policy loss --------------------------------------------------------------------------------------------

# Two trajectories, four positions; position 0 of each is prompt (masked out) and holds engine fillers.
LOGPROBS = [[-0.5, -1.2, -0.3, -2.0], [-0.1, -0.7, -1.5, -0.9]]
OLD = [[-0.4, -1.0, -0.6, -2.1], [-0.3, -0.2, -1.5, -1.3]]
BEHAVIOUR = [[0.0, -1.05, -0.9, -1.0], [0.0, -0.25, -2.9, -1.25]]
REFERENCE = [[-0.7, -1.1, -0.2, -1.8], [-0.2, -0.9, -1.4, -1.0]]
MASK = [[0, 1, 1, 1], [0, 1, 1, 0]]
ADVANTAGES = [0.8, -0.5]


def reference_loss(
    logprobs, old, behaviour, advantages, mask, eps_low, eps_high, tis_cap, reference=None, kl_coef=0.0
) -> tuple[float, list[list[float]], dict[str, float]]:
    """Loss, its gradient w.r.t. logprobs, and stats, all by explicit loops in float64."""
    tokens = [(b, t) for b in range(len(mask)) for t in range(len(mask[b])) if mask[b][t]]
    count = len(tokens)
    total, clipped, tis_values, tis_clipped, diffs, raw = 0.0, 0, [], 0, [], []
    gradient = [[0.0] * len(row) for row in mask]
    for b, t in tokens:
        ratio = math.exp(logprobs[b][t] - old[b][t])
        advantage = advantages[b]
        bounded = min(max(ratio, 1 - eps_low), 1 + eps_high)
        weight = math.exp(old[b][t] - behaviour[b][t])
        truncated = min(weight, tis_cap)
        total += -truncated * min(ratio * advantage, bounded * advantage)
        is_clipped = (advantage > 0 and ratio > 1 + eps_high) or (advantage < 0 and ratio < 1 - eps_low)
        gradient[b][t] = 0.0 if is_clipped else -truncated * ratio * advantage / count
        if reference is not None:
            delta = reference[b][t] - logprobs[b][t]
            total += kl_coef * (math.exp(delta) - delta - 1)
            gradient[b][t] += kl_coef * (1 - math.exp(delta)) / count
        clipped += is_clipped
        tis_values.append(truncated)
        tis_clipped += weight > tis_cap
        diffs.append(abs(old[b][t] - behaviour[b][t]))
        raw.append(weight)
    stats = {
        "clip_fraction": clipped / count,
        "tis_mean": math.fsum(tis_values) / count,
        "tis_clip_fraction": tis_clipped / count,
        "logprob_diff_mean": math.fsum(diffs) / count,
        "ess_ratio": math.fsum(raw) ** 2 / (count * math.fsum(w * w for w in raw)),
    }
    return total / count, gradient, stats


def run_loss(
    logprobs,
    old,
    behaviour,
    advantages,
    mask,
    reference=None,
    dtype=torch.float64,
    normalizer=None,
    **settings,
):
    current = torch.tensor(logprobs, dtype=dtype, requires_grad=True)
    loss, stats = policy_loss(
        current,
        torch.tensor(old, dtype=dtype),
        torch.tensor(behaviour, dtype=dtype),
        torch.tensor(advantages, dtype=dtype),
        torch.tensor(mask),
        LossSettings(**settings),
        ref_logprobs=None if reference is None else torch.tensor(reference, dtype=dtype),
        normalizer=normalizer,
    )
    loss.backward()
    assert current.grad is not None
    return loss.detach(), current.grad, stats


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    "eps_low, eps_high, tis_cap, kl_coef",
    [(0.2, 0.2, 2.0, 0.0), (0.2, 0.28, 1.5, 0.0), (0.1, 0.1, 10.0, 0.05), (0.3, 0.5, 1.0, 0.2)],
)
def test_policy_loss_matches_float64_reference(eps_low, eps_high, tis_cap, kl_coef, dtype) -> None:
    reference = REFERENCE if kl_coef else None
    loss, gradient, stats = run_loss(
        LOGPROBS,
        OLD,
        BEHAVIOUR,
        ADVANTAGES,
        MASK,
        reference,
        dtype=dtype,
        clip_eps_low=eps_low,
        clip_eps_high=eps_high,
        tis_cap=tis_cap,
        kl_coef=kl_coef,
    )
    expected_loss, expected_gradient, expected_stats = reference_loss(
        LOGPROBS, OLD, BEHAVIOUR, ADVANTAGES, MASK, eps_low, eps_high, tis_cap, reference, kl_coef
    )
    tolerance = 1e-12 if dtype == torch.float64 else 1e-6
    assert float(loss) == pytest.approx(expected_loss, abs=tolerance)
    assert gradient.tolist() == [pytest.approx(row, abs=tolerance) for row in expected_gradient]
    assert stats.num_tokens == 5
    for name, value in expected_stats.items():
        assert getattr(stats, name) == pytest.approx(value, abs=tolerance), name
    assert 0 < stats.ess_ratio <= 1


def test_the_fixture_exercises_clipping_and_truncation() -> None:
    _, _, stats = reference_loss(LOGPROBS, OLD, BEHAVIOUR, ADVANTAGES, MASK, 0.2, 0.2, 2.0)
    assert 0 < stats["clip_fraction"] < 1 and 0 < stats["tis_clip_fraction"] < 1


def test_masked_tokens_get_no_gradient_and_do_not_change_the_loss() -> None:
    def run(noise: float, fill: float):
        logprobs = [
            [value + noise * (1 - bit) for value, bit in zip(row, bits, strict=True)]
            for row, bits in zip(LOGPROBS, MASK, strict=True)
        ]
        old = [
            [value if bit else fill for value, bit in zip(row, bits, strict=True)]
            for row, bits in zip(OLD, MASK, strict=True)
        ]
        behaviour = [
            [value if bit else -fill for value, bit in zip(row, bits, strict=True)]
            for row, bits in zip(BEHAVIOUR, MASK, strict=True)
        ]
        return run_loss(
            logprobs,
            old,
            behaviour,
            ADVANTAGES,
            MASK,
            REFERENCE,
            clip_eps_low=0.2,
            clip_eps_high=0.2,
            tis_cap=2.0,
            kl_coef=0.1,
        )

    base_loss, base_gradient, base_stats = run(0.0, 0.0)
    for noise, fill in [(3.0, 50.0), (-7.0, float("inf")), (0.5, -1e9)]:
        loss, gradient, stats = run(noise, fill)
        assert torch.isfinite(loss) and torch.isfinite(gradient).all()
        assert float(loss) == pytest.approx(float(base_loss), abs=1e-12)
        assert torch.allclose(gradient, base_gradient, atol=1e-12)
        assert stats.ess_ratio == pytest.approx(base_stats.ess_ratio, abs=1e-12)
    masked_out = torch.tensor(MASK) == 0
    assert torch.all(base_gradient[masked_out] == 0)


@pytest.mark.parametrize(
    "ratio, advantage, clipped",
    [
        (1.2 + 1e-6, 1.0, True),  # above 1 + eps_high with A > 0: clipped
        (1.2 - 1e-6, 1.0, False),
        (0.8 - 1e-6, -1.0, True),  # below 1 - eps_low with A < 0: clipped
        (0.8 + 1e-6, -1.0, False),
        (0.5, 1.0, False),  # PPO's pessimistic bound keeps the gradient on the other side
        (1.6, -1.0, False),
        (3.0, 0.0, False),  # no advantage, nothing to clip
    ],
)
def test_clipping_at_the_boundaries(ratio: float, advantage: float, clipped: bool) -> None:
    old = [[-1.0]]
    logprobs = [[-1.0 + math.log(ratio)]]
    loss, gradient, stats = run_loss(
        logprobs, old, old, [advantage], [[1]], clip_eps_low=0.2, clip_eps_high=0.2, tis_cap=2.0
    )
    bounded = min(max(ratio, 0.8), 1.2)
    assert float(loss) == pytest.approx(-min(ratio * advantage, bounded * advantage), abs=1e-12)
    assert stats.clip_fraction == float(clipped)
    expected_gradient = 0.0 if clipped else -ratio * advantage
    assert float(gradient[0, 0]) == pytest.approx(expected_gradient, abs=1e-12)


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_exactly_on_the_boundary_the_token_is_not_clipped(advantage: float) -> None:
    # eps = 0 puts ratio exp(0) == 1 exactly on both boundaries, with no rounding in between.
    loss, gradient, stats = run_loss(
        [[-0.7]], [[-0.7]], [[-0.7]], [advantage], [[1]], clip_eps_low=0.0, clip_eps_high=0.0, tis_cap=2.0
    )
    assert float(loss) == -advantage and stats.clip_fraction == 0.0
    assert float(gradient[0, 0]) == -advantage


def test_tis_weight_is_capped_and_detached() -> None:
    old = [[-1.0, -1.0]]
    behaviour = [[-1.0 - math.log(10.0), -1.0 + math.log(2.0)]]  # raw weights 10 and 0.5
    loss, gradient, stats = run_loss(
        old, old, behaviour, [1.0], [[1, 1]], clip_eps_low=0.2, clip_eps_high=0.2, tis_cap=3.0
    )
    assert float(loss) == pytest.approx(-(3.0 + 0.5) / 2, abs=1e-12)
    assert gradient.tolist() == [pytest.approx([-3.0 / 2, -0.5 / 2], abs=1e-12)]
    assert stats.tis_mean == pytest.approx(1.75) and stats.tis_clip_fraction == 0.5
    assert stats.logprob_diff_mean == pytest.approx((math.log(10.0) + math.log(2.0)) / 2)


def test_ess_ratio_is_one_for_equal_weights_and_within_unit_interval() -> None:
    old = [[-1.0, -2.0, -0.5]]
    shifted = [[value - 0.3 for value in old[0]]]  # every raw weight exp(0.3)
    _, _, stats = run_loss(old, old, shifted, [1.0], [[1, 1, 1]], clip_eps_low=0.2, clip_eps_high=0.2, tis_cap=5.0)
    assert stats.ess_ratio == pytest.approx(1.0, abs=1e-12)
    generator = torch.Generator().manual_seed(1)
    for _ in range(20):
        behaviour = (torch.randn(1, 3, generator=generator, dtype=torch.float64) * 2 + torch.tensor(old)).tolist()
        _, _, stats = run_loss(
            old, old, behaviour, [1.0], [[1, 1, 1]], clip_eps_low=0.2, clip_eps_high=0.2, tis_cap=5.0
        )
        assert 1 / 3 - 1e-12 <= stats.ess_ratio <= 1 + 1e-12


def test_explicit_normalizer_makes_micro_batches_sum_to_the_batch_mean() -> None:
    kwargs = dict(clip_eps_low=0.2, clip_eps_high=0.28, tis_cap=2.0)
    whole, _, _ = run_loss(LOGPROBS, OLD, BEHAVIOUR, ADVANTAGES, MASK, **kwargs)
    parts = [
        run_loss([LOGPROBS[i]], [OLD[i]], [BEHAVIOUR[i]], [ADVANTAGES[i]], [MASK[i]], normalizer=5.0, **kwargs)[0]
        for i in range(2)
    ]
    assert float(parts[0] + parts[1]) == pytest.approx(float(whole), abs=1e-12)
    # Token-level, not sequence-level: the first trajectory (3 tokens) weighs 3/5 of the batch.
    unnormalised = [
        run_loss([LOGPROBS[i]], [OLD[i]], [BEHAVIOUR[i]], [ADVANTAGES[i]], [MASK[i]], **kwargs)[0] for i in range(2)
    ]
    assert float(whole) == pytest.approx(float(unnormalised[0] * 3 / 5 + unnormalised[1] * 2 / 5), abs=1e-12)


def test_per_token_advantages_and_empty_mask() -> None:
    per_token = [[0.0, 0.8, 0.8, 0.8], [0.0, -0.5, -0.5, -0.5]]
    kwargs = dict(clip_eps_low=0.2, clip_eps_high=0.2, tis_cap=2.0)
    by_trajectory, _, _ = run_loss(LOGPROBS, OLD, BEHAVIOUR, ADVANTAGES, MASK, **kwargs)
    by_token, _, _ = run_loss(LOGPROBS, OLD, BEHAVIOUR, per_token, MASK, **kwargs)
    assert float(by_token) == pytest.approx(float(by_trajectory), abs=1e-12)
    loss, gradient, stats = run_loss(LOGPROBS, OLD, BEHAVIOUR, ADVANTAGES, [[0] * 4, [0] * 4], **kwargs)
    assert float(loss) == 0.0 and torch.all(gradient == 0) and stats.num_tokens == 0


def test_sequence_mean_scales_turn_the_token_mean_into_the_mean_of_per_trajectory_means() -> None:
    """policy_loss with advantages scaled by sequence_mean_scales == the mean over trajectories of each one's own
    token-mean loss (brute force, float64), in value and gradient; clipping is unchanged by the positive factors."""
    kwargs = dict(eps_low=0.2, eps_high=0.28, tis_cap=2.0)
    lengths = [sum(row) for row in MASK]
    scales = sequence_mean_scales(lengths)
    assert scales == pytest.approx([5 / (2 * 3), 5 / (2 * 2)])
    loss, gradient, _ = run_loss(
        LOGPROBS,
        OLD,
        BEHAVIOUR,
        [a * c for a, c in zip(ADVANTAGES, scales, strict=True)],
        MASK,
        clip_eps_low=kwargs["eps_low"],
        clip_eps_high=kwargs["eps_high"],
        tis_cap=kwargs["tis_cap"],
    )
    per_row = [
        reference_loss([LOGPROBS[b]], [OLD[b]], [BEHAVIOUR[b]], [ADVANTAGES[b]], [MASK[b]], **kwargs)
        for b in range(len(MASK))
    ]
    assert float(loss) == pytest.approx(math.fsum(row[0] for row in per_row) / len(MASK), abs=1e-12)
    expected_gradient = [[g / len(MASK) for g in row[1][0]] for row in per_row]
    assert gradient.tolist() == [pytest.approx(row, abs=1e-12) for row in expected_gradient]
    # ... and it differs from the token mean, which weighs the 3-token trajectory more.
    token_mean, _, _ = run_loss(
        LOGPROBS, OLD, BEHAVIOUR, ADVANTAGES, MASK, clip_eps_low=0.2, clip_eps_high=0.28, tis_cap=2.0
    )
    assert abs(float(token_mean) - float(loss)) > 1e-3
    assert sequence_mean_scales([4, 0]) == [0.5, 0.0]  # a trajectory with no scored token adds nothing
