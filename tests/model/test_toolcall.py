"""Tool-call parsing: one well-formed call per turn, and a typed error (never an exception) for anything else."""

from __future__ import annotations

import json
import random

import pytest

from swerl.model.toolcall import ToolCall, ToolCallError, ToolCallErrorKind, ToolSpec, parse_tool_call

TOOLS = [
    ToolSpec("bash", required={"command": str}, optional={"timeout": float}),
    ToolSpec("view_file", required={"path": str, "start": int, "end": int}),
    ToolSpec("submit"),
]
Kind = ToolCallErrorKind


def call(name: object, arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_well_formed_call_with_reasoning() -> None:
    text = "The test fails on line 13; look there.\n" + call("view_file", {"path": "m.py", "start": 12, "end": 14})
    result = parse_tool_call(text, TOOLS)
    assert result == ToolCall(
        name="view_file",
        arguments={"path": "m.py", "start": 12, "end": 14},
        reasoning="The test fails on line 13; look there.",
    )


@pytest.mark.parametrize(
    "text, arguments",
    [
        ('<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>', {"command": "ls"}),
        ('  <tool_call>  {"name":"bash","arguments":{"command":"ls"}}  </tool_call>  \n', {"command": "ls"}),
        (call("bash", {"command": "ls"}) + "<|im_end|>", {"command": "ls"}),
        # Braces, quotes and even the closing tag inside a string argument do not end the call.
        (call("bash", {"command": "echo '}{' \"</tool_call>\" <tool_call>"}), None),
        (call("bash", {"command": "sed -i '13s/ <= / < /' mod.py", "timeout": 30}), None),
        (call("bash", {"command": "printf 'ünïcødé ✓ 日本'", "timeout": 1.5}), None),
        (
            '<tool_call>{"name": "bash", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>',
            {"command": "ls"},
        ),
        ('<tool_call>{"name": "submit"}</tool_call>', {}),
        (call("submit", {}), {}),
    ],
)
def test_accepted_variants(text: str, arguments: dict | None) -> None:
    result = parse_tool_call(text, TOOLS)
    assert isinstance(result, ToolCall), result
    if arguments is not None:
        assert result.arguments == arguments
    else:
        assert result.arguments == json.loads(text.split("\n")[1])["arguments"]


MALFORMED: list[tuple[str, ToolCallErrorKind]] = [
    ("", Kind.NO_TOOL_CALL),
    ("I think the bug is on line 3.", Kind.NO_TOOL_CALL),
    ('{"name": "bash", "arguments": {"command": "ls"}}', Kind.NO_TOOL_CALL),
    ('{"name": "bash"}</tool_call>', Kind.NO_TOOL_CALL),
    ("<tool_call>", Kind.UNTERMINATED),
    ('<tool_call>\n{"name": "bash", "arguments": {"command": "ls', Kind.UNTERMINATED),
    ('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}', Kind.UNTERMINATED),
    ('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_ca', Kind.UNTERMINATED),
    ("<tool_call>{name: bash}</tool_call>", Kind.INVALID_JSON),
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls"}</tool_call>', Kind.INVALID_JSON),
    ('<tool_call>{"name": "bash", "arguments": {}}}</tool_call>', Kind.INVALID_JSON),
    ("<tool_call>{'name': 'bash'}</tool_call>", Kind.INVALID_JSON),
    ('<tool_call>{"name": "bash", "arguments": {"command": "a\nb"}}</tool_call>', Kind.INVALID_JSON),
    ("<tool_call></tool_call>", Kind.INVALID_JSON),
    ('<tool_call>["bash", "ls"]</tool_call>', Kind.INVALID_JSON),
    ("<tool_call>42</tool_call>", Kind.INVALID_JSON),
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls"}} extra</tool_call>', Kind.INVALID_JSON),
    ("<tool_call>" + "[" * 100_000 + "]" * 100_000 + "</tool_call>", Kind.INVALID_JSON),
    ('<tool_call>{"arguments": {"command": "ls"}}</tool_call>', Kind.MISSING_NAME),
    ('<tool_call>{"name": "", "arguments": {}}</tool_call>', Kind.MISSING_NAME),
    ('<tool_call>{"name": 7, "arguments": {}}</tool_call>', Kind.MISSING_NAME),
    (call("rm_rf", {}), Kind.UNKNOWN_TOOL),
    (call("Bash", {"command": "ls"}), Kind.UNKNOWN_TOOL),
    (call("bash", ["ls"]), Kind.INVALID_ARGUMENTS),
    ('<tool_call>{"name": "bash", "arguments": "ls -la"}</tool_call>', Kind.INVALID_ARGUMENTS),
    (call("bash", {}), Kind.MISSING_ARGUMENT),
    (call("view_file", {"path": "m.py", "start": 1}), Kind.MISSING_ARGUMENT),
    (call("bash", {"command": "ls", "cwd": "/"}), Kind.UNKNOWN_ARGUMENT),
    (call("submit", {"patch": "x"}), Kind.UNKNOWN_ARGUMENT),
    (call("bash", {"command": ["ls"]}), Kind.WRONG_ARGUMENT_TYPE),
    (call("bash", {"command": None}), Kind.WRONG_ARGUMENT_TYPE),
    (call("bash", {"command": "ls", "timeout": "30"}), Kind.WRONG_ARGUMENT_TYPE),
    (call("bash", {"command": "ls", "timeout": True}), Kind.WRONG_ARGUMENT_TYPE),
    (call("view_file", {"path": "m.py", "start": 1.5, "end": 2}), Kind.WRONG_ARGUMENT_TYPE),
    (call("view_file", {"path": "m.py", "start": True, "end": 2}), Kind.WRONG_ARGUMENT_TYPE),
    (call("bash", {"command": "ls"}) + call("submit", {}), Kind.MULTIPLE_CALLS),
    (call("bash", {"command": "ls"}) + "\nand then\n" + call("submit", {}), Kind.MULTIPLE_CALLS),
    (call("bash", {"command": "ls"}) + "\n<tool_response>\nfile.py\n</tool_response>", Kind.TEXT_AFTER_CALL),
    (call("bash", {"command": "ls"}) + " done.", Kind.TEXT_AFTER_CALL),
    (call("bash", {"command": "ls"}) + "</tool_call>", Kind.TEXT_AFTER_CALL),
]


@pytest.mark.parametrize("text, kind", MALFORMED)
def test_malformed_turns_give_typed_errors(text: str, kind: ToolCallErrorKind) -> None:
    result = parse_tool_call(text, TOOLS)
    assert isinstance(result, ToolCallError), result
    assert result.kind is kind, result.message
    assert 0 < len(result.message) <= 300  # short enough to show the model as an observation


def test_error_messages_are_bounded_for_huge_input() -> None:
    huge_name = "x" * 1_000_000
    result = parse_tool_call(call(huge_name, {}), TOOLS)
    assert isinstance(result, ToolCallError) and result.kind is Kind.UNKNOWN_TOOL
    assert len(result.message) < 300
    trailing = parse_tool_call(call("submit", {}) + "y" * 1_000_000, TOOLS)
    assert isinstance(trailing, ToolCallError) and len(trailing.message) < 300
    big = parse_tool_call(call("bash", {"command": "z" * 2_000_000}), TOOLS)
    assert isinstance(big, ToolCall) and len(big.arguments["command"]) == 2_000_000
    digits = parse_tool_call('<tool_call>{"name": "submit", "x": ' + "9" * 10_000 + "}</tool_call>", TOOLS)
    assert isinstance(digits, ToolCallError) and digits.kind is Kind.INVALID_JSON


def test_without_specs_only_structure_is_checked() -> None:
    result = parse_tool_call(call("anything", {"k": [1, {"n": None}]}))
    assert result == ToolCall(name="anything", arguments={"k": [1, {"n": None}]})
    error = parse_tool_call(call("anything", 3))
    assert isinstance(error, ToolCallError) and error.kind is Kind.INVALID_ARGUMENTS


def test_fuzzed_inputs_never_raise() -> None:
    rng = random.Random(0)
    valid = "Reasoning {x}.\n" + call("bash", {"command": "grep -n 'a}{b' f.py | head -5", "timeout": 2})
    alphabet = list('<>/{}[]":,\\ \n\tabc0é✓\x00\ud800') + ["<tool_call>", "</tool_call>", "<|im_end|>"]
    for _ in range(3000):
        chars = list(valid)
        for _ in range(rng.randint(1, 4)):
            operation, position = rng.random(), rng.randrange(len(chars) + 1)
            if operation < 0.4:
                chars.insert(position, rng.choice(alphabet))
            elif operation < 0.8 and chars:
                del chars[min(position, len(chars) - 1)]
            else:
                chars = chars[:position]  # truncated generation
        result = parse_tool_call("".join(chars), TOOLS)
        assert isinstance(result, ToolCall | ToolCallError)
        if isinstance(result, ToolCallError):
            assert result.message and isinstance(result.kind, ToolCallErrorKind)
    assert isinstance(parse_tool_call(None, TOOLS), ToolCallError)  # type: ignore[arg-type]
