"""Running a pytest suite in a sandbox and reading per-test outcomes from its `-rA` summary.

The `-rA` short summary (one `PASSED nodeid` / `FAILED nodeid - message` line per test) is what SWE-bench and
SWE-smith grade from too; it needs no file to be written inside the sandbox. A task may name its own test
command (TaskInstance.test_cmd, e.g. a micro repository's dependency-free harness) printing the same lines.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from swerl.sandbox.base import ExecResult, Sandbox

PYTEST_ARGS = (
    "-rA",
    "-p",
    "no:cacheprovider",
    "--color=no",
    "--tb=short",
    "-o",
    "console_output_style=classic",
)
"""Flags that make pytest print one parseable summary line per test."""


SUMMARY_WIDTH = 200


class TestStatus(StrEnum):
    __test__ = False  # not a pytest test class despite its name
    PASSED = "PASSED"
    FAILED = "FAILED"
    ERROR = "ERROR"
    SKIPPED = "SKIPPED"
    XFAIL = "XFAIL"
    XPASS = "XPASS"


@dataclass(frozen=True)
class TestOutcome:
    """One test's status and, for failures, pytest's one-line reason."""

    __test__ = False

    status: TestStatus
    message: str = ""


_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S.*)$")


def _split_node(rest: str) -> tuple[str, str]:
    """'node[a - b] - message' -> ('node[a - b]', 'message'): the separator is the first ' - ' outside brackets."""
    depth = 0
    for i, ch in enumerate(rest):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif depth == 0 and rest.startswith(" - ", i):
            return rest[:i].strip(), rest[i + 3 :].strip()
    return rest.strip(), ""


def pytest_command(python: str = "python", test_ids: Sequence[str] = (), extra_args: Sequence[str] = ()) -> str:
    """The shell command that runs the suite (or the given node ids) with a parseable summary."""
    args = [python, "-m", "pytest", *PYTEST_ARGS, *extra_args, *test_ids]
    # pytest cuts summary messages to the terminal width; a wide one keeps the assertion readable.
    return f"COLUMNS={SUMMARY_WIDTH} " + " ".join(shlex.quote(a) for a in args)


def task_test_command(
    test_cmd: str = "", python: str = "python", test_ids: Sequence[str] = (), extra_args: Sequence[str] = ()
) -> str:
    """A task's own test command with the node ids appended, or pytest_command() when it has none.

    `extra_args` are pytest flags: they apply to the default command only.
    """
    if not test_cmd:
        return pytest_command(python, test_ids, extra_args)
    return " ".join([test_cmd, *(shlex.quote(t) for t in test_ids)])


def parse_pytest_summary(output: str) -> dict[str, TestOutcome]:
    """Node id -> outcome from pytest's `-rA` short summary; a later line for the same id wins."""
    results: dict[str, TestOutcome] = {}
    for raw in output.splitlines():
        match = _SUMMARY_LINE.match(raw.rstrip())
        if not match:
            continue
        status = match.group(1)
        node, message = _split_node(match.group(2))
        if status == "SKIPPED" and node.startswith("["):  # 'SKIPPED [1] file.py:12: reason' has no node id
            continue
        results[node] = TestOutcome(TestStatus(status), message)
    return results


def passing(outcomes: Mapping[str, TestOutcome]) -> set[str]:
    """Ids that passed (an unexpected XPASS counts as a pass: the code did what the test asks)."""
    return {node for node, o in outcomes.items() if o.status in (TestStatus.PASSED, TestStatus.XPASS)}


def split_fail_pass(
    clean_runs: Sequence[Mapping[str, TestOutcome]], bugged: Mapping[str, TestOutcome]
) -> tuple[list[str], list[str]]:
    """(FAIL_TO_PASS, PASS_TO_PASS): tests passing in every clean run that fail / still pass with the bug.

    A test missing from the bugged run (its module no longer imports, or the run stopped) counts as failing,
    as in SWE-bench grading; a test that passed on one clean run only is flaky and used for neither list.
    """
    if not clean_runs:
        return [], []
    stable = set.intersection(*(passing(run) for run in clean_runs))
    still_passing = passing(bugged)
    fail_to_pass = sorted(node for node in stable if node not in still_passing and "::" in node)
    pass_to_pass = sorted(node for node in stable if node in still_passing)
    return fail_to_pass, pass_to_pass


def is_resolved(fail_to_pass: Sequence[str], pass_to_pass: Sequence[str], outcomes: Mapping[str, TestOutcome]) -> bool:
    """A task is solved when every FAIL_TO_PASS and every PASS_TO_PASS test passes."""
    ok = passing(outcomes)
    return all(t in ok for t in fail_to_pass) and all(t in ok for t in pass_to_pass)


async def run_pytest(
    sandbox: Sandbox,
    timeout: float,
    python: str = "python",
    test_ids: Sequence[str] = (),
    extra_args: Sequence[str] = (),
) -> tuple[ExecResult, dict[str, TestOutcome]]:
    """Run pytest in the sandbox's /workspace; returns the raw result and the per-test outcomes."""
    result = await sandbox.exec(pytest_command(python, test_ids, extra_args), timeout=timeout)
    return result, parse_pytest_summary(result.output)


async def run_tests(
    sandbox: Sandbox,
    timeout: float,
    test_cmd: str = "",
    python: str = "python",
    test_ids: Sequence[str] = (),
    extra_args: Sequence[str] = (),
) -> tuple[ExecResult, dict[str, TestOutcome]]:
    """Run a task's test command (empty: pytest) in /workspace; the raw result and the per-test outcomes."""
    result = await sandbox.exec(task_test_command(test_cmd, python, test_ids, extra_args), timeout=timeout)
    return result, parse_pytest_summary(result.output)
