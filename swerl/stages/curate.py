"""The curate stage: synthesize and load tasks, decontaminate, split train/eval by repository, write them.

Artifacts: train.parquet and eval.parquet (TaskInstance rows) and curate_report.json (yield by repository and
modifier, rejection reasons, dataset row rejections, decontamination counts). Micro repositories (`micro`) are
synthesized like the others; their tasks keep their generator split (eval vocabulary -> eval.parquet) and the
report counts them as two repositories, 'micro-train' and 'micro-eval'.

A repository that yields no task is loud: a warning per repository (with why: skipped, every candidate rejected),
and the stage fails when none of the configured repositories yields a task, with the test runner's output of a
clean run of the first few of them (rerun for the message).

Real repositories (`curate.repos` mappings, config.RepoSource): each is materialized (an sdist extracted, a git
repository cloned) and tested with the interpreter of a virtualenv of its own (swerl.data.repoenv, built here,
before any sandbox starts). Their clean tests that fail, cannot be collected, are flaky or have unstable ids are
left out and counted; every task is confirmed through the sealed grader (`grade_patch`) in fresh processes: the
untouched bug graded unresolved and the reference fix (the candidate's fix patch over the bug) graded resolved,
ids that disagree with the validation run dropped and counted. One that yields no task fails the stage, with the
runner's output and what to set. Their contents are part of the stage key (`content_key`).

Harbor tasks (`curate.harbor`, swerl.data.harbor; swerl/stages/curate_harbor.py): each directory's image is built
offline, its reference patch is the diff solution/solve.sh makes in a fresh sandbox of it, and it is kept only when its
own verifier, through the one grader, gives that patch 1 and the empty patch 0; the rest are counted by reason. Their
split is their own rule (`harbor_eval_keys`), their directories' contents part of the stage key.

Loaded SWE-bench-style rows whose image is on the Docker engine are gold-checked (`curate.gold_check`,
swerl/stages/curate_gold.py): the reference fix must resolve, the empty patch must not; failures are dropped and
counted by cause in the report's `gold_check` section and the metrics gold_check.*.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swerl.config.data import CurateConfig, DatasetSource, MicroSource, RepoSource
from swerl.data.decontam import decontaminate
from swerl.data.harbor import (
    harbor_content_digest,
    harbor_task_dirs,
)
from swerl.data.loaders import LoadReport, load_tasks
from swerl.data.micro import SPLITS, micro_repo_spec, micro_split
from swerl.data.repoenv import RepoEnv, build_env, env_reference, materialize_source, source_fingerprint
from swerl.data.repos import RepoSpec, resolve_repos, tree_hash
from swerl.data.schema import TaskInstance, normalize_repo
from swerl.data.synth import Confirm, Confirmation, RepoReport, merge_reports, summarize, synthesize_repo
from swerl.data.taskio import tasks_to_parquet
from swerl.data.testrun import passing, run_tests
from swerl.errors import NoTasksError
from swerl.grading.grader import RESOLVED_FULL, grade_patch
from swerl.sandbox.base import SandboxProvider
from swerl.sandbox.pool import release_provider
from swerl.stages.common import run_async, sandbox_provider
from swerl.stages.curate_gold import gold_check
from swerl.stages.curate_harbor import curate_harbor
from swerl.stages.runner import StageContext, StageResult


def micro_specs(micro: MicroSource) -> list[RepoSpec]:
    """The configured micro repositories, materialized (train ones first), as repositories to synthesize from."""
    counts = {"train": micro.train_repos, "eval": micro.eval_repos}
    return [micro_repo_spec(split, micro.seed, index) for split in SPLITS for index in range(counts[split])]


CLEAN_OUTPUT_CHARS = 3000
"""The tail of each clean run's output a failing stage quotes."""
DIAGNOSED_REPOS = 3
"""Repositories whose clean suite is rerun for the failure message."""


def _why_no_task(report: RepoReport) -> str:
    if report.skipped:
        return f"skipped: {report.skipped}"
    if not sum(report.candidates.values()):
        return f"no bug candidate (sites by modifier: {dict(report.sites) or 'none'})"
    why = f"every candidate rejected: {dict(report.rejections)}"
    if report.skipped_tests:
        why += f"; clean tests left out: {dict(report.skipped_tests)}"
    return why


WHAT_TO_SET = (
    "what to set on the repository's curate.repos entry: `install` (test requirements its tests import, e.g. "
    "hypothesis, pytest-asyncio), `python_path` (where its packages are, e.g. src), `test_cmd` (its own test "
    "command printing pytest's -rA summary)"
)


@dataclass(frozen=True)
class RealRepo:
    """A real repository's environment and the sandbox provider running its interpreter."""

    source: RepoSource
    env: RepoEnv
    provider: SandboxProvider


async def _clean_output(
    spec: RepoSpec, provider: SandboxProvider, timeout_s: float, extra_args: Sequence[str] = ()
) -> str:
    """One clean run of a repository's test suite in a fresh sandbox: the runner's exit, output tail."""
    try:
        sandbox = await provider.start(spec.path)
        try:
            result, outcomes = await run_tests(sandbox, timeout_s, spec.test_cmd, extra_args=extra_args)
        finally:
            await sandbox.close()
    except Exception as exc:  # noqa: BLE001 - the message must say what the sandbox did, whatever it was
        return f"(the clean run could not run: {type(exc).__name__}: {exc})"
    tail = result.output[-CLEAN_OUTPUT_CHARS:]
    return (
        f"exit {result.exit_code}{' (timed out)' if result.timed_out else ''} in {result.duration_s:.1f} s, "
        f"{len(outcomes)} test outcomes parsed; output{' (tail)' if len(result.output) > len(tail) else ''}:"
        f"\n{tail}"
    )


def _check_yield(
    ctx: StageContext,
    specs: Sequence[RepoSpec],
    reports: Sequence[RepoReport],
    provider: SandboxProvider,
    timeout_s: float,
    real: Mapping[str, RealRepo] | None = None,
) -> None:
    """Warn per repository without a task; fail, with clean runs' output, when no repository yields one or when
    a real repository (a RepoSource entry) yields none."""
    real = real or {}
    empty = [(spec, report) for spec, report in zip(specs, reports, strict=True) if not sum(report.valid.values())]
    for spec, report in empty:
        ctx.log.warning("curate: repository %s yielded no task (%s)", spec.name, _why_no_task(report))
    empty_real = [(spec, report) for spec, report in empty if spec.name in real]
    if empty_real:
        diagnosed = [
            f"--- {spec.name}: {_why_no_task(report)}; clean run of `{spec.test_cmd or 'pytest'}` with "
            f"{real[spec.name].env.python}: "
            + run_async(_clean_output(spec, real[spec.name].provider, timeout_s, _real_pytest_args(spec)))
            for spec, report in empty_real[:DIAGNOSED_REPOS]
        ]
        raise NoTasksError(
            f"curate: {len(empty_real)} of the configured repositories yielded no task; {WHAT_TO_SET}:\n"
            + "\n".join(diagnosed)
        )
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


def _real_pytest_args(spec: RepoSpec) -> tuple[str, ...]:
    """A real repository's suite keeps running past a module that cannot be collected (that module is counted)."""
    return () if spec.test_cmd else ("--continue-on-collection-errors",)


def grader_confirm(provider: SandboxProvider, timeout_s: float) -> Confirm:
    """Confirm a task the way it will be graded: `grade_patch` (sealed runner, fresh sandbox, fresh process).

    The untouched bug must be graded unresolved and the reference fix resolved. A FAIL_TO_PASS id that passes with
    the bug, or fails with the fix, in the grader's run (e.g. parametrized over a set, or passing only after other
    tests ran) is dropped, and so is a PASS_TO_PASS id failing in either; the task is then graded again with what
    is left."""

    async def grade(task: TaskInstance, fix_patch: str) -> tuple[Any, Any]:
        bug = await grade_patch(provider, task, "", timeout_s)
        gold = await grade_patch(provider, task, fix_patch, timeout_s)
        return bug, gold

    async def confirm(task: TaskInstance, fix_patch: str) -> Confirmation:
        bug, gold = await grade(task, fix_patch)
        for name, grade_ in (("bug", bug), ("gold", gold)):
            if grade_.status not in (RESOLVED_FULL, "RESOLVED_PARTIAL", "RESOLVED_NO"):
                return Confirmation(None, f"{name}_grade:{grade_.status}")
        ok_bug, ok_gold = passing(bug.outcomes), passing(gold.outcomes)
        dropped: Counter[str] = Counter()
        f2p = []
        for t in task.FAIL_TO_PASS:
            if t in ok_bug:
                dropped["fail_to_pass_passes_with_bug"] += 1
            elif t not in ok_gold:
                dropped["fail_to_pass_fails_with_fix"] += 1
            else:
                f2p.append(t)
        p2p = [t for t in task.PASS_TO_PASS if t in ok_bug and t in ok_gold]
        dropped["pass_to_pass_fails_in_grading"] += len(task.PASS_TO_PASS) - len(p2p)
        dropped = +dropped
        if not f2p:
            return Confirmation(None, "no_fail_to_pass_in_grading", dropped)
        if not p2p:
            return Confirmation(None, "no_pass_to_pass_in_grading", dropped)
        kept = task.model_copy(update={"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p})
        if dropped:  # fewer ids run together: grade again exactly as the task now stands
            bug, gold = await grade(kept, fix_patch)
        if gold.status != RESOLVED_FULL:
            return Confirmation(None, "gold_unresolved", dropped)
        if bug.status == RESOLVED_FULL:
            return Confirmation(None, "bug_resolved", dropped)
        return Confirmation(kept, dropped=dropped)

    return confirm


async def _synthesize_all(
    cfg: CurateConfig,
    specs: Sequence[RepoSpec],
    seed: int,
    provider: SandboxProvider,
    micro: frozenset[str] = frozenset(),
    real: Mapping[str, RealRepo] | None = None,
) -> tuple[list[TaskInstance], list[RepoReport]]:
    """Every repository at once, in order of results: one gate keeps validation_workers sandboxes busy overall.

    Repositories named in `micro` deal their few candidates over the modifiers in a seeded order (a budget of 3
    in name order would never reach swap_*). Repositories named in `real` run in their own environment's
    provider, leave failing clean tests out and have every task confirmed by the grader.
    """
    real = real or {}
    gate = asyncio.Semaphore(cfg.validation_workers)
    results = await asyncio.gather(
        *(
            synthesize_repo(
                spec,
                real[spec.name].provider if spec.name in real else provider,
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
                **(_real_options(spec, real[spec.name], cfg) if spec.name in real else {}),
            )
            for spec in specs
        )
    )
    tasks = [task for repo_tasks, _ in results for task in repo_tasks]
    return tasks, [report for _, report in results]


def _real_options(spec: RepoSpec, repo: RealRepo, cfg: CurateConfig) -> dict[str, Any]:
    return {
        "pytest_args": _real_pytest_args(spec),
        "exclude_failing": True,
        "confirm": grader_confirm(repo.provider, cfg.sandbox.timeout_s),
    }


def resolve_sources(sources: Sequence[RepoSource]) -> list[RepoSpec]:
    """RepoSource entries -> repositories (sdists extracted and git repositories cloned into swerl's cache)."""
    specs = []
    for source in sources:
        path, default_name = materialize_source(source.path)
        name = source.name or default_name
        # The tasks name the repository and the environment it runs in (venv://): every later stage runs them
        # with that environment's interpreter, and another machine can rebuild it from the reference.
        image = str(env_reference(path, source.install, source.python_path))
        specs.append(RepoSpec(name=name, path=path, repo=f"local/{name}", image=image, test_cmd=source.test_cmd))
    return specs


def content_key(cfg: CurateConfig) -> str:
    """The contents of the configured repositories (directories' tree hashes, sdists' hashes, git HEADs) and Harbor
    task directories (every file: task.toml, environment/, tests/, solution/), for the stage key: a changed
    repository or task reruns curate. Empty when only shipped and micro repositories are listed."""
    parts = [
        f"harbor:{directory}={harbor_content_digest(directory)}"
        for entry in cfg.harbor
        for directory in harbor_task_dirs(entry)
    ]
    for entry in cfg.repos:
        if isinstance(entry, RepoSource):
            parts.append(f"{entry.path}={source_fingerprint(entry.path)}")
        elif entry != "builtin" and not entry.startswith("builtin:") and Path(entry).expanduser().is_dir():
            parts.append(f"{entry}=tree:{tree_hash(Path(entry).expanduser().resolve())}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20] if parts else ""


def _merge_micro_reports(reports: Sequence[RepoReport], micro: Sequence[RepoSpec]) -> list[RepoReport]:
    """Other repositories' reports as they are, then one 'micro-train' and one 'micro-eval' report (if any)."""
    split_of = {spec.name: micro_split(spec.repo) for spec in micro}
    merged = [r for r in reports if r.name not in split_of]
    for split in SPLITS:
        group = [r for r in reports if split_of.get(r.name) == split]
        if group:
            merged.append(merge_reports(f"micro-{split}", group))
    return merged


def _load_sources(sources: Sequence[DatasetSource], strict: bool) -> tuple[list[TaskInstance], list[LoadReport]]:
    tasks: list[TaskInstance] = []
    reports = []
    for source in sources:
        loaded, report = load_tasks(
            source.path, source.schema_name, source.split, source.limit, strict, source.revision
        )
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
            rows.append(
                {
                    "repo": report.name,
                    "modifier": f"(skipped: {report.skipped})",
                    "sites": 0,
                    "candidates": 0,
                    "valid": 0,
                }
            )
    return rows


def run_curate(cfg: CurateConfig, ctx: StageContext) -> StageResult:
    """Synthesize and load tasks, decontaminate, split by repository and write train/eval parquet files."""
    specs, real_sources = _repo_specs(cfg)
    micro = micro_specs(cfg.micro) if cfg.micro else []
    _check_micro_names(specs, micro)
    synthesized, repo_reports = _synthesize_logged(cfg, ctx, specs, micro, real_sources)
    repo_reports = _merge_micro_reports(repo_reports, micro)
    loaded, load_reports = _load_sources(cfg.datasets, cfg.strict_rows)
    # Rows whose image is present: the fix must resolve, the empty patch must not.
    gold = gold_check(cfg, ctx, loaded)
    loaded = gold.kept
    tasks = synthesized + loaded
    harbor = curate_harbor(cfg, ctx)

    eval_tasks_ext, eval_load_reports = _load_sources(cfg.decontamination_sets, cfg.strict_rows)
    train, held_out, unmatched = split_by_repo(tasks, cfg.eval_repos)
    unmatched = [entry for entry in unmatched if entry not in harbor.matched]
    train, held_out = train + harbor.train, held_out + harbor.held_out
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
        "harbor": harbor.report,
        "gold_check": gold.report,
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
    metrics |= gold.metrics()
    if harbor.report:
        metrics |= {"harbor_tasks": harbor.report["tasks"], "harbor_kept": harbor.report["kept"]}
        metrics |= {f"harbor_rejected.{why}": n for why, n in harbor.report["rejections"].items()}
    ctx.log_metrics(metrics)
    summary = f"{synth['valid']}/{synth['candidates']} candidates valid; {len(train)} train, {len(held_out)} eval tasks"
    markdown = _markdown(synth, report["split"], decontam_report) + _checked_markdown(harbor.report, gold.report)
    return StageResult(
        metrics=metrics, tables={"yield": yield_table(repo_reports)}, markdown={"curate": markdown}, summary=summary
    )


def _repo_specs(cfg: CurateConfig) -> tuple[list[RepoSpec], dict[RepoSpec, RepoSource]]:
    """The repositories to synthesize from (built-in names, then real sources); each real one's source."""
    sources = [e for e in cfg.repos if isinstance(e, RepoSource)]
    real_specs = resolve_sources(sources)
    specs = resolve_repos([e for e in cfg.repos if isinstance(e, str)]) + real_specs
    names = [s.name for s in specs]
    if duplicates := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"repositories listed more than once (by name; set `name` to tell them apart): {duplicates}")
    return specs, dict(zip(real_specs, sources, strict=True))


def _checked_markdown(harbor: dict[str, Any], gold: dict[str, Any]) -> str:
    """The report's lines on Harbor tasks and on the gold check of loaded rows (none where neither ran)."""
    markdown = ""
    if harbor:
        markdown += (
            f"\nHarbor tasks: {harbor['kept']} of {harbor['tasks']} kept "
            f"(rejections: {harbor['rejections'] or 'none'})\n"
        )
    if gold.get("checked"):
        markdown += (
            f"\nGold check of loaded rows: {gold['checked']} checked in their images, {gold['dropped']} dropped "
            f"({gold['causes'] or 'none'}), {gold['infra_errors']} infrastructure errors, {gold['no_image']} "
            "without their image (unchecked)\n"
        )
    return markdown


def _check_micro_names(specs: Sequence[RepoSpec], micro: Sequence[RepoSpec]) -> None:
    """No repository may share a name with a micro repository or with the two merged micro reports."""
    names = {s.name for s in specs}
    clashing = sorted(s.name for s in micro if s.name in names) + sorted(
        n for n in names if n in ("micro-train", "micro-eval")
    )
    if clashing:
        raise ValueError(f"repositories named like micro repositories or their report: {clashing[:5]}")


def _build_real(
    cfg: CurateConfig, ctx: StageContext, sources: Mapping[RepoSpec, RepoSource]
) -> tuple[dict[str, RealRepo], dict[str, Any]]:
    """Each real repository's environment (built now, before any sandbox starts) and a provider running it."""
    real: dict[str, RealRepo] = {}
    built: dict[str, Any] = {}
    for spec, source in sources.items():
        ctx.log.info("curate: building the test environment of %s (install: %s)", spec.name, source.install)
        env = build_env(spec.path, source.install, source.python_path, source.build_timeout_s)
        ctx.log.info("curate: %s tests with %s (%s)", spec.name, env.python, ", ".join(env.installed))
        provider = sandbox_provider(cfg.sandbox.model_copy(update={"python": env.python}))
        real[spec.name] = RealRepo(source, env, provider)
        built[spec.name] = {
            "python": env.python,
            "env_key": env.key,
            "python_path": env.python_path,
            "installed": list(env.installed),
        }
    return real, built


def _synthesize_logged(
    cfg: CurateConfig,
    ctx: StageContext,
    specs: list[RepoSpec],
    micro: list[RepoSpec],
    sources: Mapping[RepoSpec, RepoSource] | None = None,
) -> tuple[list[TaskInstance], list[RepoReport]]:
    """Tasks synthesized from every repository, in sandboxes whose enforced limits are logged first."""
    real, built = _build_real(cfg, ctx, sources or {})
    if built:
        ctx.log_params({f"repo_env.{name}": info["env_key"] for name, info in built.items()})
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
            _synthesize_all(cfg, all_specs, ctx.seed, provider, frozenset(s.name for s in micro), real)
        )
        for report in reports:
            if report.name in built:
                report.environment = built[report.name]
        _check_yield(ctx, all_specs, reports, provider, cfg.sandbox.timeout_s, real)
        return tasks, reports
    finally:
        release_provider(provider)
        for repo in real.values():
            release_provider(repo.provider)


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
        if "environment" in repo:
            metrics[f"gold_resolved_repo.{name}"] = repo["gold_resolved"]
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
    real = {name: r for name, r in synth["by_repo"].items() if "environment" in r}
    if real:  # repositories with their own environment: what the grader confirmed, what was left out
        lines += [
            "",
            "| repository | candidates | valid | gold-resolved | clean tests left out | ids dropped |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for name, r in real.items():
            lines.append(
                f"| {name} | {sum(r['candidates'].values())} | {sum(r['valid'].values())} | {r['gold_resolved']} "
                f"| {r['skipped_tests'] or 'none'} | {r['dropped_ids'] or 'none'} |"
            )
    return "\n".join(lines) + "\n"
