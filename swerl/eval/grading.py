"""Evaluation grading with the `swebench` package: its log parsers and its resolution status, on our test logs.

An attempt is graded SWE-bench style: a fresh sandbox in the task's starting state, the agent's patch applied,
every test file put back as it was, the task's test_patch applied, then the task's test command run between
SWE-bench's output markers. The log is graded by swebench's `get_eval_report` (the parser of the task's repository
from swebench's maps, else its pytest parser) and counts as resolved only when its status is RESOLVED_FULL: every
FAIL_TO_PASS and PASS_TO_PASS test passes. SWE-bench, SWE-smith and swerl's own tasks all follow this one rule.

`swebench` is the optional extra `swerl[swebench]`, imported only when a log is graded (it imports its Modal
client on import, ~4 s).
"""

from __future__ import annotations

import shlex
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from swerl.agent.grading import restore_test_files, start_task_sandbox, workspace_patch
from swerl.data.schema import TaskInstance
from swerl.data.testrun import task_test_command
from swerl.errors import InfraError
from swerl.sandbox.base import SandboxProvider

DEFAULT_PARSER = "parse_log_pytest"
_GIT = "git -c core.hooksPath=/dev/null -c core.fsmonitor=false"
_PATCH_FILE = ".swerl-eval.patch"


def _swebench() -> Any:
    try:
        from swebench.harness import constants, grading, log_parsers
    except ImportError as exc:
        raise ImportError(
            "grading evaluation logs needs the swebench package: pip install 'swerl[swebench]'"
        ) from exc
    return constants, grading, log_parsers


@cache
def _repo_parsers() -> dict[str, str]:
    """'owner/name' -> the name (in swebench's PARSER_REGISTRY) of the parser swebench uses for it."""
    _, _, log_parsers = _swebench()
    import swebench.harness.log_parsers as package

    registry = log_parsers.PARSER_REGISTRY
    out: dict[str, str] = {}
    for module_name in ("python", "javascript", "c", "go", "java", "php", "ruby", "rust"):
        module = getattr(package, module_name, None)
        for attr, value in vars(module).items() if module else ():
            if not (attr.startswith("MAP_REPO_TO_PARSER") and isinstance(value, dict)):
                continue
            for repo, fn in value.items():
                # Several registry names alias one function: prefer the one named after the repository.
                own = f"parse_log_{repo.split('/')[-1].split('-')[0]}"
                names = [n for n, f in registry.items() if f is fn]
                if names:
                    out[repo] = own if own in names else names[0]
    return out


def log_parser_for(task: TaskInstance) -> str:
    """swebench's parser for the task's repository (SWE-smith repos map to their upstream), else pytest's."""
    return _repo_parsers().get(task.repo_key, DEFAULT_PARSER)


@dataclass(frozen=True)
class LogGrade:
    """swebench's verdict on one test log."""

    resolved: bool
    status: str
    """swebench's ResolvedStatus value (RESOLVED_FULL / RESOLVED_PARTIAL / RESOLVED_NO), or LOG_INVALID."""
    parser: str
    log_valid: bool
    """The log had SWE-bench's output markers and parseable results (else nothing ran that could be graded)."""
    tests: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    """FAIL_TO_PASS / PASS_TO_PASS -> success / failure test ids."""
    infra_reason: str | None = None
    """swebench's classification of an invalid log as an environment failure (not the policy's fault)."""


def grade_log(task: TaskInstance, log: str, parser: str | None = None) -> LogGrade:
    """Grade one test log of `task` with swebench (parser: a PARSER_REGISTRY name; default by repository)."""
    constants, grading, _ = _swebench()
    from swebench.types import TestSpec

    parser = parser or log_parser_for(task)
    spec = TestSpec(
        instance_id=task.instance_id, image=task.image, eval_script_list=[], repo=task.repo_key, version="",
        FAIL_TO_PASS=list(task.FAIL_TO_PASS), PASS_TO_PASS=list(task.PASS_TO_PASS), log_parser=parser,
        eval_type=constants.EvalType.PASS_AND_FAIL.value,
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="swerl-grade-") as tmp:
        path = Path(tmp) / "test_output.txt"
        path.write_text(log)
        prediction = {"instance_id": task.instance_id, "model_patch": "(graded from the log)"}
        report = grading.get_eval_report(spec, prediction, str(path), include_tests_status=True)
    entry = report[task.instance_id]
    tests = entry.get("tests_status") or {}
    if not entry["patch_successfully_applied"]:
        reason = entry.get("infra_failure_reason") if entry.get("infra_failure") else None
        return LogGrade(False, "LOG_INVALID", parser, False, {}, reason)
    status = grading.get_resolution_status(tests)
    kept = {k: tests[k] for k in (constants.FAIL_TO_PASS, constants.PASS_TO_PASS) if k in tests}
    return LogGrade(bool(entry["resolved"]), str(status), parser, True, kept)


def marked_test_command(test_cmd: str) -> str:
    """A shell command printing the test run between SWE-bench's markers, its exit code after the end marker."""
    constants, _, _ = _swebench()
    return (
        f"echo {shlex.quote(constants.START_TEST_OUTPUT)}; {test_cmd}; code=$?; "
        f'echo {shlex.quote(constants.END_TEST_OUTPUT)}; echo "{constants.TEST_EXIT_CODE}: $code"'
    )


@dataclass(frozen=True)
class AttemptGrade:
    """One attempt graded from its test log (log kept for the record)."""

    grade: LogGrade
    log: str
    detail: str = ""


async def grade_attempt(
    provider: SandboxProvider, task: TaskInstance, patch: str, test_timeout_s: float, python: str = "python"
) -> AttemptGrade:
    """Apply `patch` in a fresh sandbox of the task, restore the tests, run them, grade the log with swebench.

    A patch that does not apply is unresolved (as in SWE-bench); a sandbox failure raises InfraError.
    """
    if not patch.strip():
        return AttemptGrade(LogGrade(False, "EMPTY_PATCH", log_parser_for(task), True), "", "empty patch")
    sandbox = await start_task_sandbox(provider, task)
    try:
        await sandbox.write_file(_PATCH_FILE, patch)
        applied = await sandbox.exec(
            f"{_GIT} apply --whitespace=nowarn {_PATCH_FILE}; code=$?; rm -f {_PATCH_FILE}; exit $code",
            timeout=60,
        )
        if applied.exit_code != 0:
            grade = LogGrade(False, "PATCH_APPLY_FAILED", log_parser_for(task), True)
            return AttemptGrade(
                grade, applied.output, "the agent's patch does not apply to the starting state"
            )
        if await workspace_patch(sandbox) is None or await restore_test_files(sandbox) is None:
            raise InfraError(
                "sandbox_died", f"{task.instance_id}: git unusable in a fresh evaluation sandbox"
            )
        if task.test_patch:
            await sandbox.write_file(_PATCH_FILE, task.test_patch)
            result = await sandbox.exec(
                f"{_GIT} apply --whitespace=nowarn {_PATCH_FILE}; code=$?; rm -f {_PATCH_FILE}; exit $code",
                timeout=60,
            )
            if result.exit_code != 0:
                grade = LogGrade(False, "TEST_PATCH_FAILED", log_parser_for(task), True)
                return AttemptGrade(grade, result.output, "test_patch does not apply over the agent's patch")
        command = task_test_command(task.test_cmd, python, [*task.FAIL_TO_PASS, *task.PASS_TO_PASS])
        result = await sandbox.exec(marked_test_command(command), timeout=test_timeout_s)
    finally:
        await sandbox.close()
    # swebench's environment-failure classification stays advisory (as in swebench): an out-of-memory kill can
    # be the patch's doing, and a retry must never turn a policy failure into a missing task.
    return AttemptGrade(
        grade_log(task, result.output), result.output, "timed out" if result.timed_out else ""
    )
