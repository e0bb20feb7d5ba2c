"""The oracle (expert) agent: solves a task whose diff it knows, through the agent's own tools, for real.

Its actions copy little (TINY-MODEL-NOTES, second experiment): run the tests with short output -> `cat -n FILE |
sed -n A,Bp` around the broken line -> a line-addressed `sed -i 'Ns/OLD/NEW/' FILE` (or a `str_replace` when the
fix is not a one-line substitution) -> rerun the tests -> submit. With probability `recovery_prob` it first makes
a plausible wrong edit (an operator on a neighbouring line, or the other operator on the broken line), sees the
retest fail, undoes it with sed, and then applies the right fix: the recovery a trained policy otherwise never
sees. Every command runs in the task's sandbox and the trace records the real observations; a trace is kept only
if grading the workspace afterwards gives reward 1.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import random
import re
import shlex
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from swerl.agent.episode import EpisodeLimits, initial_messages
from swerl.agent.fixplan import FixPlan, NoFixPlan, plan_fix, sed_substitution, wrong_edits
from swerl.agent.tools import Tools
from swerl.data.environments import environment_order
from swerl.data.schema import TaskInstance
from swerl.errors import InfraError
from swerl.grading.grader import grade_patch, start_task_sandbox, workspace_patch
from swerl.model.toolcall import ToolCall, format_tool_call
from swerl.sandbox.base import Sandbox, SandboxProvider

TEST_COMMAND = "python -m pytest -q -x --tb=short 2>&1 | tail -n 15"
"""What the oracle runs to see failures: stop at the first one, short traceback, last lines only."""

_FAILED = re.compile(r"\b(failed|error|errors|no tests ran)\b")


@dataclass(frozen=True)
class OracleTrace:
    """One solved task: the conversation, and how it was solved."""

    instance_id: str
    messages: list[dict[str, Any]]
    edit_kind: str
    recovery: bool
    modifier: str | None


class OracleSkip(Exception):
    """The oracle does not produce a trace for this task; `reason` is the counter key."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class OracleReport:
    """What the oracle did over a set of tasks."""

    attempted: int = 0
    traced: int = 0
    recovery_traces: int = 0
    recovery_drawn: int = 0
    """Tasks drawn for a recovery trace; those without a plausible wrong edit, or whose wrong edit passed the
    tests, were solved directly instead."""
    skipped: Counter[str] = field(default_factory=Counter)
    by_modifier: dict[str, Counter[str]] = field(default_factory=dict)

    def count(self, modifier: str | None, outcome: str) -> None:
        self.by_modifier.setdefault(modifier or "", Counter())[outcome] += 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempted": self.attempted,
            "traced": self.traced,
            "recovery_traces": self.recovery_traces,
            "recovery_drawn": self.recovery_drawn,
            "skipped": dict(sorted(self.skipped.items())),
            "by_modifier": {m: dict(c) for m, c in sorted(self.by_modifier.items())},
        }


def tests_fail(observation: str) -> bool:
    """Whether the short pytest output's summary line reports a failure (or that nothing ran)."""
    lines = [line for line in observation.strip().splitlines() if line.strip()]
    return not lines or bool(_FAILED.search(lines[-1])) or "passed" not in lines[-1]


class _Session:
    """One oracle attempt in a fresh sandbox: every action is a real tool call recorded with its observation."""

    def __init__(self, task: TaskInstance, tools: Tools) -> None:
        self.tools = tools
        self.messages = initial_messages(task)

    async def act(self, name: str, arguments: dict[str, Any]) -> str:
        self.messages.append({"role": "assistant", "content": format_tool_call(name, arguments)})
        result = await self.tools.run(ToolCall(name, arguments))
        self.messages.append({"role": "tool", "content": result.observation})
        return result.observation

    def submit(self) -> None:
        self.messages.append({"role": "assistant", "content": format_tool_call("submit", {})})


async def _apply_fix(session: _Session, plan: FixPlan) -> None:
    if plan.kind == "sed":
        await session.act("bash", {"command": plan.sed_command()})
    else:
        await session.act("str_replace", {"path": plan.file, "old": plan.old, "new": plan.new})


async def solve_task(
    task: TaskInstance,
    provider: SandboxProvider,
    limits: EpisodeLimits,
    rng: random.Random,
    recovery: bool,
    *,
    context_lines: int,
    view_whole_file_lines: int,
    view_function_lines: int,
    test_command: str | None,
    python: str = "python",
) -> OracleTrace:
    """Solve one task in a fresh sandbox; raises OracleSkip (with a reason) when no valid trace results.

    test_command None is the task's own `test_cmd` (else TEST_COMMAND). How the buggy file is viewed: see
    _view_command.
    """
    test_command = test_command or task.test_cmd or TEST_COMMAND
    sandbox = await start_task_sandbox(provider, task)
    try:
        tools = Tools(
            sandbox,
            limits.command_timeout_s,
            limits.max_observation_chars,
            limits.max_command_bytes,
            limits.max_edit_bytes,
        )
        session = _Session(task, tools)
        if not tests_fail(await session.act("bash", {"command": test_command})):
            raise OracleSkip("tests_pass_at_start")
        plan = await _fix_plan(task, sandbox)
        source = await sandbox.read_file(plan.file)
        view = _view_command(task, plan, source, context_lines, view_whole_file_lines, view_function_lines)
        await session.act("bash", {"command": view})
        did_recover = recovery and await _wrong_edit_undone(session, plan, rng, context_lines, test_command)
        await _apply_fix(session, plan)
        if tests_fail(await session.act("bash", {"command": test_command})):
            raise OracleSkip("retest_fails")
        session.submit()
        patch = await workspace_patch(sandbox)
    finally:
        await sandbox.close()
    graded = await grade_patch(provider, task, patch or "", limits.test_timeout_s, python)
    if graded.reward != 1.0:
        raise OracleSkip("not_resolved")
    return OracleTrace(task.instance_id, session.messages, plan.kind, did_recover, task.modifier)


async def _fix_plan(task: TaskInstance, sandbox: Sandbox) -> FixPlan:
    """The edit that undoes the task's bug, read against the file as the sandbox holds it."""
    try:
        first_file = _first_file(task.patch)
        return plan_fix(task.patch, task.patch_kind == "bug", await sandbox.read_file(first_file))
    except NoFixPlan as exc:
        raise OracleSkip(exc.reason) from None
    except FileNotFoundError:
        raise OracleSkip("file_missing") from None


def _view_command(
    task: TaskInstance,
    plan: FixPlan,
    source: str,
    context_lines: int,
    view_whole_file_lines: int,
    view_function_lines: int,
) -> str:
    """The command the oracle views the buggy file with.

    With view_function_lines > 0, the function holding the bug when the problem statement names it (a failing
    test called after it): `grep -n -A N 'def NAME(' FILE`, N = view_function_lines - 1. Otherwise a file of at
    most view_whole_file_lines lines whole (`cat -n FILE`): every line number the edit copies is then on screen,
    whatever the failure output shows. Otherwise context_lines around the bug.
    """
    function = enclosing_function(source, plan.line) if view_function_lines > 0 else None
    # Named in the statement: a failing test called after it (`test_NAME_1`) counts.
    if function is not None and function in task.problem_statement:
        return f"grep -n -A {view_function_lines - 1} 'def {function}(' {shlex.quote(plan.file)}"
    if len(source.splitlines()) <= view_whole_file_lines:
        return f"cat -n {shlex.quote(plan.file)}"
    return plan.view_command(context_lines)


async def _wrong_edit_undone(
    session: _Session, plan: FixPlan, rng: random.Random, context_lines: int, test_command: str
) -> bool:
    """Make a plausible wrong edit, see the retest fail, undo it; False when the bug has no plausible wrong edit.

    Raises OracleSkip("wrong_edit_passes") when the wrong edit passes (the task is then redone without one).
    """
    candidates = wrong_edits(await session.tools.sandbox.read_file(plan.file), plan, context_lines)
    if not candidates:
        return False
    line, old, new = rng.choice(candidates)
    await session.act("bash", {"command": sed_substitution(line, old, new, plan.file)})
    if not tests_fail(await session.act("bash", {"command": test_command})):
        raise OracleSkip("wrong_edit_passes")
    await session.act("bash", {"command": sed_substitution(line, new, old, plan.file)})
    return True


def enclosing_function(source: str, line: int) -> str | None:
    """Name of the innermost function whose lines hold `line` (1-based), or None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    best: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            end = node.end_lineno or node.lineno
            if node.lineno <= line <= end and (best is None or node.lineno >= best.lineno):
                best = node
    return best.name if best is not None else None


def _first_file(diff: str) -> str:
    for line in diff.splitlines():
        if line.startswith("+++ ") and line[4:].strip() != "/dev/null":
            name = line[4:].split("\t")[0].strip()
            return name[2:] if name.startswith("b/") else name
    raise OracleSkip("empty_diff")


async def generate_oracle_traces(
    tasks: Sequence[TaskInstance],
    provider: SandboxProvider,
    limits: EpisodeLimits,
    *,
    recovery_prob: float,
    workers: int,
    context_lines: int,
    view_whole_file_lines: int,
    view_function_lines: int,
    test_command: str | None,
    seed: int = 0,
    python: str = "python",
) -> tuple[list[OracleTrace], OracleReport]:
    """Traces for every task the oracle solves (in task order), and counts of what it skipped and why.

    Each task's randomness (recovery or not, which wrong edit) is seeded by (seed, instance id), so the result
    does not depend on `workers`. A recovery attempt whose wrong edit happens to pass is redone without one.
    """
    if not 0.0 <= recovery_prob <= 1.0:
        raise ValueError(f"recovery_prob must be in [0, 1], got {recovery_prob}")
    solve = functools.partial(
        solve_task,
        provider=provider,
        limits=limits,
        context_lines=context_lines,
        view_whole_file_lines=view_whole_file_lines,
        view_function_lines=view_function_lines,
        test_command=test_command,
        python=python,
    )
    gate = asyncio.Semaphore(workers)

    async def one(task: TaskInstance) -> OracleTrace | str:
        rng = _task_rng(seed, task)
        recovery = rng.random() < recovery_prob
        async with gate:
            return await _trace_or_skip_reason(solve, task, rng, recovery)

    # Tasks start in environment order (those of one image together, in order of first need); outcomes are put
    # back in task order, and each task's randomness is its own: the traces do not depend on the order.
    order = environment_order(tasks)
    ran = await asyncio.gather(*(one(tasks[i]) for i in order))
    outcomes = [outcome for _, outcome in sorted(zip(order, ran, strict=True), key=lambda pair: pair[0])]
    report = OracleReport(attempted=len(tasks))
    report.recovery_drawn = sum(_task_rng(seed, task).random() < recovery_prob for task in tasks)
    traces: list[OracleTrace] = []
    for task, outcome in zip(tasks, outcomes, strict=True):
        if isinstance(outcome, str):
            report.skipped[outcome] += 1
            report.count(task.modifier, f"skipped:{outcome}")
        else:
            traces.append(outcome)
            report.traced += 1
            report.recovery_traces += outcome.recovery
            report.count(task.modifier, "traced")
    return traces, report


def _task_rng(seed: int, task: TaskInstance) -> random.Random:
    """The task's own generator: its first draw decides recovery, later ones the wrong edit."""
    return random.Random(f"{seed}:{task.instance_id}")


async def _trace_or_skip_reason(
    solve: Callable[..., Awaitable[OracleTrace]], task: TaskInstance, rng: random.Random, recovery: bool
) -> OracleTrace | str:
    """The task's trace, or the reason there is none; a recovery whose wrong edit passed is redone directly."""
    for attempt_recovery in (True, False) if recovery else (False,):
        try:
            return await solve(task, rng=rng, recovery=attempt_recovery)
        except OracleSkip as exc:
            if exc.reason != "wrong_edit_passes":
                return exc.reason
        except InfraError as exc:
            return f"infra_error:{exc.cause}"
    return "wrong_edit_passes"
