"""The curate stage: synthesize and load tasks, decontaminate, split train/eval by repository, write them.

Artifacts: train.parquet and eval.parquet (TaskInstance rows) and curate_report.json (yield by repository and
modifier, rejection reasons, dataset row rejections, decontamination counts). Micro repositories (`micro`) are
synthesized like the others; their tasks keep their generator split (eval vocabulary -> eval.parquet) and the
report counts them as two repositories, 'micro-train' and 'micro-eval'.

A repository that yields no task is loud: a warning per repository (with why: skipped, every candidate rejected),
and the stage fails when none of the configured repositories yields a task, with the test runner's output of a
clean run of the first few of them (rerun for the message).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from typing import Any

from swerl.config import CurateConfig, DatasetSource, MicroSource
from swerl.data.decontam import decontaminate
from swerl.data.loaders import LoadReport, load_tasks
from swerl.data.micro import SPLITS, micro_repo_spec, micro_split
from swerl.data.repos import RepoSpec, resolve_repos
from swerl.data.schema import TaskInstance, normalize_repo
from swerl.data.synth import RepoReport, merge_reports, summarize, synthesize_repo
from swerl.data.taskio import tasks_to_parquet
from swerl.data.testrun import run_tests
from swerl.sandbox.base import SandboxProvider
from swerl.sandbox.pool import release_provider
from swerl.stages.common import run_async, sandbox_provider
from swerl.stages.runner import StageContext, StageResult


def micro_specs(micro: MicroSource) -> list[RepoSpec]:
    """The configured micro repositories, materialized (train ones first), as repositories to synthesize from."""
    counts = {"train": micro.train_repos, "eval": micro.eval_repos}
    return [micro_repo_spec(split, micro.seed, index) for split in SPLITS for index in range(counts[split])]


class NoTasksError(RuntimeError):
    """No configured repository yielded a task."""


CLEAN_OUTPUT_CHARS = 3000
"""The tail of each clean run's output a failing stage quotes."""
DIAGNOSED_REPOS = 3
"""Repositories whose clean suite is rerun for the failure message."""


def _why_no_task(report: RepoReport) -> str:
    if report.skipped:
        return f"skipped: {report.skipped}"
    if not sum(report.candidates.values()):
        return f"no bug candidate (sites by modifier: {dict(report.sites) or 'none'})"
    return f"every candidate rejected: {dict(report.rejections)}"


async def _clean_output(spec: RepoSpec, provider: SandboxProvider, timeout_s: float) -> str:
    """One clean run of a repository's test suite in a fresh sandbox: the runner's exit, output tail."""
    try:
        sandbox = await provider.start(spec.path)
        try:
            result, outcomes = await run_tests(sandbox, timeout_s, spec.test_cmd)
        finally:
            await sandbox.close()
    except Exception as exc:  # noqa: BLE001 - the message must say what the sandbox did, whatever it was
        return f"(the clean run could not run: {type(exc).__name__}: {exc})"
    tail = result.output[-CLEAN_OUTPUT_CHARS:]
    return (f"exit {result.exit_code}{' (timed out)' if result.timed_out else ''} in {result.duration_s:.1f} s, "
            f"{len(outcomes)} test outcomes parsed; output{' (tail)' if len(result.output) > len(tail) else ''}:"
            f"\n{tail}")  # fmt: skip


def _check_yield(
    ctx: StageContext, specs: Sequence[RepoSpec], reports: Sequence[RepoReport], provider: SandboxProvider,
    timeout_s: float,
) -> None:  # fmt: skip
    """Warn per repository without a task; fail, with clean runs' output, when no repository yields one."""
    empty = [
        (spec, report) for spec, report in zip(specs, reports, strict=True) if not sum(report.valid.values())
    ]
    for spec, report in empty:
        ctx.log.warning("curate: repository %s yielded no task (%s)", spec.name, _why_no_task(report))
    if not specs or len(empty) < len(specs):
        return
    diagnosed = [
        f"--- {spec.name}: {_why_no_task(report)}; clean run of `{spec.test_cmd or 'pytest'}`: "
        + run_async(_clean_output(spec, provider, timeout_s))
        for spec, report in empty[:DIAGNOSED_REPOS]
    ]
    raise NoTasksError(
        f"curate: none of the {len(specs)} repositories yielded a task"
        + (f" (the first {DIAGNOSED_REPOS} below)" if len(empty) > DIAGNOSED_REPOS else "")
        + ":\n"
        + "\n".join(diagnosed)
    )


async def _synthesize_all(
    cfg: CurateConfig,
    specs: Sequence[RepoSpec],
    seed: int,
    provider: SandboxProvider,
    micro: frozenset[str] = frozenset(),
) -> tuple[list[TaskInstance], list[RepoReport]]:
    """Every repository at once, in order of results: one gate keeps validation_workers sandboxes busy overall.

    Repositories named in `micro` deal their few candidates over the modifiers in a seeded order (a budget of 3
    in name order would never reach swap_*).
    """
    gate = asyncio.Semaphore(cfg.validation_workers)
    results = await asyncio.gather(
        *(
            synthesize_repo(
                spec,
                provider,
                modifiers=list(cfg.modifiers),
                max_candidates=cfg.max_candidates_per_repo,
                max_tasks=cfg.max_tasks_per_repo,
                seed=seed,
                workers=cfg.validation_workers,
                test_timeout_s=cfg.sandbox.timeout_s,
                clean_runs=cfg.clean_runs,
                bugged_timeout_factor=cfg.bugged_timeout_factor,
                min_bugged_timeout_s=cfg.min_bugged_timeout_s,
                gate=gate,
                shuffle_modifiers=spec.name in micro,
            )
            for spec in specs
        )
    )
    tasks = [task for repo_tasks, _ in results for task in repo_tasks]
    return tasks, [report for _, report in results]


def _merge_micro_reports(reports: Sequence[RepoReport], micro: Sequence[RepoSpec]) -> list[RepoReport]:
    """Other repositories' reports as they are, then one 'micro-train' and one 'micro-eval' report (if any)."""
    split_of = {spec.name: micro_split(spec.repo) for spec in micro}
    merged = [r for r in reports if r.name not in split_of]
    for split in SPLITS:
        group = [r for r in reports if split_of.get(r.name) == split]
        if group:
            merged.append(merge_reports(f"micro-{split}", group))
    return merged


def _load_sources(
    sources: Sequence[DatasetSource], strict: bool
) -> tuple[list[TaskInstance], list[LoadReport]]:
    tasks: list[TaskInstance] = []
    reports = []
    for source in sources:
        loaded, report = load_tasks(source.path, source.schema_name, source.split, source.limit, strict)
        tasks += loaded
        reports.append(report)
    return tasks, reports


def split_by_repo(
    tasks: Sequence[TaskInstance], eval_repos: Sequence[str]
) -> tuple[list[TaskInstance], list[TaskInstance], list[str]]:
    """(train, eval, unmatched eval entries): a task is eval when its repository is listed (by full name or name).

    A micro repository's task keeps its generator split whatever `eval_repos` says (swerl-micro/eval-* -> eval).
    """
    wanted = {normalize_repo(r) for r in eval_repos}
    train: list[TaskInstance] = []
    held_out: list[TaskInstance] = []
    matched: set[str] = set()
    for task in tasks:
        repo = normalize_repo(task.repo)
        fixed = micro_split(repo)
        keys = {repo, repo.rsplit("/", 1)[-1]} & wanted if fixed is None else set()
        if keys or fixed == "eval":
            matched |= keys
            held_out.append(task.model_copy(update={"split": "eval"}))
        else:
            train.append(task.model_copy(update={"split": "train"}))
    return train, held_out, sorted(wanted - matched)


def yield_table(reports: Sequence[RepoReport]) -> list[dict[str, Any]]:
    """One row per (repository, modifier): sites found, candidates validated, valid tasks."""
    rows = []
    for report in reports:
        for modifier in sorted(report.sites):
            rows.append(
                {
                    "repo": report.name,
                    "modifier": modifier,
                    "sites": report.sites[modifier],
                    "candidates": report.candidates.get(modifier, 0),
                    "valid": report.valid.get(modifier, 0),
                }
            )
        if report.skipped:
            rows.append({"repo": report.name, "modifier": f"(skipped: {report.skipped})", "sites": 0,
                         "candidates": 0, "valid": 0})  # fmt: skip
    return rows


def run_curate(cfg: CurateConfig, ctx: StageContext) -> StageResult:
    """Synthesize and load tasks, decontaminate, split by repository and write train/eval parquet files."""
    specs = resolve_repos(cfg.repos)
    micro = micro_specs(cfg.micro) if cfg.micro else []
    _check_micro_names(specs, micro)
    synthesized, repo_reports = _synthesize_logged(cfg, ctx, specs, micro)
    repo_reports = _merge_micro_reports(repo_reports, micro)
    loaded, load_reports = _load_sources(cfg.datasets, cfg.strict_rows)
    tasks = synthesized + loaded

    eval_tasks_ext, eval_load_reports = _load_sources(cfg.decontamination_sets, cfg.strict_rows)
    train, held_out, unmatched = split_by_repo(tasks, cfg.eval_repos)
    if unmatched:
        ctx.log.warning("curate: eval_repos matched no task: %s", unmatched)
    decontam_report: dict[str, Any] = {"enabled": cfg.decontaminate}
    if cfg.decontaminate:
        train, held_out, decontam_report = _decontaminate(train, held_out, eval_tasks_ext)

    ctx.write_artifact("train.parquet", tasks_to_parquet(train))
    ctx.write_artifact("eval.parquet", tasks_to_parquet(held_out))
    synth = summarize(repo_reports)
    report: dict[str, Any] = {
        "synthesis": synth,
        "datasets": [r.to_dict() for r in load_reports],
        "decontamination_sets": [r.to_dict() for r in eval_load_reports],
        "decontamination": decontam_report,
        "split": {
            "train": len(train),
            "eval": len(held_out),
            "eval_repos": cfg.eval_repos,
            "unmatched": unmatched,
            "micro": cfg.micro.model_dump() if cfg.micro else None,
        },
    }
    ctx.write_artifact("curate_report.json", json.dumps(report, indent=2, sort_keys=True).encode())
    metrics = _metrics(synth, load_reports, len(loaded), len(train), len(held_out), decontam_report)
    ctx.log_metrics(metrics)
    summary = (
        f"{synth['valid']}/{synth['candidates']} candidates valid; "
        f"{len(train)} train, {len(held_out)} eval tasks"
    )
    markdown = _markdown(synth, report["split"], decontam_report)
    return StageResult(metrics=metrics, tables={"yield": yield_table(repo_reports)}, markdown={"curate": markdown},
                       summary=summary)  # fmt: skip


def _check_micro_names(specs: Sequence[RepoSpec], micro: Sequence[RepoSpec]) -> None:
    """No repository may share a name with a micro repository or with the two merged micro reports."""
    names = {s.name for s in specs}
    clashing = sorted(s.name for s in micro if s.name in names) + sorted(
        n for n in names if n in ("micro-train", "micro-eval")
    )
    if clashing:
        raise ValueError(f"repositories named like micro repositories or their report: {clashing[:5]}")


def _synthesize_logged(
    cfg: CurateConfig, ctx: StageContext, specs: list[RepoSpec], micro: list[RepoSpec]
) -> tuple[list[TaskInstance], list[RepoReport]]:
    """Tasks synthesized from every repository, in sandboxes whose enforced limits are logged first."""
    provider = sandbox_provider(cfg.sandbox)
    # Every limit the sandboxes enforce, as resolved (the config's own values are logged by run_stage).
    limits = {f"enforced_limits.{k}": v for k, v in provider.limits().items()}
    ctx.log_params(limits | {"enforced_limits.python": cfg.sandbox.python or sys.executable})
    ctx.log.info("curate: sandbox limits %s", limits)
    ctx.log.info("curate: synthesizing from %d repositories: %s", len(specs), [s.name for s in specs])
    if micro:
        ctx.log.info("curate: and from %d micro repositories (%s)", len(micro), cfg.micro)
    all_specs = specs + micro
    try:
        if not all_specs:
            return [], []
        tasks, reports = run_async(
            _synthesize_all(cfg, all_specs, ctx.seed, provider, frozenset(s.name for s in micro))
        )
        _check_yield(ctx, all_specs, reports, provider, cfg.sandbox.timeout_s)
        return tasks, reports
    finally:
        release_provider(provider)


def _decontaminate(
    train: list[TaskInstance], held_out: list[TaskInstance], eval_tasks_ext: list[TaskInstance]
) -> tuple[list[TaskInstance], list[TaskInstance], dict[str, Any]]:
    """Drop training tasks that share a statement with any evaluation task, ours or an external set's (and
    held-out tasks that share one with an external set); returns the kept tasks and the report."""
    statements = [t.problem_statement for t in eval_tasks_ext + held_out]
    train, train_report = decontaminate(train, statements)
    held_out, eval_report = decontaminate(held_out, [t.problem_statement for t in eval_tasks_ext])
    return train, held_out, {"enabled": True, "train": train_report.to_dict(), "eval": eval_report.to_dict()}


def _metrics(
    synth: dict[str, Any],
    load_reports: Sequence[LoadReport],
    dataset_tasks: int,
    train_tasks: int,
    eval_tasks: int,
    decontam_report: dict[str, Any],
) -> dict[str, float]:
    metrics: dict[str, float] = {
        "candidates": synth["candidates"],
        "valid": synth["valid"],
        "repos_skipped": len(synth["skipped_repos"]),
        "dataset_rows_rejected": sum(len(r.rejected) for r in load_reports),
        "dataset_tasks": dataset_tasks,
        "train_tasks": train_tasks,
        "eval_tasks": eval_tasks,
    }
    for modifier, counts in synth["by_modifier"].items():
        metrics[f"candidates.{modifier}"] = counts["candidates"]
        metrics[f"valid.{modifier}"] = counts["valid"]
    for name, repo in synth["by_repo"].items():
        metrics[f"valid_repo.{name}"] = sum(repo["valid"].values())
    for part in ("train", "eval"):
        if part in decontam_report:
            metrics[f"decontam_dropped_repo.{part}"] = decontam_report[part]["dropped_repo"]
            metrics[f"decontam_dropped_statement.{part}"] = decontam_report[part]["dropped_statement"]
    return metrics


def _markdown(synth: dict[str, Any], split: dict[str, Any], decontam: dict[str, Any]) -> str:
    lines = [
        "# Curation",
        "",
        f"- candidates validated: {synth['candidates']}, valid tasks: {synth['valid']}",
        f"- train: {split['train']}, eval: {split['eval']} (held-out repos: {split['eval_repos'] or 'none'})",
        f"- micro repositories: {split['micro'] or 'none'}",
        f"- skipped repositories: {synth['skipped_repos'] or 'none'}",
        f"- rejection reasons: {synth['rejections'] or 'none'}",
    ]
    if decontam.get("enabled") and "train" in decontam:
        t = decontam["train"]
        lines.append(
            f"- decontamination (train): dropped {t['dropped_repo']} by repo, {t['dropped_statement']} by statement"
        )
    lines += ["", "| modifier | candidates | valid |", "| --- | --- | --- |"]
    for modifier, counts in synth["by_modifier"].items():
        lines.append(f"| {modifier} | {counts['candidates']} | {counts['valid']} |")
    return "\n".join(lines) + "\n"
