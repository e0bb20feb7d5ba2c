"""The agent's tools, run in the task's sandbox: bash, view_file, str_replace, submit.

A tool never raises for something the model did wrong (a failing or timed-out command, a missing file, an
ambiguous replacement, an argument no sandbox can take: a NUL character, a lone surrogate, a command over
max_command_bytes, an edit over max_edit_bytes): that is an observation the model reads. Arguments are checked
here, before they reach the sandbox, so the policy's output can never look like a sandbox failure. Only `submit`
ends the episode (it raises Submitted), and sandbox failures propagate as InfraError. Observations have their
control tokens and tool tags broken up (swerl.model.chat.neutralize_special_tokens): a file or a command's output
cannot end the turn or forge a tool response.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from swerl.config.agent import AgentConfig
from swerl.model.chat import neutralize_special_tokens
from swerl.model.toolcall import ToolCall, ToolSpec, check_call, format_tool_call
from swerl.sandbox.base import Sandbox

TOOL_SPECS: tuple[ToolSpec, ...] = (
    ToolSpec("bash", required={"command": str}),
    ToolSpec("view_file", required={"path": str}, optional={"start_line": int, "end_line": int}),
    ToolSpec("str_replace", required={"path": str, "old": str, "new": str}),
    ToolSpec("submit"),
)
"""What the tool-call parser accepts."""

_DESCRIPTIONS = {
    "bash": "bash(command): run a shell command in /workspace",
    "view_file": "view_file(path, start_line?, end_line?): show numbered lines of a file",
    "str_replace": "str_replace(path, old, new): replace the one occurrence of old with new",
    "submit": "submit(): finish; the repository's tests grade your changes",
}


PATH_MAX_BYTES = 4096
"""Linux's PATH_MAX: a longer path names no file (and would not fit a command line either)."""

DEFAULT_MAX_COMMAND_BYTES: int = AgentConfig.model_fields["max_command_bytes"].default
DEFAULT_MAX_EDIT_BYTES: int = AgentConfig.model_fields["max_edit_bytes"].default

_OUTPUT_CUT = re.compile(r"\n\[\.\.\. \d+ bytes of output omitted \.\.\.\]\n")
"""The marker a sandbox puts where it cut a long output (swerl.sandbox.process.BoundedOutput)."""


def argument_problem(name: str, value: str, max_bytes: int) -> str | None:
    """Why the string argument `name` cannot be passed to a sandbox (an error observation), or None."""
    if "\x00" in value:
        return f"Error: `{name}` contains a NUL character (\\x00), which no command, path or file text may hold"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return f"Error: `{name}` is not valid text (it holds a lone surrogate such as \\ud800)"
    if size > max_bytes:
        return f"Error: `{name}` is {size} bytes long; the limit is {max_bytes}"
    return None


class Submitted(Exception):
    """The model called submit: the episode ends and is graded."""


def system_prompt() -> str:
    """The system message: the job, the tools, the call format. Terse: it is in every trajectory, and on a small
    model every prompt token costs training and sampling time."""
    tools = "\n".join(f"- {_DESCRIPTIONS[spec.name]}" for spec in TOOL_SPECS)
    example = format_tool_call("bash", {"command": "ls"})
    return (
        f"Fix the bug in the Python repository in /workspace. One tool call per turn, like:\n{example}\nTools:\n{tools}"
    )


def truncate_middle(text: str, max_chars: int) -> str:
    """text cut to about max_chars, keeping its head and tail around a marker saying how much was dropped."""
    if len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n[... {omitted} characters omitted ...]\n{text[len(text) - tail :]}"


def number_lines(text: str, start_line: int = 1, end_line: int | None = None) -> str:
    """Lines start_line..end_line (1-based, inclusive) numbered as `cat -n` does: 6-wide number, a tab."""
    lines = text.splitlines()
    first = max(1, start_line)
    last = len(lines) if end_line is None else min(end_line, len(lines))
    return "\n".join(f"{n:6}\t{lines[n - 1]}" for n in range(first, last + 1))


@dataclass(frozen=True)
class ToolResult:
    """What a tool call produced for the model to read, and how long it took."""

    observation: str
    duration_s: float = 0.0
    timed_out: bool = False


class Tools:
    """The tools bound to one sandbox, with their limits (plain arguments, logged by the caller)."""

    def __init__(
        self,
        sandbox: Sandbox,
        command_timeout_s: float,
        max_observation_chars: int,
        max_command_bytes: int = DEFAULT_MAX_COMMAND_BYTES,
        max_edit_bytes: int = DEFAULT_MAX_EDIT_BYTES,
    ) -> None:
        self.sandbox = sandbox
        self.command_timeout_s = command_timeout_s
        self.max_observation_chars = max_observation_chars
        self.max_command_bytes = max_command_bytes
        self.max_edit_bytes = max_edit_bytes

    async def run(self, call: ToolCall) -> ToolResult:
        """Execute a call; raises Submitted for submit, InfraError when the sandbox fails. A call the sandbox
        cannot take (wrong tool, wrong argument types, NUL, lone surrogates, too long) is an error observation."""
        problem = self._problem(call)
        if problem is not None:
            return ToolResult(self._observation(f"{problem}; nothing was run."))
        if call.name == "submit":
            raise Submitted()
        if call.name == "bash":
            result = await self.bash(call.arguments["command"])
        elif call.name == "view_file":
            result = await self.view_file(
                call.arguments["path"], call.arguments.get("start_line"), call.arguments.get("end_line")
            )
        elif call.name == "str_replace":
            result = await self.str_replace(call.arguments["path"], call.arguments["old"], call.arguments["new"])
        else:  # pragma: no cover - _problem lets only TOOL_SPECS through
            return ToolResult(self._observation(f"Error: no tool {call.name!r}"))
        return ToolResult(self._observation(result.observation), result.duration_s, result.timed_out)

    def _observation(self, text: str) -> str:
        return neutralize_special_tokens(truncate_middle(text, self.max_observation_chars))

    def _problem(self, call: ToolCall) -> str | None:
        """Why the sandbox must not be given this call, or None."""
        invalid = check_call(call, TOOL_SPECS)
        if invalid is not None:
            return f"Error: {invalid.message.rstrip('.')}"
        arguments = call.arguments
        if call.name == "bash":
            return argument_problem("command", arguments["command"], self.max_command_bytes)
        if call.name in ("view_file", "str_replace"):
            problem = argument_problem("path", arguments["path"], PATH_MAX_BYTES)
            if problem is not None:
                return problem
        if call.name == "str_replace":
            for name in ("old", "new"):
                problem = argument_problem(name, arguments[name], self.max_edit_bytes)
                if problem is not None:
                    return problem
            size = len(arguments["old"].encode()) + len(arguments["new"].encode())
            if size > self.max_edit_bytes:
                return f"Error: `old` and `new` are {size} bytes together; the limit is {self.max_edit_bytes}"
        return None

    async def bash(self, command: str) -> ToolResult:
        result = await self.sandbox.exec(command, timeout=self.command_timeout_s)
        output = result.output.rstrip("\n")
        if result.timed_out:
            output += f"\n[command timed out after {self.command_timeout_s:g} s and was killed]"
        elif result.exit_code != 0:
            output += f"\n[exit code {result.exit_code}]"
        return ToolResult(output.strip("\n") or "[no output]", result.duration_s, result.timed_out)

    async def view_file(self, path: str, start_line: int | None, end_line: int | None) -> ToolResult:
        try:
            text = await self.sandbox.read_file(path)
        except FileNotFoundError:
            return ToolResult(f"Error: cannot read {path}")
        if start_line is not None and end_line is not None and end_line < start_line:
            return ToolResult(f"Error: end_line {end_line} is before start_line {start_line}")
        numbered = number_lines(text, start_line or 1, end_line)
        return ToolResult(numbered or f"[no lines in that range; {path} has {len(text.splitlines())} lines]")

    async def str_replace(self, path: str, old: str, new: str) -> ToolResult:
        if not old:
            return ToolResult("Error: `old` must not be empty")
        try:
            text = await self.sandbox.read_file(path)
        except FileNotFoundError:
            return ToolResult(f"Error: cannot read {path}")
        if _OUTPUT_CUT.search(text) or len(text.encode()) > self.max_edit_bytes:
            # A read cut by the sandbox's output cap: writing it back would drop the middle of the file.
            return ToolResult(f"Error: {path} is too large for str_replace; edit it with bash; nothing changed")
        if "\ufffd" in text:
            # Not UTF-8 (or holds U+FFFD): the text read is not the file's bytes, writing it back would corrupt it.
            return ToolResult(f"Error: {path} is not UTF-8 text; str_replace edits text files only; nothing changed")
        count = text.count(old)
        if count != 1:
            where = "not found" if count == 0 else f"found {count} times; include more context to pick one"
            return ToolResult(f"Error: `old` {where} in {path}; nothing changed")
        try:
            await self.sandbox.write_file(path, text.replace(old, new, 1))
        except (OSError, ValueError) as exc:
            return ToolResult(f"Error: cannot write {path}: {exc}")
        line = text[: text.index(old)].count("\n") + 1
        return ToolResult(f"Replaced in {path} at line {line}.")
