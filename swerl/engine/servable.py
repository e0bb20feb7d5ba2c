"""What the local engine serves (swerl/engine/local.py): a model it can run, on a device it can run on, and the
end-of-sequence ids that stop its generation."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swerl.model.loading import load_model_and_tokenizer

SERVABLE_MODEL_TYPES = ("qwen3", "qwen3_moe")
"""Model types slots.SlotModel runs (the Qwen3 attention: q_norm and k_norm per head, RoPE, GQA)."""


def engine_device(device: str | torch.device) -> torch.device:
    """The device the engine runs on: cpu, or cuda where this process sees a GPU."""
    where = torch.device(device)
    if where.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"engine device {where} asked for, but torch.cuda.is_available() is False (no GPU visible "
            f"to this process, or a CPU build of torch {torch.__version__}); use device cpu"
        )
    if where.type not in ("cpu", "cuda"):
        raise ValueError(f"engine device must be cpu or cuda, got {where}")
    return where


def load_servable(
    model_path: str | Path, dtype: torch.dtype, max_context_tokens: int
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and tokenizer at model_path, refused unless the engine can serve them at max_context_tokens."""
    model, tokenizer = load_model_and_tokenizer(model_path, dtype=dtype)
    config = model.config
    positions = getattr(config, "max_position_embeddings", None)
    if not 2 <= max_context_tokens <= (positions or max_context_tokens):
        raise ValueError(f"max_context_tokens {max_context_tokens} not in [2, max_position_embeddings {positions}]")
    if config.model_type not in SERVABLE_MODEL_TYPES:
        raise ValueError(
            f"the local engine runs Qwen3 models ({', '.join(SERVABLE_MODEL_TYPES)}), got {config.model_type}"
        )
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"}:
        raise ValueError(f"only full-attention models are supported, got layer types {sorted(layer_types)}")
    return model, tokenizer


def eos_token_ids(model: PreTrainedModel, tokenizer_eos: int | None) -> set[int]:
    """End-of-sequence ids that stop generation unless ignore_eos: the tokenizer's and the generation config's."""
    ids = {tokenizer_eos} if tokenizer_eos is not None else set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(int(token) for token in configured)
    return ids
