"""The evaluate stage: k attempts per held-out task for each model (base, SFT, GRPO), all on the same tasks.

pass@1 = mean over tasks of the success rate of the task's scored attempts, with a bootstrap CI over tasks; an
attempt lost to the infrastructure is rerun (agent.infra_retries) and otherwise left out; a task with no scored
attempt is reported as missing, never counted as a failure. Artifacts: eval_tasks.json (the instance ids, reused
by every model), eval_results.json (per model: pass@1, CI, per repository and per modifier tables, episode
statuses) and episodes_MODEL.jsonl (every episode's messages and outcome).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import torch

from swerl.agent.episode import run_episode
from swerl.agent.trajectory import Trajectory
from swerl.config import AgentConfig, EngineConfig, EvaluateConfig, StrictModel
from swerl.data.schema import TaskInstance
from swerl.engine.base import SamplingParams
from swerl.engine.local import LocalEngine
from swerl.eval.metrics import pass_at_1
from swerl.stage import Manifest, StageContext, StageResult
from swerl.stages.common import (
    episode_limits,
    episode_with_retries,
    get_dir,
    input_manifest,
    load_tasks,
    run_async,
    sandbox_provider,
    seeded_sample,
)
from swerl.train.model import load_model_and_tokenizer

SOURCES = {"base": ("sft", "base"), "sft": ("sft", "model"), "grpo": ("grpo", "model")}
"""Model name -> (stage whose manifest holds it, artifact directory)."""


class EvaluateStage(StrictModel):
    """What the evaluate stage's checkpoint key covers."""

    evaluate: EvaluateConfig
    agent: AgentConfig
    engine: EngineConfig


def model_dir(ctx: StageContext, name: str) -> Path:
    stage, directory = SOURCES[name]
    manifest: Manifest = input_manifest(ctx, stage)
    return get_dir(ctx.store, manifest, directory, ctx.workdir / f"model_{name}")


async def evaluate_model(
    path: Path, tasks: list[TaskInstance], cfg: EvaluateStage, seed: int, counts: dict[str, int]
) -> list[Trajectory]:
    """k attempts of every task with the model at `path` (infrastructure errors rerun within the budget)."""
    _, tokenizer = load_model_and_tokenizer(path)
    limits = episode_limits(cfg.agent)
    provider = sandbox_provider(cfg.agent.sandbox, git_baseline=True)
    sampling = SamplingParams(max_new_tokens=cfg.agent.max_new_tokens_per_turn,
                              temperature=cfg.evaluate.temperature)  # fmt: skip
    gate = asyncio.Semaphore(cfg.evaluate.concurrency)
    async with LocalEngine(
        path, max_batch_size=cfg.engine.max_batch_size, max_context_tokens=cfg.engine.max_context_tokens,
        seed=seed, intra_op_threads=cfg.engine.threads,
    ) as engine:  # fmt: skip

        async def one(task: TaskInstance, attempt: int) -> Trajectory:
            async def once(retry: int) -> Trajectory:
                return await run_episode(task, engine, provider, tokenizer, limits, sampling, attempt=attempt,
                                         group_id=task.instance_id, rid=f"{task.instance_id}/{attempt}/{retry}")  # fmt: skip

            async with gate:
                return await episode_with_retries(once, cfg.agent.infra_retries, counts)

        return list(await asyncio.gather(*(one(t, k) for t in tasks for k in range(cfg.evaluate.attempts))))


def summarize(
    trajectories: list[Trajectory], tasks: list[TaskInstance], cfg: EvaluateConfig, seed: int
) -> dict[str, Any]:
    by_id = {t.instance_id: t for t in tasks}
    rewards: dict[str, list[float | None]] = defaultdict(list)
    for trajectory in trajectories:
        rewards[trajectory.task_id].append(trajectory.reward)
    overall = pass_at_1(rewards, cfg.bootstrap_samples, cfg.confidence, seed)

    def table(key: str) -> list[dict[str, Any]]:
        groups: dict[str, dict[str, list[float | None]]] = defaultdict(dict)
        for task_id, values in rewards.items():
            groups[str(getattr(by_id[task_id], key) or "")][task_id] = values
        rows = []
        for name in sorted(groups):
            score = pass_at_1(groups[name], cfg.bootstrap_samples, cfg.confidence, seed)
            rows.append({key: name, **{k: round(v, 4) for k, v in score.to_dict().items()}})
        return rows

    statuses = Counter(t.status.value for t in trajectories)
    scored = [t for t in trajectories if t.reward is not None]
    return {
        **overall.to_dict(),
        "statuses": dict(statuses),
        "malformed_calls_mean": sum(t.malformed_tool_calls for t in scored) / max(1, len(scored)),
        "turns_mean": sum(t.num_turns for t in scored) / max(1, len(scored)),
        "tasks_any_resolved": sum(any(v == 1.0 for v in values) for values in rewards.values()),
        "by_repo": table("repo"),
        "by_modifier": table("modifier"),
    }


def run_evaluate(cfg: EvaluateStage, ctx: StageContext) -> StageResult:
    started = time.monotonic()
    torch.set_num_threads(cfg.evaluate.threads)
    curate = input_manifest(ctx, "curate")
    held_out = load_tasks(ctx.store, curate, "eval.parquet")
    if not held_out:
        raise ValueError(f"the curate stage ({curate.uri}) produced no held-out tasks to evaluate on")
    tasks = sorted(seeded_sample(held_out, cfg.evaluate.max_tasks, f"evaluate:{ctx.seed}"),
                   key=lambda t: t.instance_id)  # fmt: skip
    ctx.write_artifact("eval_tasks.json", json.dumps([t.instance_id for t in tasks], indent=1).encode())
    results: dict[str, Any] = {}
    metrics: dict[str, float] = {"tasks": float(len(tasks)), "attempts": float(cfg.evaluate.attempts)}
    for name in cfg.evaluate.checkpoints:
        model_started = time.monotonic()
        path = model_dir(ctx, name)
        counts: dict[str, int] = {}
        trajectories = run_async(evaluate_model(path, tasks, cfg, ctx.seed, counts))
        summary = summarize(trajectories, tasks, cfg.evaluate, ctx.seed)
        summary["failures"] = counts
        summary["wall_s"] = time.monotonic() - model_started
        results[name] = summary
        episodes = "\n".join(
            json.dumps({"task_id": t.task_id, "attempt": t.attempt, "status": t.status.value, "reward": t.reward,
                        "turns": t.num_turns, "malformed": t.malformed_tool_calls, "messages": t.messages[2:]})
            for t in trajectories
        )  # fmt: skip
        ctx.write_artifact(f"episodes_{name}.jsonl", (episodes + "\n").encode())
        for key in ("pass@1", "ci_low", "ci_high", "tasks", "missing"):
            metrics[f"{name}/{key.replace('@', '_at_')}"] = float(summary[key])
        metrics[f"{name}/malformed_calls_mean"] = float(summary["malformed_calls_mean"])
        metrics[f"{name}/wall_s"] = float(summary["wall_s"])
        ctx.log.info("evaluate %s: pass@1 %.3f [%.3f, %.3f] over %d tasks x %d (%s), %.0f s", name,
                     summary["pass@1"], summary["ci_low"], summary["ci_high"], summary["tasks"],
                     cfg.evaluate.attempts, summary["statuses"], summary["wall_s"])  # fmt: skip
    ctx.write_artifact("eval_results.json", json.dumps(results, indent=2, sort_keys=True).encode())
    metrics["wall_s"] = time.monotonic() - started
    markdown = report_markdown(results, cfg.evaluate, len(tasks))
    table = [{"model": name, **{k: round(float(r[k]), 4) for k in ("pass@1", "ci_low", "ci_high", "tasks", "missing")}}
             for name, r in results.items()]  # fmt: skip
    summary_line = ", ".join(f"{n} {r['pass@1']:.3f}" for n, r in results.items())
    return StageResult(metrics=metrics, tables={"pass-at-1": table}, markdown={"evaluation": markdown},
                       summary=f"pass@1: {summary_line}")  # fmt: skip


def report_markdown(results: dict[str, Any], cfg: EvaluateConfig, num_tasks: int) -> str:
    pct = int(round(cfg.confidence * 100))
    lines = [
        "# Held-out evaluation",
        "",
        f"{num_tasks} held-out tasks x {cfg.attempts} attempts (temperature {cfg.temperature}); pass@1 = mean "
        f"per-task success rate, {pct}% bootstrap CI over tasks ({cfg.bootstrap_samples} resamples).",
        "",
        f"| model | pass@1 | {pct}% CI | tasks (denominator) | missing | statuses |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        lines.append(f"| {name} | {r['pass@1']:.3f} | [{r['ci_low']:.3f}, {r['ci_high']:.3f}] | {r['tasks']} | "
                     f"{r['missing']} | {r['statuses']} |")  # fmt: skip
    for name, r in results.items():
        lines += [
            "",
            f"## {name}: by modifier",
            "",
            "| modifier | pass@1 | CI | tasks |",
            "| --- | --- | --- | --- |",
        ]
        for row in r["by_modifier"]:
            lines.append(f"| {row['modifier']} | {row['pass@1']:.3f} | [{row['ci_low']:.3f}, {row['ci_high']:.3f}] | "
                         f"{int(row['tasks'])} |")  # fmt: skip
    return "\n".join(lines) + "\n"
