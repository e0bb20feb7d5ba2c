"""The CPU pipeline's first stages on real micro tasks, once per test module that asks: curate, oracle traces and
the uninterrupted SFT run (test_stages, test_distributed_stages; a module's own `curate` replaces this one), in the
module's `env` (tests/conftest.py). Their configs are tests/stage_helpers.py's."""

from __future__ import annotations

import pytest

from swerl.config.data import CurateConfig, MicroSource, TracesConfig
from swerl.data.taskio import tasks_from_parquet
from swerl.stages.curate import run_curate
from swerl.stages.runner import Manifest
from swerl.stages.sft import SFTStage, run_sft
from swerl.stages.traces import TracesStage, run_traces
from tests.stage_helpers import AGENT, ENGINE, MODIFIERS, SFT, TEST_COMMAND, Env


@pytest.fixture(scope="module")
def curate(env: Env) -> Manifest:
    micro = MicroSource(train_repos=3, eval_repos=2)
    cfg = CurateConfig(
        repos=[],
        micro=micro,
        modifiers=MODIFIERS,
        max_candidates_per_repo=2,
        clean_runs=1,
        validation_workers=2,
    )
    manifest = env.run("curate", run_curate, cfg).manifest
    assert tasks_from_parquet(env.artifact(manifest, "train.parquet"))
    assert len(tasks_from_parquet(env.artifact(manifest, "eval.parquet"))) >= 2
    return manifest


@pytest.fixture(scope="module")
def traces(env: Env, curate: Manifest) -> Manifest:
    traces = TracesConfig(test_command=TEST_COMMAND, view_whole_file_lines=40, view_function_lines=7)
    return env.run("traces", run_traces, TracesStage(traces=traces, agent=AGENT), [curate]).manifest


@pytest.fixture(scope="module")
def sft(env: Env, curate: Manifest, traces: Manifest) -> Manifest:
    """The uninterrupted SFT run (the resume test trains the same config under another stage name)."""
    return env.run("sft", run_sft, SFTStage.build(sft=SFT, agent=AGENT, engine=ENGINE), [curate, traces]).manifest
