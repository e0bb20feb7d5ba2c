"""Which tasks the sealed runner's `unittest` mode grades, and the program it runs for them (the grader's side).

The mode (swerl/grading/sealed_runner.py) runs a task's own unittest-style test command in the runner's process:
Django's `./tests/runtests.py ...` (SWE-bench's Django command) or `python -m unittest ...`. The command is the
task's `test_cmd`, else the one its `eval_script` runs between SWE-bench's START/END markers (swebench 5 rows
carry it). The runner gets the command's argv as JSON before the test ids; it forces `--parallel 1`, and where the
command names no test labels it runs the ids' own (`test_a (app.tests.T.test_a)` -> `app.tests.T.test_a`) unless
one is named by a docstring (it has no label: the command then runs as it is).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Sequence

from swerl.data.schema import TaskInstance

MODE = "unittest"
RUNTESTS = "tests/runtests.py"
"""Django's test runner script, as its sdist and SWE-bench's images have it."""
START_MARKER, END_MARKER = ">>>>> Start Test Output", ">>>>> End Test Output"
"""swebench.harness.constants' START_TEST_OUTPUT and END_TEST_OUTPUT (a test checks they still agree)."""

_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
_SHELL = frozenset({"&&", "||", ";", "|", "&", ">", "<", ">>", "2>&1"})


def own_test_command(task: TaskInstance) -> str:
    """The task's own test command: its test_cmd, else the one command its eval_script runs between the
    markers (the exit-code capture swebench adds there is not a command); "" when it has neither."""
    if task.test_cmd.strip():
        return task.test_cmd.strip()
    lines = (task.eval_script or "").splitlines()
    start = next((i for i, line in enumerate(lines) if START_MARKER in line), None)
    end = next((i for i, line in enumerate(lines) if END_MARKER in line), None)
    if start is None or end is None or end < start:
        return ""
    body = [ln.strip() for ln in lines[start + 1 : end] if ln.strip() and "TEST_EXIT_CODE" not in ln]
    return body[0] if len(body) == 1 else ""


def unittest_program(task: TaskInstance) -> list[str] | None:
    """The argv of the task's command when the unittest mode can run it in-process, else None: Django's
    runtests.py (`./tests/runtests.py ...`, `python tests/runtests.py ...`) or `python -m unittest ...`.
    Anything with shell syntax (pipes, `&&`, redirections, variable assignments) is not run this way."""
    try:
        argv = shlex.split(own_test_command(task))
    except ValueError:
        return None
    if not argv or any(a in _SHELL or re.match(r"^\w+=", a) for a in argv):
        return None
    if _PYTHON.fullmatch(os.path.basename(argv[0])):
        if argv[1:3] == ["-m", "unittest"]:
            return argv
        argv = argv[1:]
    if argv and os.path.normpath(argv[0]) == RUNTESTS:
        return argv
    return None


def runner_ids(task: TaskInstance, ids: Sequence[str]) -> list[str]:
    """What the grader passes the runner after `--` in this mode: the program's argv as JSON, then the ids."""
    program = unittest_program(task)
    if program is None:
        raise ValueError(f"{task.instance_id}: its test command is not one the unittest mode runs")
    return [json.dumps(program), *ids]
