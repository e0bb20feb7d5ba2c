"""The model's architecture: the numbers of its config.json the plan needs and what they add up to.

Architecture (P: parameters). From sft.model_path/config.json, else cluster.model_config (a config.json path or a
shipped name, swerl/data/resources/architectures/), else sft.tiny when model_path is None. With hidden h, layers
L, heads n_q, KV heads n_kv, head_dim d (q = n_q d, kv = n_kv d), vocabulary V, intermediate I (dense) or E
experts of width I_e, k per token (MoE layers: every decoder_sparse_step-th layer not in mlp_only_layers):
- embeddings V h, plus V h for an untied lm_head; final norm h;
- per layer: attention h q + 2 h kv + q h (+ q + 2 kv + h biases with attention_bias), q/k norms 2 d (Qwen3),
  two norms 2 h; dense MLP 3 h I; MoE router h E + experts E x 3 h I_e (+ 3 h I_s + h for a shared expert);
- active per token: the total with k of the E experts per MoE layer instead of all of them.
Qwen3-30B-A3B: 30.53 B parameters (28.99 B in experts), 3.35 B active.

KV cache per token = L x n_kv x d x 2 (K and V) x bytes per element. Qwen3-30B-A3B in bf16: 48 x 4 x 128 x 2 x 2
= 98,304 B, so a 65,536-token trajectory holds 6.44 GB (6.00 GiB). The recipe's "6.3 GB per 64K trajectory" is
this formula at 64,000 tokens (6.29 GB): decimal GB, 64K read as 64,000.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swerl.config import ConfigError, PipelineConfig
from swerl.config.train import TinyModelConfig

ARCHITECTURES = Path(__file__).resolve().parent.parent / "data" / "resources" / "architectures"
"""Architectures shipped for planning without weights (cluster.model_config: NAME)."""


class PlanError(ConfigError):
    """The plan cannot be made: the model's architecture is missing or unreadable. The message names what."""


@dataclass(frozen=True)
class ParamCount:
    total: int
    active: int
    """Parameters one token uses (k of the E experts per MoE layer)."""
    experts: int
    """Parameters in routed experts (all of them, all layers)."""
    largest_unit: int
    """The largest FSDP unit: a decoder layer, the input embedding or the lm_head."""


@dataclass(frozen=True)
class Architecture:
    """The numbers of a causal LM's config.json the plan needs (Qwen3 and Qwen3-MoE; Llama-like models alike)."""

    source: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    qk_norm: bool = True
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    sparse_layers: int = 0
    """Decoder layers whose MLP is a mixture of experts."""
    max_positions: int = 0

    @property
    def moe(self) -> bool:
        return self.num_experts > 0 and self.sparse_layers > 0

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV cache of one token: layers x KV heads x head_dim x 2 (K and V) x bytes per element."""
        return self.num_layers * self.num_kv_heads * self.head_dim * 2 * dtype_bytes

    def params(self) -> ParamCount:
        h, q, kv, d = self.hidden_size, self.q_dim, self.kv_dim, self.head_dim
        embed = self.vocab_size * h
        lm_head = 0 if self.tie_word_embeddings else self.vocab_size * h
        attention = h * q + 2 * h * kv + q * h + (q + 2 * kv + h if self.attention_bias else 0)
        common = attention + (2 * d if self.qk_norm else 0) + 2 * h
        dense_mlp = 3 * h * self.intermediate_size
        expert = 3 * h * self.moe_intermediate_size
        shared = (3 * h * self.shared_expert_intermediate_size + h) if self.shared_expert_intermediate_size else 0
        router = h * self.num_experts
        sparse, dense = self.sparse_layers, self.num_layers - self.sparse_layers
        experts = sparse * self.num_experts * expert
        total = embed + lm_head + h + self.num_layers * common + dense * dense_mlp + sparse * (router + shared)
        total += experts
        active = total - experts + sparse * self.experts_per_token * expert
        largest_layer = common + max(dense_mlp if dense else 0, router + shared + self.num_experts * expert)
        return ParamCount(total=total, active=active, experts=experts, largest_unit=max(largest_layer, embed))

    def activation_bytes_per_token_layer(self, dtype_bytes: int) -> int:
        """A: what one layer keeps per token for its backward (rough: see swerl.plan.memory's docstring)."""
        h = self.hidden_size
        inner = (
            self.experts_per_token * self.moe_intermediate_size + self.shared_expert_intermediate_size
            if self.moe
            else self.intermediate_size
        )
        return dtype_bytes * (4 * h + 2 * self.q_dim + 2 * self.kv_dim + 3 * inner) + 4 * self.num_experts

    def describe(self) -> str:
        shape = (
            f"{self.num_layers} layers, hidden {self.hidden_size}, {self.num_heads} heads, {self.num_kv_heads} KV "
            f"heads x head_dim {self.head_dim}, vocabulary {self.vocab_size:,}"
        )
        if self.moe:
            shape += (
                f", {self.num_experts} experts of width {self.moe_intermediate_size} ({self.experts_per_token} per "
                f"token) in {self.sparse_layers} layers"
            )
        return f"{self.model_type}: {shape}"


def _int(data: dict[str, Any], key: str, source: str, default: int | None = None) -> int:
    value = data.get(key, default)
    if value is None:
        raise PlanError(f"model config {source} lacks {key!r}: the plan needs it to size the model")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlanError(f"model config {source}: {key} is {value!r}, not a non-negative integer")
    return value


def architecture_from_hf(data: dict[str, Any], source: str) -> Architecture:
    """The architecture of a Hugging Face config.json's contents (a multimodal config's text_config)."""
    if "hidden_size" not in data and isinstance(data.get("text_config"), dict):
        data = data["text_config"]
    hidden = _int(data, "hidden_size", source)
    layers = _int(data, "num_hidden_layers", source)
    heads = _int(data, "num_attention_heads", source)
    if heads == 0 or layers == 0 or hidden == 0:
        raise PlanError(f"model config {source}: hidden_size, num_hidden_layers and num_attention_heads must be > 0")
    experts = _int(data, "num_experts", source, data.get("num_local_experts", data.get("n_routed_experts", 0)))
    step = _int(data, "decoder_sparse_step", source, 1) or 1
    mlp_only = data.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list):
        raise PlanError(f"model config {source}: mlp_only_layers is {mlp_only!r}, not a list")
    sparse = sum(1 for i in range(layers) if experts and i not in mlp_only and (i + 1) % step == 0)
    model_type = str(data.get("model_type", "unknown"))
    return Architecture(
        source=source,
        model_type=model_type,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=_int(data, "num_key_value_heads", source, heads),
        head_dim=_int(data, "head_dim", source, hidden // heads),
        intermediate_size=_int(data, "intermediate_size", source, 0 if sparse == layers else None),
        vocab_size=_int(data, "vocab_size", source),
        tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
        attention_bias=bool(data.get("attention_bias", False)),
        qk_norm=model_type.startswith("qwen3"),
        num_experts=experts,
        experts_per_token=_int(data, "num_experts_per_tok", source, 0 if not sparse else None),
        moe_intermediate_size=_int(data, "moe_intermediate_size", source, 0 if not sparse else None),
        shared_expert_intermediate_size=_int(data, "shared_expert_intermediate_size", source, 0),
        sparse_layers=sparse,
        max_positions=_int(data, "max_position_embeddings", source, 0),
    )


def architecture_from_tiny(tiny: TinyModelConfig) -> Architecture:
    """The tiny Qwen3 (or Qwen3-MoE) swerl builds when sft.model_path is None (swerl.model.loading)."""
    return Architecture(
        source="sft.tiny (sft.model_path is None)",
        model_type="qwen3_moe" if tiny.moe else "qwen3",
        hidden_size=tiny.hidden_size,
        num_layers=tiny.num_layers,
        num_heads=tiny.num_heads,
        num_kv_heads=tiny.num_kv_heads,
        head_dim=tiny.hidden_size // tiny.num_heads,
        intermediate_size=tiny.ffn_size,
        vocab_size=tiny.vocab_size,  # an upper bound: the trained tokenizer may have fewer tokens
        tie_word_embeddings=True,
        num_experts=tiny.num_experts if tiny.moe else 0,
        experts_per_token=tiny.experts_per_token if tiny.moe else 0,
        moe_intermediate_size=tiny.ffn_size if tiny.moe else 0,
        sparse_layers=tiny.num_layers if tiny.moe else 0,
        max_positions=tiny.max_positions,
    )


def shipped_architectures() -> list[str]:
    return sorted(p.stem for p in ARCHITECTURES.glob("*.json"))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"model config {path} cannot be read as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PlanError(f"model config {path} does not hold a JSON object")
    return data


def _shown(path: Path) -> str:
    """A path relative to the working directory when it lies under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def load_architecture(cfg: PipelineConfig) -> Architecture:
    """The model's architecture: sft.model_path's config.json, else cluster.model_config, else sft.tiny when there
    is no model_path; a PlanError naming what is missing otherwise."""
    model_path = cfg.sft.model_path
    if model_path is None:
        return architecture_from_tiny(cfg.sft.tiny)
    own = Path(model_path) / "config.json"
    if own.is_file():
        return architecture_from_hf(_read_json(own), _shown(own))
    named = cfg.cluster.model_config_path
    shipped = ", ".join(shipped_architectures())
    if named is None:
        raise PlanError(
            f"the plan needs the model's architecture: sft.model_path {model_path} has no config.json here and "
            f"cluster.model_config is not set (a path to the model's config.json, or a shipped name: {shipped})"
        )
    path = Path(named)
    if not path.is_file():
        path = ARCHITECTURES / f"{named}.json"
        if not path.is_file():
            raise PlanError(
                f"cluster.model_config {named!r} is neither a file nor a shipped architecture ({shipped}); "
                f"sft.model_path {model_path} has no config.json here either"
            )
    return architecture_from_hf(_read_json(path), f"{_shown(path)} (cluster.model_config; {own} is absent here)")
