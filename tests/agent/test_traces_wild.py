"""Published agent traces (SWE-smith-trajectories) as they are found in the wild: mixed content types, the
tool_calls and SWE-agent xml styles, rows SFT would refuse named on load, rows of the wrong schema, and the traces
stage (source=dataset) writing rows the SFT stage reads back."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pa_json
import pytest
from datasets import Dataset, load_dataset
from datasets.exceptions import DatasetGenerationError
from transformers import PreTrainedTokenizerBase

from swerl.agent.traces import load_trace_rows, normalize_messages, trace_to_example, write_traces
from swerl.config.data import TracesConfig
from swerl.data.loaders import RowError, load_tasks, row_to_task, rows_to_tasks
from swerl.model.toolcall import ToolCall, parse_tool_call
from swerl.sandbox.process import shell_command
from swerl.stages.runner import load_manifest
from swerl.stages.traces import TracesStage, run_traces
from tests.stage_helpers import AGENT, Env, stage_key_of

Message = dict[str, Any]

DIRECTORY_LISTING = (
    "Here's the files and directories up to 2 levels deep in /testbed, excluding hidden items:\n"
    "/testbed\n/testbed/pkg\n/testbed/pkg/m.py\n"
)
FIND = "find /testbed -maxdepth 2 -not -path '*/\\.*'"
"""What SWE-agent's str_replace_editor runs for `view` of a directory (its observation is the listing above)."""

NEW_FILE = "import sys\n\nprint(sys.argv)\n"


def _create_bash(path: str, text: str) -> str:
    """The bash command the mapped create of `text` holds (checked by running it, below)."""
    [turn] = [m for m in normalize_messages(_xml_trace([_xml_create(path, text)])) if m["role"] == "assistant"]
    call = parse_tool_call(turn["content"])
    assert isinstance(call, ToolCall) and call.name == "bash" and set(call.arguments) == {"command"}, turn
    return str(call.arguments["command"])


# One trajectory, step by step: the SWE-agent call (name, arguments), what it returned, and the swerl tool call
# it must train as (None: kept as written).
STEPS: list[tuple[str, dict[str, Any], str, tuple[str, dict[str, Any]] | None]] = [
    ("str_replace_editor", {"command": "view", "path": "/testbed"}, DIRECTORY_LISTING, ("bash", {"command": FIND})),
    (
        "str_replace_editor",
        {"command": "view", "path": "/testbed/pkg/m.py"},
        "Here's the result of running `cat -n` on /testbed/pkg/m.py:\n     1\tx = 1\n",
        ("view_file", {"path": "/testbed/pkg/m.py"}),
    ),
    (
        "str_replace_editor",
        {"command": "view", "path": "/testbed/pkg/m.py", "view_range": [3, 8]},
        "Here's the result of running `cat -n` on /testbed/pkg/m.py:\n     3\ty = 2\n",
        ("view_file", {"path": "/testbed/pkg/m.py", "start_line": 3, "end_line": 8}),
    ),
    (
        "str_replace_editor",
        {"command": "view", "path": "/testbed/pkg/m.py", "view_range": [5, -1]},
        "Here's the result of running `cat -n` on /testbed/pkg/m.py:\n     5\tz = 3\n",
        ("view_file", {"path": "/testbed/pkg/m.py", "start_line": 5}),
    ),
    (
        "str_replace_editor",
        {"command": "str_replace", "path": "/testbed/pkg/m.py", "old_str": "a < b", "new_str": "a <= b"},
        "The file /testbed/pkg/m.py has been edited.",
        ("str_replace", {"path": "/testbed/pkg/m.py", "old": "a < b", "new": "a <= b"}),
    ),
    (
        "str_replace_editor",
        {"command": "str_replace", "path": "/testbed/pkg/m.py", "old_str": "debug()\n"},
        "The file /testbed/pkg/m.py has been edited.",
        ("str_replace", {"path": "/testbed/pkg/m.py", "old": "debug()\n", "new": ""}),
    ),
    (
        "str_replace_editor",
        {"command": "create", "path": "/testbed/repro.py", "file_text": NEW_FILE},
        "File created successfully at: /testbed/repro.py",
        ("bash", {"command": "cat > /testbed/repro.py <<'EOF'\n" + NEW_FILE + "EOF"}),
    ),
    (
        "str_replace_editor",
        {"command": "insert", "path": "/testbed/pkg/m.py", "insert_line": 3, "new_str": "w = 0"},
        "The file /testbed/pkg/m.py has been edited.",
        None,
    ),
    (
        "str_replace_editor",
        {"command": "undo_edit", "path": "/testbed/pkg/m.py"},
        "Last edit to /testbed/pkg/m.py undone successfully.",
        None,
    ),
    (
        "bash",
        {"command": "cd /testbed && python -m pytest -q"},
        "1 passed",
        ("bash", {"command": "cd /testbed && python -m pytest -q"}),
    ),
    ("submit", {}, "diff --git a/pkg/m.py b/pkg/m.py", ("submit", {})),
]


def _xml_call(name: str, arguments: dict[str, Any]) -> str:
    """A call as SWE-agent writes it: each parameter on its own lines, JSON values (view_range) as JSON."""
    params = "".join(
        f"<parameter={key}>\n{value if isinstance(value, str) else json.dumps(value)}\n</parameter>\n"
        for key, value in arguments.items()
    )
    return f"<function={name}>\n{params}</function>"


def _xml_create(path: str, text: str) -> tuple[str, dict[str, Any], str]:
    return ("str_replace_editor", {"command": "create", "path": path, "file_text": text}, "File created.")


def _xml_trace(steps: list[tuple[str, dict[str, Any], str]]) -> list[Message]:
    messages: list[Message] = [
        {"role": "system", "content": "You are a helpful assistant that can interact with a computer."},
        {"role": "user", "content": "<uploaded_files>\n/testbed\n</uploaded_files>\nFix the comparison."},
    ]
    for k, (name, arguments, observation) in enumerate(steps):
        messages.append({"role": "assistant", "content": f"Step {k}.\n\n{_xml_call(name, arguments)}"})
        messages.append({"role": "user", "content": f"OBSERVATION:\n{observation}"})
    return messages


def _tool_trace(steps: list[tuple[str, dict[str, Any], str]]) -> list[Message]:
    messages: list[Message] = [
        {"role": "system", "content": "You are a helpful assistant that can interact with a computer."},
        {"role": "user", "content": "<uploaded_files>\n/testbed\n</uploaded_files>\nFix the comparison."},
    ]
    for k, (name, arguments, observation) in enumerate(steps):
        call = {
            "id": f"call_{k}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        messages.append({"role": "assistant", "content": f"Step {k}.", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{k}", "content": observation})
    return messages


def _with_parts(messages: list[Message], every: int = 2) -> list[Message]:
    """The same messages with every `every`-th content (string) as a list of text parts, split in two, as
    published trajectories mix them."""
    mixed = []
    for k, message in enumerate(messages):
        content = message.get("content")
        if k % every == 0 and isinstance(content, str) and content:
            half = len(content) // 2
            parts = [{"type": "text", "text": content[:half]}, {"type": "text", "text": content[half:]}]
            message = dict(message, content=parts)
        mixed.append(message)
    return mixed


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Rows as a published .jsonl file: one json.dumps per line (no Arrow involved in writing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def _calls(messages: list[Message]) -> list[tuple[str, dict[str, Any]]]:
    """The tool call of each normalized assistant turn (structure only: kept calls parse too)."""
    calls = []
    for message in normalize_messages(messages):
        if message["role"] == "assistant":
            call = parse_tool_call(message["content"])
            assert isinstance(call, ToolCall), (message, call)
            calls.append((call.name, call.arguments))
    return calls


STEP_CALLS = [(name, arguments, observation) for name, arguments, observation, _ in STEPS]
EXPECTED = [mapped or (name, arguments) for name, arguments, _, mapped in STEPS]


def _rows(messages_of: Callable[[list[Message]], list[Message]]) -> list[dict[str, Any]]:
    return [
        {
            "instance_id": "pkg__m.1",
            "traj_id": "pkg__m.1.xml",
            "resolved": True,
            "messages": messages_of(_xml_trace(STEP_CALLS)),
        },
        {
            "instance_id": "pkg__m.1",
            "traj_id": "pkg__m.1.tool",
            "resolved": True,
            "messages": messages_of(_tool_trace(STEP_CALLS)),
        },
    ]


# ----------------------------------------------------------------------------------------------------------------
# 1. mixed content: read as written, the same examples as string-only content


def test_mixed_string_and_part_content_loads_and_trains_like_string_content(
    tokenizer: PreTrainedTokenizerBase,
    tmp_path: Path,
) -> None:
    mixed_rows, plain_rows = _rows(_with_parts), _rows(lambda m: m)
    assert any(isinstance(m["content"], list) for m in mixed_rows[0]["messages"])
    assert any(isinstance(m["content"], str) for m in mixed_rows[0]["messages"])
    mixed = _write_jsonl(tmp_path / "mixed.jsonl", mixed_rows)
    plain = _write_jsonl(tmp_path / "plain.jsonl", plain_rows)

    loaded_mixed, loaded_plain = load_trace_rows(mixed), load_trace_rows(plain)
    assert loaded_mixed == mixed_rows and loaded_plain == plain_rows  # rows as written, nothing inferred
    for index, (row_mixed, row_plain) in enumerate(zip(loaded_mixed, loaded_plain, strict=True)):
        ids_mixed, mask_mixed = trace_to_example(tokenizer, row_mixed, index)
        assert (ids_mixed, mask_mixed) == trace_to_example(tokenizer, row_plain, index)
        assert sum(mask_mixed) > 0 and len(ids_mixed) == len(mask_mixed)

    # The real problem: Arrow gives a column one type. Its JSON reader (under datasets' json builder) and
    # Dataset.from_list (what write_traces used to write .jsonl through) both refuse this file's rows.
    with pytest.raises(pa.ArrowInvalid, match=r"changed from (string to array|array to string)"):
        pa_json.read_json(mixed)
    with pytest.raises(pa.ArrowInvalid, match="cannot mix list and non-list"):
        Dataset.from_list(mixed_rows)
    # datasets (5.2, pinned) reads the file only through its on_mixed_types="use_json" fallback; without that
    # fallback, load_dataset("json") fails on it with Arrow's mixing error.
    with pytest.raises(DatasetGenerationError) as caught:
        load_dataset("json", data_files=str(mixed), split="train", on_mixed_types=None, cache_dir=str(tmp_path / "hf"))
    assert isinstance(caught.value.__cause__, pa.ArrowInvalid)
    assert re.search(r"changed from (string to array|array to string)", str(caught.value.__cause__))
    # .jsonl is written as the rows are; parquet cannot hold them and says so, naming the file.
    assert load_trace_rows(write_traces(loaded_mixed, tmp_path / "again.jsonl")) == mixed_rows
    with pytest.raises(ValueError, match=r"again\.parquet: these trace rows have no single Arrow type"):
        write_traces(loaded_mixed, tmp_path / "again.parquet")


# ----------------------------------------------------------------------------------------------------------------
# 2. the tool_calls style and SWE-agent's xml style train the same swerl calls


def test_tool_call_and_xml_styles_normalize_to_the_same_swerl_calls() -> None:
    xml_calls = _calls(_xml_trace(STEP_CALLS))
    tool_calls = _calls(_tool_trace(STEP_CALLS))
    for k, expected in enumerate(EXPECTED):
        assert xml_calls[k] == expected, f"xml step {k}"
        assert tool_calls[k] == expected, f"tool_calls step {k}"
    # Observations reach the mapping in both styles also when they are text parts.
    assert _calls(_with_parts(_xml_trace(STEP_CALLS), every=1)) == EXPECTED
    assert _calls(_with_parts(_tool_trace(STEP_CALLS), every=1)) == EXPECTED
    # Without SWE-agent's directory listing in its observation, a view of a path is a view of a file.
    listing = [("str_replace_editor", {"command": "view", "path": "/testbed"}, "     1\tHere's nothing\n")]
    assert _calls(_xml_trace(listing)) == [("view_file", {"path": "/testbed"})]


@pytest.mark.parametrize(
    "text",
    [
        "a = 1\nb = 2\n",  # a final newline: a heredoc
        "a = 1\nb = 2",  # none: a heredoc would add one
        "x\nEOF\ny\n",  # a line equal to the heredoc's delimiter
        "EOF\nEOF_\nend",  # ... and both delimiters, without a final newline
        "EOF\nEOF_\n",
        "$HOME `id` $(id) \\n 'q' \"dq\" %s %%\n\ttab\n",  # nothing expands
        "a\r\nEOF\r\n",  # CRLF: no line equals the delimiter
        "",
        "\n",
        "".join(f"line {k}\n" for k in range(10_000)) + "EOF\n",  # over 64 KiB: sandboxes pass it on stdin
    ],
    ids=lambda text: repr(text[:20]),
)
def test_create_becomes_a_bash_command_that_writes_exactly_the_text(text: str, tmp_path: Path) -> None:
    target = tmp_path / "dir with space" / "new.py"
    target.parent.mkdir()
    command = _create_bash(str(target), text)
    tool_style = _calls(_tool_trace([_xml_create(str(target), text)]))
    assert tool_style == [("bash", {"command": command})]
    # As a sandbox runs it (swerl.sandbox.process): bash -c COMMAND, or a long one read from stdin.
    script, stdin = shell_command(command)
    subprocess.run(
        ["bash", "-c", script],
        input=stdin,
        cwd=tmp_path,
        check=True,
        timeout=10,
        env={"HOME": "/nonexistent", "PATH": "/usr/bin:/bin"},
    )
    assert target.read_bytes() == text.encode()
    assert (stdin is not None) == (len(command.encode()) > 64 * 1024)


# ----------------------------------------------------------------------------------------------------------------
# 3. rows SFT would refuse are refused on load, named


def _good(traj_id: str) -> dict[str, Any]:
    return {
        "instance_id": traj_id.split(".")[0],
        "traj_id": traj_id,
        "resolved": True,
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "Fix it."}]},
            {
                "role": "assistant",
                "content": "<function=bash>\n<parameter=command>ls</parameter>\n</function>",
            },
            {"role": "user", "content": "OBSERVATION:\na.py"},
            {"role": "assistant", "content": "<function=submit>\n</function>"},
        ],
    }


def _replaced(index: int, message: Message) -> Callable[[list[Message]], list[Message]]:
    return lambda messages: messages[:index] + [message] + messages[index + 1 :]


TOOL_CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"function": {"name": "bash", "arguments": "{}"}}],
}
BAD_ROWS: list[tuple[str, Callable[[list[Message]], list[Message]], str]] = [
    (
        "unknown-role",
        _replaced(3, {"role": "observation", "content": "a.py"}),
        r"message 3: unknown role 'observation'",
    ),
    (
        "image",
        _replaced(
            1,
            {
                "role": "user",
                "content": [{"type": "text", "text": "See:"}, {"type": "image_url", "image_url": {"url": "data:"}}],
            },
        ),
        r"message 1 \(user\): content part 1 is of type 'image_url'",
    ),
    ("empty-assistant", _replaced(2, {"role": "assistant", "content": ""}), r"message 2 \(assistant\): an empty turn"),
    (
        "empty-parts",
        _replaced(4, {"role": "assistant", "content": [{"type": "text", "text": " \n"}]}),
        r"message 4 \(assistant\): an empty turn",
    ),
    (
        "late-system",
        _replaced(3, {"role": "system", "content": "again"}),
        r"message 3 \(system\): a system message is only allowed first",
    ),
    ("no-assistant", lambda m: [x for x in m if x["role"] != "assistant"], r"has no assistant turn"),
    (
        "bad-arguments",
        _replaced(2, {**TOOL_CALL, "tool_calls": [{"function": {"name": "bash", "arguments": '{"command": "ls"'}}]}),
        r"message 2 \(assistant\): tool call 0 \(bash\): arguments are not valid JSON",
    ),
    (
        "list-arguments",
        _replaced(2, {**TOOL_CALL, "tool_calls": [{"function": {"name": "bash", "arguments": "[1]"}}]}),
        r"message 2 \(assistant\): tool call 0 \(bash\): arguments are not a JSON object",
    ),
    (
        "unterminated-call",
        _replaced(4, {"role": "assistant", "content": '<tool_call>\n{"name": "submit", "arguments": {}}'}),
        r"message 4 \(assistant\): its tool call is malformed",
    ),
    (
        "invalid-call",
        _replaced(4, {"role": "assistant", "content": "<tool_call>\n{name: submit}\n</tool_call>"}),
        r"message 4 \(assistant\): its tool call is malformed",
    ),
    (
        "opens-with-assistant",
        lambda m: [{"role": "assistant", "content": "Hello."}] + m[1:],
        r"message 0 \(assistant\): the conversation opens with the assistant",
    ),
]


@pytest.mark.parametrize(("kind", "edit", "reason"), BAD_ROWS, ids=[case[0] for case in BAD_ROWS])
def test_a_row_sft_would_refuse_is_refused_on_load_naming_file_line_row_and_message(
    kind: str, edit: Callable[[list[Message]], list[Message]], reason: str, tmp_path: Path
) -> None:
    good = _good("ok.0")
    bad = dict(_good(f"{kind}.1"), messages=edit(_good(kind)["messages"]))
    path = _write_jsonl(tmp_path / "traces.jsonl", [good, bad])
    name = re.escape(f"{path}:2: trace row 1 (traj_id='{kind}.1')")
    with pytest.raises(ValueError, match=name + ":? " + reason):
        load_trace_rows(path)
    # Without a traj_id the row is named by its instance_id; the same reason, the line after a blank one.
    del bad["traj_id"]
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(bad) + "\n", encoding="utf-8")
    name = re.escape(f"{path}:3: trace row 1 (instance_id='{kind}')")
    with pytest.raises(ValueError, match=name + ":? " + reason):
        load_trace_rows(path)
    # The good row alone loads (what makes the bad one bad is its edit).
    assert load_trace_rows(_write_jsonl(tmp_path / "good.jsonl", [good])) == [good]


def test_messages_as_a_json_string_are_checked_the_same(tmp_path: Path) -> None:
    """SWE-smith-trajectories publishes `messages` as a JSON string: its messages are checked all the same."""
    unknown_role = _replaced(3, {"role": "observation", "content": "x"})
    good = dict(_good("s.0"), messages=json.dumps(_good("s")["messages"]))
    bad = dict(_good("s.1"), messages=json.dumps(unknown_role(_good("s")["messages"])))
    path = _write_jsonl(tmp_path / "traces.jsonl", [good, bad])
    name = re.escape(f"{path}:2: trace row 1 (traj_id='s.1'): message 3: unknown role")
    with pytest.raises(ValueError, match=name):
        load_trace_rows(path)


# ----------------------------------------------------------------------------------------------------------------
# 4. the wrong schema is an error, not a silent conversion

SWEBENCH_ROW = {
    "repo": "astropy/astropy",
    "instance_id": "astropy__astropy-12907",
    "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
    "patch": "diff --git a/a.py b/a.py\n",
    "test_patch": "diff --git a/t.py b/t.py\n",
    "problem_statement": "Modeling's `separability_matrix` does not compute separability correctly",
    "hints_text": "",
    "created_at": "2022-03-03T15:14:54Z",
    "version": "4.3",
    "FAIL_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]',
    "PASS_TO_PASS": "[]",
    "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
}
SWESMITH_ROW = {
    "instance_id": "pkg__m.1a2b3c4d.func_basic__x1",
    "repo": "swesmith/pkg__m.1a2b3c4d",
    "patch": "diff --git a/a.py b/a.py\n",
    "FAIL_TO_PASS": ["tests/test_m.py::test_x"],
    "PASS_TO_PASS": [],
    "image_name": "jyangballin/swesmith.x86_64.pkg_1776_m.1a2b3c4d",
    "problem_statement": "",
}


def test_a_task_row_loaded_as_traces_is_named_as_a_task_row(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "swebench.jsonl", [SWEBENCH_ROW])
    with pytest.raises(ValueError) as caught:
        load_trace_rows(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:1: trace row 0 (instance_id='astropy__astropy-12907') is not a trace")
    assert "looks like a SWE-bench task row" in message and "load it as a task dataset" in message
    path = _write_jsonl(tmp_path / "swesmith.jsonl", [SWESMITH_ROW])
    with pytest.raises(ValueError, match=r"swesmith\.jsonl:1: .* looks like a SWE-smith task row"):
        load_trace_rows(path)
    # As SWE-bench publishes it: parquet, read through `datasets` (no line to name, the row still named).
    path = tmp_path / "swebench.parquet"
    Dataset.from_list([SWEBENCH_ROW, SWEBENCH_ROW]).to_parquet(str(path))
    with pytest.raises(ValueError, match=re.escape(f"{path}: trace row 0 (instance_id='astropy__astropy-12907')")):
        load_trace_rows(path)


@pytest.mark.parametrize("schema", ["swesmith", "swebench"])
def test_a_trace_row_loaded_as_a_task_is_named_as_an_agent_trace(schema: Any, tmp_path: Path) -> None:
    trace = dict(_good("pkg__m.1.0"), messages=_with_parts(_good("x")["messages"]))
    with pytest.raises(RowError, match=r"looks like an agent trace .*load it as traces") as caught:
        row_to_task(trace, schema, "traces.jsonl", None, 4)
    assert caught.value.rejection.row == 4 and caught.value.rejection.field == "messages"
    tasks, report = rows_to_tasks([trace], schema, source="traces.jsonl")
    assert tasks == [] and report.rejected and "looks like an agent trace" in report.rejected[0].reason
    with pytest.raises(RowError, match="looks like an agent trace"):
        rows_to_tasks([trace], schema, source="traces.jsonl", strict=True)
    # A task row missing a column is still told so, not called a trace.
    with pytest.raises(RowError, match=r"FAIL_TO_PASS: missing or empty"):
        row_to_task(dict(SWEBENCH_ROW, FAIL_TO_PASS=None), schema, "tasks.jsonl", None, 0)
    # And through the task loader, from a trace file with mixed content.
    path = _write_jsonl(tmp_path / "traces.jsonl", [trace])
    with pytest.raises(RowError, match="looks like an agent trace"):
        load_tasks(str(path), schema, strict=True)


# ----------------------------------------------------------------------------------------------------------------
# 5. the traces stage on a published-style dataset


def test_traces_stage_writes_mixed_rows_the_sft_loader_reads_back_and_names_a_bad_row(
    env: Env,
    tmp_path: Path,
) -> None:
    rows = _rows(_with_parts)
    dataset = _write_jsonl(tmp_path / "wild" / "trajectories.jsonl", rows)
    cfg = TracesStage(traces=TracesConfig(source="dataset", dataset=str(dataset)), agent=AGENT)
    manifest = env.run("traces", run_traces, cfg).manifest
    written = tmp_path / "traces.jsonl"
    written.write_bytes(env.artifact(manifest, "traces.jsonl"))
    assert load_trace_rows(written) == rows  # what the SFT stage reads
    report = env.json(manifest, "traces_report.json")
    assert report["traces"] == 2 and report["messages_by_role"]["assistant"] == 2 * len(STEPS)

    bad = dict(_good("bad.7"), messages=_replaced(3, {"role": "observation", "content": "x"})(_good("b")["messages"]))
    dataset = _write_jsonl(tmp_path / "bad" / "trajectories.jsonl", [*rows, bad])
    cfg = TracesStage(traces=TracesConfig(source="dataset", dataset=str(dataset)), agent=AGENT)
    name = re.escape(f"{dataset}:3: trace row 2 (traj_id='bad.7'): message 3: unknown role 'observation'")
    with pytest.raises(ValueError, match=name):
        env.run("traces", run_traces, cfg)
    assert load_manifest(env.store, "traces", stage_key_of("traces", cfg)) is None


def test_a_tool_calls_view_range_written_as_json_text_maps_like_a_list() -> None:
    """Some published tool_calls carry view_range as JSON text ("[2, 5]"), as the xml style writes it."""

    def view(view_range: Any) -> str:
        arguments = {"command": "view", "path": "/testbed/m.py", "view_range": view_range}
        call = {"function": {"name": "str_replace_editor", "arguments": json.dumps(arguments)}}
        messages = [
            {"role": "user", "content": "fix it"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "1\tx = 1"},
        ]
        return normalize_messages(messages)[1]["content"]

    as_list, as_text = view([2, 5]), view("[2, 5]")
    assert as_text == as_list
    parsed = parse_tool_call(as_text)
    assert isinstance(parsed, ToolCall) and parsed.name == "view_file"
    assert parsed.arguments == {"path": "/testbed/m.py", "start_line": 2, "end_line": 5}
