"""What the grader runs for a task: its source's own test command, sealed where a sealed runner can run it.

A task is graded with the harness its source defines (swerl.grading.harness.harness_for: SWE-bench's eval script,
SWE-smith's repository profile, swerl's own command):

- Django's `tests/runtests.py` and `python -m unittest`: the sealed runner's `unittest` mode runs the command
  (swerl/grading/unittest_mode.py).
- A pytest command (`pytest ...`, `python -m pytest ...`, with the harness's own flags and targets): the sealed
  runner's `pytest` mode runs pytest with those arguments. Its authenticated per-test records stand in for the
  log parser, which reads the same statuses from the `-rA` or `--verbose` lines pytest would print.
- swerl's micro repositories: the `micro` mode.
- Anything else (sympy's bin/test, tox, other languages, and pytest's own repository, whose code is the runner's
  machinery): no sealed runner. The command runs as the harness runs it,
  between SWE-bench's markers with its exit code recorded, and the harness's own parser reads the log; the grade
  says `sealed=False`.

Tasks with no harness of their own (swerl's, SWE-smith's Python profile, SWE-bench rows whose eval_script is
missing but whose tests are pytest node ids) run pytest on the FAIL_TO_PASS and PASS_TO_PASS ids. A SWE-bench row
whose tests are not pytest node ids and whose harness is unknown is refused (HarnessSpecError): guessing would grade
every attempt 0, a silent bias of the headline metric.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from swerl.data.micro import TEST_CMD as MICRO_TEST_CMD
from swerl.data.schema import TaskInstance
from swerl.data.testrun import task_test_command
from swerl.grading.harness import DEFAULT_PARSER, HarnessSpecError, harness_for, harness_kind
from swerl.grading.unittest_mode import MODE as UNITTEST_MODE
from swerl.grading.unittest_mode import runner_ids as unittest_runner_ids
from swerl.grading.unittest_mode import unittest_program

RUNNER_REPOSITORIES = frozenset({"pytest-dev/pytest", "pytest-dev/pluggy"})
"""Repositories whose code is the sealed pytest runner's own machinery: their tasks run their harness's command
unsealed (the runner cannot tell a fix to pytest from tampering with pytest)."""

_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SHELL = frozenset({"&&", "||", ";", "|", "&", ">", "<", ">>", "2>&1", "2>", "$(", "`"})
_PYTHON = re.compile(r"(.*/)?python(\d+(\.\d+)?)?")


@dataclass(frozen=True)
class GradingPlan:
    """How one task's tests are run and read."""

    mode: str | None
    """The sealed runner's mode (pytest, micro, unittest), or None: the harness's command runs unsealed."""
    args: tuple[str, ...]
    """Sealed: what the runner gets after `--` (node ids, or the harness command's own pytest arguments)."""
    command: str = ""
    """Unsealed: the shell command run between SWE-bench's markers."""
    parser: str = DEFAULT_PARSER
    """Unsealed: the log parser (a swebench PARSER_REGISTRY name, or SWE-smith's readers)."""
    env: tuple[str, ...] = ()
    """`NAME=value` assignments the harness command sets before its program (sealed modes: set for the run)."""
    source: str = "swerl's default"
    """Where the command came from, in words (the grade's detail)."""
    graded_files: tuple[str, ...] = ()
    """SWE-smith's rule: only tests in these files are graded (empty: every FAIL_TO_PASS and PASS_TO_PASS test)."""


def pytest_invocation(command: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(environment assignments, pytest arguments) of a plain pytest command line; None for anything else (shell
    syntax, another program, a command the sealed runner cannot take apart)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    env: list[str] = []
    while words and _ASSIGNMENT.match(words[0]):
        env.append(words.pop(0))
    if not words or any(w in _SHELL or w.startswith(("$(", "`")) for w in words):
        return None
    if words[0] in ("pytest", "py.test") or words[0].endswith(("/pytest", "/py.test")):
        return tuple(env), tuple(words[1:])
    if _PYTHON.fullmatch(words[0]) and words[1:3] == ["-m", "pytest"]:
        return tuple(env), tuple(words[3:])
    return None


def _node_ids(ids: Sequence[str]) -> bool:
    return all("::" in t or t.endswith(".py") for t in ids)


def grading_plan(task: TaskInstance, python: str = "python") -> GradingPlan:
    """The plan for `task` (see the module docstring)."""
    tests = (*task.FAIL_TO_PASS, *task.PASS_TO_PASS)
    if unittest_program(task) is not None:  # Django's runtests.py or `python -m unittest`, eval_script too
        return GradingPlan(UNITTEST_MODE, tuple(unittest_runner_ids(task, tests)), source="the task's own command")
    command = task.test_cmd.strip()
    if command == MICRO_TEST_CMD:
        return GradingPlan("micro", tests, source="the micro harness")
    try:
        spec = harness_for(task) if harness_kind(task) != "swerl" else None
    except HarnessSpecError:
        if not _node_ids(tests):
            raise  # it names the task and what to supply
        spec = None  # its harness is unknown but its tests are pytest node ids (swerl's own images): pytest
    if spec is None:
        if not command:
            return GradingPlan("pytest", tests)
        found = pytest_invocation(command)
        if found is not None:
            return GradingPlan("pytest", (*found[1], *tests), env=found[0], source="the task's test_cmd")
        return GradingPlan(None, tests, task_test_command(command, python, tests), source="the task's test_cmd")
    found = pytest_invocation(spec.test_cmd)
    if found is not None and task.repo_key not in RUNNER_REPOSITORIES:
        return GradingPlan("pytest", found[1], env=found[0], source=spec.source, graded_files=spec.test_files)
    return GradingPlan(None, (), spec.test_cmd, spec.parser, source=spec.source, graded_files=spec.test_files)


__all__ = ["HarnessSpecError", "GradingPlan", "pytest_invocation", "grading_plan"]
