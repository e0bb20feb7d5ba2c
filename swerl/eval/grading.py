"""Evaluation grading with the `swebench` package: its resolution status and its log parsers.

An attempt is graded by swerl's one grader (swerl/agent/grading.py: a fresh sandbox in the task's starting state,
the patch without its test-infrastructure sections, the task's test_patch, the sealed runner whose results code
under test cannot forge); `swebench_verdict` then states the verdict with swebench's own `get_resolution_status`
over those authenticated statuses, RESOLVED_FULL counting as resolved. Training reward and evaluation therefore
share one grader. `grade_log` grades a log written by another harness (SWE-bench's or SWE-smith's own runs) with
swebench's parsers; it trusts the log's text and is never used to score the policy.

`swebench` is the optional extra `swerl[swebench]`, imported only when a verdict is stated (it imports its Modal
client on import, ~4 s).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from swerl.agent.grading import RESOLVED_FULL, RESOLVED_NO, RESOLVED_PARTIAL, Grade, grade_patch
from swerl.data.schema import TaskInstance
from swerl.sandbox.base import SandboxProvider

DEFAULT_PARSER = "parse_log_pytest"


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


@dataclass(frozen=True)
class AttemptGrade:
    """One attempt graded by the sealed grader, with swebench's verdict on its authenticated test statuses."""

    grade: LogGrade
    log: str
    detail: str = ""
    sealed: Grade | None = None


def swebench_verdict(task: TaskInstance, graded: Grade) -> LogGrade:
    """swebench's resolution status over the sealed grader's test outcomes (never over text the tests printed)."""
    if not graded.sealed and graded.status in (RESOLVED_FULL, RESOLVED_PARTIAL, RESOLVED_NO):
        return grade_log(task, graded.log)  # no sealed runner for this command: its log, by swebench's parser
    parser = log_parser_for(task) if not graded.sealed else "sealed"
    if graded.status not in (RESOLVED_FULL, RESOLVED_PARTIAL, RESOLVED_NO):
        return LogGrade(False, graded.status, parser, graded.status not in ("INCOMPLETE", "TIMEOUT"))
    constants, grading, _ = _swebench()
    passed = {n for n, o in graded.outcomes.items() if o.status.value in ("PASSED", "XPASS")}
    tests = {
        key: {"success": [t for t in ids if t in passed], "failure": [t for t in ids if t not in passed]}
        for key, ids in (
            (constants.FAIL_TO_PASS, task.FAIL_TO_PASS),
            (constants.PASS_TO_PASS, task.PASS_TO_PASS),
        )
    }
    status = str(grading.get_resolution_status(tests))
    if status != graded.status:  # two statements of one rule: a disagreement is a grader bug, not a verdict
        raise RuntimeError(f"{task.instance_id}: swebench says {status}, swerl's grader says {graded.status}")
    return LogGrade(status == constants.ResolvedStatus.FULL.value, status, parser, True, tests)


async def grade_attempt(
    provider: SandboxProvider, task: TaskInstance, patch: str, test_timeout_s: float, python: str = "python"
) -> AttemptGrade:
    """Grade `patch` with the one grader (swerl/agent/grading.py: a fresh sandbox, test infrastructure from the
    task, the sealed runner), then state the verdict as swebench does. A sandbox failure raises InfraError."""
    graded = await grade_patch(provider, task, patch, test_timeout_s, python)
    return AttemptGrade(swebench_verdict(task, graded), graded.log, graded.detail, graded)
