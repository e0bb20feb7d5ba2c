"""The tool-call format: `format_tool_call` writes one as the chat template lays `tool_calls` out, and
`parse_tool_call` reads one Hermes/Qwen-style tool call from an assistant turn:
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Policy (exactly one call per assistant turn):
- Text before `<tool_call>` is allowed and kept as reasoning.
- Text after `</tool_call>` is an error (TEXT_AFTER_CALL): the turn must end at the call, since anything after it
  (often an invented `<tool_response>`) was never executed and would teach the model to hallucinate results.
  Trailing whitespace and a trailing `<|im_end|>` (a decoded stop token) are ignored.
- Any failure comes back as a ToolCallError whose `message` is short enough to be shown to the model as the
  observation; parsing never raises, whatever the input.

The JSON body is read with a JSON decoder from the opening tag, not by searching for the closing tag, so a string
argument that contains `</tool_call>`, braces or quotes is parsed correctly.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from swerl.model.chat import IM_END, PAD_TOKEN, TOOL_CALL_CLOSE, TOOL_CALL_OPEN, neutralize_special_tokens

_STOP_TOKENS = (IM_END, PAD_TOKEN)
_JSON_TYPE_NAMES: dict[type, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "object",
    type(None): "null",
}
_SNIPPET_CHARS = 60
_DECODER = json.JSONDecoder()


class ToolCallErrorKind(enum.StrEnum):
    """Why a turn did not yield a usable tool call."""

    NO_TOOL_CALL = "no_tool_call"
    MULTIPLE_CALLS = "multiple_calls"
    UNTERMINATED = "unterminated"
    INVALID_JSON = "invalid_json"
    MISSING_NAME = "missing_name"
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_ARGUMENTS = "invalid_arguments"
    MISSING_ARGUMENT = "missing_argument"
    UNKNOWN_ARGUMENT = "unknown_argument"
    WRONG_ARGUMENT_TYPE = "wrong_argument_type"
    TEXT_AFTER_CALL = "text_after_call"


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model may call: its name and the JSON types of its required and optional arguments."""

    name: str
    required: Mapping[str, type] = field(default_factory=dict)
    optional: Mapping[str, type] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call to a known tool; `reasoning` is the text the model wrote before it."""

    name: str
    arguments: dict[str, Any]
    reasoning: str = ""


@dataclass(frozen=True)
class ToolCallError:
    """A malformed turn: `message` is a short observation telling the model what to fix."""

    kind: ToolCallErrorKind
    message: str


def _snippet(value: object) -> str:
    """A short repr of model-written text, so an error observation stays small whatever the model wrote."""
    # Cut before repr: the model may have written megabytes.
    text = repr(value[: _SNIPPET_CHARS + 1] if isinstance(value, str) else value)
    text = text if len(text) <= _SNIPPET_CHARS else text[: _SNIPPET_CHARS - 3] + "..."
    return neutralize_special_tokens(text)  # a quoted <|im_end|> must not end the observation's turn


def _type_name(expected: type) -> str:
    return _JSON_TYPE_NAMES.get(expected, expected.__name__)


def _matches(value: object, expected: type) -> bool:
    """JSON-aware isinstance: booleans are not numbers, integers are acceptable numbers."""
    if isinstance(value, bool):
        return expected is bool
    if expected is float:
        return isinstance(value, int | float)
    return isinstance(value, expected)


def _format_example() -> str:
    return f'{TOOL_CALL_OPEN}\n{{"name": <tool name>, "arguments": {{...}}}}\n{TOOL_CALL_CLOSE}'


def _error(kind: ToolCallErrorKind, message: str) -> ToolCallError:
    return ToolCallError(kind=kind, message=message)


def _strip_trailer(text: str) -> str:
    """Drop trailing whitespace and stop tokens that a decoder may have left in the text."""
    text = text.rstrip()
    stripped = True
    while stripped:
        stripped = False
        for token in _STOP_TOKENS:
            if text.endswith(token):
                text = text[: -len(token)].rstrip()
                stripped = True
    return text


def _skip_whitespace(text: str, index: int) -> int:
    while index < len(text) and text[index].isspace():
        index += 1
    return index


def _decode_envelope(text: str) -> tuple[Any, str] | ToolCallError:
    """The JSON payload of the single tool call in text and the reasoning before it, or the structural error."""
    start = text.find(TOOL_CALL_OPEN)
    if start < 0:
        return _error(
            ToolCallErrorKind.NO_TOOL_CALL,
            f"No tool call found. End your turn with exactly one call: {_format_example()}",
        )
    body = _skip_whitespace(text, start + len(TOOL_CALL_OPEN))
    try:
        payload, end = _DECODER.raw_decode(text, body)
    except (ValueError, RecursionError) as error:  # RecursionError: absurdly deep nesting
        if TOOL_CALL_CLOSE not in text[body:]:
            return _error(ToolCallErrorKind.UNTERMINATED, f"The tool call is cut off: no {TOOL_CALL_CLOSE}.")
        if isinstance(error, json.JSONDecodeError):
            detail = error.msg
        elif isinstance(error, RecursionError):
            detail = "nested too deeply"
        else:  # e.g. an integer literal over Python's digit limit
            detail = str(error)[:_SNIPPET_CHARS]
        return _error(ToolCallErrorKind.INVALID_JSON, f"The tool call is not valid JSON ({detail}).")
    close = _skip_whitespace(text, end)
    if not text.startswith(TOOL_CALL_CLOSE, close):
        if TOOL_CALL_CLOSE.startswith(text[close:]):  # nothing, or a closing tag cut off mid-way
            return _error(ToolCallErrorKind.UNTERMINATED, f"The tool call is cut off: no {TOOL_CALL_CLOSE}.")
        return _error(
            ToolCallErrorKind.INVALID_JSON,
            f"Unexpected text after the JSON object inside the tool call: {_snippet(text[close : close + 20])}.",
        )
    after = text[close + len(TOOL_CALL_CLOSE) :]
    if TOOL_CALL_OPEN in after:
        return _error(ToolCallErrorKind.MULTIPLE_CALLS, "Make exactly one tool call per turn; you made several.")
    if after.strip():
        return _error(
            ToolCallErrorKind.TEXT_AFTER_CALL,
            f"End your turn right after {TOOL_CALL_CLOSE}; found trailing text {_snippet(after.strip())}.",
        )
    return payload, text[:start].strip()


def _check_arguments(spec: ToolSpec, arguments: Mapping[str, Any]) -> ToolCallError | None:
    """The first argument error of a call to spec, or None."""
    for name, expected in spec.required.items():
        if name not in arguments:
            return _error(
                ToolCallErrorKind.MISSING_ARGUMENT,
                f"Tool {spec.name!r} needs argument {name!r} ({_type_name(expected)}).",
            )
    for name, value in arguments.items():
        expected_type = spec.required.get(name, spec.optional.get(name))
        if expected_type is None:
            known = sorted([*spec.required, *spec.optional])
            return _error(
                ToolCallErrorKind.UNKNOWN_ARGUMENT,
                f"Tool {spec.name!r} has no argument {_snippet(name)}; its arguments: {known}.",
            )
        if not _matches(value, expected_type):
            return _error(
                ToolCallErrorKind.WRONG_ARGUMENT_TYPE,
                f"Argument {name!r} of tool {spec.name!r} must be of type {_type_name(expected_type)}, "
                f"got {_type_name(type(value))}.",
            )
    return None


def check_call(call: ToolCall, tools: Sequence[ToolSpec]) -> ToolCallError | None:
    """Why `call` (parsed or built by hand) is not a valid call to one of `tools`, or None."""
    specs = {spec.name: spec for spec in tools}
    spec = specs.get(call.name) if isinstance(call.name, str) else None
    if spec is None:
        return _error(
            ToolCallErrorKind.UNKNOWN_TOOL,
            f"Unknown tool {_snippet(call.name)}; available tools: {sorted(specs)}.",
        )
    if not isinstance(call.arguments, dict):
        return _error(ToolCallErrorKind.INVALID_ARGUMENTS, '"arguments" must be a JSON object.')
    return _check_arguments(spec, call.arguments)


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """An assistant turn's tool-call text, in the same layout the chat template gives `tool_calls`."""
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{payload}\n{TOOL_CALL_CLOSE}"


def parse_tool_call(text: str, tools: Sequence[ToolSpec] | None = None) -> ToolCall | ToolCallError:
    """The single tool call in an assistant turn, or a typed error; never raises.

    With `tools`, the name must be one of them and the arguments must match its spec; without, any name and any
    argument object are accepted (structure only).
    """
    if not isinstance(text, str):
        return _error(ToolCallErrorKind.NO_TOOL_CALL, "No tool call found: the turn is not text.")
    envelope = _decode_envelope(_strip_trailer(text))
    if isinstance(envelope, ToolCallError):
        return envelope
    payload, reasoning = envelope
    if not isinstance(payload, dict):
        return _error(
            ToolCallErrorKind.INVALID_JSON,
            f'The tool call must be a JSON object like {{"name": ..., "arguments": {{...}}}}, '
            f"got a JSON {_type_name(type(payload))}.",
        )
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return _error(ToolCallErrorKind.MISSING_NAME, 'The tool call needs a "name" string.')
    specs = {spec.name: spec for spec in tools} if tools is not None else None
    if specs is not None and name not in specs:
        return _error(
            ToolCallErrorKind.UNKNOWN_TOOL,
            f"Unknown tool {_snippet(name)}; available tools: {sorted(specs)}.",
        )
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        # OpenAI-style clients send arguments as a JSON-encoded string: accept it if it decodes to an object.
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            return _error(ToolCallErrorKind.INVALID_ARGUMENTS, '"arguments" must be a JSON object.')
    if not isinstance(arguments, dict):
        return _error(ToolCallErrorKind.INVALID_ARGUMENTS, '"arguments" must be a JSON object.')
    if specs is not None:
        argument_error = _check_arguments(specs[name], arguments)
        if argument_error is not None:
            return argument_error
    return ToolCall(name=name, arguments=arguments, reasoning=reasoning)
