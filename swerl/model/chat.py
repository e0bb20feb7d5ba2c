"""The chat format every layer shares: Qwen3-style control and tool tokens, the prefix-stable chat template, and
rendering a conversation into token ids with an assistant-only loss mask (what SFT trains on and what the agent
loop's prompts are cut from)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"
TOOL_RESPONSE_CLOSE = "</tool_response>"
# Control tokens are special (dropped by decode(skip_special_tokens=True)); the tool tags are added tokens that
# are NOT special, as in Qwen3, so decoding a sampled turn keeps the tags the tool-call parser needs.
CONTROL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
TOOL_TAG_TOKENS = (TOOL_CALL_OPEN, TOOL_CALL_CLOSE, TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE)

# Qwen3's template minus the <think> handling: Qwen3 strips reasoning from earlier assistant turns, which would
# make a conversation's render differ from the prefix the model was sampled on. This one is prefix-stable:
# render(messages[:k], add_generation_prompt=True) is a prefix of render(messages) whenever messages[k] is an
# assistant turn.
CHAT_TEMPLATE = r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages and messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within ' }}
    {{- '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": ' }}
    {{- '<args-json-object>}\n</tool_call><|im_end|>\n' }}
{%- elif messages and messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}
            {{- raise_exception('a system message is only allowed first') }}
        {%- endif %}
    {%- elif message.role == 'user' %}
        {{- '<|im_start|>user\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\n' + content }}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function is defined %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {{- '<tool_call>\n{"name": ' + (tool_call.name | tojson) + ', "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or (messages[loop.index0 - 1].role != 'tool') %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('unknown message role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


def _render(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
    add_generation_prompt: bool,
) -> str:
    text = tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools else None,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )
    assert isinstance(text, str)
    return text


def _render_segments(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None,
) -> list[tuple[str, bool]]:
    """Split the full render into (text, is_assistant) segments by rendering prefix by prefix."""
    end_marker = IM_END
    segments: list[tuple[str, bool]] = []
    rendered = ""  # the text covered by segments so far
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        prompt = _render(tokenizer, messages[:index], tools, add_generation_prompt=True)
        full = _render(tokenizer, messages[: index + 1], tools, add_generation_prompt=False)
        if not prompt.startswith(rendered) or not full.startswith(prompt):
            raise ValueError(f"the chat template is not prefix-stable at message {index}")
        turn = full[len(prompt) :]
        cut = turn.rfind(end_marker)
        if cut < 0:
            raise ValueError(f"assistant message {index} renders without a closing {end_marker}")
        cut += len(end_marker)  # the model samples <|im_end|> itself: it is part of its turn
        segments.append((prompt[len(rendered) :], False))
        segments.append((turn[:cut], True))
        rendered = prompt + turn[:cut]
    whole = _render(tokenizer, messages, tools, add_generation_prompt=False)
    if not whole.startswith(rendered):
        raise ValueError("the chat template is not prefix-stable at the end of the conversation")
    segments.append((whole[len(rendered) :], False))
    if "".join(text for text, _ in segments) != whole:
        raise AssertionError("segments do not concatenate to the full render")
    return [(text, is_assistant) for text, is_assistant in segments if text]


def render_messages(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
) -> tuple[list[int], list[int]]:
    """Token ids of a conversation through the chat template and its assistant-only loss mask.

    The mask is 1 exactly on the tokens of each assistant turn's content (tool calls included) and its closing
    <|im_end|>; 0 on system, user and tool turns and on the `<|im_start|>assistant\\n` header.

    Invariant: ids are the concatenation of per-segment tokenizations, cut where generation starts and stops
    (after the generation prompt, after <|im_end|>). That is how the tokens arise at inference time: the engine
    receives the prompt's ids and samples the turn's ids after them, so training sees the same ids the model
    samples. Model-sampled tokens (RL trajectories) must be kept as sampled, never re-rendered through here.
    With this module's tokenizer a segment boundary is always a pre-token boundary, so the ids also equal the
    tokenization of the full render (checked in tests).
    """
    if not any(message.get("role") == "assistant" for message in messages):
        raise ValueError("conversation has no assistant turn: nothing to train on (the loss mask would be all 0)")
    if messages[0].get("role") == "assistant":
        raise ValueError("conversation starts with an assistant turn: it has no prompt to condition on")
    input_ids: list[int] = []
    loss_mask: list[int] = []
    for text, is_assistant in _render_segments(tokenizer, messages, tools):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        input_ids.extend(ids)
        loss_mask.extend([int(is_assistant)] * len(ids))
    return input_ids, loss_mask


def render_text(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    """A conversation through the chat template as text (the agent loop cuts its appended segments from it)."""
    return _render(tokenizer, messages, tools, add_generation_prompt)


_NEUTRALIZED = {token: token[:1] + "\u2060" + token[1:] for token in (*CONTROL_TOKENS, *TOOL_TAG_TOKENS)}
"""Each control token and tool tag with a WORD JOINER after its `<`: shown the same, tokenized as plain text."""


def neutralize_special_tokens(text: str) -> str:
    """Text the model did not write (a tool's output, a file, a quote of the model's text in an error) with every
    control token and tool tag broken up, so it cannot tokenize as a turn boundary or a fake tool call/response."""
    if "<" not in text:
        return text
    for token, neutral in _NEUTRALIZED.items():
        if token in text:
            text = text.replace(token, neutral)
    return text
