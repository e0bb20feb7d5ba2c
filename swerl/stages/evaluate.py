"""The evaluate stage: k attempts per task of a stratified held-out subset, for each model, all on the same tasks.

The subset (swerl.eval.stratify) is drawn once per (held-out set, size, seed) and saved in the store under
`eval_subsets/`, so a later evaluation (a scheduled one of a new checkpoint) reuses exactly the same tasks. Each
attempt's patch is graded from its test log by the swebench package (swerl.grading.verdict; config
`evaluate.grader`). An attempt lost to the infrastructure is rerun (agent.infra_retries) and otherwise left out; a
task with no scored attempt is reported as missing, never counted as a failure, and every pass@1 states its
denominator. Models evaluated: those of `evaluate.checkpoints` whose stage is among the inputs (the pipeline
passes sft and every GRPO phase: base, sft and grpo, or grpo-NAME per phase; a scheduled evaluation of one
checkpoint passes one of them).

Artifacts: eval_tasks.json (the ids), eval_subset.json (strata, allocation, notes), eval_results.json (per model:
pass@1 with CI and denominator, pass@k, per-stratum / repository / modifier tables, statuses, per-task rewards;
paired comparisons), episodes_MODEL.jsonl, pass_at_1_by_stratum.png, report.md. MLflow: one eval run per model
under the stage's run (swerl.eval.report).

Each graded attempt is journaled under the stage key as it finishes (swerl.stages.evaluate_journal), so a rerun after
a crash runs only the attempts the journal lacks and publishes what an undisturbed run would (greedy evaluation).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import torch

from swerl.agent.episode import run_episode
from swerl.config.agent import AgentConfig
from swerl.config.base import StrictModel
from swerl.config.engine import EngineConfig
from swerl.config.evaluate import EvaluateConfig
from swerl.config.load import config_hash
from swerl.data.environments import environment_order
from swerl.data.loaders import load_tasks as load_dataset_tasks
from swerl.data.schema import TaskInstance
from swerl.engine.base import SamplingParams
from swerl.engine.factory import open_engine
from swerl.errors import InfraError
from swerl.eval.metrics import pass_at_1, pass_at_k, stratum_table
from swerl.eval.report import compare_consecutive, log_eval_runs, markdown_report, plot_strata
from swerl.eval.stratify import Subset, dataset_fingerprint, stratify, subset_path
from swerl.grading.verdict import AttemptGrade, grade_attempt
from swerl.model.loading import load_tokenizer
from swerl.sandbox.base import SandboxProvider
from swerl.stages.common import (
    episode_limits,
    episode_with_retries,
    get_dir,
    input_manifest,
    load_tasks,
    run_async,
    sandbox_pool,
)
from swerl.stages.evaluate_journal import JOURNAL_FOLDER, EvalJournal
from swerl.stages.runner import Manifest, StageContext, StageResult
from swerl.storage import Store
from swerl.tracking import dataset_input
from swerl.trajectory import EpisodeStatus, Trajectory

_log = logging.getLogger("swerl.evaluate")


def source_of(name: str) -> tuple[str, str]:
    """A model's (stage whose manifest holds it, artifact directory): base and sft from the sft stage; a GRPO model
    is named by its stage (grpo, or grpo-NAME for a phase of grpo.phases)."""
    return {"base": ("sft", "base"), "sft": ("sft", "model")}.get(name, (name, "model"))


def is_grpo_stage(stage: str) -> bool:
    return stage == "grpo" or stage.startswith("grpo-")


class EvaluateStage(StrictModel):
    """What the evaluate stage's checkpoint key covers."""

    evaluate: EvaluateConfig
    agent: AgentConfig
    engine: EngineConfig


class CheckpointLoadError(ValueError):
    """A checkpoint that cannot be evaluated: its files are missing or do not load."""


def model_dir(ctx: StageContext, name: str) -> Path:
    stage, directory = source_of(name)
    manifest: Manifest = input_manifest(ctx, stage)
    return get_dir(ctx.store, manifest, directory, ctx.workdir / f"model_{name}")


def checked_model_dir(ctx: StageContext, name: str) -> Path:
    """Download a model and check that its config and tokenizer load, before any episode runs."""
    from transformers import AutoConfig, AutoTokenizer

    manifest = ctx.inputs[source_of(name)[0]]
    try:
        path = model_dir(ctx, name)
        AutoConfig.from_pretrained(path, local_files_only=True)
        AutoTokenizer.from_pretrained(path, local_files_only=True)
        if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
            raise FileNotFoundError(f"no weights (*.safetensors, *.bin) in {path}")
    except InfraError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the loader raised, the message names the checkpoint
        raise CheckpointLoadError(
            f"checkpoint {name!r} ({manifest.stage} manifest {manifest.uri}) does not load: {exc}"
        ) from exc
    return path


def models_to_evaluate(cfg: EvaluateConfig, ctx: StageContext) -> list[str]:
    """The models evaluate.checkpoints names among the inputs, in its order; `grpo` stands for every GRPO stage
    among the inputs (the one `grpo`, or each phase's grpo-NAME, in phase order)."""
    names: list[str] = []
    for name in cfg.checkpoints:
        expanded = [s for s in ctx.inputs if is_grpo_stage(s)] if name == "grpo" else [name]
        names += [n for n in expanded if source_of(n)[0] in ctx.inputs and n not in names]
    if not names:
        raise ValueError(
            f"evaluate.checkpoints {cfg.checkpoints} names no model of the inputs ({sorted(ctx.inputs)}); "
            "base and sft come from an sft manifest, grpo from a grpo manifest (grpo-NAME: that phase's)"
        )
    return names


def evaluation_tasks(cfg: EvaluateConfig, ctx: StageContext, curate: Manifest) -> tuple[list[TaskInstance], str]:
    """The tasks to draw the subset from: `evaluate.dataset` (through `datasets`), or the curate stage's held-out
    split (or its training split, `evaluate.split: train`)."""
    if cfg.dataset is not None:
        d = cfg.dataset
        tasks, report = load_dataset_tasks(d.path, d.schema_name, d.split, d.limit, revision=d.revision)
        if report.rejected:
            ctx.log.warning(
                "evaluate.dataset %s: %d row(s) rejected, e.g. %s", d.path, len(report.rejected), report.rejected[0]
            )
        at = f" at revision {d.revision}" if d.revision else ""
        source = f"evaluate.dataset {d.path}{at} (split {d.split}, schema {d.schema_name})"
    elif cfg.split == "train":
        tasks, source = load_tasks(ctx.store, curate, "train.parquet"), f"the training split of {curate.uri}"
    else:
        tasks, source = load_tasks(ctx.store, curate, "eval.parquet"), f"the held-out split of {curate.uri}"
    if not tasks:
        if cfg.dataset is None:
            which = "held-out" if cfg.split == "held_out" else "training"
            raise ValueError(f"the curate stage ({curate.uri}) produced no {which} tasks to evaluate on")
        raise ValueError(f"{source} holds no usable task to evaluate on")
    return tasks, source


def load_or_draw_subset(
    store: Store, held_out: list[TaskInstance], cfg: EvaluateConfig, seed: int
) -> tuple[Subset, str]:
    """The saved subset of this held-out set (same size and seed), or a new one, saved for every later use."""
    fingerprint = dataset_fingerprint(held_out)
    labeled = cfg.by_difficulty and any(t.difficulty for t in held_out)
    rel = subset_path(fingerprint, cfg.max_tasks, seed, labeled)
    if store.exists(rel):
        subset = Subset.from_json(store.read_bytes(rel))
        subset.select(held_out)  # raises if the saved ids are not all in this held-out set
        return subset, store.uri(rel)
    subset = stratify(held_out, cfg.max_tasks, seed, by_difficulty=cfg.by_difficulty)
    store.write_bytes(rel, subset.to_json())
    return subset, store.uri(rel)


async def evaluate_model(
    path: Path,
    tasks: list[TaskInstance],
    cfg: EvaluateStage,
    seed: int,
    counts: dict[str, int],
    journal: EvalJournal | None = None,
) -> tuple[list[Trajectory], list[dict[str, Any]]]:
    """k attempts of every task with the model at `path`, each graded (infrastructure errors rerun in budget), in
    task order. With a journal (the evaluate stage's), the attempts it holds are taken from it, not run, and every
    other one is written to it as it finishes; with every attempt journaled no engine is started."""
    n = cfg.evaluate.attempts
    jobs = [(t, k) for t in tasks for k in range(n)]
    journaled = journal.load([(t.instance_id, k) for t, k in jobs]).attempts if journal is not None else {}
    results: dict[int, Trajectory] = {}
    grades: list[dict[str, Any]] = []
    for index, (task, attempt) in enumerate(jobs):
        entry = journaled.get((task.instance_id, attempt))
        if entry is not None:
            results[index] = entry.trajectory
            grades += [entry.grade] if entry.grade is not None else []
            _add_counts(counts, entry.failures)
    # Attempts start in environment order (tasks of one image together, in order of first need: its image
    # prepared once while its attempts run), and come back in task order: the same attempts, rids and grades.
    order = [i * n + k for i in environment_order(tasks) for k in range(n) if i * n + k not in results]
    if order:
        ran = await _run_attempts(path, [jobs[i] for i in order], cfg, seed, counts, grades, journal)
        results |= dict(zip(order, ran, strict=True))
    return [results[i] for i in range(len(jobs))], grades


def _add_counts(counts: dict[str, int], more: dict[str, int]) -> None:
    for key, value in more.items():
        counts[key] = counts.get(key, 0) + value


async def _run_attempts(
    path: Path,
    jobs: list[tuple[TaskInstance, int]],
    cfg: EvaluateStage,
    seed: int,
    counts: dict[str, int],
    grades: list[dict[str, Any]],
    journal: EvalJournal | None,
) -> list[Trajectory]:
    """Run (task, attempt) jobs with one engine and sandbox pool, in the order given; each finished attempt's grade
    appended to `grades` and, with a journal, written to it as it finishes."""
    tokenizer = load_tokenizer(path)  # the engine loads the weights; the episodes need only the tokenizer
    limits = episode_limits(cfg.agent)
    provider = sandbox_pool(cfg.agent.sandbox, git_baseline=True)
    sampling = SamplingParams(max_new_tokens=cfg.agent.max_new_tokens_per_turn, temperature=cfg.evaluate.temperature)
    gate = asyncio.Semaphore(cfg.evaluate.concurrency)
    async with (
        provider,
        open_engine(
            cfg.engine, path, concurrency=cfg.evaluate.concurrency, seed=seed, log_dir=path.parent / "engines"
        ) as engine,
    ):

        async def one(task: TaskInstance, attempt: int) -> Trajectory:
            graded: list[dict[str, Any]] = []  # its grade, when the grader regrades it
            tries: dict[str, int] = {}  # the infrastructure errors its tries met

            async def once(retry: int) -> Trajectory:
                trajectory = await run_episode(
                    task,
                    engine,
                    provider,
                    tokenizer,
                    limits,
                    sampling,
                    attempt=attempt,
                    group_id=task.instance_id,
                    rid=f"{task.instance_id}/{attempt}/{retry}",
                )
                if cfg.evaluate.grader == "episode" or trajectory.status is EpisodeStatus.INFRA_ERROR:
                    return trajectory
                return await _graded(provider, task, trajectory, cfg, attempt, retry, graded)

            async with gate:
                trajectory = await episode_with_retries(once, cfg.agent.infra_retries, tries)
            grades.extend(graded)
            _add_counts(counts, tries)
            if journal is not None:
                await _journal(journal, task, attempt, trajectory, graded[-1] if graded else None, tries)
            return trajectory

        return list(await asyncio.gather(*(one(task, attempt) for task, attempt in jobs)))


async def _journal(
    journal: EvalJournal,
    task: TaskInstance,
    attempt: int,
    trajectory: Trajectory,
    grade: dict[str, Any] | None,
    tries: dict[str, int],
) -> None:
    """Write a finished attempt to the journal; a store that fails only costs its rerun after a crash (logged)."""
    try:
        await asyncio.to_thread(journal.record, task.instance_id, attempt, trajectory, grade, tries)
    except InfraError as exc:
        _log.warning(
            "evaluation journal: %s/%d not journaled (%s): a rerun would run it again", task.instance_id, attempt, exc
        )


async def _graded(
    provider: SandboxProvider,
    task: TaskInstance,
    trajectory: Trajectory,
    cfg: EvaluateStage,
    attempt: int,
    retry: int,
    grades: list[dict[str, Any]],
) -> Trajectory:
    """The attempt graded by the grader (evaluate.grader), its grade appended to `grades`; a grading failure makes
    it an infrastructure error, rerun like any other."""
    try:
        graded = await grade_attempt(provider, task, trajectory.patch, cfg.agent.test_timeout_s)
    except InfraError as exc:  # the attempt is rerun, like any infrastructure failure
        return trajectory.model_copy(
            update={
                "status": EpisodeStatus.INFRA_ERROR,
                "reward": None,
                "infra_cause": exc.cause,
                "infra_message": exc.message,
            }
        )
    reward = 1.0 if graded.grade.resolved else 0.0
    grades.append(
        {
            "task_id": task.instance_id,
            "attempt": attempt,
            "retry": retry,
            "episode_reward": trajectory.reward,
            "reward": reward,
            "status": graded.grade.status,
            "parser": graded.grade.parser,
            "tests": graded.grade.tests,
            "infra_reason": graded.grade.infra_reason,
            "detail": graded.detail,
            **_sealed_fields(graded),
        }
    )
    status = trajectory.status
    if status in (EpisodeStatus.RESOLVED, EpisodeStatus.UNRESOLVED):
        status = EpisodeStatus.RESOLVED if reward == 1.0 else EpisodeStatus.UNRESOLVED
    return trajectory.model_copy(update={"reward": reward, "status": status})


def _sealed_fields(graded: AttemptGrade) -> dict[str, Any]:
    """What the grader took from the task instead of the patch, and any forgery or tampering it saw."""
    sealed = graded.sealed
    if sealed is None:
        return {}
    return {
        "sealed": sealed.sealed,
        "dropped": list(sealed.dropped),
        "tampered": list(sealed.tampered),
        "forged_lines": sealed.forged_lines,
        "introspection_lines": sealed.introspection_lines,
    }


def pass_at_ks(attempts: int) -> list[int]:
    """k = 1, 2, 4, ... up to the attempts made, and the attempts themselves."""
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= attempts]
    return sorted(set(ks) | {attempts})


def summarize(
    trajectories: list[Trajectory],
    tasks: list[TaskInstance],
    cfg: EvaluateConfig,
    seed: int,
    subset: Subset | None = None,
) -> dict[str, Any]:
    by_id = {t.instance_id: t for t in tasks}
    rewards: dict[str, list[float | None]] = {t.instance_id: [] for t in tasks}
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

    stratum_of = subset.stratum_of_task if subset else {t: by_id[t].repo_key for t in rewards}
    population = subset.population if subset else dict(Counter(stratum_of.values()))
    statuses = Counter(t.status.value for t in trajectories)
    scored = [t for t in trajectories if t.reward is not None]
    ks = [pass_at_k(rewards, k, cfg.bootstrap_samples, cfg.confidence, seed) for k in pass_at_ks(cfg.attempts)]
    return {
        **overall.to_dict(),
        "pass@k": [
            {
                "k": s.k,
                "value": s.value,
                "ci_low": s.ci_low,
                "ci_high": s.ci_high,
                "tasks": s.tasks,
                "excluded": s.excluded,
            }
            for s in ks
        ],
        "statuses": dict(statuses),
        "malformed_calls_mean": sum(t.malformed_tool_calls for t in scored) / max(1, len(scored)),
        "turns_mean": sum(t.num_turns for t in scored) / max(1, len(scored)),
        "tasks_any_resolved": sum(any(v == 1.0 for v in values) for values in rewards.values()),
        "by_stratum": stratum_table(rewards, stratum_of, population, cfg.bootstrap_samples, cfg.confidence, seed),
        "by_repo": table("repo"),
        "by_modifier": table("modifier"),
        "per_task": rewards,
    }


def grading_summary(grades: list[dict[str, Any]], grader: str) -> str:
    if grader == "episode":
        return "the episode's own in-workspace grade (evaluate.grader = episode)"
    statuses = Counter(g["status"] for g in grades)
    disagree = sum(g["episode_reward"] is not None and g["episode_reward"] != g["reward"] for g in grades)
    parsers = sorted({g["parser"] for g in grades})
    sealed = sum(bool(g.get("sealed")) for g in grades)
    return (
        f"swebench verdicts on {len(grades)} regraded attempt(s), {sealed} by the sealed runner "
        f"({dict(statuses)}; parsers {parsers}); {disagree} disagree with the episode's grade"
    )


def episodes_jsonl(trajectories: list[Trajectory], grades: list[dict[str, Any]]) -> bytes:
    by_attempt = {(g["task_id"], g["attempt"]): g for g in grades}
    return (
        "\n".join(
            json.dumps(
                {
                    "task_id": t.task_id,
                    "attempt": t.attempt,
                    "status": t.status.value,
                    "reward": t.reward,
                    "turns": t.num_turns,
                    "malformed": t.malformed_tool_calls,
                    "infra_cause": t.infra_cause,
                    "grade": by_attempt.get((t.task_id, t.attempt)),
                    "patch": t.patch,
                    "messages": t.messages[2:],
                }
            )
            for t in trajectories
        )
        + "\n"
    ).encode()


def model_metrics(name: str, summary: dict[str, Any]) -> dict[str, float]:
    """The stage run's per-model metrics (MODEL/pass_at_1, ...); each model's eval run has them unprefixed."""
    out = {
        f"{name}/{key.replace('@', '_at_')}": float(summary[key])
        for key in ("pass@1", "ci_low", "ci_high", "tasks", "missing")
    }
    out |= {f"{name}/pass_at_{row['k']}": float(row["value"]) for row in summary["pass@k"]}
    out[f"{name}/malformed_calls_mean"] = float(summary["malformed_calls_mean"])
    out[f"{name}/wall_s"] = float(summary["wall_s"])
    return out


def model_journal(cfg: EvaluateStage, ctx: StageContext, name: str) -> EvalJournal:
    """The journal of one model's attempts under the stage key (swerl.stages.evaluate_journal), its entries tagged
    with the model, its checkpoint's manifest fingerprint, the stage config and the seed."""
    identity = {
        "model": name,
        "checkpoint": ctx.inputs[source_of(name)[0]].fingerprint,
        "config": config_hash(cfg),
        "seed": ctx.seed,
    }
    return EvalJournal(
        ctx.store, ctx.durable(f"{JOURNAL_FOLDER}/{name}"), identity, ran_by=ctx.prefix.rsplit("/", 1)[-1]
    )


def _evaluate_one(
    cfg: EvaluateStage, ctx: StageContext, name: str, path: Path, tasks: list[TaskInstance], subset: Subset
) -> tuple[dict[str, Any], bytes, EvalJournal]:
    """One model's evaluation: its summary (with failures, grading and wall time), its episodes as JSONL, and its
    journal (how many attempts it gave back, how many were run)."""
    model_started = time.monotonic()
    counts: dict[str, int] = {}
    journal = model_journal(cfg, ctx, name)
    trajectories, grades = run_async(evaluate_model(path, tasks, cfg, ctx.seed, counts, journal))
    summary = summarize(trajectories, tasks, cfg.evaluate, ctx.seed, subset)
    summary |= {
        "failures": counts,
        "grading": grading_summary(grades, cfg.evaluate.grader),
        "wall_s": time.monotonic() - model_started,
    }
    ctx.log.info(
        "evaluate %s: pass@1 %.3f [%.3f, %.3f] over %d tasks (%d missing) x %d (%s), %.0f s; %d attempt(s) from "
        "the journal, %d run",
        name,
        summary["pass@1"],
        summary["ci_low"],
        summary["ci_high"],
        summary["tasks"],
        summary["missing"],
        cfg.evaluate.attempts,
        summary["statuses"],
        summary["wall_s"],
        journal.reused,
        len(trajectories) - journal.reused,
    )
    return summary, episodes_jsonl(trajectories, grades), journal


def run_evaluate(cfg: EvaluateStage, ctx: StageContext) -> StageResult:
    started = time.monotonic()
    torch.set_num_threads(cfg.evaluate.threads)
    curate = input_manifest(ctx, "curate")
    held_out, source = evaluation_tasks(cfg.evaluate, ctx, curate)
    names = models_to_evaluate(cfg.evaluate, ctx)
    if cfg.evaluate.max_tasks > len(held_out):
        raise ValueError(
            f"evaluate.max_tasks ({cfg.evaluate.max_tasks}) is larger than the {len(held_out)} tasks of "
            f"{source}: lower it to at most {len(held_out)}"
        )
    paths = {name: checked_model_dir(ctx, name) for name in names}  # every checkpoint loads, or nothing runs
    subset, subset_uri = load_or_draw_subset(ctx.store, held_out, cfg.evaluate, ctx.seed)
    if subset.note:
        ctx.log.warning("evaluation subset: %s", subset.note)
    tasks = subset.select(held_out)
    results: dict[str, Any] = {}
    metrics: dict[str, float] = {"tasks": float(len(tasks)), "attempts": float(cfg.evaluate.attempts)}
    episodes: dict[str, bytes] = {}
    for done, name in enumerate(names):
        ctx.progress(done, len(names), f"evaluating {name} ({done + 1} of {len(names)})")
        results[name], episodes[name], journal = _evaluate_one(cfg, ctx, name, paths[name], tasks, subset)
        metrics |= model_metrics(name, results[name])
        metrics[f"{name}/journal_reused"] = float(journal.reused)
        metrics[f"{name}/journal_written"] = float(journal.written)
    markdown, comparisons = publish(cfg.evaluate, ctx, results, episodes, subset, subset_uri, source)
    for c in comparisons:
        metrics[f"compare/{c['b']}_vs_{c['a']}/difference"] = float(c["difference"])
        metrics[f"compare/{c['b']}_vs_{c['a']}/p_value"] = float(c["p_value"])
    metrics["wall_s"] = time.monotonic() - started
    table = [
        {"model": name, **{k: round(float(r[k]), 4) for k in ("pass@1", "ci_low", "ci_high", "tasks", "missing")}}
        for name, r in results.items()
    ]
    summary_line = ", ".join(f"{n} {r['pass@1']:.3f} (n={r['tasks']})" for n, r in results.items())
    ctx.progress(len(names), len(names), "every model evaluated")
    images = {"pass_at_1_by_stratum": (ctx.workdir / "pass_at_1_by_stratum.png").read_bytes()}
    return StageResult(
        metrics=metrics,
        tables={"pass-at-1": table},
        markdown={"evaluation": markdown},
        summary=f"pass@1: {summary_line}",
        images=images,
    )


class TooManyMissingError(RuntimeError):
    """An evaluation missing more than evaluate.max_missing_share of its tasks (or with no scored task)."""


def missing_tasks(summary: dict[str, Any]) -> list[str]:
    """The tasks of a model's summary without one scored attempt (every attempt lost to the infrastructure)."""
    return sorted(t for t, rewards in summary["per_task"].items() if all(r is None for r in rewards))


def check_missing(ev: EvaluateConfig, results: dict[str, Any]) -> None:
    """Fail, naming the missing tasks, when a model misses more than ev.max_missing_share of its tasks or has no
    scored task at all: a published pass@1 is never NaN and never silently over a fraction of the subset."""
    problems = []
    for name, summary in results.items():
        missing, total = missing_tasks(summary), len(summary["per_task"])
        share = len(missing) / total if total else 1.0
        if share > ev.max_missing_share or not summary["tasks"] or math.isnan(summary["pass@1"]):
            more = f", ... ({len(missing) - 20} more)" if len(missing) > 20 else ""
            shown = ", ".join(missing[:20]) + more
            problems.append(f"{name}: {len(missing)} of {total} tasks missing ({share:.0%}): {shown}")
    if problems:
        raise TooManyMissingError(
            f"evaluate: more than evaluate.max_missing_share = {ev.max_missing_share:.0%} of the tasks have no "
            "scored attempt (every attempt an infrastructure error; see the log and failures/*), nothing "
            "published:\n" + "\n".join(problems)
        )


def publish(
    ev: EvaluateConfig,
    ctx: StageContext,
    results: dict[str, Any],
    episodes: dict[str, bytes],
    subset: Subset,
    subset_uri: str,
    source: str = "",
) -> tuple[str, list[dict[str, Any]]]:
    """Comparisons, report, plot; then (every model evaluated) the artifacts and one MLflow eval run per model.

    Nothing is published for an evaluation that lost too many tasks (check_missing)."""
    check_missing(ev, results)
    per_task = {name: r["per_task"] for name, r in results.items()}
    comparisons = compare_consecutive(per_task, ev.comparison_samples, ev.confidence, ctx.seed)
    markdown = markdown_report(
        results,
        comparisons,
        attempts=ev.attempts,
        temperature=ev.temperature,
        confidence=ev.confidence,
        samples=ev.bootstrap_samples,
        subset_note=subset.note,
        subset_uri=subset_uri,
        by_difficulty=subset.by_difficulty,
        source=source,
        training_split=ev.dataset is None and ev.split == "train",
    )
    plot = plot_strata(results, ctx.workdir / "pass_at_1_by_stratum.png", ev.confidence)
    ctx.write_artifact("eval_tasks.json", json.dumps(subset.instance_ids, indent=1).encode())
    ctx.write_artifact("eval_subset.json", subset.to_json())
    for name, body in episodes.items():
        ctx.write_artifact(f"episodes_{name}.jsonl", body)
    ctx.write_artifact(
        "eval_results.json",
        json.dumps({"models": results, "comparisons": comparisons}, indent=2, sort_keys=True).encode(),
    )
    ctx.put_artifact("pass_at_1_by_stratum.png", plot)
    ctx.write_artifact("report.md", markdown.encode())
    ctx.run.log_file(plot)
    _log_eval_runs(ev, ctx, results, per_task, subset, subset_uri, plot, markdown)
    return markdown, comparisons


def _log_eval_runs(
    ev: EvaluateConfig,
    ctx: StageContext,
    results: dict[str, Any],
    per_task: dict[str, Any],
    subset: Subset,
    subset_uri: str,
    plot: Path,
    markdown: str,
) -> None:
    """One MLflow eval run per model, linked to its checkpoint and the subset; their ids tagged on the stage run."""
    links = {
        name: {
            "swerl.checkpoint.stage": source_of(name)[0],
            "swerl.checkpoint.manifest": ctx.inputs[source_of(name)[0]].uri,
            "swerl.checkpoint.run_id": ctx.inputs[source_of(name)[0]].mlflow_run_id or "",
            "swerl.checkpoint.artifact": source_of(name)[1],
        }
        for name in results
    }
    shared = {
        "swerl.eval": "true",
        "swerl.eval.subset": subset_uri,
        "swerl.stage": "evaluate-model",
        "swerl.eval.split": "dataset" if ev.dataset is not None else ev.split,
        "swerl.eval.curate_manifest": ctx.inputs["curate"].uri,
    }
    subset_digest = hashlib.sha256(subset.to_json()).hexdigest()
    dataset = dataset_input("eval_subset", subset_uri, subset_digest, "evaluation")
    run_ids = log_eval_runs(
        ctx.run.client,
        ctx.run.run_id,
        results,
        per_task,
        links,
        shared,
        plot,
        markdown,
        params=ev.model_dump(mode="json", by_alias=True),
        dataset=dataset,
    )
    ctx.run.set_tags({f"swerl.eval.run.{name}": run_id for name, run_id in run_ids.items()})
