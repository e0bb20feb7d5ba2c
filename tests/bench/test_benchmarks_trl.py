"""Smoke test of benchmarks/trl_compare.py: a tiny run of both comparisons against TRL prints both ratios."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # ~25 s on an idle 2-core machine, over a minute under load
def test_trl_compare_tiny_run_prints_both_ratios(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    spec = importlib.util.spec_from_file_location("trl_compare", ROOT / "benchmarks" / "trl_compare.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "trl_compare", module)  # dataclasses resolve annotations through it
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # as when run as a script: `from common import ...`
    spec.loader.exec_module(module)
    # One round of one timed step each; a small tokenizer corpus, short rows and tiny GRPO groups. Besides the
    # timings this runs the benchmark's own checks: TRL's packed SFT dataset holds exactly swerl's examples and
    # TRL renders the GRPO prompts to swerl's prompt ids.
    results = module.main(
        [
            *("--rounds", "1", "--sft-steps", "1", "--grpo-steps", "1", "--generate-steps", "1"),
            *("--corpus-bytes", "200000", "--sft-examples", "12", "--seq-len", "1024"),
            *("--prompts", "2", "--generations", "2", "--completion", "8"),
        ]
    )
    out = capsys.readouterr().out
    assert "SFT tokens/s   swerl / TRL = " in out
    assert "GRPO s/step    swerl / TRL = " in out
    for key in (
        "sft_ratio",
        "grpo_ratio",
        "sft_trl_tokens_per_s",
        "grpo_trl_s_per_step",
        "grpo_trl_generation_s",
    ):
        assert math.isfinite(results[key]) and results[key] > 0, key
