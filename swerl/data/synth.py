"""Synthesize SWE-smith-style tasks from a Python repository with a pytest suite.

The clean suite runs first (a repository without tests, or whose clean suite fails, is skipped with the reason
recorded; with `exclude_failing`, real repositories' mode, a clean test that fails, errors, cannot be collected or
passes only sometimes is left out and counted by reason instead, and so is a test whose id pytest maps to
different parameters in processes with different hash seeds, e.g. parametrized over a set); then every sampled bug
candidate runs the suite in a fresh sandbox with the bug applied. A candidate becomes a task when it breaks at least one
test that passed cleanly (FAIL_TO_PASS) and leaves at least one passing (PASS_TO_PASS). The problem statement is written
from the failing tests alone, never from the patch.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import shlex
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from swerl.data.bugs import MODIFIERS, BugCandidate, candidates
from swerl.data.environments import spec_environment
from swerl.data.repos import RepoSpec, has_tests, source_files, tree_hash
from swerl.data.schema import TaskInstance
from swerl.data.testrun import TestOutcome, TestStatus, passing, run_tests, split_fail_pass
from swerl.errors import InfraError
from swerl.sandbox.base import Environment, ExecResult, SandboxProvider

SOURCE = "swerl-synth"


@dataclass
class RepoReport:
    """What synthesis did with one repository."""

    name: str
    skipped: str | None = None
    repos: int = 1
    """Repositories this report covers (more than one for a merged report, see merge_reports)."""
    clean_tests: int = 0
    clean_passing: int = 0
    bugged_timeout_s: float = 0.0
    sites: dict[str, int] = field(default_factory=dict)
    candidates: dict[str, int] = field(default_factory=dict)
    valid: dict[str, int] = field(default_factory=dict)
    rejections: Counter[str] = field(default_factory=Counter)
    duration_s: float = 0.0
    skipped_tests: Counter[str] = field(default_factory=Counter)
    """Clean tests left out of every task, by reason (exclude_failing mode): clean_failed, clean_error,
    uncollectable (a module that cannot be collected), flaky, unstable_id."""
    confirmed: int = 0
    """Tasks graded by the confirmation (see synthesize_repo's `confirm`) with the fix resolved, the bug not."""
    dropped_ids: Counter[str] = field(default_factory=Counter)
    """FAIL_TO_PASS / PASS_TO_PASS ids the confirmation dropped, by reason."""
    environment: dict[str, Any] | None = None
    """The repository's own test environment (interpreter, what was installed), when it has one."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "skipped": self.skipped,
            "repos": self.repos,
            "clean_tests": self.clean_tests,
            "clean_passing": self.clean_passing,
            "bugged_timeout_s": round(self.bugged_timeout_s, 3),
            "sites": dict(self.sites),
            "candidates": dict(self.candidates),
            "valid": dict(self.valid),
            "rejections": dict(self.rejections),
            "duration_s": round(self.duration_s, 3),
            "skipped_tests": dict(sorted(self.skipped_tests.items())),
            "gold_resolved": self.confirmed,
            "dropped_ids": dict(sorted(self.dropped_ids.items())),
            **({"environment": self.environment} if self.environment is not None else {}),
        }


def sample_candidates(
    by_modifier: Mapping[str, Sequence[BugCandidate]],
    max_candidates: int,
    seed: int,
    salt: str = "",
    shuffle_modifiers: bool = False,
) -> list[BugCandidate]:
    """Up to `max_candidates`, shuffled per modifier by seed and dealt round-robin so every modifier is tried.

    The deal goes through the modifiers in name order, or in a seeded order with `shuffle_modifiers`: when the
    budget is smaller than the number of modifiers (many tiny repositories), each then gets its fair share.
    """
    queues = []
    for modifier in sorted(by_modifier):
        pool = list(by_modifier[modifier])
        random.Random(f"{seed}:{salt}:{modifier}").shuffle(pool)
        queues.append(pool)
    if shuffle_modifiers:
        random.Random(f"{seed}:{salt}:modifier-order").shuffle(queues)
    picked: list[BugCandidate] = []
    while len(picked) < max_candidates and any(queues):
        for queue in queues:
            if queue and len(picked) < max_candidates:
                picked.append(queue.pop(0))
    return picked


def problem_statement(repo: str, failing: Mapping[str, TestOutcome], total_failing: int, max_listed: int = 5) -> str:
    """An issue-style description of what breaks: failing test ids and their one-line reasons only.

    Short on purpose (it is in every trajectory) and without the repository's name: the agent works in
    /workspace, and a held-out repository's name would be text no training prompt ever showed. `repo` is kept
    in the signature for statements that want it.
    """
    del repo
    lines = [f"{total_failing} test(s) fail:"]
    for node in sorted(failing)[:max_listed]:
        message = failing[node].message or "(the test did not run: its module could not be collected)"
        lines.append(f"- `{node}`: {message}")
    if total_failing > max_listed:
        lines.append(f"- ... and {total_failing - max_listed} more")
    lines.append("Fix the code so that they pass without breaking the tests that pass now.")
    return "\n".join(lines)


def _instance_id(name: str, base_commit: str, candidate: BugCandidate) -> str:
    digest = hashlib.sha256(candidate.bug_patch.encode()).hexdigest()[:8]
    return f"{name}.{base_commit[:8]}.{candidate.modifier}__{digest}"


@dataclass(frozen=True)
class Confirmation:
    """What confirming a task found: the task kept (maybe with fewer test ids) or why not, and ids dropped."""

    task: TaskInstance | None
    rejection: str = ""
    dropped: Mapping[str, int] = field(default_factory=dict)


Confirm = Callable[[TaskInstance, str], Awaitable[Confirmation]]
"""(task, its reference fix patch) -> Confirmation; e.g. the curate stage's check through the sealed grader."""


async def synthesize_repo(
    spec: RepoSpec,
    provider: SandboxProvider,
    *,
    modifiers: Sequence[str],
    max_candidates: int,
    max_tasks: int,
    seed: int,
    workers: int,
    test_timeout_s: float,
    clean_runs: int,
    bugged_timeout_factor: float,
    min_bugged_timeout_s: float,
    python: str = "python",
    pytest_args: Sequence[str] = (),
    gate: asyncio.Semaphore | None = None,
    shuffle_modifiers: bool = False,
    exclude_failing: bool = False,
    confirm: Confirm | None = None,
) -> tuple[list[TaskInstance], RepoReport]:
    """Validated tasks from one repository, and a report of what was tried and why candidates were rejected.

    A bugged suite gets `bugged_timeout_factor` times the slowest clean run (at least `min_bugged_timeout_s`,
    at most `test_timeout_s`): a bug that loops forever is rejected in seconds, not after the full limit.
    The suite runs with the repository's own test command (`spec.test_cmd`), pytest if it has none. `gate`, when
    given, bounds every sandbox of this call, clean runs included (share one across concurrent repositories);
    otherwise `workers` candidate sandboxes run at once. `shuffle_modifiers`: see sample_candidates.
    `exclude_failing`: see the module docstring. `confirm`, when given, checks every task that validation made
    (within the gate) and decides whether it is kept.
    """
    _check_arguments(modifiers, workers, clean_runs)
    loop = asyncio.get_running_loop()
    started = loop.time()
    report = RepoReport(name=spec.name)
    if not has_tests(spec.path):
        report.skipped = "no_tests"
        return [], report
    suite = _Suite(spec, provider, gate if gate is not None else asyncio.Semaphore(workers), python, pytest_args)

    # The clean suite, clean_runs times: a test that does not pass in every run never becomes F2P or P2P.
    clean, slowest_clean_s = await _clean_runs(suite, clean_runs, test_timeout_s, report, exclude_failing)
    if exclude_failing and not report.skipped:
        clean = await _without_unstable(suite, clean, test_timeout_s, report)
    if report.skipped:
        report.duration_s = loop.time() - started
        return [], report
    bugged_timeout_s = min(test_timeout_s, max(min_bugged_timeout_s, bugged_timeout_factor * slowest_clean_s))
    report.bugged_timeout_s = bugged_timeout_s
    report.clean_tests = len(clean[0])
    report.clean_passing = len(set.intersection(*(passing(c) for c in clean)))

    # Then each sampled bug in a fresh sandbox, under a timeout scaled from the clean runs.
    base_commit = tree_hash(spec.path)
    sampled = _sample_bugs(spec, modifiers, max_candidates, seed, shuffle_modifiers, report)
    validated = await asyncio.gather(
        *(_validate(suite, candidate, clean, bugged_timeout_s, base_commit, confirm, report) for candidate in sampled)
    )
    tasks = _keep(validated, max_tasks, report)
    report.duration_s = loop.time() - started
    return tasks, report


def _check_arguments(modifiers: Sequence[str], workers: int, clean_runs: int) -> None:
    unknown = sorted(set(modifiers) - set(MODIFIERS))
    if unknown:
        raise ValueError(f"unknown bug modifiers {unknown}; known: {sorted(MODIFIERS)}")
    if workers < 1 or clean_runs < 1:
        raise ValueError(f"workers ({workers}) and clean_runs ({clean_runs}) must be >= 1")


def _keep(validated: Sequence[TaskInstance | str], max_tasks: int, report: RepoReport) -> list[TaskInstance]:
    """The first max_tasks valid tasks; every rejection (and every task past max_tasks) counted in the report."""
    tasks: list[TaskInstance] = []
    for outcome in validated:
        if isinstance(outcome, str):
            report.rejections[outcome] += 1
        elif len(tasks) >= max_tasks:
            report.rejections["over_max_tasks"] += 1
        else:
            tasks.append(outcome)
    report.valid = dict(Counter(t.modifier or "" for t in tasks))
    return tasks


@dataclass(frozen=True)
class _Suite:
    """How one repository's test suite is run: in a fresh sandbox per run, at most `gate` at once."""

    spec: RepoSpec
    provider: SandboxProvider
    gate: asyncio.Semaphore
    python: str
    pytest_args: Sequence[str]

    @property
    def environment(self) -> Environment:
        """Where its sandboxes start: the repository's image where the spec names one, its directory with its own
        virtualenv (venv://), else its directory."""
        return spec_environment(self.spec.image, self.spec.path)

    async def exec(self, command: str, timeout_s: float) -> ExecResult:
        """One command in a fresh sandbox of the clean repository."""
        async with self.gate:
            sandbox = await self.provider.start(self.environment)
            try:
                return await sandbox.exec(command, timeout=timeout_s)
            finally:
                await sandbox.close()

    async def run(self, timeout_s: float, patch: str | None = None) -> tuple[ExecResult, dict[str, TestOutcome]]:
        """One run of the suite, with `patch` applied first when given."""
        path = self.environment
        async with self.gate:
            sandbox = await (self.provider.start(path) if patch is None else self.provider.start(path, patch))
            try:
                return await run_tests(sandbox, timeout_s, self.spec.test_cmd, self.python, extra_args=self.pytest_args)
            finally:
                await sandbox.close()


async def _clean_runs(
    suite: _Suite, clean_runs: int, test_timeout_s: float, report: RepoReport, exclude_failing: bool = False
) -> tuple[list[dict[str, TestOutcome]], float]:
    """Outcomes of each clean run and the slowest one's seconds; sets report.skipped at the first bad run.

    With `exclude_failing`, failing and uncollectable tests do not skip the repository: they are counted in
    report.skipped_tests (and never become FAIL_TO_PASS or PASS_TO_PASS, which need a pass in every clean run)."""
    clean: list[dict[str, TestOutcome]] = []
    slowest_clean_s = 0.0
    for _ in range(clean_runs):
        result, outcomes = await suite.run(test_timeout_s)
        if result.timed_out:
            report.skipped = "clean_suite_timeout"
        elif not outcomes:
            report.skipped = "no_tests_collected"
        elif exclude_failing and not passing(outcomes):
            report.skipped = "no_clean_test_passes"
        elif not exclude_failing and len(passing(outcomes)) < len(outcomes) - _not_run(outcomes):
            report.skipped = "clean_suite_fails"
        if report.skipped:
            break
        clean.append(outcomes)
        slowest_clean_s = max(slowest_clean_s, result.duration_s)
    if exclude_failing and clean:
        report.skipped_tests.update(_excluded_by_reason(clean))
    return clean, slowest_clean_s


def _excluded_by_reason(clean: Sequence[Mapping[str, TestOutcome]]) -> Counter[str]:
    """Tests of the clean runs that no task may use, by reason (a test counted once, by its first run's status)."""
    stable = set.intersection(*(passing(run) for run in clean))
    reasons: Counter[str] = Counter()
    for node in sorted(set().union(*clean)):
        if node in stable:
            continue
        statuses = {run[node].status for run in clean if node in run}
        if statuses & {TestStatus.PASSED, TestStatus.XPASS}:
            reasons["flaky"] += 1
        elif statuses <= {TestStatus.SKIPPED, TestStatus.XFAIL}:
            continue  # not run: neither evidence for nor against
        elif "::" not in node:
            reasons["uncollectable"] += 1
        elif TestStatus.FAILED in statuses:
            reasons["clean_failed"] += 1
        else:
            reasons["clean_error"] += 1
    return reasons


_COLLECT_SOURCE = r"""
import re, sys, pytest
class _Ids:
    def pytest_collection_modifyitems(self, items):
        for item in items:
            spec = getattr(item, "callspec", None)
            params = "" if spec is None else repr([(k, spec.params[k]) for k in sorted(spec.params)])
            print("@@swerl-id " + item.nodeid + "\t" + re.sub(r" at 0x[0-9a-fA-F]+", "", params).replace("\n", " "))
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[_Ids()]))
"""
HASH_SEEDS = (1, 2, 3)
"""PYTHONHASHSEED of the collections compared for unstable ids (fixed: the check itself is deterministic)."""
_ID_LINE = re.compile(r"^@@swerl-id (.*)\t(.*)$")


async def _without_unstable(
    suite: _Suite, clean: list[dict[str, TestOutcome]], timeout_s: float, report: RepoReport
) -> list[dict[str, TestOutcome]]:
    """The clean runs without ids that pytest maps to other parameters (or collects only sometimes) in
    processes with other hash seeds: e.g. parametrized over a set, whose order changes from process to process.
    Only for pytest suites (a repository's own test command is trusted as it is)."""
    if suite.spec.test_cmd:
        return clean
    seen: list[dict[str, str]] = []
    for seed in HASH_SEEDS:
        command = (
            f"PYTHONHASHSEED={seed} COLUMNS=200 {shlex.quote(suite.python)} -c "
            f"{shlex.quote(_COLLECT_SOURCE)} {' '.join(shlex.quote(a) for a in suite.pytest_args)}"
        )
        result = await suite.exec(command, timeout_s)
        ids = {}
        for line in result.output.splitlines():
            if match := _ID_LINE.match(line):
                ids[match.group(1)] = match.group(2)
        seen.append(ids)
    candidates = set(clean[0]) if clean else set()
    unstable = {node for node in candidates if "::" in node and len({ids.get(node) for ids in seen}) > 1}
    if unstable:
        report.skipped_tests["unstable_id"] += len(unstable)
    return [{n: o for n, o in run.items() if n not in unstable} for run in clean]


def _sample_bugs(
    spec: RepoSpec,
    modifiers: Sequence[str],
    max_candidates: int,
    seed: int,
    shuffle_modifiers: bool,
    report: RepoReport,
) -> list[BugCandidate]:
    """Every bug site of every modifier in the repository's sources, sampled down to max_candidates."""
    by_modifier: dict[str, list[BugCandidate]] = {m: [] for m in modifiers}
    for rel in source_files(spec.path):
        text = (spec.path / rel).read_text(encoding="utf-8", errors="surrogateescape")
        for modifier in modifiers:
            try:
                by_modifier[modifier] += candidates(modifier, rel.as_posix(), text)
            except ValueError:
                report.rejections["unparseable_source"] += 1
                break
    report.sites = {m: len(c) for m, c in by_modifier.items()}
    sampled = sample_candidates(by_modifier, max_candidates, seed, spec.name, shuffle_modifiers)
    report.candidates = dict(Counter(c.modifier for c in sampled))
    return sampled


async def _validate(
    suite: _Suite,
    candidate: BugCandidate,
    clean: list[dict[str, TestOutcome]],
    bugged_timeout_s: float,
    base_commit: str,
    confirm: Confirm | None = None,
    report: RepoReport | None = None,
) -> TaskInstance | str:
    """The task a bug candidate makes (confirmed, when `confirm` is given), or the reason it makes none."""
    try:
        result, bugged = await suite.run(bugged_timeout_s, candidate.bug_patch)
    except InfraError as exc:
        # One broken sandbox costs one candidate, counted by cause, not the whole repository.
        return f"infra_error:{exc.cause}"
    if result.timed_out:
        return "bugged_suite_timeout"
    fail_to_pass, pass_to_pass = split_fail_pass(clean, bugged)
    if not fail_to_pass:
        return "no_fail_to_pass"
    if not pass_to_pass:
        return "no_pass_to_pass"
    spec = suite.spec
    failing = {t: bugged.get(t, TestOutcome(TestStatus.ERROR)) for t in fail_to_pass}
    task = TaskInstance(
        instance_id=_instance_id(spec.name, base_commit, candidate),
        repo=spec.repo,
        base_commit=base_commit,
        problem_statement=problem_statement(spec.repo, failing, len(fail_to_pass)),
        patch=candidate.bug_patch,
        patch_kind="bug",
        FAIL_TO_PASS=fail_to_pass,
        PASS_TO_PASS=pass_to_pass,
        image=spec.image,
        test_cmd=spec.test_cmd,
        source=SOURCE,
        modifier=candidate.modifier,
    )
    if confirm is None:
        return task
    try:
        async with suite.gate:
            confirmation = await confirm(task, candidate.fix_patch)
    except InfraError as exc:
        return f"infra_error:{exc.cause}"
    if report is not None:
        report.dropped_ids.update(confirmation.dropped)
    if confirmation.task is None:
        return confirmation.rejection or "not_confirmed"
    kept = confirmation.task
    if report is not None:
        report.confirmed += 1
    if kept.FAIL_TO_PASS != task.FAIL_TO_PASS:  # the statement names only the tests the task still has
        failing = {t: failing[t] for t in kept.FAIL_TO_PASS if t in failing}
        kept = kept.model_copy(
            update={"problem_statement": problem_statement(spec.repo, failing, len(kept.FAIL_TO_PASS))}
        )
    return kept


def merge_reports(name: str, reports: Sequence[RepoReport]) -> RepoReport:
    """One report for many repositories (e.g. hundreds of micro repositories): counts summed; the bugged-suite
    timeout and the duration the largest (repositories are synthesized concurrently, so durations overlap);
    each skipped repository counted as a `repo_skipped:REASON` rejection."""
    merged = RepoReport(name=name, repos=sum(r.repos for r in reports))
    sites: Counter[str] = Counter()
    tried: Counter[str] = Counter()
    valid: Counter[str] = Counter()
    for r in reports:
        merged.clean_tests += r.clean_tests
        merged.clean_passing += r.clean_passing
        merged.bugged_timeout_s = max(merged.bugged_timeout_s, r.bugged_timeout_s)
        merged.duration_s = max(merged.duration_s, r.duration_s)
        merged.rejections.update(r.rejections)
        merged.skipped_tests.update(r.skipped_tests)
        merged.dropped_ids.update(r.dropped_ids)
        merged.confirmed += r.confirmed
        if r.skipped:
            merged.rejections[f"repo_skipped:{r.skipped}"] += 1
        sites.update(r.sites)
        tried.update(r.candidates)
        valid.update(r.valid)
    merged.sites, merged.candidates, merged.valid = dict(sites), dict(tried), dict(valid)
    return merged


def _not_run(outcomes: Mapping[str, TestOutcome]) -> int:
    """Tests that neither passed nor failed (skipped, expected failures): not evidence of a broken suite."""
    return sum(o.status in (TestStatus.SKIPPED, TestStatus.XFAIL) for o in outcomes.values())


def summarize(reports: Sequence[RepoReport]) -> dict[str, Any]:
    """Totals across repositories: candidates, valid, by modifier, by repo, rejection reasons, skipped repos."""
    candidates_by_modifier: Counter[str] = Counter()
    valid_by_modifier: Counter[str] = Counter()
    rejections: Counter[str] = Counter()
    for r in reports:
        candidates_by_modifier.update(r.candidates)
        valid_by_modifier.update(r.valid)
        rejections.update(r.rejections)
    return {
        "candidates": sum(candidates_by_modifier.values()),
        "valid": sum(valid_by_modifier.values()),
        "by_modifier": {
            m: {"candidates": candidates_by_modifier[m], "valid": valid_by_modifier[m]}
            for m in sorted(candidates_by_modifier)
        },
        "by_repo": {r.name: r.to_dict() for r in reports},
        "rejections": dict(sorted(rejections.items())),
        "skipped_repos": {r.name: r.skipped for r in reports if r.skipped},
    }
