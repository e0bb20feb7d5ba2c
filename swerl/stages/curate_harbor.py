"""Harbor tasks as a curate source (`curate.harbor`): each directory's image built offline, its reference patch
the diff solution/solve.sh makes in a fresh sandbox of it, kept only when its own verifier, through the one
grader, gives that patch 1 and the empty patch 0 (the rest counted by reason); split by `harbor_eval_keys`."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swerl.config.data import CurateConfig
from swerl.data.harbor import (
    HarborFormatError,
    HarborTask,
    SolutionFailed,
    build_harbor_image,
    harbor_reference_patch,
    harbor_task_dirs,
    load_harbor_task,
)
from swerl.data.schema import TaskInstance, normalize_repo
from swerl.errors import InfraError, NoTasksError
from swerl.grading.grader import RESOLVED_FULL, grade_patch, start_task_sandbox
from swerl.sandbox.base import SandboxProvider
from swerl.sandbox.pool import release_provider
from swerl.stages.common import run_async, sandbox_provider
from swerl.stages.runner import StageContext

HARBOR_CATEGORY = "harbor-category:"
"""An eval_repos entry `harbor-category:CAT` holds out every Harbor task whose [metadata] category is CAT."""


def harbor_eval_keys(harbor: HarborTask) -> set[str]:
    """The eval_repos entries (normalized) that hold a Harbor task out: `harbor/NAME` (its repo), `NAME` (its
    directory's name) and `harbor-category:CATEGORY` ([metadata] category, when it has one)."""
    keys = {normalize_repo(f"harbor/{harbor.name}"), normalize_repo(harbor.name)}
    category = harbor.metadata.get("category")
    if isinstance(category, str) and category.strip():
        keys.add(normalize_repo(HARBOR_CATEGORY + category.strip()))
    return keys


@dataclass(frozen=True)
class HarborCuration:
    """The Harbor tasks kept, split; the eval_repos entries (normalized) they matched; the report section."""

    train: list[TaskInstance]
    held_out: list[TaskInstance]
    matched: frozenset[str]
    report: dict[str, Any]


@dataclass(frozen=True)
class _HarborOutcome:
    directory: Path
    task: TaskInstance | None
    harbor: HarborTask | None
    reason: str | None
    detail: str


async def _gold_check_harbor(directory: Path, provider: SandboxProvider, timeout_s: float) -> _HarborOutcome:
    """Load, build, take solve.sh's diff in a fresh sandbox, and grade that diff (must be 1) and the empty patch
    (must be 0) with the task's verifier; a failure is a rejection reason and what it said."""

    def rejected(reason: str, detail: str, harbor: HarborTask | None = None) -> _HarborOutcome:
        return _HarborOutcome(directory, None, harbor, reason, detail)

    try:
        task, harbor = await asyncio.to_thread(load_harbor_task, directory)
    except HarborFormatError as exc:
        return rejected("format_error", str(exc))
    if not harbor.has_solution:
        return rejected("no_solution", f"{directory}: no solution/solve.sh to take a reference patch from", harbor)
    try:
        await asyncio.to_thread(build_harbor_image, harbor)
        sandbox = await start_task_sandbox(provider, task)
        try:  # solve.sh runs under the task's own agent timeout (Harbor's oracle agent runs under it too)
            patch = await harbor_reference_patch(sandbox, harbor, harbor.agent_timeout_s or timeout_s)
        finally:
            await sandbox.close()
        if not patch.strip():
            return rejected(
                "solution_changes_nothing", f"{directory}: solution/solve.sh left the repository as it was", harbor
            )
        task, _ = await asyncio.to_thread(load_harbor_task, directory, reference_patch=patch)
        gold = await grade_patch(provider, task, patch, timeout_s)
        if gold.status != RESOLVED_FULL:
            return rejected(
                "gold_unresolved",
                f"the reference patch graded {gold.status}, reward {gold.reward} ({gold.detail}): {gold.log[-300:]}",
                harbor,
            )
        empty = await grade_patch(provider, task, "", timeout_s)
        if empty.reward != 0.0:
            return rejected(
                "empty_patch_rewarded",
                f"the empty patch graded {empty.status}, reward {empty.reward} ({empty.detail})",
                harbor,
            )
    except SolutionFailed as exc:
        return rejected("solution_failed", exc.message, harbor)
    except InfraError as exc:
        return rejected(f"infra_error:{exc.cause}", exc.message, harbor)
    return _HarborOutcome(directory, task, harbor, None, f"gold {gold.detail}; empty patch {empty.detail}")


def _harbor_limits(harbor: HarborTask, cfg: CurateConfig) -> dict[str, Any]:
    """task.toml's limits next to what swerl applies: the verifier timeout is the task's own; the agent timeout
    runs solve.sh here but is not an episode's cap (agent.episode_timeout_s is one value per stage); cpus and
    memory_mb are per provider in swerl (sandbox.docker.cpus, sandbox.memory_mb), never per task."""
    limits: dict[str, Any] = {
        "verifier_timeout_s": harbor.verifier_timeout_s,
        "agent_timeout_s": harbor.agent_timeout_s,
        "cpus": harbor.cpus,
        "memory_mb": harbor.memory_mb,
    }
    above = []
    if harbor.memory_mb is not None and harbor.memory_mb > cfg.sandbox.memory_mb:
        above.append(f"memory_mb {harbor.memory_mb} > sandbox.memory_mb {cfg.sandbox.memory_mb}")
    if cfg.sandbox.backend == "docker" and harbor.cpus is not None and harbor.cpus > cfg.sandbox.docker.cpus:
        above.append(f"cpus {harbor.cpus} > sandbox.docker.cpus {cfg.sandbox.docker.cpus}")
    if above:
        limits["above_sandbox"] = above
    return limits


def _task_dirs(entries: list[str]) -> list[Path]:
    """Every Harbor task directory the `curate.harbor` entries name; two with one name (their instance id) refused."""
    directories = [directory for entry in entries for directory in harbor_task_dirs(entry)]
    by_name: dict[str, list[str]] = {}
    for directory in directories:
        by_name.setdefault(directory.name, []).append(str(directory))
    if clashing := {name: paths for name, paths in by_name.items() if len(paths) > 1}:
        raise ValueError(f"curate.harbor: Harbor tasks share a directory name (their instance id): {clashing}")
    return directories


def _gold_check_all(cfg: CurateConfig, directories: list[Path]) -> list[_HarborOutcome]:
    """The gold check of every task directory, validation_workers at a time, in curate's sandboxes."""
    provider = sandbox_provider(cfg.sandbox, git_baseline=True)
    gate = asyncio.Semaphore(cfg.validation_workers)

    async def gated(directory: Path) -> _HarborOutcome:
        async with gate:
            return await _gold_check_harbor(directory, provider, cfg.sandbox.timeout_s)

    async def every() -> list[_HarborOutcome]:
        return list(await asyncio.gather(*(gated(d) for d in directories)))

    try:
        return run_async(every())
    finally:
        release_provider(provider)


def curate_harbor(cfg: CurateConfig, ctx: StageContext) -> HarborCuration:
    """The `curate.harbor` tasks that pass the gold check, split by `harbor_eval_keys`; the others counted by reason
    (the stage fails when Harbor tasks are configured and none is kept, saying why for each)."""
    if not cfg.harbor:
        return HarborCuration([], [], frozenset(), {})
    if cfg.sandbox.backend == "local" and cfg.sandbox.runtime == "bubblewrap":
        raise ValueError(
            "curate.harbor needs sandboxes that keep /tmp between commands (the verifier's tests and reward live "
            "there): set curate.sandbox.backend docker, or runtime supervisor (local backend, as root), not bubblewrap"
        )
    directories = _task_dirs(cfg.harbor)
    ctx.log.info("curate: %d Harbor tasks from %s", len(directories), cfg.harbor)
    outcomes = _gold_check_all(cfg, directories)
    wanted = {normalize_repo(r) for r in cfg.eval_repos}
    train: list[TaskInstance] = []
    held_out: list[TaskInstance] = []
    matched: set[str] = set()
    rejections: Counter[str] = Counter()
    rejected: dict[str, str] = {}
    limits: dict[str, Any] = {}
    for outcome in outcomes:
        name = outcome.directory.name
        if outcome.task is None or outcome.harbor is None:
            rejections[outcome.reason or "unknown"] += 1
            rejected[name] = f"{outcome.reason}: {outcome.detail}"
            ctx.log.warning("curate: Harbor task %s dropped (%s)", outcome.directory, rejected[name][:1000])
            continue
        limits[name] = _harbor_limits(outcome.harbor, cfg)
        if "above_sandbox" in limits[name]:
            ctx.log.warning(
                "curate: Harbor task %s asks for more than swerl's sandboxes give (per provider, not per task): %s",
                name,
                limits[name]["above_sandbox"],
            )
        keys = harbor_eval_keys(outcome.harbor) & wanted
        matched |= keys
        if keys:
            held_out.append(outcome.task.model_copy(update={"split": "eval"}))
        else:
            train.append(outcome.task.model_copy(update={"split": "train"}))
    if not train and not held_out:
        raise NoTasksError(
            f"curate: none of the {len(directories)} Harbor tasks passed the gold check (reference patch 1, empty "
            "patch 0):\n" + "\n".join(f"--- {name}: {why[:2000]}" for name, why in rejected.items())
        )
    report = {
        "tasks": len(directories),
        "kept": len(train) + len(held_out),
        "train": len(train),
        "eval": len(held_out),
        "rejections": dict(sorted(rejections.items())),
        "rejected": rejected,
        "limits": limits,
    }
    return HarborCuration(train, held_out, frozenset(matched), report)
