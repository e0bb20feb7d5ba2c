"""Trajectory records, observation truncation, and trace loading (tool and xml styles) into training examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from transformers import PreTrainedTokenizerBase

from swerl.agent.tools import TOOL_SPECS, number_lines, truncate_middle
from swerl.agent.traces import (
    load_trace_rows,
    normalize_messages,
    trace_to_example,
    traces_to_examples,
    write_traces,
    xml_to_tool_style,
)
from swerl.model.chat import render_messages
from swerl.model.toolcall import format_tool_call, parse_tool_call
from swerl.trajectory import EpisodeStatus, Trajectory


def _trajectory(**overrides: object) -> Trajectory:
    fields: dict[str, object] = dict(
        task_id="t",
        status=EpisodeStatus.RESOLVED,
        reward=1.0,
        prompt_tokens=2,
        token_ids=[5, 6, 7, 8],
        loss_mask=[0, 0, 1, 1],
        behaviour_logprobs=[0.0, 0.0, -0.5, -0.1],
        token_weight_versions=[-1, -1, 4, 4],
    )
    return Trajectory(**(fields | overrides))  # type: ignore[arg-type]


def test_trajectory_validates_alignment_and_reward_rules() -> None:
    assert _trajectory().sampled_tokens == 2
    with pytest.raises(ValidationError, match="loss_mask has 3 entries"):
        _trajectory(loss_mask=[0, 1, 1])
    with pytest.raises(ValidationError, match="non-sampled token 0"):
        _trajectory(behaviour_logprobs=[-1.0, 0.0, -0.5, -0.1])
    with pytest.raises(ValidationError, match="sampled token 2"):
        _trajectory(token_weight_versions=[-1, -1, -1, 4])
    with pytest.raises(ValidationError, match="prompt token is marked"):
        _trajectory(prompt_tokens=3)
    with pytest.raises(ValidationError, match="reward must be None"):
        _trajectory(status=EpisodeStatus.INFRA_ERROR, infra_cause="sandbox_died")
    infra = _trajectory(status=EpisodeStatus.INFRA_ERROR, reward=None, infra_cause="sandbox_died")
    assert infra.reward is None
    assert Trajectory.model_validate_json(infra.model_dump_json()) == infra


def test_truncation_keeps_head_and_tail_and_cat_n_numbering() -> None:
    text = "".join(f"line {i}\n" for i in range(1000))
    cut = truncate_middle(text, 200)
    assert cut.startswith("line 0\n") and cut.endswith("line 999\n") and "characters omitted" in cut
    assert len(cut) < 260 and truncate_middle("short", 200) == "short"
    assert number_lines("a\nb\nc\n", 2, 3) == "     2\tb\n     3\tc"


def test_tool_call_format_parses_with_the_tool_specs() -> None:
    call = parse_tool_call(format_tool_call("str_replace", {"path": "a.py", "old": "x", "new": "y"}), TOOL_SPECS)
    assert getattr(call, "name", None) == "str_replace" and call.arguments["old"] == "x"  # type: ignore[union-attr]


XML_TURN = (
    "Let me look at the file.\n\n<function=str_replace_editor>\n<parameter=command>view</parameter>\n"
    "<parameter=path>/testbed/pkg/m.py</parameter>\n<parameter=view_range>[10, 20]</parameter>\n</function>"
)


def test_xml_style_turns_are_converted_to_tool_calls() -> None:
    converted = xml_to_tool_style(XML_TURN)
    assert converted.startswith("Let me look at the file.\n\n<tool_call>\n")
    call = parse_tool_call(converted, TOOL_SPECS)
    assert getattr(call, "name", None) == "view_file"
    assert call.arguments == {"path": "/testbed/pkg/m.py", "start_line": 10, "end_line": 20}  # type: ignore[union-attr]
    bash = xml_to_tool_style("<function=bash>\n<parameter=command>\nls -la\n</parameter>\n</function>")
    assert json.loads(bash.split("\n")[1]) == {"name": "bash", "arguments": {"command": "ls -la"}}
    edit = xml_to_tool_style(
        "<function=str_replace_editor><parameter=command>str_replace</parameter><parameter=path>m.py</parameter>"
        "<parameter=old_str>a < b</parameter><parameter=new_str>a <= b</parameter></function>"
    )
    assert json.loads(edit.split("\n")[1])["arguments"] == {"path": "m.py", "old": "a < b", "new": "a <= b"}


def test_rows_load_from_json_strings_xml_and_openai_tool_calls(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    xml_messages = [
        {"role": "system", "content": [{"type": "text", "text": "You are an agent."}]},
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": XML_TURN},
        {"role": "user", "content": "OBSERVATION:\n10 x = 1"},
        {"role": "assistant", "content": "<function=submit>\n</function>"},
    ]
    openai_messages = [
        {"role": "user", "content": "Fix it."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "bash", "arguments": '{"command": "ls"}'}}],
        },
        {"role": "tool", "content": "a.py"},
    ]
    rows = [
        {"instance_id": "a", "traj_id": "a.0", "resolved": True, "messages": json.dumps(xml_messages)},
        {"instance_id": "b", "traj_id": "b.0", "resolved": True, "messages": json.dumps(openai_messages)},
        {"instance_id": "c", "traj_id": "c.0", "resolved": False, "messages": json.dumps(openai_messages)},
    ]
    loaded = load_trace_rows(write_traces(rows, tmp_path / "rows.parquet"))
    normalized = normalize_messages(loaded[0]["messages"])
    assert normalized[0] == {"role": "system", "content": "You are an agent."}
    assert "<function=" not in normalized[2]["content"] and "<tool_call>" in normalized[4]["content"]
    assert normalize_messages(openai_messages)[1]["content"] == format_tool_call("bash", {"command": "ls"})
    examples = traces_to_examples(tokenizer, loaded)
    assert len(examples) == 2  # the unresolved row is left out
    assert examples[0] == render_messages(tokenizer, normalized)


def test_a_row_without_an_assistant_turn_is_named_in_the_error(tokenizer: PreTrainedTokenizerBase) -> None:
    row = {"instance_id": "x", "traj_id": "x.7", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(ValueError, match=r"row 3 \(traj_id='x.7', instance_id='x'\) has no assistant turn"):
        trace_to_example(tokenizer, row, 3)
