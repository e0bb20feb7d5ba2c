"""Held-out evaluation: which models, on which tasks, how many attempts, graded how."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from swerl.config.base import StrictModel
from swerl.config.data import DatasetSource

CHECKPOINT_NAMES: tuple[str, ...] = ("base", "sft", "grpo")
"""Models the evaluate stage can name: base and sft (from the sft stage), grpo (every GRPO phase among its inputs),
and grpo-NAME (one phase of grpo.phases)."""


class EvaluateConfig(StrictModel):
    """Held-out evaluation: a stratified subset, k attempts per task, pass@k with bootstrap CIs, paired tests."""

    form_first = ("max_tasks", "checkpoints")

    checkpoints: list[Annotated[str, Field(pattern=r"^(base|sft|grpo|grpo-[a-z0-9][a-z0-9_]*)$")]] = Field(
        default_factory=lambda: list(CHECKPOINT_NAMES), min_length=1
    )
    """Which models are evaluated, each on the same tasks (those whose stage is among the inputs): base, sft, grpo
    (every GRPO phase: the one `grpo` stage, or each grpo-NAME of grpo.phases) or grpo-NAME (that phase)."""
    max_tasks: int = Field(100, ge=1, le=10_000_000)
    """Subset size: held-out tasks drawn proportionally from repository x difficulty strata (an error if the
    held-out set is smaller)."""
    dataset: DatasetSource | None = None
    """Evaluate on these tasks instead of the curate stage's held-out split (e.g. SWE-bench/SWE-bench_Verified,
    split test, schema swebench: swebench 5's rows, each with its eval_script; or another curate stage's
    eval.parquet, schema swerl); each task keeps its environment. None: the held-out split."""
    split: Literal["held_out", "train"] = "held_out"
    """Without `dataset`: the curate stage's held-out split, or its training split (the tasks SFT and GRPO trained on,
    a fixed stratified probe set of max_tasks: how well training fitted them, not generalisation; the report says
    which split it is)."""
    by_difficulty: bool = True
    """Strata are repository x difficulty; False (or a dataset without labels): repository only."""
    grader: Literal["swebench", "episode"] = "swebench"
    """swebench: each attempt's patch re-run in a fresh sandbox, its test log graded by the swebench package
    (extra `swebench`); episode: the episode's own in-workspace grade."""
    comparison_samples: int = Field(10_000, ge=100, le=10_000_000)
    """Paired bootstrap resamples and Monte Carlo sign flips of a paired comparison of two checkpoints."""
    attempts: int = Field(2, ge=1, le=10_000)
    """k attempts per task."""
    temperature: float = Field(0.7, ge=0, le=10)
    """Sampling temperature (0: greedy)."""
    concurrency: int = Field(8, ge=1, le=1_000_000)
    """Episodes running at once."""
    bootstrap_samples: int = Field(2000, ge=100, le=10_000_000)
    """Bootstrap resamples (over tasks) of each pass@k confidence interval."""
    confidence: float = Field(0.95, gt=0, lt=1)
    """Confidence level of the intervals (and 1 - the significance level of comparisons)."""
    threads: int = Field(1, ge=1, le=1024)
    """torch intra-op threads of the engine."""
    max_missing_share: float = Field(0.2, ge=0, le=1)
    """A model with more than this share of its tasks missing (no valid attempt) fails the stage, naming them."""
