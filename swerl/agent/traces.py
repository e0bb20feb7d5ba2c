"""Agent traces as datasets in the SWE-smith-trajectories format, and turning them into training examples.

A row: instance_id, traj_id, model, resolved, reward, messages (a list of {role, content}, or that list as a JSON
string). Two assistant styles are read:
- tool: the content holds `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` text (swerl's own), or the
  message carries OpenAI-style `tool_calls`; tool results have role "tool";
- xml (SWE-agent): the content holds `<function=NAME><parameter=KEY>VALUE</parameter></function>`, converted on
  load to the tool style; SWE-agent's `str_replace_editor` view / str_replace map onto view_file / str_replace.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from swerl.agent.oracle import OracleTrace
from swerl.model.chat import render_messages
from swerl.model.toolcall import format_tool_call

_XML_CALL = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.DOTALL)
_XML_PARAM = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.DOTALL)
_DATA_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


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
    """Write rows as a .jsonl or .parquet dataset file (by suffix) through `datasets`."""
    from datasets import Dataset

    out = Path(path)
    kind = _DATA_SUFFIXES.get(out.suffix)
    if kind is None:
        raise ValueError(f"trace file {out} must end in one of {sorted(_DATA_SUFFIXES)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    dataset = Dataset.from_list([dict(row) for row in rows])
    if kind == "parquet":
        dataset.to_parquet(str(out))
    else:
        dataset.to_json(str(out), lines=True, force_ascii=False)
    return out


def load_trace_rows(source: str | Path, split: str = "train") -> list[dict[str, Any]]:
    """Rows of a trace dataset: a local file or directory of .jsonl/.json/.parquet files, or a hub dataset id."""
    from datasets import load_dataset

    from swerl.data.loaders import check_json_file

    path = Path(source)
    if path.exists():
        files = sorted(p for p in path.rglob("*") if p.suffix in _DATA_SUFFIXES) if path.is_dir() else [path]
        kinds = {_DATA_SUFFIXES.get(p.suffix) for p in files}
        if not files or None in kinds or len(kinds) != 1:
            raise ValueError(
                f"{source}: expected .jsonl/.json or .parquet trace files of one kind, got {files}"
            )
        for file in files:
            if file.suffix in (".jsonl", ".json"):
                check_json_file(file)  # a broken line is named (file and line), not a datasets traceback
        dataset = load_dataset(kinds.pop(), data_files=[str(p) for p in files], split="train")
    else:
        dataset = load_dataset(str(source), split=split)  # a hub id, read as published
    return [dict(row) for row in dataset]


def _text(content: Any) -> str:
    """Message content as text: a string, or a list of {type: text, text} parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(part.get("text", "") if isinstance(part, Mapping) else str(part) for part in content)
    return str(content)


def _xml_value(key: str, value: str) -> Any:
    value = value[1:] if value.startswith("\n") else value
    value = value[:-1] if value.endswith("\n") else value
    if key == "view_range":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _mapped_call(name: str, arguments: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """SWE-agent's editor commands that swerl's tools express, renamed; everything else kept as written."""
    if name != "str_replace_editor":
        return name, arguments
    command, path = arguments.get("command"), arguments.get("path")
    if command == "view" and isinstance(path, str) and set(arguments) <= {"command", "path", "view_range"}:
        mapped: dict[str, Any] = {"path": path}
        view_range = arguments.get("view_range")
        if (
            isinstance(view_range, list)
            and len(view_range) == 2
            and all(isinstance(v, int) for v in view_range)
        ):
            mapped["start_line"] = view_range[0]
            if view_range[1] != -1:
                mapped["end_line"] = view_range[1]
        return "view_file", mapped
    if command == "str_replace" and set(arguments) == {"command", "path", "old_str", "new_str"}:
        return "str_replace", {"path": path, "old": arguments["old_str"], "new": arguments["new_str"]}
    return name, arguments


def xml_to_tool_style(content: str) -> str:
    """An assistant turn in SWE-agent's xml style rewritten with `<tool_call>` JSON; other text is kept."""

    def convert(match: re.Match[str]) -> str:
        arguments = {key: _xml_value(key, value) for key, value in _XML_PARAM.findall(match.group(2))}
        return format_tool_call(*_mapped_call(match.group(1), arguments))

    converted = _XML_CALL.sub(convert, content)
    return converted.rstrip()


def _tool_calls_text(content: str, tool_calls: Sequence[Mapping[str, Any]]) -> str:
    """OpenAI-style `tool_calls` written into the content as the chat template would render them."""
    parts = [content] if content else []
    for call in tool_calls:
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            arguments = json.loads(arguments) if arguments.strip() else {}
        parts.append(format_tool_call(function["name"], arguments))
    return "\n".join(parts)


def normalize_messages(messages: Any) -> list[dict[str, str]]:
    """A row's messages as role/content dicts in swerl's tool style (JSON strings and the xml style accepted)."""
    if isinstance(messages, str):
        messages = json.loads(messages)
    if hasattr(messages, "tolist"):
        messages = messages.tolist()
    normalized = []
    for message in messages:
        role = message["role"]
        content = _text(message.get("content"))
        if role == "assistant":
            if message.get("tool_calls"):
                content = _tool_calls_text(content, message["tool_calls"])
            elif "<function=" in content:
                content = xml_to_tool_style(content)
        normalized.append({"role": role, "content": content})
    return normalized


def _row_name(row: Mapping[str, Any], index: int) -> str:
    return f"row {index} (traj_id={row.get('traj_id')!r}, instance_id={row.get('instance_id')!r})"


def trace_to_example(
    tokenizer: PreTrainedTokenizerBase, row: Mapping[str, Any], index: int = 0
) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask) of one trace row through the chat template, loss on assistant turns only."""
    try:
        messages = normalize_messages(row["messages"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{_row_name(row, index)}: unreadable messages ({exc})") from exc
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(f"{_row_name(row, index)} has no assistant turn: nothing to train on")
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
