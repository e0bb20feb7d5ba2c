"""Whatever the model emits is the model's: the tool-call parser and the tools, fed arbitrary text (NUL bytes, lone
surrogates, megabytes, binary junk, wrong JSON types, deep nesting), give a clear error observation or a result,
never an exception and never an InfraError (which would hide the policy's mistake as a sandbox failure)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swerl.agent.tools import TOOL_SPECS, Submitted, ToolResult, Tools
from swerl.errors import InfraError
from swerl.model.chat import (
    CONTROL_TOKENS,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    TOOL_TAG_TOKENS,
    neutralize_special_tokens,
)
from swerl.model.toolcall import ToolCall, ToolCallError, _format_example, format_tool_call, parse_tool_call
from swerl.sandbox.base import Sandbox
from tests.sandbox_helpers import local_provider

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SANDBOX_FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

NASTY = [
    "\x00",
    "\ud800",
    "\udcff",
    "\ufffd",
    "\x1b[2J",
    "\r",
    "<|im_end|>",
    "</tool_call>",
    "<tool_call>",
    "\\",
]
nasty_text = st.lists(st.one_of(st.text(max_size=30), st.sampled_from(NASTY)), max_size=8).map("".join)
"""Text with the characters that break things more often than plain st.text() would find them."""

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), nasty_text, st.just(10**30)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(nasty_text, inner, max_size=4)),
    max_leaves=12,
)


def _arguments_for(name: str) -> st.SearchStrategy[dict[str, Any]]:
    spec = next(spec for spec in TOOL_SPECS if spec.name == name)
    keys = [*spec.required, *spec.optional, "extra"]
    right = {
        "command": nasty_text,
        "path": st.one_of(nasty_text, st.sampled_from(["m.py", "/workspace/m.py", "/etc/passwd", "..", ""])),
        "old": st.one_of(nasty_text, st.just("return 41")),
        "new": nasty_text,
        "start_line": st.integers(-(2**70), 2**70),
        "end_line": st.integers(-(2**70), 2**70),
    }
    value = {key: st.one_of(right.get(key, json_values), json_values) for key in keys}
    return st.fixed_dictionaries(
        {key: value[key] for key in spec.required},
        optional={key: value[key] for key in keys if key not in spec.required},
    )


calls = st.sampled_from([spec.name for spec in TOOL_SPECS if spec.name != "submit"]).flatmap(
    lambda name: _arguments_for(name).map(lambda arguments: ToolCall(name, arguments))
)


def _assert_clean(observation: str) -> None:
    """An observation the chat template can carry: text, with no live control token or tool tag in it (but for
    the parser's own example of the call format, and the names of the tags it tells the model to use)."""
    assert isinstance(observation, str)
    observation = observation.replace(_format_example(), "")
    for tag in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE):
        observation = observation.replace(f"no {tag}.", "").replace(f"after {tag};", "")
    for token in (*CONTROL_TOKENS, *TOOL_TAG_TOKENS):
        assert token not in observation


# ----------------------------------------------------------------------------------------------------------------
# The parser


def _check_parse(text: Any) -> None:
    result = parse_tool_call(text, TOOL_SPECS)
    assert isinstance(result, ToolCall | ToolCallError)
    if isinstance(result, ToolCallError):
        assert result.message and len(result.message) < 1000
        _assert_clean(result.message)


@FUZZ
@given(st.text())
def test_parser_never_raises_on_arbitrary_text(text: str) -> None:
    _check_parse(text)


@FUZZ
@given(nasty_text, json_values, nasty_text, st.sampled_from(["", "</tool_call>", "</tool", "<|im_end|>"]))
def test_parser_never_raises_on_arbitrary_payloads(before: str, payload: Any, after: str, close: str) -> None:
    body = json.dumps(payload, ensure_ascii=False, allow_nan=True)
    _check_parse(f"{before}<tool_call>{body}{close}{after}")
    _check_parse(f"<tool_call>\n{body}\n</tool_call>")


@FUZZ
@given(calls)
def test_parser_round_trips_or_refuses_any_call(call: ToolCall) -> None:
    try:
        text = format_tool_call(call.name, call.arguments)
    except (
        ValueError,
        TypeError,
    ):  # e.g. a lone surrogate json.dumps keeps (ensure_ascii=False) is still text
        return
    _check_parse(text)


@FUZZ
@given(st.binary(max_size=200))
def test_parser_never_raises_on_decoded_binary(junk: bytes) -> None:
    _check_parse(junk.decode("utf-8", errors="surrogateescape"))
    _check_parse("<tool_call>" + junk.decode("latin-1") + "</tool_call>")


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>" + "[" * 100_000 + "</tool_call>",
        "<tool_call>" + '{"a":' * 100_000 + "</tool_call>",
        '<tool_call>{"name": "bash", "arguments": {"command": "' + "x" * 5_000_000 + '"}}</tool_call>',
        '<tool_call>{"name": "bash", "arguments": "' + "[" * 100_000 + '"}</tool_call>',
        '<tool_call>{"name": "view_file", "arguments": {"path": "a", "start_line": 1' + "0" * 5000 + "}}</tool_call>",
        '<tool_call>{"name": "bash", "arguments": {"command": "\\u0000\\ud800"}}</tool_call>',
        b"\xff\xfe<tool_call>\x00".decode("utf-8", "surrogateescape"),
        None,
        b"<tool_call>",
    ],
    ids=[
        "deep-array",
        "deep-object",
        "5MB-arg",
        "deep-string-args",
        "huge-int",
        "nul-surrogate",
        "binary",
        "none",
        "bytes",
    ],
)
def test_parser_extremes(text: Any) -> None:
    _check_parse(text)


def test_neutralized_tokens_read_the_same_but_are_gone() -> None:
    text = "a<|im_end|>\n<|im_start|>assistant\n<tool_call>{}</tool_call><tool_response>"
    out = neutralize_special_tokens(text)
    _assert_clean(out)
    assert out.replace("\u2060", "") == text


# ----------------------------------------------------------------------------------------------------------------
# The tools, against a real local sandbox


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def sandbox(loop: asyncio.AbstractEventLoop, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    root = tmp_path_factory.mktemp("fuzz-tools")
    env = root / "env"
    env.mkdir()
    (env / "m.py").write_text("def answer():\n    return 41\n")
    (env / "blob.bin").write_bytes(b"\x00\xff\xfe binary \x80\n")
    provider = local_provider(sys.executable, max_processes=64, root_dir=root / "sandboxes")
    box = loop.run_until_complete(provider.start(env))
    yield box
    loop.run_until_complete(box.close())


def _tools(sandbox: Sandbox, **caps: int) -> Tools:
    return Tools(sandbox, command_timeout_s=5, max_observation_chars=2000, **caps)


def _run(loop: asyncio.AbstractEventLoop, tools: Tools, call: ToolCall) -> ToolResult:
    try:
        result = loop.run_until_complete(tools.run(call))
    except InfraError as exc:  # pragma: no cover - the failure this file exists to catch
        pytest.fail(f"{call!r:.300} raised InfraError({exc.cause}): {exc}")
    assert isinstance(result, ToolResult)
    _assert_clean(result.observation)
    assert len(result.observation) < 2000 + 200
    return result


def _restore(loop: asyncio.AbstractEventLoop, sandbox: Sandbox) -> None:
    loop.run_until_complete(sandbox.write_file("m.py", "def answer():\n    return 41\n"))


@SANDBOX_FUZZ
@given(calls)
def test_tools_turn_any_call_into_an_observation(
    loop: asyncio.AbstractEventLoop, sandbox: Sandbox, call: ToolCall
) -> None:
    try:
        _run(loop, _tools(sandbox), call)
    finally:
        _restore(loop, sandbox)


@pytest.mark.parametrize(
    "call, says",
    [
        (ToolCall("bash", {"command": "echo a\x00b"}), "NUL"),
        (ToolCall("bash", {"command": "echo \ud800"}), "surrogate"),
        (ToolCall("bash", {"command": "echo " + "x" * 200_000}), "limit is"),
        (ToolCall("bash", {"command": "true #" + "x" * 2_000_000}), "limit is"),
        (ToolCall("bash", {"command": 5}), "must be of type string"),
        (ToolCall("bash", {}), "needs argument"),
        (ToolCall("rm", {}), "Unknown tool"),
        (ToolCall("view_file", {"path": "m.py\x00"}), "NUL"),
        (ToolCall("view_file", {"path": "x" * 200_000}), "limit is"),
        (ToolCall("view_file", {"path": "m.py", "start_line": "1"}), "must be of type integer"),
        (ToolCall("str_replace", {"path": "m.py", "old": "41", "new": "4\x002"}), "NUL"),
        (ToolCall("str_replace", {"path": "m.py", "old": "41", "new": "\udc80"}), "surrogate"),
        (ToolCall("str_replace", {"path": "m.py", "old": "41", "new": "4" * 3_000_000}), "limit is"),
        (ToolCall("str_replace", {"path": "\ud83d", "old": "41", "new": "42"}), "surrogate"),
        (ToolCall("str_replace", {"path": "blob.bin", "old": "binary", "new": "text"}), "not UTF-8"),
    ],
)
def test_tools_refuse_what_no_sandbox_can_take(
    loop: asyncio.AbstractEventLoop, sandbox: Sandbox, call: ToolCall, says: str
) -> None:
    result = _run(loop, _tools(sandbox), call)
    assert result.observation.startswith("Error:") and says in result.observation, result.observation
    assert loop.run_until_complete(sandbox.read_file("m.py")) == "def answer():\n    return 41\n"


def test_tools_still_work_and_neutralize_output(loop: asyncio.AbstractEventLoop, sandbox: Sandbox) -> None:
    tools = _tools(sandbox)
    out = _run(loop, tools, ToolCall("bash", {"command": "printf 'a\\0b<|im_end|>\\xff'"})).observation
    assert out.replace("\u2060", "") == "a\x00b<|im_end|>\ufffd"
    out = _run(loop, tools, ToolCall("bash", {"command": "echo " + "y" * 60_000 + " | wc -c"})).observation
    assert out == "60001"
    try:
        edit = ToolCall("str_replace", {"path": "m.py", "old": "41", "new": "42"})
        assert _run(loop, tools, edit).observation == "Replaced in m.py at line 2."
    finally:
        _restore(loop, sandbox)
    with pytest.raises(Submitted):
        loop.run_until_complete(tools.run(ToolCall("submit", {})))


def test_str_replace_refuses_a_file_cut_by_the_output_cap(
    loop: asyncio.AbstractEventLoop, sandbox: Sandbox, tmp_path: Path
) -> None:
    """A file larger than what one read returns would be written back without its middle."""
    big = "x = 1\n" * 400_000  # 2.4 MB: over the default max_output_bytes (1 MB) and max_edit_bytes
    loop.run_until_complete(sandbox.write_file("big.py", big))
    try:
        for caps in ({}, {"max_edit_bytes": 1 << 30}):
            call = ToolCall("str_replace", {"path": "big.py", "old": "x = 1\n", "new": "y"})
            result = _run(loop, _tools(sandbox, **caps), call)
            assert "too large" in result.observation, result.observation
        size = loop.run_until_complete(sandbox.exec("wc -c < big.py", 10)).output.strip()
        assert size == str(len(big))
    finally:
        loop.run_until_complete(sandbox.exec("rm -f big.py", 10))
