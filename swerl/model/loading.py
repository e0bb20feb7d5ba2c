"""Model folders in Hugging Face format: the tiny Qwen3 (dense or MoE) bootstrap, loading and saving, the context
length. Models are built from a config or loaded with `local_files_only=True`: never from a hub."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from swerl.model.chat import CHAT_TEMPLATE
from swerl.model.tokenizer import save_tokenizer

_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


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


def save_model_and_tokenizer(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> Path:
    """Save model and tokenizer side by side in Hugging Face format; returns the directory."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    save_tokenizer(tokenizer, out)
    return out


def check_model_dir(path: Path) -> None:
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
    path: str | Path, dtype: torch.dtype = torch.float32, attn_implementation: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a local directory, never from a hub. attn_implementation: as
    transformers names it (sdpa, eager, flash_attention_2, flex_attention); None: transformers' choice."""
    directory = Path(path)
    tokenizer = load_tokenizer(directory)
    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=dtype, **extra)
    return model, tokenizer


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a local model directory (checked as load_model_and_tokenizer checks it), without weights."""
    directory = Path(path)
    check_model_dir(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    if tokenizer.chat_template is None:
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def context_length(path: str | Path) -> int:
    """max_position_embeddings of a local model directory's config (0 when it does not say)."""
    config = AutoConfig.from_pretrained(Path(path), local_files_only=True)
    return int(getattr(config, "max_position_embeddings", 0) or 0)
