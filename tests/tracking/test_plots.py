"""Stage plots: real matplotlib PNGs from GRPO histories and trajectory durations (what MLflow and Prefect show)."""

from __future__ import annotations

import io

import pytest

from swerl.plots import duration_histogram, grpo_curves, step_time_breakdown, step_time_shares

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _size(png: bytes) -> tuple[int, int]:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        return image.size


def test_step_time_shares_match_the_recipes_breakdown() -> None:
    """63% update / 29% waiting / 8% recompute, as the recipe reports, summed over steps; the rest is `other`."""
    history = [
        {
            "time_total_s": 60.0,
            "time_update_s": 40.0,
            "time_wait_rollouts_s": 15.0,
            "time_logprob_recompute_s": 5.0,
        },
        {
            "time_total_s": 40.0,
            "time_update_s": 23.0,
            "time_wait_rollouts_s": 14.0,
            "time_logprob_recompute_s": 3.0,
        },
    ]
    shares = step_time_shares(history)
    assert shares == pytest.approx(
        {
            "actor update": 0.63,
            "waiting for rollouts": 0.29,
            "log-prob recompute": 0.08,
            "weight sync": 0.0,
            "other": 0.0,
        }
    )
    assert step_time_shares([{"time_total_s": 0.0}]) == {}
    png = step_time_breakdown(history)
    assert png is not None and png.startswith(PNG_MAGIC)
    assert step_time_breakdown([]) is None


def test_grpo_curves_draw_reward_and_staleness() -> None:
    history = [{"step": s, "reward_mean": s / 10, "staleness/mean": 0.5, "staleness/max": 1.0} for s in range(1, 6)]
    png = grpo_curves(history)
    assert png is not None and png.startswith(PNG_MAGIC)
    width, height = _size(png)
    assert width > 400 and height > 300
    assert grpo_curves([{"step": 1}]) is None  # no reward: nothing to draw
    sync = grpo_curves([{"reward_mean": 0.5}, {"reward_mean": 0.7}])  # synchronous: no staleness, no step key
    assert sync is not None and sync.startswith(PNG_MAGIC)


def test_duration_histogram_of_a_long_tail() -> None:
    durations = [1.0] * 90 + [30.0] * 9 + [300.0]
    png = duration_histogram(durations, [3] * 100)
    assert png is not None and png.startswith(PNG_MAGIC)
    assert duration_histogram([], []) is None
