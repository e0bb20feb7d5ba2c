"""Grading an attempt so that nothing the policy wrote can influence the verdict; one grader for reward and evaluation.

`grade_patch` is the only grader (training reward, the oracle, evaluation):

1. The attempt's patch (`workspace_patch`: `git diff` of the agent's workspace against the task's starting commit)
   loses every file section that touches test code or test infrastructure (`is_test_infra`: tests, conftest.py,
   pytest/tox/setup.cfg/pyproject configuration, sitecustomize/usercustomize, .pth files, the micro harness,
   shadows of pytest/pluggy, symlinks), as the SWE-bench harness drops test-file hunks; the dropped paths are kept
   in the grade and counted.
2. What is left is applied to a pristine copy of the task in a fresh sandbox (never the agent's, whose files and
   .git the agent controlled), the task's test_patch after it.
3. FAIL_TO_PASS + PASS_TO_PASS run under swerl's sealed runner (swerl/grading/sealed_runner.py): results reach the
   grader as lines authenticated with a key the tests never see, the test machinery is checked for tampering, and
   the run's exit status must agree with its results. Printed `PASSED` lines, early exits, atexit tricks, patched
   harnesses or hooks, skipped tests and timeouts all score 0.

The verdict uses SWE-bench's rule and status names: RESOLVED_FULL (reward 1) iff every FAIL_TO_PASS and
PASS_TO_PASS test passed. Tasks whose test command is neither pytest nor the micro harness have no sealed runner
yet: they are graded from their log and the grade says `sealed=False`.

A task with a `verifier` (a Harbor task, swerl.data.harbor) is graded by it instead of by test ids: step 1 and 2
as above, then the task's tests/test.sh runs (swerl.grading.harbor_verifier.run_verifier) and its reward is the
grade's (`sealed=False`: the verifier runs in the same sandbox user as the code it tests; see
_grade_with_verifier).
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import hmac
import json
import re
import secrets
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path, PurePosixPath

from swerl.data.environments import task_environment
from swerl.data.harbor import VERIFIER_TEST_ID, harbor_task_of
from swerl.data.repos import is_test_file
from swerl.data.schema import TaskInstance
from swerl.data.testrun import TestOutcome, TestStatus
from swerl.errors import InfraError
from swerl.grading.harbor_verifier import run_verifier
from swerl.grading.harness import read_harness_log
from swerl.grading.plan import GradingPlan, grading_plan
from swerl.sandbox.base import IGNORED_AT_START, ExecResult, Sandbox, SandboxProvider

_GIT_TIMEOUT_S = 60.0
# The workspace's .git is the agent's to write: ignore any hooks or fsmonitor it may have planted there.
_GIT = "git -c core.hooksPath=/dev/null -c core.fsmonitor=false"
_PATCH_FILE = ".swerl-grade.patch"
# Caches that tools leave in the workspace are not part of anyone's patch.
_EXCLUDES = ("**/.pytest_cache/**", "**/__pycache__/**", "**/*.pyc", ".swerl-*")
_PATHSPEC = " ".join(["."] + [shlex.quote(f":(exclude,glob){pattern}") for pattern in _EXCLUDES])
RUNNER_FILES = tuple(
    Path(__file__).with_name(name)
    for name in ("sealed_hook.py", "sealed_micro.py", "sealed_unittest.py", "sealed_runner.py")
)
"""The sealed runner's parts, joined in this order into the one script sent to the sandbox (runner_source)."""


@cache
def runner_source() -> str:
    """The sealed runner as one script: its parts joined, without the statements that import one part into another
    for the linters (`from swerl.grading.sealed_... import ...`: the sandbox has no swerl), `_main()` run last
    (sealed_runner.py's `__main__` guard)."""
    parts = []
    for path in RUNNER_FILES:
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.parse(text).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("swerl."):
                for i in range(node.lineno - 1, node.end_lineno or node.lineno):
                    lines[i] = ""
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


_INFRA_NAMES = frozenset(
    {
        "conftest.py",
        "run_tests.py",
        "pytest.ini",
        ".pytest.ini",
        "pytest.toml",
        ".pytest.toml",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "noxfile.py",
        ".coveragerc",
        "sitecustomize.py",
        "usercustomize.py",
        "pytest.py",
        "pluggy.py",
        "py.py",
    }
)
"""Files pytest or the interpreter read as configuration or load at start-up (pytest reads `.pytest.ini` before
`pytest.ini`, and pytest 9 reads `pytest.toml` and `.pytest.toml` too)."""
_INFRA_TOP_DIRS = frozenset({"_pytest", "pytest", "pluggy", "py"})
_METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg-link")
"""Package metadata: an entry point in it (a pytest11 plugin, a console script) is loaded from wherever it lies on
sys.path, the workspace included. The sealed runner does not read the workspace's; the patch may not carry any."""
_DIFF_HEADER = re.compile(r"^diff --git (\"(?:[^\"\\]|\\.)*\"|\S+) (\"(?:[^\"\\]|\\.)*\"|\S+)$")
# Code that reaches into the interpreter running the tests: not a verdict (pytest's own fixes do this), a signal
# counted in every grade so that a policy learning to poke at the runner shows up in the metrics.
_INTROSPECTION = re.compile(
    r"sys\._getframe|\bf_back\b|\bf_locals\b|gc\.get_(objects|referrers)|\bctypes\b|sys\.set(trace|profile)"
    r"|sys\.meta_path|sys\.path_hooks|\b_pytest\b|\bpluggy\b|os\._exit|\batexit\b|__builtins__|@@swerl"
)

SWEBENCH_MARKERS = (">>>>> Start Test Output", ">>>>> End Test Output", ">>>>> Test Exit Code")
"""swebench.harness.constants' START_TEST_OUTPUT, END_TEST_OUTPUT and TEST_EXIT_CODE: an unsealed run's log is
printed between them so that swebench's own parsers read it (tests check they still equal swebench's)."""

RESOLVED_FULL, RESOLVED_PARTIAL, RESOLVED_NO = "RESOLVED_FULL", "RESOLVED_PARTIAL", "RESOLVED_NO"
"""SWE-bench's resolution statuses (swebench.harness.constants.ResolvedStatus values)."""


def is_test_infra(path: str) -> bool:
    """Whether a repository path is test code or test infrastructure: the task's, never the patch's."""
    rel = PurePosixPath(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        return True
    return (
        is_test_file(Path(path))
        or rel.name in _INFRA_NAMES
        or rel.suffix == ".pth"
        or rel.parts[0] in _INFRA_TOP_DIRS
        or rel.name.startswith((".swerl", "__editable__"))
        or any(part.endswith(_METADATA_SUFFIXES) for part in rel.parts)
    )


def _unquote(token: str) -> str:
    """A path token of a `diff --git` header, C-quoted by git when it holds special characters."""
    if token.startswith('"'):
        raw = token[1:-1].encode("latin-1", "backslashreplace").decode("unicode_escape")
        return raw.encode("latin-1", "replace").decode("utf-8", "replace")
    return token


@dataclass(frozen=True)
class FilteredPatch:
    kept: str
    dropped: tuple[str, ...]
    """Paths whose sections were dropped (test infrastructure, symlinks, or a header that could not be read)."""
    touched: tuple[str, ...] = ()
    """Every path a kept section names (both sides of its `diff --git` header: binary files and renames have no
    `+++` line), the files the sealed runner holds the patch responsible for."""
    added: dict[str, tuple[int, ...] | None] = field(default_factory=dict)
    """Touched path -> the new-side line numbers the patch added there; None for a file whose lines cannot be
    told (a binary file: all of it is the patch's). The sealed runner denies introspection to those lines."""


def filter_patch(patch: str) -> FilteredPatch:
    """The patch without the file sections a grader must not take from the policy (SWE-bench drops test hunks)."""
    sections: list[list[str]] = []
    for line in patch.splitlines(keepends=True):
        if line.startswith("diff --git ") or not sections:
            sections.append([])
        sections[-1].append(line)
    kept: list[str] = []
    dropped: list[str] = []
    touched: list[str] = []
    added: dict[str, tuple[int, ...] | None] = {}
    for section in sections:
        header = section[0].rstrip("\n")
        match = _DIFF_HEADER.match(header)
        if not header.startswith("diff --git "):
            if "".join(section).strip():
                dropped.append("<text before the first diff header>")
            continue
        if match is None:
            dropped.append(header[len("diff --git ") :])
            continue
        paths = [_unquote(token) for token in match.groups()]
        paths = [p[2:] if p[:2] in ("a/", "b/") else p for p in paths]
        symlink = any(
            line.startswith(("new mode 120000", "new file mode 120000", "old mode 120000")) for line in section
        )
        if symlink or any(is_test_infra(p) for p in paths):
            dropped.append(paths[-1])
            continue
        kept.append("".join(section))
        touched += [p for p in paths if p not in touched]
        lines, new_path = _added_lines(section), paths[-1]
        for p in paths:
            added.setdefault(p, ())
        known = added[new_path]
        added[new_path] = None if known is None or lines is None else tuple(sorted({*known, *lines}))
    return FilteredPatch("".join(kept), tuple(dropped), tuple(touched), added)


_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def _added_lines(section: list[str]) -> tuple[int, ...] | None:
    """New-side line numbers of a file section's `+` lines; None for a binary section (no lines to tell)."""
    if any(line.startswith(("GIT binary patch", "Binary files ")) for line in section):
        return None
    out: list[int] = []
    line_no = 0
    in_hunk = False
    for line in section:
        match = _HUNK.match(line)
        if match:
            line_no, in_hunk = int(match.group(1)), True
        elif in_hunk and line.startswith("+"):
            out.append(line_no)
            line_no += 1
        elif in_hunk and line.startswith(" "):
            line_no += 1
        elif in_hunk and not line.startswith(("-", "\\")):
            in_hunk = False
    return tuple(out)


def runner_mode(task: TaskInstance) -> str | None:
    """The sealed runner's mode for the task (swerl.grading.plan): pytest, micro, unittest, or None (its
    harness's command runs unsealed)."""
    return grading_plan(task).mode


def sealed_command(
    mode: str,
    keyfile: str,
    test_ids: Sequence[str],
    python: str = "python",
    touched: Sequence[str] | Mapping[str, Sequence[int] | None] = (),
    env: Sequence[str] = (),
) -> str:
    """The shell command that runs the sealed runner on `test_ids` (the runner's source travels inline);
    `touched`: the repository files the graded patch changed (hooks planted elsewhere are the repository's own),
    with the line numbers it added in each where known (FilteredPatch.added; a plain list means whole files)."""
    source = runner_source()
    reach = dict(touched) if isinstance(touched, Mapping) else dict.fromkeys(touched)
    for path in reach:
        lines = reach[path]
        reach[path] = None if lines is None else sorted(lines)
    args = [python, "-I", "-c", source, mode, keyfile, json.dumps(reach, sort_keys=True), "--", *test_ids]
    assignments = [shlex.quote(a) for a in env]  # NAME=value the harness command sets (PYTHON* ones reach the tests'
    # child processes only: -I keeps them from the runner)
    return " ".join(["COLUMNS=200", *assignments, *(shlex.quote(a) for a in args)])


def marked_test_command(test_cmd: str) -> str:
    """A shell command printing the test run between SWE-bench's markers, its exit code after the end marker."""
    start, end, exit_code = SWEBENCH_MARKERS
    return f'echo {shlex.quote(start)}; {test_cmd}; code=$?; echo {shlex.quote(end)}; echo "{exit_code}: $code"'


@dataclass(frozen=True)
class SealedReport:
    """What the sealed runner reported, authenticated: outcomes, the run's own exit code, tampering found."""

    outcomes: dict[str, TestOutcome]
    complete: bool
    exit_code: int | None
    tampered: tuple[str, ...]
    forged_lines: int
    """Lines shaped like the runner's records without a valid MAC: written by code under test."""
    command_exit: int | None = None
    """The test program's own exit status (pytest's), where the mode has one."""
    guarded: bool = True
    """False where the task's Python has no audit hooks (< 3.8): results sealed, introspection not denied."""


def read_sealed(output: str, key: bytes) -> SealedReport:
    """The authenticated records of a sealed run; anything else in the output is the tests' own printing."""
    outcomes: dict[str, TestOutcome] = {}
    forged = 0
    end: dict[str, object] | None = None
    expected_seq = 0
    for line in output.splitlines():
        kind, _, rest = line.partition(" ")
        if kind not in ("@@swerl-result", "@@swerl-end"):
            if "@@swerl" in line:
                forged += 1
            continue
        mac, _, payload = rest.partition(" ")
        good = hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(mac, good) or end is not None:
            forged += 1
            continue
        try:
            data = json.loads(payload)
        except ValueError:
            forged += 1
            continue
        if kind == "@@swerl-end":
            end = data
            continue
        seq, status, node = data
        if seq != expected_seq:  # a replayed or reordered record: the run's report is not intact
            forged += 1
            continue
        expected_seq += 1
        outcomes[node] = TestOutcome(TestStatus(status))
    complete = end is not None and end.get("results") == expected_seq
    code = end.get("exit_code") if end else None
    listed = end.get("tampered") if end else None
    tampered = tuple(str(t) for t in listed) if isinstance(listed, list) else ()
    command = end.get("command_exit") if end else None
    return SealedReport(
        outcomes,
        complete,
        code if isinstance(code, int) else None,
        tampered,
        forged,
        command if isinstance(command, int) else None,
        bool(end.get("guarded", True)) if end else True,
    )


_RESOLVES: frozenset[TestStatus | None] = frozenset({TestStatus.PASSED, TestStatus.XFAIL})
_MAINTAINS: frozenset[TestStatus | None] = _RESOLVES | {TestStatus.SKIPPED}


def _status_of(test: str, status: dict[str, TestStatus]) -> TestStatus | None:
    """A test's status; for an id cut off inside its parameters (676 of SWE-bench Verified's ids are, swebench's
    issue #290), the status of the ids it begins when they agree on passing or not, as swebench reads them."""
    if test in status or test.count("[") <= test.count("]"):
        return status.get(test)
    matches = [status[k] for k in status if k.startswith(test)]
    return matches[0] if matches and len({m in _RESOLVES for m in matches}) == 1 else None


def resolution_status(
    fail_to_pass: Sequence[str],
    pass_to_pass: Sequence[str],
    outcomes: dict[str, TestOutcome],
    graded_files: Sequence[str] = (),
) -> str:
    """SWE-bench 5's rule: a FAIL_TO_PASS test counts as fixed when it PASSED (or XFAIL, as swebench reads it), never
    when skipped; a PASS_TO_PASS test is kept when it passed or was skipped; a test with no outcome failed (an
    unexpected pass, XPASS, is no line swebench's parsers read: failed). FULL when every F2P is fixed and every P2P
    kept; PARTIAL when every P2P is kept and some F2P fixed; else NO. `graded_files` (SWE-smith's rule): only the
    PASS_TO_PASS tests in those files count."""
    if graded_files:
        pass_to_pass = [t for t in pass_to_pass if any(t.startswith(f) for f in graded_files)]
    status: dict[str, TestStatus] = {n: o.status for n, o in outcomes.items() if o.status != TestStatus.XPASS}
    f2p = sum(_status_of(t, status) in _RESOLVES for t in fail_to_pass)
    p2p_ok = all(_status_of(t, status) in _MAINTAINS for t in pass_to_pass)
    if p2p_ok and f2p == len(fail_to_pass):
        return RESOLVED_FULL
    if p2p_ok and f2p > 0:
        return RESOLVED_PARTIAL
    return RESOLVED_NO


@dataclass(frozen=True)
class Grade:
    """The verdict on one attempt: reward 1.0 iff its status is RESOLVED_FULL."""

    reward: float
    status: str
    """RESOLVED_FULL / RESOLVED_PARTIAL / RESOLVED_NO, or why nothing could be graded: PATCH_APPLY_FAILED,
    TEST_PATCH_FAILED, TIMEOUT, INCOMPLETE (the run ended before its report), TAMPERED."""
    patch: str
    outcomes: dict[str, TestOutcome] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()
    """Paths the patch touched that grading took from the task instead (test files and test infrastructure)."""
    timed_out: bool = False
    sealed: bool = True
    tampered: tuple[str, ...] = ()
    forged_lines: int = 0
    introspection_lines: int = 0
    """Added lines reaching into the interpreter (frames, gc, tracers, pytest internals): a signal, not a verdict."""
    log: str = ""
    detail: str = ""
    harness: str = ""
    """What ran the tests: the sealed runner's mode and where its command came from, or the harness's command."""
    infra_label: str | None = None
    """swebench's advisory reading of an unresolved log ("environment:out_of_memory", "ambiguous:missing_module").
    A label only: the log is the policy's to write, so it never turns a failure into an infrastructure error."""

    def to_record(self) -> dict[str, object]:
        """The grade as a JSON-ready record (evaluation's grades file, metrics)."""
        return {
            "reward": self.reward,
            "status": self.status,
            "sealed": self.sealed,
            "timed_out": self.timed_out,
            "dropped": list(self.dropped),
            "tampered": list(self.tampered),
            "forged_lines": self.forged_lines,
            "introspection_lines": self.introspection_lines,
            "detail": self.detail,
            "harness": self.harness,
            "infra_label": self.infra_label,
            "tests": {n: o.status.value for n, o in self.outcomes.items()},
        }


async def start_task_sandbox(provider: SandboxProvider, task: TaskInstance) -> Sandbox:
    """A sandbox in the task's starting state: its environment, with the bug applied for bug-kind tasks.

    The environment is resolved in a thread: a micro repository is rendered the first time a process needs it
    and its tree hash is checked at every start, file reads the event loop (every other episode) should not wait
    for."""
    return await provider.start(*await asyncio.to_thread(task_environment, task))


async def _git(sandbox: Sandbox, args: str) -> tuple[int, str]:
    result = await sandbox.exec(f"{_GIT} {args}", timeout=_GIT_TIMEOUT_S)
    return result.exit_code, result.output


async def workspace_patch(sandbox: Sandbox) -> str | None:
    """The workspace's changes against the starting commit, new files included (those the repository's ignore
    rules would hide too); None if git is unusable."""
    code, _ = await _git(sandbox, f"add -A -- {_PATHSPEC}")
    if code != 0:
        return None
    new_ignored = await _new_ignored(sandbox)
    if new_ignored:
        quoted = " ".join(shlex.quote(p) for p in new_ignored)
        code, _ = await _git(sandbox, f"add --force -- {quoted} {' '.join(_PATHSPEC.split()[1:])}")
        if code != 0:
            return None
    code, diff = await _git(sandbox, "diff --cached --no-color --binary HEAD")
    return diff if code == 0 else None


_TOOL_DIRS = frozenset(
    {
        ".venv",
        "venv",
        "env",
        "build",
        "dist",
        "node_modules",
        ".tox",
        ".nox",
        ".eggs",
        "__pycache__",
        ".pytest_cache",
        ".mypy_cache",
        ".ruff_cache",
        "htmlcov",
        ".hypothesis",
    }
)
"""Folders tools make (environments, builds, caches): never part of a patch, even when new."""


async def _new_ignored(sandbox: Sandbox) -> list[str]:
    """Files the agent made that the repository's ignore rules hide (semver's .gitignore holds `/*.py`: a new
    module at the root would silently drop out of the patch): what is ignored now and was not at the start
    (IGNORED_AT_START, written by the provider after the starting commit). Nothing without that record."""
    try:
        start = await sandbox.read_file(IGNORED_AT_START)
    except (FileNotFoundError, InfraError):
        return []
    code, now = await _git(sandbox, "ls-files -z --others --ignored --exclude-standard --directory")
    if code != 0:
        return []
    before = set(start.split("\0"))
    fresh = [p for p in now.split("\0") if p and p not in before]
    return [
        p for p in fresh if not (set(PurePosixPath(p).parts) & _TOOL_DIRS) and not p.rstrip("/").endswith(".egg-info")
    ]


async def _apply(sandbox: Sandbox, patch: str) -> tuple[bool, str]:
    await sandbox.write_file(_PATCH_FILE, patch)
    result = await sandbox.exec(
        f"{_GIT} apply --whitespace=nowarn {_PATCH_FILE}; code=$?; rm -f {_PATCH_FILE}; exit $code",
        timeout=_GIT_TIMEOUT_S,
    )
    return result.exit_code == 0, result.output


def _introspection_lines(patch: str) -> int:
    return sum(
        1
        for line in patch.splitlines()
        if line.startswith("+") and not line.startswith("+++") and _INTROSPECTION.search(line)
    )


async def _apply_attempt(
    sandbox: Sandbox, patch: str, filtered: FilteredPatch, signal: int, sealed: bool
) -> Grade | None:
    """Apply the attempt's kept sections to the fresh sandbox; the PATCH_APPLY_FAILED grade if they do not apply.
    An empty patch is graded too: the tests decide, not an assumption about the task."""
    applied, output = await _apply(sandbox, filtered.kept) if filtered.kept.strip() else (True, "")
    if applied:
        return None
    return Grade(
        0.0,
        "PATCH_APPLY_FAILED",
        patch,
        dropped=filtered.dropped,
        sealed=sealed,
        introspection_lines=signal,
        log=output,
        detail="the patch does not apply to the task's starting state",
    )


async def grade_patch(
    provider: SandboxProvider, task: TaskInstance, patch: str, test_timeout_s: float, python: str = "python"
) -> Grade:
    """Grade `patch` against `task` in a fresh sandbox with the sealed runner (see the module docstring).

    A patch that does not apply is the policy's failure (reward 0); a sandbox failure raises InfraError."""
    if task.verifier is not None:
        return await _grade_with_verifier(provider, task, patch)
    filtered = filter_patch(patch)
    signal = _introspection_lines(filtered.kept)
    started = time.monotonic()
    sandbox = await start_task_sandbox(provider, task)
    try:
        refused = await _apply_attempt(sandbox, patch, filtered, signal, sealed=True)
        if refused is not None:
            return refused
        if task.test_patch:
            applied, output = await _apply(sandbox, task.test_patch)
            if not applied:
                raise InfraError("start_failed", f"{task.instance_id}: test_patch does not apply: {output[-500:]}")
        plan = grading_plan(task, python)
        invalid: str | None = None
        if plan.mode is None:  # the harness's own command, unsealed, read by the harness's own parser
            result = await sandbox.exec(marked_test_command(plan.command), timeout=test_timeout_s)
            status_map, invalid = await asyncio.to_thread(read_harness_log, task, result.output, plan.parser)
            outcomes, report = _outcomes(status_map), None
        else:
            result, report = await _run_sealed(sandbox, plan.mode, plan, filtered.added, python, test_timeout_s)
            outcomes = report.outcomes
    finally:
        await sandbox.close()
    forged = report.forged_lines if report else 0
    harness = f"{plan.mode or 'unsealed'}: {plan.source}"
    base = Grade(
        0.0,
        "",
        patch,
        outcomes,
        filtered.dropped,
        result.timed_out,
        report is not None,
        forged_lines=forged,
        introspection_lines=signal,
        log=result.output,
        detail=f"graded in {time.monotonic() - started:.1f}s",
        harness=harness,
    )
    if result.timed_out:
        return replace(base, status="TIMEOUT", detail=base.detail + " (timed out)")
    if report is not None:
        invalid = _sealed_invalid(report, result.exit_code)
        if report.complete and report.tampered:
            return replace(base, status="TAMPERED", tampered=report.tampered)
    if invalid is not None:
        return replace(base, status="INCOMPLETE", outcomes={}, detail=f"{base.detail}: {invalid}")
    status = resolution_status(task.FAIL_TO_PASS, task.PASS_TO_PASS, outcomes, plan.graded_files)
    label = _infra_label(result.output) if status != RESOLVED_FULL else None
    return replace(base, status=status, reward=float(status == RESOLVED_FULL), infra_label=label)


async def _run_sealed(
    sandbox: Sandbox,
    mode: str,
    plan: GradingPlan,
    added: Mapping[str, Sequence[int] | None],
    python: str,
    test_timeout_s: float,
) -> tuple[ExecResult, SealedReport]:
    """The tests under the sealed runner, with a key of their own that only the runner reads."""
    key = secrets.token_bytes(32)
    keyfile = f".swerl-key-{secrets.token_hex(8)}"
    await sandbox.write_file(keyfile, key.hex())
    command = sealed_command(mode, keyfile, plan.args, python, added, plan.env)
    result = await sandbox.exec(command, timeout=test_timeout_s)
    return result, read_sealed(result.output, key.hex().encode())


def _sealed_invalid(report: SealedReport, exit_status: int) -> str | None:
    """Why a sealed run cannot be graded (swebench 5's rules on the runner's authenticated report), or None."""
    if not report.complete:
        return "no intact report"
    if report.exit_code != exit_status:
        return f"exit status {exit_status}, reported {report.exit_code}"
    if not report.outcomes:
        return "no sign that the test suite ran"
    failing = any(o.status in (TestStatus.FAILED, TestStatus.ERROR) for o in report.outcomes.values())
    if report.command_exit not in (None, 0, 1, 5) and not failing:
        return f"the test command ended with status {report.command_exit} and reported no failure"
    return None


def _outcomes(status_map: dict[str, str]) -> dict[str, TestOutcome]:
    """A harness parser's status map as outcomes (statuses swerl does not know are failures)."""
    known = {s.value for s in TestStatus}
    return {n: TestOutcome(TestStatus(s) if s in known else TestStatus.FAILED) for n, s in status_map.items()}


def _infra_label(log: str) -> str | None:
    """swebench's advisory classification of a failed run's log (tier:reason), where swebench is installed."""
    try:
        from swebench.harness.infra_failure import classify_text
    except ImportError:
        return None
    found = classify_text(log[-200_000:])
    return f"{found[1]}:{found[0]}" if found else None


async def _grade_with_verifier(provider: SandboxProvider, task: TaskInstance, patch: str) -> Grade:
    """Grade `patch` with the task's Harbor verifier in a fresh sandbox of the task's image.

    The verifier's exit status counts (Harbor ignores it): no reward file, an unreadable one, or a positive reward
    from a run that exited non-zero is InfraError(verifier_failed), never a score; a timeout scores 0 (TIMEOUT);
    processes left running when tests/test.sh ended (code under test racing the verifier to the reward file)
    score 0 (TAMPERED). A reward in (0, 1) is kept as the verifier gave it (RESOLVED_PARTIAL)."""
    harbor = await asyncio.to_thread(harbor_task_of, task)
    filtered = filter_patch(patch)
    signal = _introspection_lines(filtered.kept)
    started = time.monotonic()
    sandbox = await start_task_sandbox(provider, task)
    try:
        refused = await _apply_attempt(sandbox, patch, filtered, signal, sealed=False)
        if refused is not None:
            return refused
        run = await run_verifier(sandbox, harbor)
    finally:
        await sandbox.close()
    took = f"verified in {time.monotonic() - started:.1f}s"
    base = Grade(
        0.0,
        "",
        patch,
        dropped=filtered.dropped,
        timed_out=run.timed_out,
        sealed=False,
        introspection_lines=signal,
        log=run.output,
        detail=took,
    )
    if run.timed_out:
        return replace(base, status="TIMEOUT", detail=f"{took} (timed out after {harbor.verifier_timeout_s}s)")
    if run.outlived:
        return replace(base, status="TAMPERED", tampered=("processes outlived tests/test.sh",))
    if run.reward is None:
        raise InfraError(
            "verifier_failed",
            f"{task.instance_id}: tests/test.sh ended ({run.exit_code}) without writing /logs/verifier/reward.txt "
            f"or reward.json: {run.output[-500:]}",
        )
    if run.exit_code != 0 and run.reward > 0:
        raise InfraError(
            "verifier_failed",
            f"{task.instance_id}: tests/test.sh exited non-zero ({run.exit_code}) after writing reward "
            f"{run.reward} to {run.reward_file}: not trusted",
        )
    status = RESOLVED_FULL if run.reward >= 1.0 else RESOLVED_PARTIAL if run.reward > 0 else RESOLVED_NO
    passed = TestStatus.PASSED if status == RESOLVED_FULL else TestStatus.FAILED
    why = f"{took}: reward {run.reward} from {run.reward_file}, tests/test.sh exit {run.exit_code}"
    return replace(base, reward=run.reward, status=status, outcomes={VERIFIER_TEST_ID: TestOutcome(passed)}, detail=why)


async def grade_workspace(
    sandbox: Sandbox,
    provider: SandboxProvider,
    task: TaskInstance,
    test_timeout_s: float,
    python: str = "python",
) -> Grade:
    """Grade what the agent left in `sandbox` (its patch only) in a fresh sandbox from `provider`."""
    patch = await workspace_patch(sandbox)
    if patch is None:
        return Grade(0.0, "PATCH_APPLY_FAILED", "", detail="git metadata unusable: no patch could be taken")
    return await grade_patch(provider, task, patch, test_timeout_s, python)
