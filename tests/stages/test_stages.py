"""The agent stages (traces -> sft -> grpo -> evaluate) through run_stage, on real micro tasks.

Nothing is faked: the curate stage synthesizes tasks from micro repositories once per module, the oracle solves
them in real bubblewrap sandboxes, a tiny Qwen3 model (hidden 32, one layer, a 500-token vocabulary) is trained,
sampled by the local engine and graded in sandboxes. The store is a file:// folder and MLflow a sqlite file, both
shared by the module (MLflow migrates a new database for ~10 s). The only injected faults are the crashes of the
SFT resume tests (and a guard that fails if GRPO starts an episode with a refused config).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from transformers import AutoModelForCausalLM

from swerl.agent.tools import TOOL_SPECS
from swerl.agent.traces import load_trace_rows, write_traces
from swerl.config.data import CurateConfig, TracesConfig
from swerl.config.evaluate import EvaluateConfig
from swerl.data.schema import TaskInstance
from swerl.data.taskio import tasks_from_parquet, tasks_to_parquet
from swerl.model.loading import load_model_and_tokenizer
from swerl.model.toolcall import ToolCall, parse_tool_call
from swerl.stages import grpo as grpo_module
from swerl.stages import sft as sft_module
from swerl.stages.common import DurableCheckpoints, get_dir
from swerl.stages.evaluate import (
    EvaluateStage,
    TooManyMissingError,
    check_missing,
    publish,
    run_evaluate,
    summarize,
)
from swerl.stages.grpo import GRPOStage, run_grpo
from swerl.stages.runner import (
    Manifest,
    StageContext,
    StageResult,
    load_manifest,
)
from swerl.stages.sft import SFTStage, run_sft
from swerl.stages.traces import TracesStage, run_traces
from swerl.storage import Store
from swerl.train import sft as train_sft_module
from swerl.train.checkpoint import COMPLETE_MARKER
from swerl.trajectory import EpisodeStatus, Trajectory
from tests.stage_helpers import (
    AGENT,
    CONTEXT,
    ENGINE,
    GRPO,
    SFT,
    TEST_COMMAND,
    TINY,
    Env,
    crash_after_sync,
    stage_key_of,
    state_dict,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread", "micro_cache")]

EVALUATE = EvaluateConfig(max_tasks=2, attempts=1, concurrency=4, bootstrap_samples=200, temperature=0.7)


@pytest.fixture
def scratch_env(env: Env, tmp_path: Path) -> Env:
    """A store of the test's own (the module's MLflow database): for literal input manifests."""
    return Env(Store(f"file://{tmp_path}/store"), env.tracker)


@pytest.fixture(scope="module")
def grpo(env: Env, curate: Manifest, sft: Manifest) -> Manifest:
    return env.run("grpo", run_grpo, GRPOStage(grpo=GRPO, agent=AGENT, engine=ENGINE), [curate, sft]).manifest


def empty_curate(cfg: Any, ctx: StageContext) -> StageResult:
    """A curate stage that found nothing: both task files exist and hold no row."""
    ctx.write_artifact("train.parquet", tasks_to_parquet([]))
    ctx.write_artifact("eval.parquet", tasks_to_parquet([]))
    return StageResult()


# ----------------------------------------------------------------------------------------------------------------
# traces


def test_oracle_traces_are_swe_smith_rows_that_start_with_the_test_command(
    env: Env, curate: Manifest, traces: Manifest
) -> None:
    assert set(traces.artifacts) == {"traces.jsonl", "traces_report.json"}
    assert [ref.stage for ref in traces.inputs] == ["curate"]
    train = tasks_from_parquet(env.artifact(curate, "train.parquet"))
    rows = [json.loads(line) for line in env.artifact(traces, "traces.jsonl").decode().splitlines() if line]
    assert rows and {r["instance_id"] for r in rows} <= {t.instance_id for t in train}
    for row in rows:
        assert row["resolved"] is True and row["model"] == "oracle" and row["traj_id"]
        roles = [m["role"] for m in row["messages"]]
        assert roles[:2] == ["system", "user"] and "assistant" in roles and "tool" in roles
        assert all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in row["messages"])
        first = parse_tool_call(next(m["content"] for m in row["messages"] if m["role"] == "assistant"), TOOL_SPECS)
        assert isinstance(first, ToolCall) and first.name == "bash", first
        assert first.arguments["command"] == TEST_COMMAND
        last = parse_tool_call(row["messages"][-1]["content"], TOOL_SPECS)
        assert isinstance(last, ToolCall) and last.name == "submit"
        # The second call views the function a failing test is named after, whose name the statement shows.
        view = parse_tool_call([m["content"] for m in row["messages"] if m["role"] == "assistant"][1], TOOL_SPECS)
        assert isinstance(view, ToolCall) and view.arguments["command"].startswith("grep -n -A 6 'def "), view
        function = view.arguments["command"].split("'def ")[1].split("(")[0]
        assert f"test_{function}_" in row["messages"][1]["content"]

    report = env.json(traces, "traces_report.json")
    oracle = report["oracle"]
    assert report["source"] == "oracle" and report["traces"] == len(rows) == traces.metrics["traces"]
    assert oracle["attempted"] == len(train) and oracle["traced"] == len(rows)
    assert oracle["traced"] + sum(oracle["skipped"].values()) == oracle["attempted"]
    by_role = report["messages_by_role"]
    assert by_role["system"] == by_role["user"] == len(rows)
    assert by_role["assistant"] == sum(sum(m["role"] == "assistant" for m in r["messages"]) for r in rows)
    assert traces.metrics["assistant_turns_per_trace"] == by_role["assistant"] / len(rows)


def test_dataset_traces_are_checked_row_by_row(env: Env, traces: Manifest, tmp_path: Path) -> None:
    (tmp_path / "oracle.jsonl").write_bytes(env.artifact(traces, "traces.jsonl"))
    rows = load_trace_rows(tmp_path / "oracle.jsonl")
    good = write_traces(rows[:2], tmp_path / "good" / "traces.jsonl")
    outcome = env.run(
        "traces", run_traces, TracesStage(traces=TracesConfig(source="dataset", dataset=str(good)), agent=AGENT)
    )
    report = env.json(outcome.manifest, "traces_report.json")
    assert report["source"] == "dataset" and report["dataset"] == str(good) and report["traces"] == 2
    assert outcome.manifest.inputs == []

    no_assistant = dict(
        rows[0], traj_id="no-assistant.0", messages=[m for m in rows[0]["messages"] if m["role"] != "assistant"]
    )
    bad = write_traces([rows[1], no_assistant], tmp_path / "bad" / "traces.jsonl")
    cfg = TracesStage(traces=TracesConfig(source="dataset", dataset=str(bad)), agent=AGENT)
    with pytest.raises(ValueError, match=r"trace row 1 \(traj_id='no-assistant.0'\) has no assistant turn"):
        env.run("traces", run_traces, cfg)
    assert load_manifest(env.store, "traces", stage_key_of("traces", cfg)) is None


def test_dataset_source_without_a_dataset_is_refused(env: Env) -> None:
    cfg = TracesStage(traces=TracesConfig(source="dataset"), agent=AGENT)
    with pytest.raises(ValueError, match="traces.dataset must name a trace dataset"):
        env.run("traces", run_traces, cfg)


def test_a_test_command_the_tasks_lack_is_named_as_why_there_is_no_trace(env: Env, curate: Manifest) -> None:
    """configs/local.yaml's run_tests.py on a repository without one: the error names the setting and what to set."""
    command = "python no_such_harness.py -q"
    cfg = TracesStage(traces=TracesConfig(test_command=command, max_traces=3), agent=AGENT)
    with pytest.raises(ValueError) as refused:
        env.run("traces", run_traces, cfg, [curate])
    message = str(refused.value)
    assert message.startswith(f"no traces: traces.test_command {command!r} never showed a reference fix")
    assert "{'retest_fails': 3}" in message and "no other repository has a run_tests.py" in message
    assert "Set traces.test_command to null" in message and "--set traces.test_command=null" in message
    assert load_manifest(env.store, "traces", stage_key_of("traces", cfg, [curate])) is None


def test_traces_refuse_a_curation_without_training_tasks(scratch_env: Env) -> None:
    empty = scratch_env.run("curate", empty_curate, CurateConfig(repos=[])).manifest
    cfg = TracesStage(traces=TracesConfig(test_command=TEST_COMMAND), agent=AGENT)
    with pytest.raises(ValueError, match="no training tasks"):
        scratch_env.run("traces", run_traces, cfg, [empty])


# ----------------------------------------------------------------------------------------------------------------
# sft


def test_sft_publishes_loadable_base_and_model_and_the_loss_falls(
    env: Env, traces: Manifest, sft: Manifest, tmp_path: Path
) -> None:
    names = set(sft.artifacts)
    assert "sft_report.json" in names
    assert {
        "base/config.json",
        "model/config.json",
        "base/model.safetensors",
        "model/model.safetensors",
    } <= names
    base_model, base_tokenizer = load_model_and_tokenizer(get_dir(env.store, sft, "base", tmp_path / "base"))
    model, tokenizer = load_model_and_tokenizer(get_dir(env.store, sft, "model", tmp_path / "model"))
    for m in (base_model, model):
        assert (m.config.hidden_size, m.config.num_hidden_layers) == (32, 1)
        assert m.config.max_position_embeddings == CONTEXT
    assert len(tokenizer) == len(base_tokenizer) <= TINY.vocab_size + 16
    trained = model.state_dict()
    assert any(not torch.equal(v, trained[k]) for k, v in base_model.state_dict().items())

    report = env.json(sft, "sft_report.json")
    assert (report["steps"], report["steps_this_attempt"], report["resumed_from"]) == (6, 6, None)
    assert report["examples"] == traces.metrics["traces"]  # every oracle trace fits seq_len
    assert sft.metrics["steps"] == 6
    losses = env.metric_history(sft, "train/loss")
    assert [step for step, _ in losses] == [1, 2, 3, 4, 5, 6]
    assert losses[-1][1] < losses[0][1] - 0.3, losses
    assert report["final_loss"] == pytest.approx(losses[-1][1])
    checkpoints = f"stages/sft/{sft.key}/checkpoints"
    assert env.store.exists(f"{checkpoints}/step_00000006/{COMPLETE_MARKER}")
    # retention: checkpoints at steps 2, 4, 6 were uploaded; the store keeps sft.keep_checkpoints = 2 of them
    kept = sorted(rel.rsplit("/", 1)[-1] for rel in env.store.list(checkpoints))
    assert kept == ["step_00000004", "step_00000006"], kept
    # MLflow: the trained model is the run's output model (weights inside: a tiny one)
    run = env.tracker.client.get_run(sft.mlflow_run_id or "")
    assert [o.model_id for o in run.outputs.model_outputs] == [run.data.tags["swerl.model.id"]]
    assert run.data.tags["swerl.model.weights_inside"] == "true"
    assert "swerl.model.registered" not in run.data.tags  # run_stage without a registered model: log only


def test_sft_trains_max_steps_whatever_the_warmup_took_and_the_same_weights(
    env: Env,
    curate: Manifest,
    traces: Manifest,
    sft: Manifest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A loaded machine's slow warm-up (3 steps of 2 s here) once planned fewer steps from a time budget (12 s /
    2 s < 6); now max_steps decides: the budget only guards, and the weights equal the unbudgeted run's bit for
    bit. (The 3 fast steps have ~6 s of margin, so a busy machine does not trip the guard.)"""
    original = train_sft_module.train_step
    calls: list[int] = []

    def slow_warmup(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) <= 3:
            time.sleep(2.0)
        return original(*args, **kwargs)

    monkeypatch.setattr(train_sft_module, "train_step", slow_warmup)
    cfg = SFTStage.build(sft=SFT.model_copy(update={"time_budget_s": 12.0}), agent=AGENT, engine=ENGINE)
    manifest = env.run("sft-loaded", run_sft, cfg, [curate, traces]).manifest
    report = env.json(manifest, "sft_report.json")
    assert report["steps"] == SFT.max_steps and not report["budget"]["ended_by_budget"], report["budget"]
    assert manifest.metrics["ended_by_budget"] == 0.0 and manifest.metrics["max_steps"] == SFT.max_steps
    reference = state_dict(get_dir(env.store, sft, "model", tmp_path / "reference"))
    weights = state_dict(get_dir(env.store, manifest, "model", tmp_path / "loaded"))
    assert all(torch.equal(reference[k], weights[k]) for k in reference)


def test_sft_time_budget_ends_the_stage_loudly_and_counts_across_resumes(
    env: Env,
    curate: Manifest,
    traces: Manifest,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Steps of 0.5 s against a 1.2 s guard: the stage ends early, said in the log, the report, the manifest's
    metrics and an MLflow tag; the elapsed time is saved in each checkpoint, so a rerun of a crashed stage does
    not start its budget afresh."""
    original = train_sft_module.train_step

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.5)
        return original(*args, **kwargs)

    monkeypatch.setattr(train_sft_module, "train_step", slow)
    sft_cfg = SFT.model_copy(update={"max_steps": 20, "time_budget_s": 1.2, "checkpoint_every": 1})
    cfg = SFTStage.build(sft=sft_cfg, agent=AGENT, engine=ENGINE)
    with caplog.at_level(logging.WARNING):
        manifest = env.run("sft-guard", run_sft, cfg, [curate, traces]).manifest
    report = env.json(manifest, "sft_report.json")
    ended = report["budget"]["ended_at_step"]
    assert report["budget"]["ended_by_budget"] and 1 <= ended < 20 and report["steps"] == ended
    assert manifest.metrics["ended_by_budget"] == 1.0
    assert f"ended the stage at step {ended} of 20" in caplog.text
    tags = env.tracker.client.get_run(manifest.mlflow_run_id).data.tags
    assert tags["swerl.sft.ended_by_budget"] == f"step {ended} of 20"

    # The same config again under another name, crashed after its first checkpoint: the rerun resumes with the
    # first attempt's time counted, so the guard ends it at once instead of granting a fresh 1.2 s.
    original_sync = DurableCheckpoints.sync

    def crash_after_the_first(self: DurableCheckpoints) -> list[str]:
        done = original_sync(self)
        if done:  # step_00000001, holding the ~1 s the first attempt had spent by then
            raise RuntimeError("injected crash")
        return done

    monkeypatch.setattr(DurableCheckpoints, "sync", crash_after_the_first)
    with pytest.raises(RuntimeError, match="injected crash"):
        env.run("sft-guard-crash", run_sft, cfg, [curate, traces])
    monkeypatch.setattr(DurableCheckpoints, "sync", original_sync)
    resumed = env.run("sft-guard-crash", run_sft, cfg, [curate, traces])
    budget = env.json(resumed.manifest, "sft_report.json")["budget"]
    assert budget["elapsed_before_s"] > 0.5 and budget["ended_by_budget"], budget


def test_sft_refuses_a_model_path_without_a_model(env: Env, curate: Manifest, traces: Manifest, tmp_path: Path) -> None:
    empty = tmp_path / "empty-model"
    empty.mkdir()
    cfg = SFTStage.build(sft=SFT.model_copy(update={"model_path": str(empty)}), agent=AGENT, engine=ENGINE)
    with pytest.raises(FileNotFoundError, match=r"missing: model config \(config.json\).*weights.*tokenizer"):
        env.run("sft", run_sft, cfg, [curate, traces])


def test_sft_refuses_token_caps_beyond_the_model_context(env: Env, curate: Manifest, traces: Manifest) -> None:
    agent = AGENT.model_copy(update={"max_trajectory_tokens": 4096})
    engine = ENGINE.model_copy(update={"max_context_tokens": 3000})
    cfg = SFTStage.build(sft=SFT, agent=agent, engine=engine)
    with pytest.raises(ValueError, match=f"context of {CONTEXT} tokens") as caught:
        env.run("sft", run_sft, cfg, [curate, traces])
    message = str(caught.value)
    assert "agent.max_trajectory_tokens" in message and "engine.max_context_tokens" in message
    assert "sft.seq_len" not in message


def test_sft_resumes_exactly_from_the_store_after_a_crash(
    env: Env,
    curate: Manifest,
    traces: Manifest,
    sft: Manifest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A crash after step 4's checkpoint reached the store: the rerun resumes there and ends bitwise equal to
    the uninterrupted run (the `sft` fixture: same config, inputs and seed, another stage name)."""
    cfg = SFTStage.build(sft=SFT, agent=AGENT, engine=ENGINE)
    inputs = [curate, traces]
    key = stage_key_of("sft-crash", cfg, inputs)
    crash_after_sync(monkeypatch, "step_00000004")
    with pytest.raises(RuntimeError, match="injected crash"):
        env.run("sft-crash", run_sft, cfg, inputs)
    monkeypatch.undo()
    assert load_manifest(env.store, "sft-crash", key) is None
    checkpoints = f"stages/sft-crash/{key}/checkpoints"
    assert env.store.exists(f"{checkpoints}/step_00000004/{COMPLETE_MARKER}")
    assert not env.store.exists(f"{checkpoints}/step_00000006")

    resumed = env.run("sft-crash", run_sft, cfg, inputs)
    assert not resumed.skipped and resumed.manifest.key == key
    report = env.json(resumed.manifest, "sft_report.json")
    assert (report["resumed_from"], report["steps_this_attempt"], report["steps"]) == ("step_00000004", 2, 6)
    # one MLflow run across the crash (the resumed attempt continues it): the curve covers steps 1-6, the
    # resumed attempt's points at 5 and 6 (the crashed one may have logged step 5 before its checkpoint was cut)
    steps = [step for step, _ in env.metric_history(resumed.manifest, "train/loss")]
    assert set(steps) == set(range(1, 7)) and max(steps) == 6

    reference = state_dict(get_dir(env.store, sft, "model", tmp_path / "reference"))
    weights = state_dict(get_dir(env.store, resumed.manifest, "model", tmp_path / "resumed"))
    assert reference.keys() == weights.keys()
    assert all(torch.equal(reference[k], weights[k]) for k in reference), [
        k for k in reference if not torch.equal(reference[k], weights[k])
    ]


def test_sft_crashed_after_its_last_checkpoint_publishes_it_and_is_skipped_next_time(
    env: Env, curate: Manifest, traces: Manifest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The rerun trains no step (its final_loss is NaN) and its manifest must still read back: it once was
    written with a null metric that failed validation, so every later run of the stage raised."""
    cfg = SFTStage.build(sft=SFT.model_copy(update={"max_steps": 2, "checkpoint_every": 0}), agent=AGENT, engine=ENGINE)
    original = sft_module.save_model_and_tokenizer

    def crash_on_the_final_model(model: Any, tokenizer: Any, out: Path) -> Path:
        if out.name == "model":
            raise RuntimeError("injected crash after the final checkpoint was synced")
        return original(model, tokenizer, out)

    monkeypatch.setattr(sft_module, "save_model_and_tokenizer", crash_on_the_final_model)
    with pytest.raises(RuntimeError, match="injected crash"):
        env.run("sft-late-crash", run_sft, cfg, [curate, traces])
    monkeypatch.undo()

    resumed = env.run("sft-late-crash", run_sft, cfg, [curate, traces])
    report = env.json(resumed.manifest, "sft_report.json")
    assert (report["resumed_from"], report["steps_this_attempt"], report["steps"]) == ("step_00000002", 0, 2)
    assert math.isnan(resumed.manifest.metrics["final_loss"])
    checkpoint = f"stages/sft-late-crash/{resumed.manifest.key}/checkpoints/step_00000002"
    for name in ("config.json", "model.safetensors"):
        env.store.get_file(f"{checkpoint}/{name}", tmp_path / "checkpoint" / name)
    expected = state_dict(get_dir(env.store, resumed.manifest, "model", tmp_path / "model"))
    got = AutoModelForCausalLM.from_pretrained(tmp_path / "checkpoint", local_files_only=True).state_dict()
    assert all(torch.equal(expected[k], got[k]) for k in expected)

    again = env.run("sft-late-crash", run_sft, cfg, [curate, traces])
    assert again.skipped and again.manifest.attempt == resumed.manifest.attempt
    assert math.isnan(again.manifest.metrics["final_loss"])


def test_forced_sft_trains_afresh_and_a_crash_of_it_resumes_its_own_checkpoints(
    env: Env,
    curate: Manifest,
    traces: Manifest,
    sft: Manifest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """`--force sft` with an unchanged config once restored the key's final durable checkpoint and trained
    nothing (it only published again). Now a forced run trains from the base model, in a force epoch of its own: it
    crashes after step 2 here, leaving the published result readable and the earlier checkpoints untouched; a plain
    rerun resumes the forced attempt from its step 2 (not the earlier final step 6) and ends with the weights of an
    uninterrupted run (the `sft` fixture); `--force` again starts afresh once more."""
    cfg = SFTStage.build(sft=SFT, agent=AGENT, engine=ENGINE)
    inputs = [curate, traces]
    first = env.run("sft-forced", run_sft, cfg, inputs).manifest
    key, earlier = first.key, f"stages/sft-forced/{first.key}/checkpoints"
    assert env.store.exists(f"{earlier}/step_00000006/{COMPLETE_MARKER}")
    crash_after_sync(monkeypatch, "step_00000002")
    with pytest.raises(RuntimeError, match="injected crash"):  # before the fix: resumed at step 6, no step trained
        env.run("sft-forced", run_sft, cfg, inputs, force=True)
    monkeypatch.undo()
    # the published result is still the first one, readable; the earlier attempts' checkpoints are untouched
    assert load_manifest(env.store, "sft-forced", key) == first
    assert env.json(first, "sft_report.json")["steps"] == 6
    kept = sorted(rel.rsplit("/", 1)[-1] for rel in env.store.list(earlier))
    assert kept == ["step_00000004", "step_00000006"], kept
    epoch = json.loads(env.store.read_bytes(f"stages/sft-forced/{key}/force_epoch.json"))["epoch"]
    forced = f"stages/sft-forced/{key}/forced/{epoch}/checkpoints"
    assert env.store.exists(f"{forced}/step_00000002/{COMPLETE_MARKER}")

    resumed = env.run("sft-forced", run_sft, cfg, inputs)  # no --force: the forced attempt is not done yet
    assert not resumed.skipped and resumed.manifest.key == key and resumed.manifest.force_epoch == epoch
    report = env.json(resumed.manifest, "sft_report.json")
    assert (report["resumed_from"], report["steps_this_attempt"], report["steps"]) == ("step_00000002", 4, 6)
    # the forced attempt's MLflow run (tagged so), continued by the resume: its curve starts at step 1 again
    assert resumed.manifest.mlflow_run_id != first.mlflow_run_id
    run = env.tracker.client.get_run(resumed.manifest.mlflow_run_id or "")
    assert (run.data.tags["swerl.forced"], run.data.tags["swerl.force_epoch"]) == ("true", epoch)
    # (the crashed attempt may have logged step 3 before the crash cut its checkpoint)
    assert {step for step, _ in env.metric_history(resumed.manifest, "train/loss")} == set(range(1, 7))
    reference = state_dict(get_dir(env.store, sft, "model", tmp_path / "reference"))
    weights = state_dict(get_dir(env.store, resumed.manifest, "model", tmp_path / "resumed"))
    assert all(torch.equal(reference[k], weights[k]) for k in reference)
    assert sorted(rel.rsplit("/", 1)[-1] for rel in env.store.list(earlier)) == kept
    assert env.run("sft-forced", run_sft, cfg, inputs).skipped

    again = env.run("sft-forced", run_sft, cfg, inputs, force=True).manifest
    report = env.json(again, "sft_report.json")
    assert (report["resumed_from"], report["steps_this_attempt"], report["steps"]) == (None, 6, 6)
    assert again.force_epoch not in ("", epoch) and again.mlflow_run_id != resumed.manifest.mlflow_run_id
    assert env.store.exists(f"{forced}/step_00000006/{COMPLETE_MARKER}")  # the previous epoch's, kept


# ----------------------------------------------------------------------------------------------------------------
# grpo


def test_grpo_takes_its_steps_and_publishes_the_model(env: Env, grpo: Manifest, tmp_path: Path) -> None:
    report = env.json(grpo, "grpo_report.json")
    assert (report["steps"], report["steps_this_attempt"], report["resumed"]) == (2, 2, None)
    assert len(report["history"]) == len(report["reward_by_step"]) == 2
    for stats in report["history"]:
        assert stats["trajectories"] == GRPO.schedule.tasks_per_step * GRPO.rollout.attempts_per_task
        assert stats["groups"] == GRPO.schedule.tasks_per_step and 0.0 <= stats["reward_mean"] <= 1.0
    for name in ("train/reward_mean", "train/loss", "train/groups", "train/time_rollout_s"):
        assert [step for step, _ in env.metric_history(grpo, name)] == [1, 2], name
    assert grpo.metrics["steps"] == 2
    model, _ = load_model_and_tokenizer(get_dir(env.store, grpo, "model", tmp_path / "grpo"))
    assert model.config.max_position_embeddings == CONTEXT
    assert env.store.exists(f"stages/grpo/{grpo.key}/checkpoints/step_00000002/{COMPLETE_MARKER}")
    # the plots people look at: in the stage run's plots/, and the model as its output
    client = env.tracker.client
    plots = {a.path for a in client.list_artifacts(grpo.mlflow_run_id or "", "plots")}
    assert {"plots/reward_and_staleness.png", "plots/step_time_breakdown.png"} <= plots, plots
    run = client.get_run(grpo.mlflow_run_id or "")
    assert [o.model_id for o in run.outputs.model_outputs] == [run.data.tags["swerl.model.id"]]


def test_forced_grpo_trains_afresh_with_checkpoints_and_journal_of_its_own(
    env: Env, curate: Manifest, sft: Manifest
) -> None:
    """`--force grpo` (async: checkpoints and rollout journal): the forced run trains its steps from the SFT model
    (it once resumed from the final checkpoint and trained none), in a force epoch of its own; the earlier result's
    handoff (what a later phase starts from) still points at its own intact checkpoint and journal."""
    schedule = GRPO.schedule.model_copy(update={"steps": 1})
    cfg = GRPOStage(grpo=GRPO.model_copy(update={"mode": "async", "schedule": schedule}), agent=AGENT, engine=ENGINE)
    first = env.run("grpo-forced", run_grpo, cfg, [curate, sft]).manifest
    forced = env.run("grpo-forced", run_grpo, cfg, [curate, sft], force=True).manifest
    report = env.json(forced, "grpo_report.json")
    assert (report["steps"], report["steps_this_attempt"], report["resumed"]) == (1, 1, None)
    assert forced.force_epoch and forced.key == first.key
    root = f"stages/grpo-forced/{first.key}"
    new, old = env.json(forced, "phase_handoff.json"), env.json(first, "phase_handoff.json")
    epoch = f"{root}/forced/{forced.force_epoch}"
    assert (new["checkpoints"], new["journals"]) == (f"{epoch}/checkpoints", [f"{epoch}/rollouts"])
    assert (old["checkpoints"], old["journals"]) == (f"{root}/checkpoints", [f"{root}/rollouts"])
    assert env.store.exists(f"{old['checkpoints']}/{old['checkpoint']}/{COMPLETE_MARKER}")
    assert env.store.list(f"{epoch}/rollouts") and env.store.list(f"{root}/rollouts")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_grpo_that_trained_no_step_does_not_publish_the_sft_weights(
    env: Env, curate: Manifest, sft: Manifest, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A time budget spent before the first step: the stage fails saying so (it once published the SFT model as
    GRPO's result), the budget's end is a warning, and no manifest is written."""
    schedule = GRPO.schedule.model_copy(update={"time_budget_s": 1e-3})
    cfg = GRPOStage(grpo=GRPO.model_copy(update={"mode": mode, "schedule": schedule}), agent=AGENT, engine=ENGINE)
    with (
        caplog.at_level(logging.WARNING),
        pytest.raises(RuntimeError, match=r"trained 0 of 2 steps .*not published"),
    ):
        env.run(f"grpo-no-step-{mode}", run_grpo, cfg, [curate, sft])
    assert "ended the stage at step 0 of 2" in caplog.text
    assert (
        load_manifest(env.store, f"grpo-no-step-{mode}", stage_key_of(f"grpo-no-step-{mode}", cfg, [curate, sft]))
        is None
    )


def test_grpo_time_budget_ends_the_stage_loudly_and_counts_across_resumes(
    env: Env,
    curate: Manifest,
    sft: Manifest,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Step 1's checkpoint upload takes past the 20 s guard: the stage ends at step 1 of 2, said in the log, the
    report, the manifest's metrics and an MLflow tag. Then a crash after step 1's checkpoint: the rerun resumes with
    the first attempt's seconds (saved in the checkpoint) counted against its budget."""
    schedule = GRPO.schedule.model_copy(update={"time_budget_s": 20.0})
    cfg = GRPOStage(grpo=GRPO.model_copy(update={"schedule": schedule}), agent=AGENT, engine=ENGINE)
    original = DurableCheckpoints.sync

    def slow_after_step_1(self: DurableCheckpoints) -> list[str]:
        done = original(self)
        if "step_00000001" in done:
            time.sleep(20.0)
        return done

    monkeypatch.setattr(DurableCheckpoints, "sync", slow_after_step_1)
    with caplog.at_level(logging.WARNING):
        manifest = env.run("grpo-guard", run_grpo, cfg, [curate, sft]).manifest
    report = env.json(manifest, "grpo_report.json")
    assert report["steps"] == 1 and report["budget"]["ended_by_budget"] and report["budget"]["ended_at_step"] == 1
    assert manifest.metrics["ended_by_budget"] == 1.0 and manifest.metrics["max_steps"] == 2
    assert "ended the stage at step 1 of 2" in caplog.text
    assert env.tracker.client.get_run(manifest.mlflow_run_id).data.tags["swerl.grpo.ended_by_budget"] == "step 1 of 2"

    def crash_after_step_1(self: DurableCheckpoints) -> list[str]:
        done = original(self)
        if "step_00000001" in done:
            raise RuntimeError("injected crash")
        return done

    cfg = GRPOStage(
        grpo=GRPO.model_copy(update={"schedule": schedule.model_copy(update={"time_budget_s": 600.0})}),
        agent=AGENT,
        engine=ENGINE,
    )
    monkeypatch.setattr(DurableCheckpoints, "sync", crash_after_step_1)
    with pytest.raises(RuntimeError, match="injected crash"):
        env.run("grpo-guard-crash", run_grpo, cfg, [curate, sft])
    monkeypatch.setattr(DurableCheckpoints, "sync", original)
    report = env.json(env.run("grpo-guard-crash", run_grpo, cfg, [curate, sft]).manifest, "grpo_report.json")
    assert (report["steps"], report["steps_this_attempt"]) == (2, 1)
    assert report["budget"]["elapsed_before_s"] > 0 and not report["budget"]["ended_by_budget"], report["budget"]


def test_grpo_refuses_an_agent_cap_beyond_the_engine_context(
    env: Env, curate: Manifest, sft: Manifest, monkeypatch: pytest.MonkeyPatch
) -> None:
    episodes: list[Any] = []

    async def no_episode(*args: Any, **kwargs: Any) -> Any:
        episodes.append(args)
        raise AssertionError("an episode ran before the config was checked")

    monkeypatch.setattr(grpo_module, "run_episode", no_episode)
    agent = AGENT.model_copy(update={"max_trajectory_tokens": CONTEXT})  # fits the model, not the engine
    cfg = GRPOStage(grpo=GRPO, agent=agent, engine=ENGINE)
    with pytest.raises(
        ValueError,
        match=rf"agent.max_trajectory_tokens \({CONTEXT}\) exceeds "
        rf"engine.max_context_tokens \({ENGINE.max_context_tokens}\)",
    ):
        env.run("grpo", run_grpo, cfg, [curate, sft])
    assert episodes == []


# ----------------------------------------------------------------------------------------------------------------
# evaluate


def test_evaluate_scores_every_model_on_the_same_held_out_tasks(
    env: Env, curate: Manifest, sft: Manifest, grpo: Manifest
) -> None:
    cfg = EvaluateStage(evaluate=EVALUATE, agent=AGENT, engine=ENGINE)
    outcome = env.run("evaluate", run_evaluate, cfg, [curate, sft, grpo])
    manifest, result = outcome.manifest, outcome.result
    assert result is not None
    held_out = {t.instance_id: t for t in tasks_from_parquet(env.artifact(curate, "eval.parquet"))}
    ids = env.json(manifest, "eval_tasks.json")
    assert len(ids) == min(EVALUATE.max_tasks, len(held_out)) and set(ids) <= set(held_out)

    results = env.json(manifest, "eval_results.json")["models"]
    assert set(results) == {"base", "sft", "grpo"}
    run = env.tracker.client.get_run(manifest.mlflow_run_id)
    for name, summary in results.items():
        episodes = [
            json.loads(line) for line in env.artifact(manifest, f"episodes_{name}.jsonl").splitlines() if line.strip()
        ]
        assert sorted(e["task_id"] for e in episodes) == sorted(ids * EVALUATE.attempts), name
        assert summary["tasks"] + summary["missing"] == len(ids)
        assert 0.0 <= summary["ci_low"] <= summary["pass@1"] <= summary["ci_high"] <= 1.0, summary
        assert sum(summary["statuses"].values()) == len(ids) * EVALUATE.attempts
        assert {row["repo"] for row in summary["by_repo"]} == {held_out[i].repo for i in ids}
        assert {row["modifier"] for row in summary["by_modifier"]} == {held_out[i].modifier for i in ids}
        assert all({"pass@1", "ci_low", "ci_high", "tasks"} <= set(row) for row in summary["by_modifier"])
        for key in ("pass_at_1", "ci_low", "ci_high", "tasks", "missing"):
            assert run.data.metrics[f"{name}/{key}"] == manifest.metrics[f"{name}/{key}"]
        assert manifest.metrics[f"{name}/pass_at_1"] == summary["pass@1"]
    assert [row["model"] for row in result.tables["pass-at-1"]] == ["base", "sft", "grpo"]
    assert "| grpo |" in result.markdown["evaluation"]
    # base -> sft -> grpo paired on the same tasks; one MLflow eval run per model, linked to its stage's run
    comparisons = env.json(manifest, "eval_results.json")["comparisons"]
    assert [(c["a"], c["b"]) for c in comparisons] == [("base", "sft"), ("sft", "grpo")]
    experiment = run.info.experiment_id
    eval_runs = env.tracker.client.search_runs([experiment], f"tags.mlflow.parentRunId = '{run.info.run_id}'")
    linked = {r.data.tags["swerl.eval.checkpoint"]: r.data.tags["swerl.checkpoint.run_id"] for r in eval_runs}
    assert linked == {"base": sft.mlflow_run_id, "sft": sft.mlflow_run_id, "grpo": grpo.mlflow_run_id}
    assert all(r.data.params["checkpoint"] == r.data.tags["swerl.eval.checkpoint"] for r in eval_runs)
    assert result.images["pass_at_1_by_stratum"].startswith(b"\x89PNG")
    assert [a.path for a in env.tracker.client.list_artifacts(run.info.run_id, "plots")] == [
        "plots/pass_at_1_by_stratum.png"
    ]


def test_evaluate_refuses_a_curation_without_held_out_tasks(scratch_env: Env) -> None:
    empty = scratch_env.run("curate", empty_curate, CurateConfig(repos=[])).manifest
    cfg = EvaluateStage(evaluate=EVALUATE, agent=AGENT, engine=ENGINE)
    with pytest.raises(ValueError, match="no held-out tasks"):
        scratch_env.run("evaluate", run_evaluate, cfg, [empty])


def test_evaluate_fails_naming_the_missing_tasks_instead_of_publishing_nan() -> None:
    """A model whose tasks were lost to the infrastructure: over evaluate.max_missing_share missing fails the
    stage before anything is published, naming the tasks; every task missing (pass@1 NaN) always fails."""
    tasks = [
        TaskInstance(
            instance_id=f"micro__t{i}",
            repo="swerl-micro/eval-0",
            base_commit="c",
            problem_statement="p",
            patch="d",
            patch_kind="bug",
            FAIL_TO_PASS=["t::a"],
            source="test",
        )
        for i in (1, 2)
    ]
    ok, lost = tasks

    def attempt(task_id: str, reward: float | None) -> Trajectory:
        status = EpisodeStatus.INFRA_ERROR if reward is None else EpisodeStatus.RESOLVED
        return Trajectory(
            task_id=task_id, status=status, reward=reward, infra_cause="engine_http" if reward is None else None
        )

    half = summarize([attempt(ok.instance_id, 1.0), attempt(lost.instance_id, None)], tasks, EVALUATE, 0)
    none = summarize([attempt(ok.instance_id, None), attempt(lost.instance_id, None)], tasks, EVALUATE, 0)
    assert math.isnan(none["pass@1"])
    ctx: Any = None  # the check comes before any artifact: publish never reaches the context
    with pytest.raises(TooManyMissingError, match=rf"sft: 1 of 2 tasks missing \(50%\): {lost.instance_id}"):
        publish(EVALUATE, ctx, {"sft": half}, {}, cast(Any, None), "")
    with pytest.raises(TooManyMissingError, match="base: 2 of 2 tasks missing"):
        publish(
            EVALUATE.model_copy(update={"max_missing_share": 1.0}),
            ctx,
            {"base": none},
            {},
            cast(Any, None),
            "",
        )
    check_missing(EVALUATE.model_copy(update={"max_missing_share": 0.5}), {"sft": half})  # within the share
