"""Resumable evaluation: the evaluate stage SIGKILLed mid-stage, rerun, runs only the attempts its journal lacks and
publishes the report an undisturbed run publishes.

The evaluate stage runs for real in a subprocess (`python tests/stages/test_eval_resume_crash.py ROOT STAGE
HOLD`): two tiny Qwen3 checkpoints (base, sft) in the local engine, greedy, real bubblewrap sandboxes on clean micro
repositories, real swebench grading, a file:// store and a sqlite MLflow. Nothing is faked. The child counts every
episode it starts (a line per episode in `ROOT/STAGE.episodes`), and with HOLD = K it stops journaling after its
K-th journal entry (each later write blocks before writing) and says so in `ROOT/STAGE.held`: the test then SIGKILLs
it, so the kill lands with exactly K attempts journaled and others in flight, whatever the machine's speed. The
last entry written is then cut in half, as by a kill mid-write: the rerun must run that attempt again.

The untrained models answer every task alike (a malformed call; the clean repositories' tests pass, so each attempt
is graded 1), so beside eval_results.json the test compares every published attempt (episodes_MODEL.jsonl: status,
reward, grade, patch, messages) with the undisturbed run's.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from swerl.config.agent import AgentConfig
from swerl.config.engine import EngineConfig
from swerl.config.evaluate import EvaluateConfig
from swerl.stages.runner import Manifest, StageContext, StageResult, run_stage
from swerl.storage import Store
from swerl.tracking import Tracker

ROOT = Path(__file__).resolve().parents[2]
TASKS, ATTEMPTS, MODELS = 3, 2, ("base", "sft")
TOTAL = TASKS * ATTEMPTS * len(MODELS)
HOLD = 5  # journal entries written before the kill: the first model's 6 attempts not all done
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
EVALUATE = EvaluateConfig(
    checkpoints=list(MODELS),
    max_tasks=TASKS,
    attempts=ATTEMPTS,
    concurrency=2,
    temperature=0.0,  # greedy: every attempt's result is its own, whatever ran beside it
    bootstrap_samples=200,
    comparison_samples=200,
    by_difficulty=False,
)


def stores(root: Path) -> tuple[Store, Tracker]:
    return Store(f"file://{root}/store"), Tracker(f"sqlite:///{root}/mlflow.db", "eval-crash")


def make_inputs(root: Path) -> list[Manifest]:
    """curate (clean micro tasks, held out) and sft (two tiny untrained models) manifests, by literal stages."""
    from benchmarks.grpo_async import clean_micro_tasks, emulation_tokenizer
    from swerl.data.taskio import tasks_to_parquet
    from swerl.model.loading import save_model_and_tokenizer
    from swerl.stages.common import put_dir
    from tests.tiny_models import SMALL, tiny_qwen3

    def curate(cfg: Any, ctx: StageContext) -> StageResult:
        ctx.write_artifact("train.parquet", tasks_to_parquet([]))
        ctx.write_artifact("eval.parquet", tasks_to_parquet(clean_micro_tasks(TASKS)))
        return StageResult()

    def sft(cfg: Any, ctx: StageContext) -> StageResult:
        tokenizer = emulation_tokenizer(ctx.workdir / "tokenizer")
        for seed, name in enumerate(("base", "model")):
            model = tiny_qwen3(tokenizer, 512, seed=seed, shape=SMALL)
            put_dir(ctx, name, save_model_and_tokenizer(model, tokenizer, ctx.workdir / name))
        return StageResult()

    store, tracker = stores(root)
    return [
        run_stage(name, fn, ENGINE, store=store, tracker=tracker, parent=None).manifest
        for name, fn in (("curate", curate), ("sft", sft))
    ]


def child(root: Path, stage: str, hold: int) -> None:
    """The evaluate process: run the stage to completion (resuming whatever a killed run left), counting episodes;
    with hold > 0, journal writes after the hold-th block forever."""
    from swerl.stages import evaluate, evaluate_journal
    from swerl.stages.evaluate import EvaluateStage, run_evaluate

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    real_episode, real_record = evaluate.run_episode, evaluate_journal.EvalJournal.record
    real_one = evaluate._evaluate_one
    lock, written, model = threading.Lock(), [0], [""]

    def model_named(cfg: Any, ctx: Any, name: str, *args: Any) -> Any:
        model[0] = name
        return real_one(cfg, ctx, name, *args)

    async def counted_episode(task: Any, *args: Any, **kwargs: Any) -> Any:
        with (root / f"{stage}.episodes").open("a") as fh:
            fh.write(f"{os.getpid()} {model[0]} {task.instance_id} {kwargs['attempt']}\n")
        return await real_episode(task, *args, **kwargs)

    def held_record(self: Any, *args: Any, **kwargs: Any) -> bool:
        with lock:
            if written[0] >= hold:
                threading.Event().wait()  # blocks until the SIGKILL
            done = real_record(self, *args, **kwargs)
            written[0] += done
            if done:
                with (root / f"{stage}.journaled").open("a") as fh:
                    fh.write(f"{model[0]} {args[0]} {args[1]} {self.entry_path(args[0], args[1])}\n")
            if written[0] == hold:
                (root / f"{stage}.held").write_text(str(written[0]))
            return done

    evaluate.run_episode = counted_episode  # type: ignore[assignment]
    evaluate._evaluate_one = model_named  # type: ignore[assignment]
    if hold:
        evaluate_journal.EvalJournal.record = held_record  # type: ignore[method-assign]
    store, tracker = stores(root)
    inputs = [Manifest.model_validate_json((root / f"{name}.json").read_text()) for name in ("curate", "sft")]
    cfg = EvaluateStage(evaluate=EVALUATE, agent=AGENT, engine=ENGINE)
    run_stage(stage, run_evaluate, cfg, store=store, tracker=tracker, parent=None, inputs=inputs)


def spawn(root: Path, stage: str, hold: int) -> subprocess.Popen[bytes]:
    log = open(root / f"{stage}.log", "ab")  # noqa: SIM115 - the child writes it
    return subprocess.Popen(
        [sys.executable, __file__, str(root), stage, str(hold)],
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def run_to_end(root: Path, stage: str) -> None:
    process = spawn(root, stage, 0)
    assert process.wait(timeout=900) == 0, (root / f"{stage}.log").read_text()[-3000:]


def episodes(root: Path, stage: str) -> list[tuple[int, str, str, int]]:
    """(pid, model, task, attempt) of every episode the stage's processes started, in order."""
    lines = (root / f"{stage}.episodes").read_text().splitlines()
    return [(int(pid), model, task, int(attempt)) for pid, model, task, attempt in (line.split() for line in lines)]


def journal_entries(store: Store, stage: str) -> dict[str, list[str]]:
    """Per model, the store paths of its journal's entries."""
    [key] = [rel.rsplit("/", 1)[-1] for rel in store.list(f"stages/{stage}")]
    return {m: [r for r in store.list(f"stages/{stage}/{key}/eval_journal/{m}")] for m in MODELS}


def report(store: Store, stage: str) -> tuple[dict[str, Any], dict[str, float]]:
    """The published eval_results.json, less each model's wall time, with each model's published attempts (its
    episodes_MODEL.jsonl, less the grader's timing note) under "episodes"; and the manifest's metrics."""
    [key] = [rel.rsplit("/", 1)[-1] for rel in store.list(f"stages/{stage}")]
    manifest = json.loads(store.read_bytes(f"stages/{stage}/{key}/manifest.json"))

    def artifact(name: str) -> bytes:
        return store.read_bytes(store.rel_of(manifest["artifacts"][name]["uri"]))

    results = json.loads(artifact("eval_results.json"))
    results["episodes"] = {}
    for model, summary in results["models"].items():
        summary.pop("wall_s")
        attempts = [json.loads(line) for line in artifact(f"episodes_{model}.jsonl").splitlines() if line]
        for attempt in attempts:
            if attempt["grade"] is not None:  # none for an attempt lost to the infrastructure
                attempt["grade"].pop("detail")
        results["episodes"][model] = attempts
    return results, manifest["metrics"]


@pytest.mark.slow
def test_sigkill_mid_evaluation_then_rerun_runs_only_the_missing_attempts_and_reports_the_same(tmp_path: Path) -> None:
    os.environ.setdefault("SWERL_CACHE_DIR", str(tmp_path / "swerl-cache"))
    for manifest in make_inputs(tmp_path):
        (tmp_path / f"{manifest.stage}.json").write_text(manifest.model_dump_json())
    store, _ = stores(tmp_path)

    # Undisturbed.
    run_to_end(tmp_path, "evaluate-whole")
    whole, whole_metrics = report(store, "evaluate-whole")
    assert len(episodes(tmp_path, "evaluate-whole")) >= TOTAL
    assert sum(whole_metrics[f"{m}/journal_written"] for m in MODELS) == TOTAL

    # Killed with HOLD attempts journaled (others in flight), the last entry then truncated as by a kill mid-write.
    stage = "evaluate-crash"
    process = spawn(tmp_path, stage, HOLD)
    deadline = time.monotonic() + 900
    while not (tmp_path / f"{stage}.held").exists():
        assert process.poll() is None and time.monotonic() < deadline, (tmp_path / f"{stage}.log").read_text()[-3000:]
        time.sleep(0.1)
    process.kill()
    process.wait()
    first_pid = episodes(tmp_path, stage)[0][0]
    journaled = [line.split() for line in (tmp_path / f"{stage}.journaled").read_text().splitlines()]
    assert len(journaled) == HOLD == sum(len(rs) for rs in journal_entries(store, stage).values())
    *kept, (_, _, _, truncated) = journaled
    body = store.read_bytes(truncated)
    Path(tmp_path / "store" / truncated).write_bytes(body[: len(body) // 2])

    run_to_end(tmp_path, stage)
    rerun = {(model, task, attempt) for pid, model, task, attempt in episodes(tmp_path, stage) if pid != first_pid}
    resumed, metrics = report(store, stage)
    # (1) only the missing attempts ran: every attempt but the journaled ones (the truncated one is redone)
    every = {(m, t, a) for m in MODELS for t in whole["models"][m]["per_task"] for a in range(ATTEMPTS)}
    assert rerun == every - {(m, t, int(a)) for m, t, a, _ in kept}
    assert sum(metrics[f"{m}/journal_reused"] for m in MODELS) == HOLD - 1
    assert sum(metrics[f"{m}/journal_written"] for m in MODELS) == TOTAL - (HOLD - 1)
    assert sum(len(rs) for rs in journal_entries(store, stage).values()) == TOTAL
    # (2) the final report equals the undisturbed run's: pass@1, pass@k, per-task outcomes, tables, comparisons,
    # and every published attempt (status, reward, grade, patch, messages), journaled or run again
    assert resumed == whole
    assert [len(whole["episodes"][m]) for m in MODELS] == [TASKS * ATTEMPTS] * len(MODELS)
    for model in MODELS:
        assert resumed["models"][model]["per_task"] == whole["models"][model]["per_task"]


if __name__ == "__main__":
    child(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
