"""Synthesize SWE-smith-style tasks from a Python repository with a pytest suite.

The clean suite runs first (a repository without tests, or whose clean suite fails, is skipped with the reason
recorded); then every sampled bug candidate runs the suite in a fresh sandbox with the bug applied. A candidate
becomes a task when it breaks at least one test that passed cleanly (FAIL_TO_PASS) and leaves at least one
passing (PASS_TO_PASS). The problem statement is written from the failing tests alone, never from the patch.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from swerl.data.bugs import MODIFIERS, BugCandidate, candidates
from swerl.data.repos import RepoSpec, has_tests, source_files, tree_hash
from swerl.data.schema import TaskInstance
from swerl.data.testrun import TestOutcome, TestStatus, passing, run_tests, split_fail_pass
from swerl.errors import InfraError
from swerl.sandbox.base import ExecResult, SandboxProvider

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


def problem_statement(
    repo: str, failing: Mapping[str, TestOutcome], total_failing: int, max_listed: int = 5
) -> str:
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
) -> tuple[list[TaskInstance], RepoReport]:
    """Validated tasks from one repository, and a report of what was tried and why candidates were rejected.

    A bugged suite gets `bugged_timeout_factor` times the slowest clean run (at least `min_bugged_timeout_s`,
    at most `test_timeout_s`): a bug that loops forever is rejected in seconds, not after the full limit.
    The suite runs with the repository's own test command (`spec.test_cmd`), pytest if it has none. `gate`, when
    given, bounds every sandbox of this call, clean runs included (share one across concurrent repositories);
    otherwise `workers` candidate sandboxes run at once. `shuffle_modifiers`: see sample_candidates.
    """
    _check_arguments(modifiers, workers, clean_runs)
    loop = asyncio.get_running_loop()
    started = loop.time()
    report = RepoReport(name=spec.name)
    if not has_tests(spec.path):
        report.skipped = "no_tests"
        return [], report
    suite = _Suite(
        spec, provider, gate if gate is not None else asyncio.Semaphore(workers), python, pytest_args
    )

    # The clean suite, clean_runs times: a test that does not pass in every run never becomes F2P or P2P.
    clean, slowest_clean_s = await _clean_runs(suite, clean_runs, test_timeout_s, report)
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
        *(_validate(suite, candidate, clean, bugged_timeout_s, base_commit) for candidate in sampled)
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

    async def run(
        self, timeout_s: float, patch: str | None = None
    ) -> tuple[ExecResult, dict[str, TestOutcome]]:
        """One run of the suite, with `patch` applied first when given."""
        path = self.spec.path
        async with self.gate:
            sandbox = await (self.provider.start(path) if patch is None else self.provider.start(path, patch))
            try:
                return await run_tests(
                    sandbox, timeout_s, self.spec.test_cmd, self.python, extra_args=self.pytest_args
                )
            finally:
                await sandbox.close()


async def _clean_runs(
    suite: _Suite, clean_runs: int, test_timeout_s: float, report: RepoReport
) -> tuple[list[dict[str, TestOutcome]], float]:
    """Outcomes of each clean run and the slowest one's seconds; sets report.skipped at the first bad run."""
    clean: list[dict[str, TestOutcome]] = []
    slowest_clean_s = 0.0
    for _ in range(clean_runs):
        result, outcomes = await suite.run(test_timeout_s)
        if result.timed_out:
            report.skipped = "clean_suite_timeout"
        elif not outcomes:
            report.skipped = "no_tests_collected"
        elif len(passing(outcomes)) < len(outcomes) - _not_run(outcomes):
            report.skipped = "clean_suite_fails"
        if report.skipped:
            break
        clean.append(outcomes)
        slowest_clean_s = max(slowest_clean_s, result.duration_s)
    return clean, slowest_clean_s


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
) -> TaskInstance | str:
    """The task a bug candidate makes, or the reason it makes none."""
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
    return TaskInstance(
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
