"""Which checkpoints await evaluation: sft/grpo manifests no evaluate manifest took as input (by uri and
fingerprint), each with the curate manifest of its own run; literal stages, a real store and MLflow."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from swerl.config.run import RunConfig
from swerl.stages.runner import Manifest, StageContext, StageResult, run_stage
from swerl.stages.schedule import pending_evaluations, schedule_report
from swerl.storage import Store
from swerl.tracking import Tracker


def literal(body: bytes) -> Any:
    def stage(cfg: Any, ctx: StageContext) -> StageResult:
        ctx.write_artifact("out.bin", body)
        return StageResult()

    return stage


@pytest.fixture(scope="module")
def tracker(tmp_path_factory: pytest.TempPathFactory) -> Tracker:
    return Tracker(f"sqlite:///{tmp_path_factory.mktemp('pending')}/mlflow.db", "pending-test")


def test_pending_checkpoints_follow_evaluations_and_reruns(tmp_path: Path, tracker: Tracker) -> None:
    store = Store(f"file://{tmp_path}/store")

    def run(stage: str, body: bytes, inputs: list[Manifest] | None = None, force: bool = False) -> Manifest:
        return run_stage(
            stage,
            literal(body),
            RunConfig(),
            store=store,
            tracker=tracker,
            parent=None,
            inputs=inputs,
            force=force,
            log=logging.getLogger("test"),
        ).manifest

    assert pending_evaluations(store) == ([], [])
    curate = run("curate", b"tasks")
    traces = run("traces", b"traces", [curate])
    sft = run("sft", b"model-1", [curate, traces])
    grpo = run("grpo", b"policy", [curate, sft])
    pending, problems = pending_evaluations(store)
    assert [(p.checkpoint.uri, p.curate.uri) for p in pending] == [
        (sft.uri, curate.uri),
        (grpo.uri, curate.uri),
    ]
    assert problems == []

    run("evaluate", b"scores", [curate, sft])
    assert [p.checkpoint.uri for p in pending_evaluations(store)[0]] == [grpo.uri]
    run("evaluate", b"scores", [curate, grpo])
    assert pending_evaluations(store) == ([], [])

    # Each GRPO phase's checkpoint (stage grpo-NAME) awaits its own evaluation, in pipeline order.
    wide = run("grpo-wide", b"phase 1", [curate, sft])
    tight = run("grpo-tight", b"phase 2", [curate, sft, wide])
    assert [(p.checkpoint.uri, p.label) for p in pending_evaluations(store)[0]] == [
        (wide.uri, f"grpo-wide/{wide.key}"),
        (tight.uri, f"grpo-tight/{tight.key}"),
    ]
    run("evaluate", b"scores", [curate, sft, wide, tight])
    assert pending_evaluations(store) == ([], [])

    # A forced rerun republishes sft under the same key with other weights: it is pending again.
    sft2 = run("sft", b"model-2", [curate, traces], force=True)
    assert sft2.uri == sft.uri and sft2.fingerprint != sft.fingerprint
    assert [p.checkpoint.fingerprint for p in pending_evaluations(store)[0]] == [sft2.fingerprint]

    # Its curate manifest rerun with other tasks: not evaluated on tasks it was not trained beside; said so.
    run("curate", b"other tasks", force=True)
    pending, problems = pending_evaluations(store)
    assert pending == [] and len(problems) == 1 and "was rerun since" in problems[0] and sft.uri in problems[0]
    report = schedule_report([], problems, store.root_uri)
    assert "Not evaluated:" in report and sft.uri in report
