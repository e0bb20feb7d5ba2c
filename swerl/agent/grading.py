"""Starting a task's sandbox and grading the agent's workspace against the task's pristine tests.

Grading runs in the agent's own workspace, SWE-bench style but without a second sandbox: the agent's patch is
taken with `git diff` against the task's starting commit (LocalSandboxProvider(git_baseline=True)), then every
test file the agent added, changed or deleted is put back as it was at the start, the task's test_patch (if any)
is applied, and only FAIL_TO_PASS + PASS_TO_PASS run, with the task's own test command if it has one
(TaskInstance.test_cmd). An agent cannot pass by editing or adding tests, or a `run_tests.py` harness.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from swerl.data.environments import task_environment
from swerl.data.repos import is_test_file
from swerl.data.schema import TaskInstance
from swerl.data.testrun import TestOutcome, is_resolved, run_tests
from swerl.sandbox.base import Sandbox, SandboxProvider

_GIT_TIMEOUT_S = 60.0
# The workspace's .git is the agent's to write: ignore any hooks or fsmonitor it may have planted there.
_GIT = "git -c core.hooksPath=/dev/null -c core.fsmonitor=false"
_TEST_PATCH_FILE = ".swerl-test.patch"
# Caches that tools leave in the workspace are not part of anyone's patch.
_EXCLUDES = ("**/.pytest_cache/**", "**/__pycache__/**", "**/*.pyc", _TEST_PATCH_FILE)
_PATHSPEC = " ".join(["."] + [shlex.quote(f":(exclude,glob){pattern}") for pattern in _EXCLUDES])


@dataclass(frozen=True)
class Grade:
    """The outcome of grading: reward 1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passes."""

    reward: float
    patch: str
    outcomes: dict[str, TestOutcome] = field(default_factory=dict)
    restored_tests: tuple[str, ...] = ()
    timed_out: bool = False
    detail: str = ""


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
    """The workspace's changes against the starting commit, new files included; None if git is unusable."""
    code, _ = await _git(sandbox, f"add -A -- {_PATHSPEC}")
    if code != 0:
        return None
    code, diff = await _git(sandbox, "diff --cached --no-color --binary HEAD")
    return diff if code == 0 else None


async def restore_test_files(sandbox: Sandbox) -> tuple[str, ...] | None:
    """Put every changed test file back to the starting commit; returns the restored paths (None: git broken)."""
    code, status = await _git(sandbox, "diff --cached --name-status --no-renames HEAD")
    if code != 0:
        return None
    added: list[str] = []
    changed: list[str] = []
    for line in status.splitlines():
        kind, _, path = line.partition("\t")
        if path and is_test_file(Path(path)):
            (added if kind.startswith("A") else changed).append(path)
    commands = []
    if added:
        commands.append(f"{_GIT} rm -q -f --cached -- " + " ".join(shlex.quote(p) for p in added))
        commands.append("rm -f -- " + " ".join(shlex.quote(p) for p in added))
    if changed:
        commands.append(f"{_GIT} checkout -q HEAD -- " + " ".join(shlex.quote(p) for p in changed))
    if commands:
        result = await sandbox.exec(" && ".join(commands), timeout=_GIT_TIMEOUT_S)
        if result.exit_code != 0:
            return None
    return tuple(sorted(added + changed))


async def grade(sandbox: Sandbox, task: TaskInstance, test_timeout_s: float, python: str = "python") -> Grade:
    """Grade the workspace: the agent's patch, pristine tests, FAIL_TO_PASS + PASS_TO_PASS must all pass.

    A workspace whose git metadata the agent destroyed cannot be graded against pristine tests: reward 0.
    """
    patch = await workspace_patch(sandbox)
    restored = await restore_test_files(sandbox) if patch is not None else None
    if patch is None or restored is None:
        return Grade(0.0, patch or "", detail="git metadata unusable: tests cannot be restored")
    if task.test_patch:
        await sandbox.write_file(_TEST_PATCH_FILE, task.test_patch)
        result = await sandbox.exec(
            f"{_GIT} apply --whitespace=nowarn {_TEST_PATCH_FILE}; code=$?; rm -f {_TEST_PATCH_FILE}; exit $code",
            timeout=_GIT_TIMEOUT_S,
        )
        if result.exit_code != 0:
            return Grade(0.0, patch, restored_tests=restored, detail="test_patch does not apply")
    tests = [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]
    started = time.monotonic()
    result, outcomes = await run_tests(sandbox, test_timeout_s, task.test_cmd, python, test_ids=tests)
    resolved = not result.timed_out and is_resolved(task.FAIL_TO_PASS, task.PASS_TO_PASS, outcomes)
    detail = f"tests ran in {time.monotonic() - started:.1f}s" + (" (timed out)" if result.timed_out else "")
    return Grade(float(resolved), patch, outcomes, restored, result.timed_out, detail)
