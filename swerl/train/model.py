"""Model bootstrap: a local byte-level BPE tokenizer, a Qwen3-style chat template, tiny Qwen3 models, and
rendering a conversation into token ids with an assistant-only loss mask.

Nothing here touches a model hub: tokenizers are trained from local text and models are built from a config
or loaded with `local_files_only=True`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

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

# Every newline and digit is its own pre-token: line numbers then tokenize the same way in an observation (`cat -n`
# output) and in an action (`sed -n 12,14p`), and a segment that ends with "\n" tokenizes independently of what
# follows (see render_messages). Runs of punctuation stay together (the byte-level regex keeps ` ?[^\s\p{L}\p{N}]+`
# as one pre-token), so BPE may merge them: `{"`, `":`, ` <=` are one token each, which makes a tool call ~35%
# shorter than with every punctuation character alone, and an operator with its leading space tokenizes the same
# in code and in a sed substitution.
_ISOLATE_PATTERN = r"\n|\p{N}"

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

_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def train_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str | Path) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on local text and save it in Hugging Face format to out_dir."""
    special_tokens = [*CONTROL_TOKENS, *TOOL_TAG_TOKENS]
    if vocab_size < 256 + len(special_tokens):
        raise ValueError(
            f"vocab_size {vocab_size} is below the 256 byte tokens plus {len(special_tokens)} specials"
        )
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_ISOLATE_PATTERN), behavior="isolated"),
            # add_prefix_space=False: a segment tokenized alone must not gain a leading space.
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,  # ids 0..6, counted within vocab_size
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable, whatever the corpus
        min_frequency=2,
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer)
    # Re-adding an existing token updates its flags: the tool tags keep their ids but stop being special.
    backend.add_tokens([AddedToken(tag, special=False, normalized=False) for tag in TOOL_TAG_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,  # a chat model ends its turn with <|im_end|>, as Qwen3 instruct models do
        pad_token=PAD_TOKEN,
        model_max_length=1 << 30,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    save_tokenizer(tokenizer, out_dir)
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> Path:
    """Save a tokenizer so that transformers 4.x readers (e.g. an SGLang install) load it as well as 5.x."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # save_jinja_files=False keeps the chat template inside tokenizer_config.json, where every reader looks.
    tokenizer.save_pretrained(out, save_jinja_files=False)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":
        # 5.x names its fast tokenizer class TokenizersBackend; PreTrainedTokenizerFast is the alias both know.
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return out


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    moe: bool = False,
    num_experts: int = 4,
    num_experts_per_tok: int = 2,
    seed: int = 0,
) -> PreTrainedModel:
    """A randomly initialised Qwen3 (dense) or Qwen3-MoE causal LM with tied embeddings sized to the tokenizer."""
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"hidden_size {hidden_size} must divide by num_heads {num_heads}, which must divide by "
            f"num_kv_heads {num_kv_heads}"
        )
    common: dict[str, Any] = dict(
        vocab_size=len(tokenizer),  # len() counts added tokens, unlike tokenizer.vocab_size
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    model: PreTrainedModel
    # fork_rng: seeding the initialisation must not reseed the caller's global generator.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if moe:
            if not 1 <= num_experts_per_tok <= num_experts:
                raise ValueError(f"num_experts_per_tok {num_experts_per_tok} not in [1, {num_experts}]")
            config = Qwen3MoeConfig(
                **common,
                moe_intermediate_size=intermediate_size,  # each expert's FFN width
                num_experts=num_experts,
                num_experts_per_tok=num_experts_per_tok,
                norm_topk_prob=True,
            )
            model = Qwen3MoeForCausalLM(config)
        else:
            model = Qwen3ForCausalLM(Qwen3Config(**common))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


def save_model_and_tokenizer(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path
) -> Path:
    """Save model and tokenizer side by side in Hugging Face format; returns the directory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    save_tokenizer(tokenizer, out)
    return out


def _check_model_dir(path: Path) -> None:
    """Raise FileNotFoundError naming what a local model directory lacks, before transformers sees it."""
    if not path.is_dir():
        raise FileNotFoundError(f"model path {path} is not a local directory (hub ids are never downloaded)")
    missing = []
    if not (path / "config.json").is_file():
        missing.append("model config (config.json)")
    if not any((path / name).is_file() for name in _WEIGHT_FILES):
        missing.append(f"model weights (one of {', '.join(_WEIGHT_FILES)})")
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        missing.append(f"tokenizer (one of {', '.join(_TOKENIZER_FILES)})")
    if missing:
        raise FileNotFoundError(f"model path {path} is missing: {'; '.join(missing)}")


def load_model_and_tokenizer(
    path: str | Path, dtype: torch.dtype = torch.float32
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a local directory, never from a hub."""
    directory = Path(path)
    tokenizer = load_tokenizer(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=dtype)
    return model, tokenizer


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a local model directory (checked as load_model_and_tokenizer checks it), without weights."""
    directory = Path(path)
    _check_model_dir(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    if tokenizer.chat_template is None:
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def context_length(path: str | Path) -> int:
    """max_position_embeddings of a local model directory's config (0 when it does not say)."""
    config = AutoConfig.from_pretrained(Path(path), local_files_only=True)
    return int(getattr(config, "max_position_embeddings", 0) or 0)


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
        raise ValueError(
            "conversation has no assistant turn: nothing to train on (the loss mask would be all 0)"
        )
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
