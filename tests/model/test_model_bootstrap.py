"""Model bootstrap: local tokenizer, chat template, tiny Qwen3 models, and assistant-only loss masks."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM, Qwen3MoeForCausalLM

from swerl.model.chat import CHAT_TEMPLATE, CONTROL_TOKENS, TOOL_TAG_TOKENS, render_messages
from swerl.model.loading import build_tiny_model, load_model_and_tokenizer, save_model_and_tokenizer
from swerl.model.tokenizer import train_tokenizer

CORPUS = [
    "def add(left, right):\n    return left + right\n",
    "def clamp(value, low, high):\n    if value < low:\n        return low\n    return min(value, high)\n",
    "for index in range(10):\n    total += index * 2  # 3.14 != 2.71\n",
    "     1\timport os\n     2\t\n     3\tdef main() -> None:\n     4\t    print('héllo wörld', 42)\n",
    "sed -n 12,14p mod.py && sed -i '13s/ <= / < /' mod.py\n",
    "FAILED tests/test_mod.py::test_clamp - assert 5 == 4\n1 failed, 2 passed in 0.03s\n",
]
CODE_SAMPLE = (
    "class Counter:\n\tdef __init__(self, start: int = 0) -> None:\n\t\tself.count = start  # 日本語 ✓\n\n"
    "    def bump(self):  \n        self.count += 1_000_000 ** 2 >> 3\r\n        return {'k': [1, (2,)]}\n"
)
SMALL_MODEL: dict[str, Any] = dict(
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=64,
    max_position_embeddings=512,
)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(CORPUS * 20, vocab_size=400, out_dir=out)
    return out


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path):
    return AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_tokenizer_saved_in_hugging_face_format(tokenizer_dir: Path, tokenizer) -> None:
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    assert (tokenizer_dir / "tokenizer.json").is_file()
    assert config["chat_template"] == CHAT_TEMPLATE
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert len(tokenizer) <= 400


def test_tokenizer_round_trips_code(tokenizer) -> None:
    ids = encode(tokenizer, CODE_SAMPLE)
    assert tokenizer.decode(ids) == CODE_SAMPLE
    assert len(ids) < len(CODE_SAMPLE.encode())  # it learnt merges, not only bytes


def test_digits_are_single_tokens_and_operators_tokenize_alike_in_code_and_sed(tokenizer) -> None:
    text = "x <= 12345 and y != 3.14 -> f(a,b)[0] == {'k': 1}"
    for token in tokenizer.convert_ids_to_tokens(encode(tokenizer, text)):
        visible = token.replace("Ġ", " ").strip()
        if any(char.isdigit() for char in visible):
            assert len(visible) == 1, token  # digits never merge, with each other or with anything else
    # A line number tokenizes identically in an observation and in an action that copies it.
    observation = encode(tokenizer, "    12\t    if value <= low:")
    action = encode(tokenizer, "sed -i '12s/ <= / < /' mod.py")
    one, two = encode(tokenizer, "1"), encode(tokenizer, "2")
    assert len(one) == len(two) == 1
    for ids in (observation, action):
        assert any(ids[index : index + 2] == one + two for index in range(len(ids) - 1))
    # The operator with its leading space is the same token sequence in the code and in the substitution.
    operator = encode(tokenizer, " <=")
    for ids in (observation, action):
        assert any(ids[index : index + len(operator)] == operator for index in range(len(ids)))


def test_special_tokens_are_single_ids(tokenizer) -> None:
    for token in (*CONTROL_TOKENS, *TOOL_TAG_TOKENS):
        token_id = tokenizer.convert_tokens_to_ids(token)
        assert encode(tokenizer, token) == [token_id]
        in_context = encode(tokenizer, f"a{token}b")
        assert token_id in in_context and len(in_context) == 3
    # Control tokens are special; tool tags survive skip_special_tokens so the tool-call parser still sees them.
    ids = encode(tokenizer, "<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "assistant\n<tool_call>\n{}\n</tool_call>"


def test_chat_template_renders_qwen3_format(tokenizer) -> None:
    messages = [
        {"role": "system", "content": "Fix the bug."},
        {"role": "user", "content": "Tests fail."},
        {
            "role": "assistant",
            "content": "Run them.",
            "tool_calls": [{"type": "function", "function": {"name": "bash", "arguments": {"command": "pytest"}}}],
        },
        {"role": "tool", "content": "1 failed"},
        {"role": "tool", "content": "done"},
    ]
    expected = (
        "<|im_start|>system\nFix the bug.<|im_end|>\n"
        "<|im_start|>user\nTests fail.<|im_end|>\n"
        "<|im_start|>assistant\nRun them.\n"
        '<tool_call>\n{"name": "bash", "arguments": {"command": "pytest"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n1 failed\n</tool_response>\n<tool_response>\ndone\n</tool_response>"
        "<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == expected
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    with_tools = tokenizer.apply_chat_template(messages[:2], tools=tools, tokenize=False)
    assert with_tools.startswith("<|im_start|>system\nFix the bug.\n\n# Tools\n")
    assert json.dumps(tools[0]) in with_tools


def assistant_text(message: dict) -> str:
    """What the model writes in an assistant turn, built by hand rather than through the template."""
    parts = [message.get("content") or ""]
    for call in message.get("tool_calls") or []:
        body = json.dumps({"name": call["name"], "arguments": call["arguments"]}, ensure_ascii=False)
        parts.append(f"<tool_call>\n{body}\n</tool_call>")
    return "\n".join(part for part in parts if part) + "<|im_end|>"


def masked_spans(ids: list[int], mask: list[int]) -> list[list[int]]:
    spans: list[list[int]] = []
    for index, (token_id, bit) in enumerate(zip(ids, mask, strict=True)):
        if bit and (index == 0 or not mask[index - 1]):
            spans.append([])
        if bit:
            spans[-1].append(token_id)
    return spans


def check_render(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> None:
    ids, mask = render_messages(tokenizer, messages, tools=tools)
    full = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    assert len(ids) == len(mask) and set(mask) <= {0, 1}
    assert tokenizer.decode(ids) == full
    # With this tokenizer, rendering prefix by prefix gives exactly the tokens of the whole render.
    assert ids == encode(tokenizer, full)
    expected = [assistant_text(message) for message in messages if message["role"] == "assistant"]
    spans = masked_spans(ids, mask)
    assert [tokenizer.decode(span) for span in spans] == expected
    header = encode(tokenizer, "<|im_start|>assistant\n")
    starts = [index for index in range(1, len(ids)) if mask[index] and not mask[index - 1]]
    for start in starts:
        assert ids[start - len(header) : start] == header and not any(mask[start - len(header) : start])


def test_loss_mask_covers_exactly_assistant_turns(tokenizer) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful engineer."},
        {"role": "user", "content": "Fix clamp in mod.py (line 13)."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"name": "bash", "arguments": {"command": "pytest -q"}}],
        },
        {"role": "tool", "content": "FAILED test_clamp - assert 5 == 4"},
        {
            "role": "assistant",
            "content": "Look at lines 12-14.",
            "tool_calls": [{"name": "bash", "arguments": {"command": "cat -n mod.py | sed -n 12,14p"}}],
        },
        {"role": "tool", "content": "    13\t    if value <= low:"},
        {"role": "user", "content": "Go on."},
        {"role": "assistant", "content": "\n  Done: the bound was off by one.\n\n"},
    ]
    check_render(tokenizer, messages)
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    check_render(tokenizer, messages, tools=tools)
    check_render(tokenizer, messages[1:3])


def test_loss_mask_on_random_conversations(tokenizer) -> None:
    rng = random.Random(7)
    pieces = ["\n", " ", "  ", "x", "12", "<=", "def f():", "é", "\t", "{}", "a b", "\n\n"]

    def text() -> str:
        return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))

    for _ in range(25):
        messages: list[dict] = [{"role": "system", "content": text()}] if rng.random() < 0.5 else []
        messages.append({"role": "user", "content": text()})
        for _ in range(rng.randint(1, 4)):
            call = {"name": "bash", "arguments": {"command": text()}} if rng.random() < 0.6 else None
            messages.append({"role": "assistant", "content": text(), "tool_calls": [call] if call else []})
            messages.extend({"role": rng.choice(["tool", "user"]), "content": text()} for _ in range(rng.randint(0, 2)))
        check_render(tokenizer, messages)


def test_render_rejects_conversations_without_a_prompt_or_an_assistant_turn(tokenizer) -> None:
    with pytest.raises(ValueError, match="no assistant turn"):
        render_messages(tokenizer, [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    with pytest.raises(ValueError, match="starts with an assistant turn"):
        render_messages(tokenizer, [{"role": "assistant", "content": "a"}])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Path:
    model = build_tiny_model(tokenizer, **SMALL_MODEL, seed=3)
    return save_model_and_tokenizer(model, tokenizer, tmp_path_factory.mktemp("model"))


def test_tiny_model_builds_and_runs_forward(tokenizer) -> None:
    model = build_tiny_model(tokenizer, **SMALL_MODEL, seed=3)
    assert isinstance(model, Qwen3ForCausalLM)
    assert model.config.vocab_size == len(tokenizer)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    ids = torch.tensor([encode(tokenizer, "def add(left, right):")])
    logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer)) and torch.isfinite(logits).all()
    same = build_tiny_model(tokenizer, **SMALL_MODEL, seed=3)
    other = build_tiny_model(tokenizer, **SMALL_MODEL, seed=4)
    assert torch.equal(same(input_ids=ids).logits, logits)
    assert not torch.equal(other(input_ids=ids).logits, logits)


def test_save_load_round_trip_gives_identical_logits(tokenizer, model_dir: Path) -> None:
    model = build_tiny_model(tokenizer, **SMALL_MODEL, seed=3).eval()
    loaded, loaded_tokenizer = load_model_and_tokenizer(model_dir)
    assert isinstance(loaded, Qwen3ForCausalLM)
    ids = torch.tensor([encode(loaded_tokenizer, CODE_SAMPLE)])
    assert encode(loaded_tokenizer, CODE_SAMPLE) == encode(tokenizer, CODE_SAMPLE)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(input_ids=ids).logits, model(input_ids=ids).logits)
    assert loaded.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_load_names_the_missing_files(tmp_path: Path, model_dir: Path, tokenizer_dir: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a local directory"):
        load_model_and_tokenizer(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match=r"config\.json.*weights.*tokenizer") as empty_error:
        load_model_and_tokenizer(tmp_path)
    assert str(tmp_path) in str(empty_error.value)
    model_only = tmp_path / "model_only"
    model_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(model_dir / name, model_only / name)
    with pytest.raises(FileNotFoundError, match="missing: tokenizer"):
        load_model_and_tokenizer(model_only)
    with pytest.raises(FileNotFoundError, match=r"missing: model config \(config\.json\); model weights"):
        load_model_and_tokenizer(tokenizer_dir)


def test_moe_option_builds_and_round_trips(tokenizer, tmp_path: Path) -> None:
    model = build_tiny_model(tokenizer, **SMALL_MODEL, moe=True, num_experts=4, num_experts_per_tok=2, seed=1)
    assert isinstance(model, Qwen3MoeForCausalLM)
    assert model.config.num_experts == 4 and model.config.num_experts_per_tok == 2
    ids = torch.tensor([encode(tokenizer, "return min(value, high)")])
    with torch.no_grad():
        logits = model.eval()(input_ids=ids).logits
        assert logits.shape == (1, ids.shape[1], len(tokenizer))
        loaded, _ = load_model_and_tokenizer(save_model_and_tokenizer(model, tokenizer, tmp_path))
        assert torch.equal(loaded.eval()(input_ids=ids).logits, logits)
