"""Evaluation grading with the `swebench` package: its resolution status and its log parsers.

An attempt is graded by swerl's one grader (swerl/grading/grader.py: a fresh sandbox in the task's starting state,
the patch without its test-infrastructure sections, the task's test_patch, the sealed runner whose results code
under test cannot forge); `swebench_verdict` then states the verdict with swebench's own `get_resolution_status`
over those authenticated statuses, RESOLVED_FULL counting as resolved. Training reward and evaluation therefore
share one grader.

`grade_log` grades a log written by another harness (SWE-bench's or SWE-smith's own runs, swerl/grading/harness.py)
the way that harness's grader does: swebench's parsers and rule for SWE-bench logs (`-rA` summaries, Django's
runner), SWE-smith's verbose parser and rule for its `pytest --verbose` logs. It trusts the log's text (a test
that prints a line `tests/x.py::test_a PASSED` passes in SWE-smith's reading, as in SWE-smith's own), so it is
for third-party logs only and never used to score the policy.

`swebench` is the optional extra `swerl[swebench]`, imported only when a verdict is stated (it imports its Modal
client on import, ~4 s).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from swerl.data.schema import TaskInstance
from swerl.grading.grader import RESOLVED_FULL, RESOLVED_NO, RESOLVED_PARTIAL, Grade, grade_patch
from swerl.grading.harness import (
    DEFAULT_PARSER,
    SWESMITH_PARSERS,
    HarnessName,
    HarnessSpec,
    _swebench,
    harness_kind,
    log_parser_for,
    reading_for_log,
    swesmith_spec,
    swesmith_test_region,
    swesmith_tests_report,
)
from swerl.grading.plan import grading_plan
from swerl.sandbox.base import SandboxProvider

__all__ = [
    "DEFAULT_PARSER",
    "AttemptGrade",
    "LogGrade",
    "grade_attempt",
    "grade_log",
    "log_parser_for",
    "swebench_verdict",
]


@dataclass(frozen=True)
class LogGrade:
    """A harness's verdict on one test log."""

    resolved: bool
    status: str
    """swebench's ResolvedStatus value (RESOLVED_FULL / RESOLVED_PARTIAL / RESOLVED_NO), or LOG_INVALID."""
    parser: str
    log_valid: bool
    """The log had the harness's output markers and results it could grade (else nothing ran to grade)."""
    tests: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    """FAIL_TO_PASS / PASS_TO_PASS -> success / failure test ids."""
    infra_reason: str | None = None
    """swebench's classification of an invalid log as an environment failure (not the policy's fault)."""
    harness: str = "swebench"
    """Whose reading graded the log: swebench, swesmith or swerl (swerl's own runs, by swebench's rule)."""
    assumed_passing: tuple[str, ...] = ()
    """SWE-smith's rule: graded tests with no line in the log, counted as passing."""


def grade_log(
    task: TaskInstance, log: str, parser: str | None = None, harness: HarnessSpec | HarnessName | None = None
) -> LogGrade:
    """Grade one test log of `task` as the harness that wrote it grades it (see the module docstring).

    `harness`: the spec (or name) of the harness that ran the command; `parser`: a swebench PARSER_REGISTRY name
    or swerl.grading.harness.SWESMITH_VERBOSE / SWESMITH_SUMMARY. With neither, the log's format decides
    (swerl.grading.harness.reading_for_log): a SWE-smith `--verbose` log is read by SWE-smith's parser and rule, a
    `-rA` or Django log by swebench's. A log trusted as written: never a score for the policy.

    Raises HarnessSpecError for a SWE-smith task whose profile swerl does not reimplement, unless `parser` says
    how to read its log."""
    name: str
    files: tuple[str, ...] | None = None
    if isinstance(harness, HarnessSpec):
        name, chosen, files = harness.harness, parser or harness.parser, harness.test_files
    elif harness is not None:
        name = harness
        chosen = parser or (swesmith_spec(task).parser if harness == "swesmith" else log_parser_for(task))
    elif parser is not None:
        kind = harness_kind(task)
        name = "swesmith" if parser in SWESMITH_PARSERS else ("swebench" if kind == "swesmith" else kind)
        chosen = parser
    else:
        name, chosen = reading_for_log(task, log)
    if name == "swesmith":
        return _grade_swesmith(task, log, chosen, files)
    return _grade_swebench(task, log, chosen, name)


def _grade_swebench(task: TaskInstance, log: str, parser: str, harness: str) -> LogGrade:
    """swebench's get_eval_report over the log: its markers, exit-code check, parser and per-test rule."""
    constants, grading, _ = _swebench()
    from swebench.types import TestSpec

    if parser in SWESMITH_PARSERS:
        raise ValueError(f"{parser} is SWE-smith's reading: grade with harness='swesmith'")
    spec = TestSpec(
        instance_id=task.instance_id,
        image=task.image,
        eval_script_list=[],
        repo=task.repo_key,
        version="",
        FAIL_TO_PASS=list(task.FAIL_TO_PASS),
        PASS_TO_PASS=list(task.PASS_TO_PASS),
        log_parser=parser,
        eval_type=constants.EvalType.PASS_AND_FAIL.value,
    )
    with tempfile.TemporaryDirectory(prefix="swerl-grade-") as tmp:
        path = Path(tmp) / "test_output.txt"
        path.write_text(log)
        prediction = {"instance_id": task.instance_id, "model_patch": "(graded from the log)"}
        report = grading.get_eval_report(spec, prediction, str(path), include_tests_status=True)
    entry = report[task.instance_id]
    tests = entry.get("tests_status") or {}
    if not entry["patch_successfully_applied"]:
        reason = entry.get("infra_failure_reason") if entry.get("infra_failure") else None
        return LogGrade(False, "LOG_INVALID", parser, False, {}, reason, harness)
    status = grading.get_resolution_status(tests)
    kept = {k: tests[k] for k in (constants.FAIL_TO_PASS, constants.PASS_TO_PASS) if k in tests}
    return LogGrade(bool(entry["resolved"]), str(status), parser, True, kept, None, harness)


def _grade_swesmith(task: TaskInstance, log: str, parser: str, files: tuple[str, ...] | None) -> LogGrade:
    """SWE-smith's grading of its own log (swerl's reimplementation, swerl/grading/harness.py): the test region
    between its markers, its parser, its per-test rule over the tests of the files its command ran (`files`;
    by default the FAIL_TO_PASS tests' files, which its pytest command runs), swebench's get_resolution_status."""
    constants, grading, _ = _swebench()
    if parser not in SWESMITH_PARSERS:
        raise ValueError(f"{parser} is not one of SWE-smith's readings ({sorted(SWESMITH_PARSERS)})")
    region = swesmith_test_region(log)
    if region is None:
        return LogGrade(False, "LOG_INVALID", parser, False, {}, None, "swesmith")
    status_map = SWESMITH_PARSERS[parser](region)
    if files is None:
        files = tuple(sorted({t.split("::", 1)[0] for t in task.FAIL_TO_PASS}))
    tests = swesmith_tests_report(status_map, task.FAIL_TO_PASS, task.PASS_TO_PASS, files)
    status = str(grading.get_resolution_status(tests))
    graded = [*tests[constants.FAIL_TO_PASS]["success"], *tests[constants.PASS_TO_PASS]["success"]]
    assumed = tuple(t for t in graded if t not in status_map)
    resolved = status == constants.ResolvedStatus.FULL.value
    return LogGrade(resolved, status, parser, True, tests, None, "swesmith", assumed)


@dataclass(frozen=True)
class AttemptGrade:
    """One attempt graded by the sealed grader, with swebench's verdict on its authenticated test statuses."""

    grade: LogGrade
    log: str
    detail: str = ""
    sealed: Grade | None = None


def swebench_verdict(task: TaskInstance, graded: Grade) -> LogGrade:
    """swebench's resolution status over the sealed grader's test outcomes (never over text the tests printed);
    a task graded by its own verifier (Harbor) keeps the verifier's verdict: its log is no test log to parse."""
    if task.verifier is not None:
        status = graded.status
        return LogGrade(graded.reward >= 1.0, status, "verifier", status not in ("INCOMPLETE", "TIMEOUT"))
    parser = log_parser_for(task) if not graded.sealed else "sealed"
    if graded.status not in (RESOLVED_FULL, RESOLVED_PARTIAL, RESOLVED_NO):
        return LogGrade(False, graded.status, parser, graded.status not in ("INCOMPLETE", "TIMEOUT"))
    constants, grading, _ = _swebench()
    # The grader's outcomes (authenticated records, or the harness parser's reading of an unsealed log) as the
    # status map swebench's parsers would have made: an unexpected pass (XPASS) is no line they read.
    status_map = {n: o.status.value for n, o in graded.outcomes.items() if o.status.value != "XPASS"}
    scope = grading_plan(task).graded_files
    pass_to_pass = [t for t in task.PASS_TO_PASS if not scope or any(t.startswith(f) for f in scope)]
    gold = {constants.FAIL_TO_PASS: list(task.FAIL_TO_PASS), constants.PASS_TO_PASS: pass_to_pass}
    report = grading.get_eval_tests_report(status_map, gold)
    tests = {key: report[key] for key in (constants.FAIL_TO_PASS, constants.PASS_TO_PASS)}
    status = str(grading.get_resolution_status(tests))
    if status != graded.status:  # two statements of one rule: a disagreement is a grader bug, not a verdict
        raise RuntimeError(f"{task.instance_id}: swebench says {status}, swerl's grader says {graded.status}")
    return LogGrade(status == constants.ResolvedStatus.FULL.value, status, parser, True, tests)


async def grade_attempt(
    provider: SandboxProvider, task: TaskInstance, patch: str, test_timeout_s: float, python: str = "python"
) -> AttemptGrade:
    """Grade `patch` with the one grader (swerl/grading/grader.py: a fresh sandbox, test infrastructure from the
    task, the sealed runner), then state the verdict as swebench does. A sandbox failure raises InfraError."""
    graded = await grade_patch(provider, task, patch, test_timeout_s, python)
    return AttemptGrade(swebench_verdict(task, graded), graded.log, graded.detail, graded)
