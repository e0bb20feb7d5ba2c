"""The asynchronous GRPO stage, run for real in this process: failure counts across a crash, and evaluation of
checkpoints beside training.

A tiny Qwen3 in the local engine, real bubblewrap sandboxes on clean micro repositories (train and held-out
splits), real grading, a file:// store and a sqlite MLflow. Injected: infrastructure errors on the first episodes
and a crash of the trainer (the failure-count test), and a hold on the first evaluation until the trainer has
started its third step (the evaluation test: had training waited for the evaluation, it would never end).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from benchmarks.grpo_async import clean_micro_tasks, emulation_tokenizer
from swerl.config.agent import AgentConfig
from swerl.config.engine import EngineConfig
from swerl.config.grpo import GRPOConfig
from swerl.data.taskio import tasks_to_parquet
from swerl.model.loading import save_model_and_tokenizer
from swerl.stages import evaluate as evaluate_module
from swerl.stages import grpo as grpo_module
from swerl.stages import grpo_eval
from swerl.stages.common import put_dir
from swerl.stages.grpo import GRPOStage, run_grpo
from swerl.stages.grpo_state import FAILURES_FILE
from swerl.stages.runner import Manifest, StageContext, StageOutcome, StageResult, run_stage, stage_key
from swerl.storage import Store
from swerl.tracking import Tracker
from swerl.train.grpo_trainer import GRPOTrainer
from swerl.trajectory import EpisodeStatus, Trajectory
from tests.tiny_models import SMALL, tiny_qwen3

pytestmark = pytest.mark.usefixtures("one_torch_thread", "micro_cache")

B, N = 2, 2
GRPO = GRPOConfig.model_validate(
    {
        "mode": "async",
        "threads": 1,
        "schedule": {"steps": 2, "tasks_per_step": B, "checkpoint_every": 1},
        "rollout": {"attempts_per_task": N, "max_in_flight": 4, "max_staleness": 1, "max_extra_groups_per_step": 1},
        "algorithm": {"lr": 1e-3},
    }
)


def grpo_with(**sections: dict[str, Any]) -> GRPOConfig:
    """GRPO with some fields of its sections changed."""
    data = GRPO.model_dump()
    for section, values in sections.items():
        data[section] |= values
    return GRPOConfig.model_validate(data)


AGENT = AgentConfig(
    max_turns=2,
    max_trajectory_tokens=512,
    max_new_tokens_per_turn=16,
    max_malformed_calls=1,
    command_timeout_s=20,
    test_timeout_s=30,
    infra_retries=1,
)
ENGINE = EngineConfig.model_validate({"max_batch_size": 4, "max_context_tokens": 512, "local": {"threads": 1}})


@dataclass
class Env:
    store: Store
    tracker: Tracker
    inputs: list[Manifest]

    def run(self, stage: str, cfg: GRPOStage) -> StageOutcome:
        return run_stage(
            stage,
            run_grpo,
            cfg,
            store=self.store,
            tracker=self.tracker,
            parent=None,
            inputs=self.inputs,
            seed=0,
            log=logging.getLogger(f"swerl.test.{stage}"),
        )

    def report(self, manifest: Manifest) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(
            self.store.read_bytes(self.store.rel_of(manifest.artifact("grpo_report.json").uri))
        )
        return data

    def metric(self, manifest: Manifest, key: str) -> list[tuple[int, float]]:
        assert manifest.mlflow_run_id
        history = self.tracker.client.get_metric_history(manifest.mlflow_run_id, key)
        return sorted((m.step, m.value) for m in history)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, micro_cache: Path) -> Env:
    """curate (clean micro tasks: 6 train, 2 held out) and sft (a tiny untrained model), by literal stages."""
    root = tmp_path_factory.mktemp("grpo-async-eval")
    store, tracker = Store(f"file://{root}/store"), Tracker(f"sqlite:///{root}/mlflow.db", "grpo-async-eval")

    def curate(cfg: Any, ctx: StageContext) -> StageResult:
        ctx.write_artifact("train.parquet", tasks_to_parquet(clean_micro_tasks(6)))
        ctx.write_artifact("eval.parquet", tasks_to_parquet(clean_micro_tasks(2, split="eval")))
        return StageResult()

    def sft(cfg: Any, ctx: StageContext) -> StageResult:
        tokenizer = emulation_tokenizer(ctx.workdir / "tokenizer")
        model = tiny_qwen3(tokenizer, 512, shape=SMALL)
        put_dir(ctx, "model", save_model_and_tokenizer(model, tokenizer, ctx.workdir / "model"))
        return StageResult()

    inputs = [
        run_stage(name, fn, ENGINE, store=store, tracker=tracker, parent=None).manifest
        for name, fn in (("curate", curate), ("sft", sft))
    ]
    return Env(store, tracker, inputs)


def leftover_threads() -> list[str]:
    """Threads of an evaluation or of a local engine still alive."""
    return [t.name for t in threading.enumerate() if t.name.startswith(("swerl-grpo-eval", "local-engine"))]


def test_eval_beside_training_needs_async_mode() -> None:
    with pytest.raises(ValueError, match="eval.every .* needs mode async"):
        GRPOConfig.model_validate({"mode": "sync", "eval": {"every": 1}})
    assert GRPOConfig.model_validate({"mode": "async", "eval": {"every": 1}}).eval.concurrency >= 1


# ----------------------------------------------------------------------------------------------------------------
# Failure counts are part of the checkpoint


def test_failure_counts_continue_from_the_checkpoint_after_a_crash(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first three episode tries end in injected infrastructure errors; the trainer crashes in step 2 (after
    step 1's checkpoint). The rerun resumes there: its failures/* counts start from the checkpoint's, not 0."""
    stage, cfg = "grpo-failures", GRPOStage(grpo=GRPO, agent=AGENT, engine=ENGINE)
    real_episode, real_step = grpo_module.run_episode, GRPOTrainer.train_step
    finished = itertools.count()

    async def flaky(*args: Any, **kwargs: Any) -> Trajectory:
        trajectory: Trajectory = await real_episode(*args, **kwargs)
        if next(finished) < 3:
            return trajectory.model_copy(
                update={
                    "status": EpisodeStatus.INFRA_ERROR,
                    "reward": None,
                    "infra_cause": "sandbox_died",
                    "infra_message": "injected",
                }
            )
        return trajectory

    def crashing_step(self: GRPOTrainer, groups: Any) -> dict[str, float]:
        if self.step == 1:
            raise RuntimeError("injected crash in step 2")
        return real_step(self, groups)

    monkeypatch.setattr(grpo_module, "run_episode", flaky)
    monkeypatch.setattr(GRPOTrainer, "train_step", crashing_step)
    with pytest.raises(RuntimeError, match="injected crash"):
        env.run(stage, cfg)
    key = stage_key(stage, cfg, env.inputs, 0)
    checkpoint = f"stages/{stage}/{key}/checkpoints/step_00000001"
    saved = json.loads(env.store.read_bytes(f"{checkpoint}/{FAILURES_FILE}"))
    assert saved.get("infra_error.sandbox_died", 0) >= 2, saved  # injected (some retries may be injected too)

    monkeypatch.setattr(GRPOTrainer, "train_step", real_step)
    monkeypatch.setattr(grpo_module, "run_episode", real_episode)
    manifest = env.run(stage, cfg).manifest
    report = env.report(manifest)
    assert report["resumed"] == "step_00000001" and report["steps"] == 2 and report["steps_this_attempt"] == 1
    for cause, count in saved.items():
        assert report["failures"].get(cause, 0) >= count, (cause, saved, report["failures"])
        # the resumed attempt continues the crashed attempt's MLflow run: its step-2 value continues the counts
        assert env.metric(manifest, f"train/failures/{cause}")[-1] >= (2, count)


# ----------------------------------------------------------------------------------------------------------------
# Evaluation of checkpoints beside training


def test_checkpoints_are_evaluated_beside_training_without_delaying_it(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """eval.every 1 over 3 steps. The first evaluation is held open until the trainer has started step 3 (so step 2
    comes due while it runs: skipped and counted); had the trainer or the rollouts waited for it, the stage would
    never end. Every evaluation logs eval/* at the step it evaluated; nothing is left running afterwards (warm
    sandboxes of groups warmed ahead included)."""
    steps = 3
    g = grpo_with(
        schedule={"steps": steps, "checkpoint_every": 0},
        rollout={"prewarm_groups": 1},
        eval={"every": 1, "tasks": 2, "attempts": 1, "concurrency": 2, "temperature": 0.7},
    )
    cfg = GRPOStage(grpo=GRPOConfig.model_validate(g.model_dump()), agent=AGENT, engine=ENGINE)
    real_step, real_evaluate = GRPOTrainer.train_step, grpo_eval.evaluate_model
    step_started: list[float] = []
    step_finished: list[float] = []
    progress = threading.Condition()

    def timed_step(self: GRPOTrainer, groups: Any) -> dict[str, float]:
        with progress:
            step_started.append(time.time())
            progress.notify_all()
        stats = real_step(self, groups)
        step_finished.append(time.time())
        return stats

    async def held_evaluate(*args: Any, **kwargs: Any) -> Any:
        result = await real_evaluate(*args, **kwargs)
        if not hasattr(held_evaluate, "held"):  # the first evaluation only
            held_evaluate.held = True  # type: ignore[attr-defined]

            def wait() -> bool:
                with progress:
                    return progress.wait_for(lambda: len(step_started) >= steps, timeout=120)

            assert await asyncio.to_thread(wait), "the trainer did not reach step 3 while an evaluation ran"
        return result

    monkeypatch.setattr(GRPOTrainer, "train_step", timed_step)
    monkeypatch.setattr(grpo_eval, "evaluate_model", held_evaluate)
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    started = time.monotonic()
    manifest = env.run("grpo-eval", cfg).manifest
    wall = time.monotonic() - started

    report = env.report(manifest)
    evaluations = report["evaluations"]
    assert report["steps"] == steps, report
    assert not evaluations["errors"] and not evaluations["cancelled"], evaluations
    evaluated = [entry["step"] for entry in evaluations["evaluated"]]
    assert evaluated[0] == 1 and 2 in evaluations["skipped"], evaluations
    assert sorted(evaluated + evaluations["skipped"]) == list(range(1, steps + 1)), evaluations
    first = evaluations["evaluated"][0]
    assert first["tasks"] == 2 and first["attempts_per_task"] == 1 and 0.0 <= first["pass@1"] <= 1.0, first
    # Trainer steps 2 and 3 ran while the first evaluation was running: training was not held up by it.
    running = (first["started_at"], first["finished_at"])
    assert running[0] < step_started[1] < step_finished[1] < running[1], (running, step_finished)
    assert running[0] < step_started[2] < running[1], (running, step_started)
    # eval/* metrics at the steps evaluated; the skipped count at the steps skipped.
    assert [step for step, _ in env.metric(manifest, "eval/pass_at_1")] == evaluated
    assert [step for step, _ in env.metric(manifest, "eval/tasks")] == evaluated
    # the learning curve: a picture of the evaluated steps, published with the stage
    curve = manifest.artifact("learning_curve.png")
    png = env.store.read_bytes(env.store.rel_of(curve.uri))
    assert curve.size > 10_000 and png.startswith(b"\x89PNG\r\n\x1a\n")
    skipped = [(step, float(count)) for count, step in enumerate(evaluations["skipped"], 1)]
    assert env.metric(manifest, "eval/skipped") == skipped
    assert len(env.metric(manifest, "train/reward_mean")) == steps
    # prewarm_groups 1: groups after the first found their sandboxes started (and their environment prepared)
    assert env.metric(manifest, "train/pool/warm.ahead")[-1][1] > 0
    assert env.metric(manifest, "train/pool/start.warm")[-1][1] > 0
    # Nothing left running: no evaluation or engine thread, no child process (sandbox, engine server).
    deadline = time.monotonic() + 10
    while leftover_threads() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not leftover_threads()
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children_before
    print(
        f"grpo with evaluation beside training: {wall:.1f} s; evaluated {evaluated}, skipped {evaluations['skipped']}"
    )


def test_the_starting_weights_are_evaluated_first_when_asked(env: Env) -> None:
    """eval.at_start: step 0 (the SFT model the stage starts from) is evaluated on the same tasks, beside training,
    so the learning curve starts where GRPO started."""
    g = grpo_with(
        schedule={"steps": 1, "checkpoint_every": 0}, eval={"every": 1, "tasks": 1, "concurrency": 1, "at_start": True}
    )
    cfg = GRPOStage(grpo=GRPOConfig.model_validate(g.model_dump()), agent=AGENT, engine=ENGINE)
    manifest = env.run("grpo-eval-start", cfg).manifest
    evaluations = env.report(manifest)["evaluations"]
    evaluated = [entry["step"] for entry in evaluations["evaluated"]]
    assert evaluated[0] == 0 and sorted(evaluated + evaluations["skipped"]) == [0, 1], evaluations
    assert not evaluations["errors"] and not evaluations["cancelled"], evaluations
    assert [step for step, _ in env.metric(manifest, "eval/pass_at_1")] == evaluated
    assert not leftover_threads()


def test_a_running_evaluation_is_cancelled_at_the_end_when_configured(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """eval_at_end cancel: the evaluation of the last step, held inside its episodes (engine and sandbox pool
    open), is cancelled when training ends; it is reported as cancelled, and its engine thread is gone."""
    g = grpo_with(
        schedule={"steps": 1, "checkpoint_every": 0},
        eval={"every": 1, "tasks": 1, "concurrency": 1, "at_end": "cancel"},
    )
    cfg = GRPOStage(grpo=GRPOConfig.model_validate(g.model_dump()), agent=AGENT, engine=ENGINE)
    real_episode = evaluate_module.run_episode

    async def endless(*args: Any, **kwargs: Any) -> Trajectory:
        await real_episode(*args, **kwargs)
        await asyncio.sleep(3600)  # only a cancellation ends it
        raise AssertionError("not cancelled")

    monkeypatch.setattr(evaluate_module, "run_episode", endless)
    started = time.monotonic()
    report = env.report(env.run("grpo-eval-cancel", cfg).manifest)
    assert time.monotonic() - started < 120
    evaluations = report["evaluations"]
    assert evaluations["cancelled"] == [1], evaluations
    assert not evaluations["evaluated"] and not evaluations["errors"], evaluations
    assert not leftover_threads()
