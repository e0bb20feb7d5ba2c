"""Off-policy corrections of asynchronous GRPO (TIS and MIS, token and sequence level) against float64 loops."""

from __future__ import annotations

import math

import pytest
import torch

from swerl.train.grpo import LossSettings, policy_loss

# Two trajectories (rows); position 0 is prompt. Row 1 lags: its old/behaviour gap is large (a stale policy).
LOGPROBS = [[-0.5, -1.2, -0.3, -2.0], [-0.1, -0.7, -1.5, -0.9]]
OLD = [[-0.4, -1.0, -0.6, -2.1], [-0.3, -0.2, -1.5, -1.3]]
BEHAVIOUR = [[0.0, -1.05, -0.9, -1.0], [0.0, -0.25, -2.9, -1.25]]
MASK = [[0, 1, 1, 1], [0, 1, 1, 0]]
ADVANTAGES = [0.8, -0.5]


def reference(
    level_tis: str, tis_cap: float, mis: tuple[float, float] | None, level_mis: str
) -> tuple[float, list[list[float]], float]:
    """Loss, gradient w.r.t. logprobs, masked fraction; explicit loops in float64 (eps 0.2 both sides)."""
    tokens = [(b, t) for b in range(2) for t in range(4) if MASK[b][t]]
    count = len(tokens)
    sequence = [math.exp(math.fsum(OLD[b][t] - BEHAVIOUR[b][t] for t in range(4) if MASK[b][t])) for b in range(2)]
    total, masked = 0.0, 0
    gradient = [[0.0] * 4 for _ in range(2)]
    for b, t in tokens:
        token_weight = math.exp(OLD[b][t] - BEHAVIOUR[b][t])
        weight = min(token_weight if level_tis == "token" else sequence[b], tis_cap)
        if mis is not None:
            judged = token_weight if level_mis == "token" else sequence[b]
            if not mis[0] <= judged <= mis[1]:
                masked += 1
                continue
        ratio = math.exp(LOGPROBS[b][t] - OLD[b][t])
        advantage = ADVANTAGES[b]
        bounded = min(max(ratio, 0.8), 1.2)
        total += -weight * min(ratio * advantage, bounded * advantage)
        clipped = (advantage > 0 and ratio > 1.2) or (advantage < 0 and ratio < 0.8)
        gradient[b][t] = 0.0 if clipped else -weight * ratio * advantage / count
    return total / count, gradient, masked / count


@pytest.mark.parametrize(
    "tis_level, tis_cap, mis, mis_level",
    [
        ("token", 2.0, None, "token"),
        ("sequence", 2.0, None, "token"),
        ("sequence", 1e6, None, "token"),
        ("token", 2.0, (0.5, 2.0), "token"),
        ("token", 5.0, (0.8, 3.0), "sequence"),
        ("sequence", 10.0, (0.2, 1.5), "sequence"),
    ],
)
def test_tis_and_mis_match_float64_reference(tis_level, tis_cap, mis, mis_level) -> None:
    current = torch.tensor(LOGPROBS, dtype=torch.float64, requires_grad=True)
    loss, stats = policy_loss(
        current,
        torch.tensor(OLD, dtype=torch.float64),
        torch.tensor(BEHAVIOUR, dtype=torch.float64),
        torch.tensor(ADVANTAGES, dtype=torch.float64),
        torch.tensor(MASK),
        LossSettings(
            0.2,
            0.2,
            tis_cap,
            tis_level=tis_level,
            mis_low=mis[0] if mis else 0.0,
            mis_high=mis[1] if mis else None,
            mis_level=mis_level,
        ),
    )
    loss.backward()
    expected_loss, expected_gradient, expected_masked = reference(tis_level, tis_cap, mis, mis_level)
    assert float(loss.detach()) == pytest.approx(expected_loss, abs=1e-12)
    assert current.grad is not None
    assert current.grad.tolist() == [pytest.approx(row, abs=1e-12) for row in expected_gradient]
    assert stats.mis_mask_fraction == pytest.approx(expected_masked)


def test_the_cases_differ() -> None:
    """The parametrised cases are not all the same number: each knob changes the loss on these inputs."""
    losses = {
        case: reference(*case)[0]
        for case in [
            ("token", 2.0, None, "token"),
            ("sequence", 2.0, None, "token"),
            ("token", 2.0, (0.5, 2.0), "token"),
            ("token", 5.0, (0.8, 3.0), "sequence"),
        ]
    }
    assert len({round(value, 9) for value in losses.values()}) == len(losses)
    assert reference("token", 2.0, (0.5, 2.0), "token")[2] > 0  # MIS masks something here


def test_sequence_weights_of_long_trajectories_do_not_overflow() -> None:
    """A long trajectory's product of weights overflows exp(); the cap is applied in log space."""
    length = 2000
    old = torch.zeros(1, length, dtype=torch.float32)
    behaviour = torch.full((1, length), -0.5)  # weight e^0.5 per token: e^1000 over the trajectory
    current = old.clone().requires_grad_(True)
    loss, stats = policy_loss(
        current,
        old,
        behaviour,
        torch.tensor([1.0]),
        torch.ones(1, length),
        LossSettings(0.2, 0.2, 2.0, tis_level="sequence"),
    )
    loss.backward()
    assert math.isfinite(float(loss.detach())) and stats.tis_mean == pytest.approx(2.0)
    assert current.grad is not None and torch.isfinite(current.grad).all()


def test_mis_bounds_must_contain_one() -> None:
    zeros = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="mis_low <= 1 <= mis_high"):
        policy_loss(
            zeros,
            zeros,
            zeros,
            torch.tensor([1.0]),
            torch.ones(1, 2),
            LossSettings(0.2, 0.2, 2.0, mis_low=0.5, mis_high=0.9),
        )
