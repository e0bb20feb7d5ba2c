"""What the Prefect UI shows of a stage: artifact keys without the stage twice, plots inlined as data: URIs; and
which datasets a stage run names as its MLflow inputs. (Pure functions; the flow test runs them on a server.)"""

from __future__ import annotations

import base64

import pytest

from swerl.pipeline import stage_datasets
from swerl.plots import step_time_breakdown
from swerl.stages.runner import ArtifactRecord, Manifest
from tasks.stages import INLINE_IMAGE_MAX_BYTES, _artifact_key, image_markdown


@pytest.mark.parametrize(
    ("stage", "name", "key"),
    [
        ("sft", "sft", "sft"),
        ("curate", "curate", "curate"),
        ("grpo-explore", "grpo", "grpo-explore"),
        ("grpo", "grpo", "grpo"),
        ("curate", "yield", "curate-yield"),
        ("evaluate", "pass-at-1", "evaluate-pass-at-1"),
        ("sft", "progress", "sft-progress"),
        ("grpo-Tight_2", "plots", "grpo-tight-2-plots"),
    ],
)
def test_artifact_keys_never_repeat_the_stage(stage: str, name: str, key: str) -> None:
    assert _artifact_key(stage, name) == key


def test_a_plot_is_inlined_as_a_png_data_uri_and_a_huge_one_is_not() -> None:
    png = step_time_breakdown([{"time_total_s": 1.0, "time_update_s": 0.63}]) or b""
    text = image_markdown("step time", png)
    assert text.startswith("![step time](data:image/png;base64,") and text.endswith(")")
    assert base64.b64decode(text.split(",", 1)[1][:-1]) == png
    big = image_markdown("huge", b"x" * (INLINE_IMAGE_MAX_BYTES + 1))
    assert "data:" not in big and "too large" in big


def _manifest(stage: str, *names: str) -> Manifest:
    arts = {n: ArtifactRecord(name=n, uri=f"file:///s/{stage}/{n}", sha256="ab" * 32, size=1) for n in names}
    return Manifest(
        stage=stage,
        key="k",
        attempt="a",
        config_hash="h",
        artifacts=arts,
        started_at="",
        finished_at="",
        duration_s=0.0,
    )


def test_each_stage_names_what_it_trains_or_evaluates_on() -> None:
    curate = _manifest("curate", "train.parquet", "eval.parquet", "curate_report.json")
    traces = _manifest("traces", "traces.jsonl")
    assert stage_datasets("sft", [curate, traces]) == [
        ("traces/traces.jsonl", "file:///s/traces/traces.jsonl", "ab" * 32, "training")
    ]
    assert [d[0] for d in stage_datasets("grpo-tight", [curate])] == ["curate/train.parquet"]
    assert [(d[0], d[3]) for d in stage_datasets("evaluate", [curate])] == [("curate/eval.parquet", "evaluation")]
    assert stage_datasets("curate", []) == [] and stage_datasets("sft", [curate]) == []
