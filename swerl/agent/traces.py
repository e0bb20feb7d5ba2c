"""Agent traces as datasets in the SWE-smith-trajectories format, and turning them into training examples.

A row: instance_id, traj_id, model, resolved, reward, messages (a list of {role, content}, or that list as a JSON
string; content a string or a list of {"type": "text", "text": ...} parts). Two assistant styles are read:
- tool: the content holds `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` text (swerl's own), or the
  message carries OpenAI-style `tool_calls`; tool results have role "tool";
- xml (SWE-agent): the content holds `<function=NAME><parameter=KEY>VALUE</parameter></function>`.
Both styles are rewritten on load to swerl's `<tool_call>` text through one mapping (`_mapped_call`): SWE-agent's
calls become swerl's tools where those express them faithfully, so the same trajectory in either style trains the
same calls.

Local .jsonl/.json files are read with the json module (rows as written: no Arrow type inference to trip over
content that is a string in one message and a list in the next), parquet files and hub ids through `datasets`.
Every row is checked on load for what SFT would refuse (`check_trace_row`); a refused row is a ValueError naming
the file (and line), the row and its traj_id or instance_id, and the message to blame.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from swerl.agent.oracle import OracleTrace
from swerl.data.loaders import REQUIRED, SCHEMA_NAMES, TRACE_COLUMN, read_json_rows, task_schema_of
from swerl.model.chat import TOOL_CALL_OPEN, render_messages
from swerl.model.toolcall import ToolCallError, ToolCallErrorKind, format_tool_call, parse_tool_call

_XML_CALL = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.DOTALL)
_XML_PARAM = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.DOTALL)
_XML_JSON_PARAMS = ("view_range", "insert_line")
"""SWE-agent parameters whose xml text is a JSON value (the rest are strings)."""
_DATA_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
ROLES = ("system", "user", "assistant", "tool")
"""The roles the chat template renders (swerl.model.chat.CHAT_TEMPLATE); any other is refused."""
_DIRECTORY_LISTING = "Here's the files and directories up to 2 levels deep in"
"""How SWE-agent's str_replace_editor answers `view` of a directory (it runs `find PATH -maxdepth 2 ...`)."""
_BROKEN_CALL_KINDS = {
    ToolCallErrorKind.UNTERMINATED,
    ToolCallErrorKind.INVALID_JSON,
    ToolCallErrorKind.MISSING_NAME,
    ToolCallErrorKind.INVALID_ARGUMENTS,
}
"""Parse errors of a `<tool_call>` written in a trace's text that make it no call at all: nothing to imitate."""


class TraceRowError(ValueError):
    """A trace row SFT cannot use. `reason` continues the row's name: 'has no assistant turn...', 'is not a
    trace...', or 'message 3 (assistant): ...'."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)

    def named(self, name: str) -> str:
        """The reason after the row's name: 'trace row 3 (...) has no assistant turn', '...: message 2 (tool): ...'."""
        return f"{name} {self.reason}" if self.reason.startswith(("has ", "is ")) else f"{name}: {self.reason}"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value[: limit + 1] if isinstance(value, str) else value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def oracle_rows(traces: Iterable[OracleTrace]) -> list[dict[str, Any]]:
    """Rows in the SWE-smith-trajectories format; the traj_id numbers repeated traces of one task."""
    rows: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for trace in traces:
        index = seen.get(trace.instance_id, 0)
        seen[trace.instance_id] = index + 1
        rows.append(
            {
                "instance_id": trace.instance_id,
                "traj_id": f"{trace.instance_id}.oracle.{index}",
                "model": "oracle",
                "resolved": True,
                "reward": 1.0,
                "messages": [{"role": m["role"], "content": m["content"]} for m in trace.messages],
                "edit_kind": trace.edit_kind,
                "recovery": trace.recovery,
                "modifier": trace.modifier or "",
            }
        )
    return rows


def write_traces(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path:
    """Write rows as a .jsonl file (with the json module: rows as they are) or a .parquet file (through
    `datasets`, which needs every column to have one Arrow type across rows)."""
    out = Path(path)
    kind = _DATA_SUFFIXES.get(out.suffix)
    if kind is None:
        raise ValueError(f"trace file {out} must end in one of {sorted(_DATA_SUFFIXES)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    if kind == "parquet":
        import pyarrow as pa
        from datasets import Dataset

        try:
            dataset = Dataset.from_list([dict(row) for row in rows])
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ValueError(
                f"{out}: these trace rows have no single Arrow type per column ({exc}): write them as .jsonl, "
                "or with `messages` as a JSON string (as SWE-smith-trajectories publishes them)"
            ) from None
        dataset.to_parquet(str(out))
    else:
        with out.open("w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(dict(row), ensure_ascii=False, default=str) + "\n")
    return out


def trace_row_name(row: Mapping[str, Any], index: int) -> str:
    """'trace row N (traj_id=...)', or with the instance_id where the row has no traj_id."""
    if row.get("traj_id") is not None:
        return f"trace row {index} (traj_id={row.get('traj_id')!r})"
    if row.get("instance_id") is not None:
        return f"trace row {index} (instance_id={row.get('instance_id')!r})"
    return f"trace row {index} (no traj_id or instance_id)"


def load_trace_rows(source: str | Path, split: str = "train") -> list[dict[str, Any]]:
    """Rows of a trace dataset, each checked (`check_trace_row`): a local file or directory of .jsonl/.json (read
    with the json module) or .parquet files, or a hub dataset id. A refused row is a ValueError naming the file
    (and line), the row and what is wrong with it."""
    path = Path(source)
    rows: list[dict[str, Any]] = []
    if not path.exists():
        from datasets import load_dataset

        dataset = load_dataset(str(source), split=split)  # a hub id, read as published
        for index, row in enumerate(dataset):
            rows.append(_checked(dict(row), index, f"{source} ({split} split)"))
        return rows
    files = sorted(p for p in path.rglob("*") if p.suffix in _DATA_SUFFIXES) if path.is_dir() else [path]
    kinds = {_DATA_SUFFIXES.get(p.suffix) for p in files}
    if not files or None in kinds or len(kinds) != 1:
        raise ValueError(f"{source}: expected .jsonl/.json or .parquet trace files of one kind, got {files}")
    for file in files:
        for index, (line, row) in enumerate(_file_rows(file)):
            rows.append(_checked(row, index, f"{file}:{line}" if line is not None else str(file)))
    return rows


def _file_rows(file: Path) -> list[tuple[int | None, dict[str, Any]]]:
    if file.suffix in (".jsonl", ".json"):
        return read_json_rows(file)  # a broken line is named (file and line), not an Arrow traceback
    from datasets import load_dataset

    dataset = load_dataset("parquet", data_files=str(file), split="train")
    return [(None, dict(row)) for row in dataset]


def _checked(row: dict[str, Any], index: int, where: str) -> dict[str, Any]:
    try:
        check_trace_row(row)
    except TraceRowError as exc:
        raise ValueError(exc.named(f"{where}: {trace_row_name(row, index)}")) from None
    return row


def _not_a_trace(row: Mapping[str, Any]) -> str:
    """Why a row without messages is no trace: the schema it looks like, or its columns."""
    schema = task_schema_of(row)
    if schema is not None:
        return (
            f"is not a trace: it has no `{TRACE_COLUMN}` and looks like a {SCHEMA_NAMES[schema]} task row "
            f"(it has {', '.join(REQUIRED[schema])}): load it as a task dataset, not as traces"
        )
    task_columns = [c for c in ("patch", "problem_statement", "FAIL_TO_PASS") if row.get(c) is not None]
    if task_columns:
        return (
            f"is not a trace: it has no `{TRACE_COLUMN}` and looks like a task row (it has "
            f"{', '.join(task_columns)}): load it as a task dataset, not as traces"
        )
    if "history" in row and ("trajectory" in row or "info" in row):
        return (
            f"is not a trace row: it has no `{TRACE_COLUMN}` and looks like a SWE-agent .traj file "
            "(history, trajectory, info): convert it to SWE-smith-trajectories rows (its history as messages)"
        )
    return f"has no `{TRACE_COLUMN}` (its columns: {sorted(row)[:12]})"


def _plain_text(content: Any) -> str:
    """Content as text where it is text, else '' (for looking at an observation, never for training)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p if isinstance(p, str) else str(p.get("text") or "") if isinstance(p, Mapping) else "" for p in content
        )
    return ""


def _text(content: Any, where: str) -> str:
    """Message content as text: None, a string, or a list of text parts ({type: text, text} or strings) joined;
    a part that is not text (an image) or content of another type is refused."""
    if content is None:
        return ""
    if isinstance(content, str):
        text = content
    else:
        if hasattr(content, "tolist"):
            content = content.tolist()
        if not isinstance(content, list):
            raise TraceRowError(
                f"{where}: content must be a string or a list of text parts, got {type(content).__name__}"
            )
        parts = []
        for k, part in enumerate(content):
            if isinstance(part, str):
                parts.append(part)
                continue
            if not isinstance(part, Mapping):
                raise TraceRowError(f"{where}: content part {k} is not a text part: {_short(part)}")
            kind = part.get("type") or "text"
            if kind != "text":
                raise TraceRowError(f"{where}: content part {k} is of type {kind!r}: only text parts can be trained on")
            if not isinstance(part.get("text"), str):
                raise TraceRowError(f"{where}: content part {k} is a text part without a `text` string")
            parts.append(part["text"])
        text = "".join(parts)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise TraceRowError(f"{where}: content is not valid text (it holds a lone surrogate)") from None
    return text


def _xml_value(key: str, value: str) -> Any:
    value = value[1:] if value.startswith("\n") else value
    value = value[:-1] if value.endswith("\n") else value
    if key in _XML_JSON_PARAMS:
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _create_command(path: str, text: str) -> str:
    """A bash command that writes exactly `text` to `path`: a quoted heredoc (no expansion, a delimiter no line
    of the text equals) when the text ends with a newline or is empty, else printf (a heredoc would add one)."""
    target = shlex.quote(path)
    if text and not text.endswith("\n"):
        return f"printf '%s' {shlex.quote(text)} > {target}"
    delimiter, lines = "EOF", set(text.split("\n"))
    while delimiter in lines:
        delimiter += "_"
    return f"cat > {target} <<'{delimiter}'\n{text}{delimiter}"


def _mapped_call(name: str, arguments: dict[str, Any], observation: str = "") -> tuple[str, dict[str, Any]]:
    """A SWE-agent call as the swerl tool call that does the same, where swerl's tools express it faithfully;
    `observation` is what the traced call returned (it tells a directory `view` from a file `view`).

    - `bash` (command) and `submit` are swerl's own `bash` and `submit`: kept;
    - `str_replace_editor view PATH [view_range]` -> `view_file(path, start_line, end_line)` (an end of -1 is the
      end of the file: no end_line); both number lines as `cat -n` does. A `view` whose observation is SWE-agent's
      directory listing -> `bash` running the `find PATH -maxdepth 2 -not -path '*/\\.*'` it ran;
    - `str_replace_editor str_replace PATH old_str [new_str]` -> `str_replace(path, old, new)` (a missing new_str
      deletes, as in SWE-agent; both require exactly one occurrence. SWE-agent also expands tabs, swerl does not);
    - `str_replace_editor create PATH file_text` -> `bash` writing exactly file_text (`_create_command`). SWE-agent
      refuses to overwrite an existing file or create a missing directory; in a call that succeeded neither
      happened, so the command does the same.
    Kept as written (an unknown tool to swerl, which the model is told so when it calls one): `insert` (swerl has
    no line-addressed insert; a `sed` rewrite would differ at line 0, past the end and on a missing final newline),
    `undo_edit` (it restores SWE-agent's per-file edit history, which no swerl tool keeps), other tools, and any
    call whose arguments do not fit the above (a malformed view_range, an extra argument).
    """
    if name != "str_replace_editor":
        return name, arguments
    command, path, keys = arguments.get("command"), arguments.get("path"), set(arguments)
    if not isinstance(path, str):
        return name, arguments
    if command == "view" and keys <= {"command", "path", "view_range"}:
        view_range = arguments.get("view_range")
        # a tool_calls argument written as JSON text, as the xml style writes it
        if isinstance(view_range, str):
            view_range = _xml_value("view_range", view_range)
        if not view_range:  # SWE-agent treats an empty view_range as none
            if _DIRECTORY_LISTING in observation[:300]:
                return "bash", {"command": f"find {shlex.quote(path)} -maxdepth 2 -not -path '*/\\.*'"}
            return "view_file", {"path": path}
        if (
            isinstance(view_range, list)
            and len(view_range) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in view_range)
        ):
            mapped: dict[str, Any] = {"path": path, "start_line": view_range[0]}
            if view_range[1] != -1:
                mapped["end_line"] = view_range[1]
            return "view_file", mapped
        return name, arguments
    if command == "str_replace" and {"command", "path", "old_str"} <= keys <= {
        "command",
        "path",
        "old_str",
        "new_str",
    }:
        old, new = arguments["old_str"], arguments.get("new_str")
        new = "" if new is None else new
        if isinstance(old, str) and isinstance(new, str):
            return "str_replace", {"path": path, "old": old, "new": new}
        return name, arguments
    if command == "create" and keys == {"command", "path", "file_text"} and isinstance(arguments["file_text"], str):
        return "bash", {"command": _create_command(path, arguments["file_text"])}
    return name, arguments


def xml_to_tool_style(content: str, observations: Sequence[str] = ()) -> str:
    """An assistant turn in SWE-agent's xml style rewritten with `<tool_call>` JSON; other text is kept. The k-th
    call's observation (for `_mapped_call`) is observations[k] where there is one."""
    calls = 0

    def convert(match: re.Match[str]) -> str:
        nonlocal calls
        arguments = {key: _xml_value(key, value) for key, value in _XML_PARAM.findall(match.group(2))}
        observation = observations[calls] if calls < len(observations) else ""
        calls += 1
        return format_tool_call(*_mapped_call(match.group(1), arguments, observation))

    converted = _XML_CALL.sub(convert, content)
    return converted.rstrip()


def _openai_call(call: Any, k: int, where: str) -> tuple[str, dict[str, Any]]:
    """(name, arguments) of an OpenAI-style tool call; arguments a JSON object or a JSON string of one."""
    if not isinstance(call, Mapping):
        raise TraceRowError(f"{where}: tool call {k} is not an object: {_short(call)}")
    function = call["function"] if isinstance(call.get("function"), Mapping) else call
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise TraceRowError(f"{where}: tool call {k} has no function name")
    arguments = function.get("arguments")
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            raise TraceRowError(
                f"{where}: tool call {k} ({name}): arguments are not valid JSON: {_short(arguments)}"
            ) from None
    if not isinstance(arguments, Mapping):
        raise TraceRowError(f"{where}: tool call {k} ({name}): arguments are not a JSON object: {_short(arguments)}")
    return name, dict(arguments)


def _observations(messages: Sequence[Any], index: int) -> list[str]:
    """What the calls of assistant message `index` returned: the tool messages after it, else the user message
    after it (SWE-agent's xml style answers with one)."""
    following = messages[index + 1 :]
    tools = []
    for message in following:
        if not isinstance(message, Mapping) or message.get("role") != "tool":
            break
        tools.append(_plain_text(message.get("content")))
    if tools:
        return tools
    if following and isinstance(following[0], Mapping) and following[0].get("role") == "user":
        return [_plain_text(following[0].get("content"))]
    return []


def _assistant_text(message: Mapping[str, Any], content: str, observations: list[str], where: str) -> str:
    """An assistant turn's text in swerl's tool style: its `tool_calls` (laid out as the chat template renders
    them) or its xml calls through `_mapped_call`; a `<tool_call>` written in its text must be a well-formed call."""
    tool_calls: Any = message.get("tool_calls")
    if hasattr(tool_calls, "tolist"):
        tool_calls = tool_calls.tolist()
    if tool_calls:
        if not isinstance(tool_calls, list):
            raise TraceRowError(f"{where}: tool_calls must be a list, got {type(tool_calls).__name__}")
        parts = [content] if content else []
        for k, call in enumerate(tool_calls):
            name, arguments = _openai_call(call, k, where)
            observation = observations[k] if k < len(observations) else ""
            parts.append(format_tool_call(*_mapped_call(name, arguments, observation)))
        return "\n".join(parts)
    if "<function=" in content:
        return xml_to_tool_style(content, observations)
    if TOOL_CALL_OPEN in content:
        parsed = parse_tool_call(content)
        if isinstance(parsed, ToolCallError) and parsed.kind in _BROKEN_CALL_KINDS:
            raise TraceRowError(f"{where}: its tool call is malformed: {parsed.message}")
    return content


def normalize_messages(messages: Any) -> list[dict[str, str]]:
    """A row's messages as role/content dicts in swerl's tool style (JSON strings, text-part lists and the xml style
    accepted); a TraceRowError names the message that cannot be rendered (an unknown role, non-text content, a
    tool call whose arguments are no JSON object)."""
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except (ValueError, RecursionError) as exc:
            raise TraceRowError(f"has unreadable messages: not JSON ({str(exc)[:80]})") from None
    if hasattr(messages, "tolist"):
        messages = messages.tolist()
    if not isinstance(messages, list):
        raise TraceRowError(f"has unreadable messages: expected a list, got {type(messages).__name__}")
    normalized = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TraceRowError(f"message {index}: not an object: {_short(message)}")
        role = message.get("role")
        if role not in ROLES:
            raise TraceRowError(f"message {index}: unknown role {_short(role)} (the chat template renders {ROLES})")
        where = f"message {index} ({role})"
        content = _text(message.get("content"), where)
        if role == "assistant":
            content = _assistant_text(message, content, _observations(messages, index), where)
        normalized.append({"role": role, "content": content})
    return normalized


def check_trace_row(row: Mapping[str, Any]) -> list[dict[str, str]]:
    """A row's normalized messages, or TraceRowError for what SFT would refuse (render_messages and the chat
    template): no messages (a task row, say), a message normalize_messages refuses, a system message that is not
    first, an empty assistant turn, a conversation that opens with the assistant or has no assistant turn."""
    if row.get(TRACE_COLUMN) is None:
        raise TraceRowError(_not_a_trace(row))
    messages = normalize_messages(row[TRACE_COLUMN])
    if not any(m["role"] == "assistant" for m in messages):
        raise TraceRowError("has no assistant turn: nothing to train on")
    for index, message in enumerate(messages):
        if message["role"] == "system" and index:
            raise TraceRowError(f"message {index} (system): a system message is only allowed first")
        if message["role"] == "assistant" and not message["content"].strip():
            raise TraceRowError(f"message {index} (assistant): an empty turn (no text, no tool call)")
    if messages[0]["role"] == "assistant":
        raise TraceRowError("message 0 (assistant): the conversation opens with the assistant: no prompt")
    return messages


def _row_name(row: Mapping[str, Any], index: int) -> str:
    return f"row {index} (traj_id={row.get('traj_id')!r}, instance_id={row.get('instance_id')!r})"


def trace_to_example(
    tokenizer: PreTrainedTokenizerBase, row: Mapping[str, Any], index: int = 0
) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) of one trace row through the chat template, loss on assistant turns only."""
    try:
        messages = check_trace_row(row)
    except TraceRowError as exc:
        raise ValueError(exc.named(_row_name(row, index))) from exc
    try:
        return render_messages(tokenizer, messages)
    except (ValueError, TemplateError) as exc:
        raise ValueError(f"{_row_name(row, index)}: {exc}") from exc


def traces_to_examples(
    tokenizer: PreTrainedTokenizerBase, rows: Sequence[Mapping[str, Any]], resolved_only: bool = True
) -> list[tuple[list[int], list[int]]]:
    """Training examples from trace rows; by default only rows that resolved their task (where that is known)."""
    examples = []
    for index, row in enumerate(rows):
        resolved = row.get("resolved", row.get("reward"))
        if resolved_only and resolved is not None and not resolved:
            continue
        examples.append(trace_to_example(tokenizer, row, index))
    return examples
