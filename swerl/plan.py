"""`swerl plan`: where a run's engines and trainer ranks go, and whether each one's memory fits, before it starts.

The plan reads the config only (and the model's config.json; never weights, never the GPUs): `cluster` (nodes,
GPUs per node, GPU and host memory), `engine`, `sft.distributed` and `grpo.distributed`, and the model's
architecture. It prints the placement (which GPU, as node and index, runs which engine or trainer rank), the
processes and ports, the memory of every GPU and of every node's host, and a list of checks; a failed check
names what does not fit where and by how much. `swerl plan` exits 1 on a failed check, `swerl run` refuses with
the same lines before any stage starts, and `swerl doctor` lists the checks among its own.

Placement. Engines take GPUs first, in (node, index) order: engine i gets tp_size GPUs from i x tp_size (SGLang
engines; a local engine on cuda one GPU). With cluster.engine_nodes the engines own that many whole nodes and the
trainer starts on the next node; otherwise the trainer's GPUs follow the engines' at once. The trainer gets
cluster.trainer_gpus GPUs, or every GPU left; on cuda it runs one rank per GPU, so a stage's distributed.ranks must
equal its GPUs. SFT and GRPO run one after the other on the same trainer GPUs; engines run in grpo and evaluate.

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

Engines (per GPU of an engine):
- SGLang: weights P x 2 (bf16) / tp_size + KV max_batch_size x max_context_tokens x KV per token (bf16, KV heads
  split over tp_size, at least one head per GPU), checked against gpu_memory x engine.mem_fraction_static: SGLang's
  static budget (weights plus its KV pool) is that fraction of the GPU's whole memory (None: SGLang chooses at
  start; the plan assumes SGLANG_ASSUMED_MEM_FRACTION and says so). SGLang fills the rest of the budget with KV
  pool, so the plan also reports the pool's tokens. With grpo.eval.every (async) a second engine set is opened on
  the same GPUs for evaluation: the engines' fractions must then sum to at most 1.
- local engines on cuda (local: one in the stage's process; http_local: one per engine): weights P x engine.dtype
  + KV (max_batch_size + prefix_cache_size) x max_context_tokens x KV per token in engine.dtype, checked against
  gpu_memory x cluster.usable_memory_fraction. On cpu the same bytes count in the host's memory.

Trainer (per rank; N ranks; b = bytes of distributed.param_dtype; U = the largest FSDP unit: a decoder layer, the
embedding or the lm_head; T = tokens in one micro-batch: sft.seq_len x rows_per_micro_batch for SFT,
max(grpo.algorithm.micro_batch_tokens, agent.max_trajectory_tokens) for GRPO, since a longer trajectory is a
micro-batch of its own):
- torch (one process, nothing sharded): float32 weights 4P + gradients 4P + AdamW moments 8P; autocast's bf16
  copies of the weights 2P when bf16; a KL reference model 4P (grpo.algorithm.kl_coef > 0).
- fsdp2: float32 master weights 4P/N, gradients 4P/N and AdamW moments 8P/N (all sharded over the N ranks), plus
  the gathered units: 3 U b (one unit computing, the next prefetched, one unit's unsharded gradient); without
  reshard_after_forward every gathered unit stays from forward to backward: P b + U b. A reference model 4P/N.
- megatron (TP tensor, PP pipeline, CP context, EP expert, ETP expert-tensor parallel; D = ranks / (TP PP CP)
  data parallel; D_e = ranks / (EP ETP PP) expert data parallel): non-expert parameters P_d = P - P_x split
  P_d / (TP PP), expert parameters P_x / (EP ETP PP); each shard holds b (weights) + 4 (float32 main gradients)
  + 12 (float32 master and two moments) bytes per parameter, the 12 divided by D x CP (non-expert) and D_e
  (expert) under the distributed optimizer.
- activations, a rough estimate per token (bytes a, of the compute dtype: param_dtype; torch: 2 under autocast,
  else 4): a layer keeps A = a (4 h + 2 q + 2 kv + 3 I_a) + 4 E, where I_a = I (dense) or k I_e (+ I_s) for MoE
  and 4 E the float32 router logits (flash/SDPA attention: no T x T scores). Without checkpointing T L A; with
  activation checkpointing (fsdp2 distributed.activation_checkpointing; megatron recompute full) T (L h a + A):
  every layer's input plus one layer recomputed. The torch backend does not checkpoint. megatron divides by TP
  and CP.
- logits: T V (a + 12): the logits in the compute dtype, the float32 scores the loss keeps for its backward (4)
  and the float32 transients of the log-softmax and entropy (8); megatron divides by TP (vocab-parallel).
Checked against gpu_memory x cluster.usable_memory_fraction (on cpu: the host's memory).

Host memory per node: every GPU process (an SGLang engine is 2 + tp_size: tokenizer, detokenizer, a scheduler
per GPU; a trainer rank; the stage's own process) takes PROCESS_HOST_GIB; the node of trainer rank 0 holds the
whole float32 model (4P) while rank 0 loads it and gathers exports; trainers and engines on cpu take their whole
memory there (a cpu process PROCESS_HOST_GIB_CPU). Checked per stage against cluster.host_memory_gib (None: this
machine's MemTotal) x usable_memory_fraction. Sandboxes are `swerl doctor`'s business.

Everything here is an estimate for refusing plans that cannot fit, not a promise that one that passes will.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swerl.config import ConfigError, DistributedConfig, PipelineConfig, TinyModelConfig

GIB = 2**30
"""Bytes in a GiB: every memory figure of the plan is in GiB (GB = 10^9 only where the recipe's figure is)."""
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
SGLANG_ASSUMED_MEM_FRACTION = 0.85
"""The static memory fraction planned for SGLang engines when engine.mem_fraction_static is None (SGLang then
chooses its own at start, from the GPU; set the field to plan with the fraction SGLang will really use)."""
PROCESS_HOST_GIB = 4.0
"""Host memory of one GPU process (Python, torch, the CUDA runtime and its pinned buffers): rough."""
PROCESS_HOST_GIB_CPU = 0.5
"""Host memory of one CPU process beyond its model (Python, torch): rough."""
ARCHITECTURES = Path(__file__).resolve().parent / "data" / "resources" / "architectures"
"""Architectures shipped for planning without weights (cluster.model_config: NAME)."""


class PlanError(ConfigError):
    """The plan cannot be made: the model's architecture is missing or unreadable. The message names what."""


# ----------------------------------------------------------------------------------------------------------------
# The model's architecture


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
        shared = (
            (3 * h * self.shared_expert_intermediate_size + h) if self.shared_expert_intermediate_size else 0
        )
        router = h * self.num_experts
        sparse, dense = self.sparse_layers, self.num_layers - self.sparse_layers
        experts = sparse * self.num_experts * expert
        total = (
            embed + lm_head + h + self.num_layers * common + dense * dense_mlp + sparse * (router + shared)
        )
        total += experts
        active = total - experts + sparse * self.experts_per_token * expert
        largest_layer = common + max(dense_mlp if dense else 0, router + shared + self.num_experts * expert)
        return ParamCount(total=total, active=active, experts=experts, largest_unit=max(largest_layer, embed))

    def activation_bytes_per_token_layer(self, dtype_bytes: int) -> int:
        """A: what one layer keeps per token for its backward (rough: see the module docstring)."""
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
        raise PlanError(
            f"model config {source}: hidden_size, num_hidden_layers and num_attention_heads must be > 0"
        )
    experts = _int(
        data, "num_experts", source, data.get("num_local_experts", data.get("n_routed_experts", 0))
    )
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
    return architecture_from_hf(
        _read_json(path), f"{_shown(path)} (cluster.model_config; {own} is absent here)"
    )


# ----------------------------------------------------------------------------------------------------------------
# Memory estimates (bytes)


def trainer_tokens(cfg: PipelineConfig, stage: str) -> int:
    """T: tokens of one micro-batch of a stage's trainer."""
    if stage == "sft":
        return cfg.sft.seq_len * cfg.sft.rows_per_micro_batch
    return max(cfg.grpo.algorithm.micro_batch_tokens, cfg.agent.max_trajectory_tokens)


def _compute_bytes(cfg: PipelineConfig, stage: str) -> int:
    d = cfg.sft.distributed if stage == "sft" else cfg.grpo.distributed
    if d.backend != "torch":
        return DTYPE_BYTES[d.param_dtype]
    autocast = d.param_dtype == "bfloat16" or (stage == "sft" and cfg.sft.bf16)
    return 2 if autocast else 4


def trainer_memory(arch: Architecture, cfg: PipelineConfig, stage: str) -> dict[str, int]:
    """Bytes one trainer rank of a stage ("sft" or "grpo") holds at its peak, by item (module docstring)."""
    d: DistributedConfig = cfg.sft.distributed if stage == "sft" else cfg.grpo.distributed
    p = arch.params()
    P, n = p.total, d.ranks
    a = _compute_bytes(cfg, stage)
    b = DTYPE_BYTES[d.param_dtype]
    reference = stage == "grpo" and cfg.grpo.algorithm.kl_coef > 0
    T = trainer_tokens(cfg, stage)
    A = arch.activation_bytes_per_token_layer(a)
    L, h, V = arch.num_layers, arch.hidden_size, arch.vocab_size
    out: dict[str, int] = {}
    if d.backend == "torch":
        out = {"weights": 4 * P, "grads": 4 * P, "optimizer": 8 * P}
        if a == 2:
            out["autocast copies"] = 2 * P
        if reference:
            out["reference"] = 4 * P
        out["activations"] = T * L * A  # the torch backend does not checkpoint
        out["logits"] = T * V * (a + 12)
    elif d.backend == "fsdp2":
        out = {
            "weights": math.ceil(4 * P / n),
            "grads": math.ceil(4 * P / n),
            "optimizer": math.ceil(8 * P / n),
        }
        out["gathered"] = 3 * p.largest_unit * b if d.reshard_after_forward else (P + p.largest_unit) * b
        if reference:
            out["reference"] = math.ceil(4 * P / n)
        out["activations"] = T * (L * h * a + A) if d.activation_checkpointing else T * L * A
        out["logits"] = T * V * (a + 12)
    else:
        m = d.megatron
        dense_shard = (P - p.experts) / (m.tensor_parallel * m.pipeline_parallel)
        expert_shard = p.experts / (m.expert_parallel * m.expert_tensor_parallel * m.pipeline_parallel)
        data_parallel = n // m.model_parallel
        expert_dp = max(1, n // (m.expert_parallel * m.expert_tensor_parallel * m.pipeline_parallel))
        dense_div = data_parallel * m.context_parallel if m.distributed_optimizer else 1
        expert_div = expert_dp if m.distributed_optimizer else 1
        shard = dense_shard + expert_shard
        out = {"weights": math.ceil(b * shard), "grads": math.ceil(4 * shard)}
        out["optimizer"] = math.ceil(12 * dense_shard / dense_div + 12 * expert_shard / expert_div)
        if reference:
            out["reference"] = math.ceil(b * shard)
        split = m.tensor_parallel * m.context_parallel
        per_token = L * h * a + A if m.recompute == "full" else L * A
        out["activations"] = math.ceil(T * per_token / split)
        out["logits"] = math.ceil(T * V * (a + 12) / (m.tensor_parallel * m.context_parallel))
    return out


def engine_memory(arch: Architecture, cfg: PipelineConfig) -> tuple[dict[str, int], str]:
    """Bytes on one GPU of an engine (or in the host for a cpu engine), by item, and the KV line's wording."""
    e = cfg.engine
    if e.kind == "sglang":
        tp = e.tp_size
        kv_heads = max(1, math.ceil(arch.num_kv_heads / tp))
        per_token = arch.num_layers * kv_heads * arch.head_dim * 2 * 2
        weights = math.ceil(arch.params().total * 2 / tp)
        kv = e.max_batch_size * e.max_context_tokens * per_token
        return {"weights": weights, "KV": kv}, f"{e.max_batch_size} x {e.max_context_tokens:,} tokens"
    dtype = DTYPE_BYTES[e.dtype]
    slots = e.max_batch_size + e.prefix_cache_size
    kv = slots * e.max_context_tokens * arch.kv_bytes_per_token(dtype)
    words = f"({e.max_batch_size} + {e.prefix_cache_size} cached) x {e.max_context_tokens:,} tokens"
    return {"weights": arch.params().total * dtype, "KV": kv}, words


# ----------------------------------------------------------------------------------------------------------------
# The plan


@dataclass(frozen=True)
class PlanCheck:
    name: str
    ok: bool
    detail: str


@dataclass
class MemoryLine:
    """What one GPU (or a node's host) holds, by item, against its budget."""

    where: str
    who: str
    items: dict[str, int]
    budget: float
    budget_text: str
    extra: str = ""

    @property
    def total(self) -> int:
        return sum(self.items.values())

    @property
    def ok(self) -> bool:
        return self.total <= self.budget

    def text(self) -> str:
        parts = " + ".join(f"{name} {_size(value)}" for name, value in self.items.items() if value)
        margin = self.budget - self.total
        verdict = f"ok, {_size(margin)} to spare" if margin >= 0 else f"OVER by {_size(-margin)}"
        line = (
            f"{self.where} ({self.who}): {parts or 'nothing'} = {_size(self.total)} of {self.budget_text}: "
        )
        return line + verdict + (f"; {self.extra}" if self.extra else "")

    def shortfall(self) -> str:
        return (
            f"{self.where} ({self.who}) needs {_size(self.total)} but has {self.budget_text}: "
            f"{_size(self.total - self.budget)} short"
        )

    def fits(self) -> str:
        return f"{self.where} ({self.who}): {_size(self.total)} of {self.budget_text}"


@dataclass
class Plan:
    source: str
    arch: Architecture
    cluster: str
    placement: list[str] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)
    gpu_memory: list[MemoryLine] = field(default_factory=list)
    host_memory: list[MemoryLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checks: list[PlanCheck] = field(default_factory=list)
    model_lines: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[PlanCheck]:
        return [c for c in self.checks if not c.ok]

    def text(self) -> str:
        lines = [f"plan of {self.source}", "model:"] + [f"  {line}" for line in self.model_lines]
        lines += [f"cluster: {self.cluster}", "placement:"] + [f"  {line}" for line in self.placement]
        lines += ["processes and ports:"] + [f"  {line}" for line in self.processes]
        lines.append("memory per GPU:")
        lines += [f"  {m.text()}" for m in self.gpu_memory] or ["  no GPU (cluster.gpus_per_node is 0)"]
        lines += ["host memory per node (peak stage):"] + [f"  {m.text()}" for m in self.host_memory]
        if self.notes:
            lines += ["notes:"] + [f"  - {note}" for note in self.notes]
        lines += ["checks:"] + [f"  {'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}" for c in self.checks]
        failed = [c.name for c in self.failed]
        lines.append(f"plan: {'refused: ' + ', '.join(failed) if failed else 'ok'}")
        return "\n".join(lines)

    def refusal(self) -> str:
        """The failed checks, one per line (what `swerl run` prints when it refuses)."""
        return "swerl plan refuses this config:\n  " + "\n  ".join(
            f"{c.name}: {c.detail}" for c in self.failed
        )


def _size(value: float) -> str:
    if abs(value) >= GIB / 10:
        return f"{value / GIB:,.1f} GiB"
    return f"{value / 2**20:,.1f} MiB"


def _count(n: int) -> str:
    if n >= 10**9:
        return f"{n / 1e9:,.2f} B"
    return f"{n / 1e6:,.2f} M" if n >= 10**6 else f"{n:,}"


def _decimal(value: float) -> str:
    """Bytes in decimal units (GB = 10^9), as the recipe states its KV-cache figure."""
    return f"{value / 1e9:,.2f} GB" if value >= 10**8 else f"{value / 1e6:,.2f} MB"


def _shown(path: Path) -> str:
    """A path relative to the working directory when it lies under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _each(gpus: Sequence[int]) -> str:
    return "; each GPU" if len(gpus) > 1 else ""


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def _where(gpus: Sequence[int], per_node: int) -> str:
    """GPUs (global indices) as "node N GPU a-b", one run per node."""
    runs: list[str] = []
    for node in sorted({g // per_node for g in gpus}):
        local = [g % per_node for g in gpus if g // per_node == node]
        runs.append(f"node {node} GPU {_span(min(local), max(local))}")
    return ", ".join(runs)


def _host_memory_gib(cfg: PipelineConfig) -> tuple[float, str]:
    if cfg.cluster.host_memory_gib is not None:
        return cfg.cluster.host_memory_gib, "cluster.host_memory_gib"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20, "this machine's MemTotal"
    except (OSError, ValueError, IndexError):
        pass
    return 0.0, "unknown (set cluster.host_memory_gib)"


def _trainer_stages(cfg: PipelineConfig) -> dict[str, DistributedConfig]:
    stages = {"sft": cfg.sft.distributed}
    if cfg.grpo.schedule.steps > 0:
        stages["grpo"] = cfg.grpo.distributed
    return stages


def _engine_gpus_each(cfg: PipelineConfig) -> int:
    """GPUs of one engine (0: the engine runs on cpu)."""
    e = cfg.engine
    if e.kind == "sglang":
        return e.tp_size
    return 1 if e.device == "cuda" else 0


def _engine_count(cfg: PipelineConfig) -> int:
    """Engines: one in process (local), the servers at engine.urls (planned as engine.* describes them, started
    by someone else), or num_engines launched by swerl."""
    e = cfg.engine
    if e.kind == "local":
        return 1
    return len(e.urls) if e.urls else e.num_engines


def make_plan(cfg: PipelineConfig, source: str = "the config") -> Plan:
    """The placement and memory plan of a config, with its checks (a PlanError when the architecture is missing)."""
    arch = load_architecture(cfg)
    c, e = cfg.cluster, cfg.engine
    params = arch.params()
    ctx = e.max_context_tokens
    per_node = c.gpus_per_node
    host_gib, host_source = _host_memory_gib(cfg)
    plan = Plan(
        source=source,
        arch=arch,
        cluster=(
            f"{c.nodes} node{'s' if c.nodes > 1 else ''} x {per_node} GPUs x {c.gpu_memory_gib:g} GiB"
            if per_node
            else f"{c.nodes} CPU machine{'s' if c.nodes > 1 else ''} (cluster.gpus_per_node 0)"
        )
        + f"; host {host_gib:,.1f} GiB per node ({host_source}); usable fraction {c.usable_memory_fraction:g}",
    )
    kv_dtype = "bfloat16" if e.kind == "sglang" else e.dtype
    kv_token = arch.kv_bytes_per_token(DTYPE_BYTES[kv_dtype])
    plan.model_lines = [
        f"{arch.describe()}",
        f"from {arch.source}",
        f"{_count(params.total)} parameters ({_count(params.experts)} in experts), {_count(params.active)} active "
        "per token",
        f"KV cache per token ({kv_dtype}, the engines'): {arch.num_layers} layers x {arch.num_kv_heads} KV heads x "
        f"{arch.head_dim} x 2 (K, V) x {DTYPE_BYTES[kv_dtype]} B = {kv_token:,} B; {ctx:,} tokens "
        f"(engine.max_context_tokens) = {_decimal(kv_token * ctx)} ({_size(kv_token * ctx)}) per trajectory",
    ]
    stages = _trainer_stages(cfg)
    cuda_stages = {name: d for name, d in stages.items() if d.device == "cuda"}
    _model_checks(cfg, arch, stages, plan.checks)
    engine_gpus, trainer_gpus = _place(cfg, plan, cuda_stages)
    _placement_lines(cfg, plan, engine_gpus, trainer_gpus, cuda_stages)
    _gpu_memory(cfg, plan, arch, engine_gpus, trainer_gpus, cuda_stages)
    _host_memory(cfg, plan, arch, engine_gpus, trainer_gpus, stages, host_gib, host_source)
    _port_checks(cfg, plan, engine_gpus, trainer_gpus)
    _launch_notes(cfg, plan, engine_gpus, trainer_gpus)
    return plan


def _place(
    cfg: PipelineConfig, plan: Plan, cuda_stages: dict[str, DistributedConfig]
) -> tuple[list[int], list[int]]:
    """The engines' and the trainer's GPUs (global indices: node x gpus_per_node + index), with the checks that
    they exist: enough GPUs, engines within their nodes, one trainer rank per trainer GPU."""
    c, e = cfg.cluster, cfg.engine
    per_node = c.gpus_per_node
    engine_each = _engine_gpus_each(cfg)
    engines = _engine_count(cfg)
    engine_need = engines * engine_each
    total_gpus = c.nodes * per_node
    engine_gpus: list[int] = []
    trainer_gpus: list[int] = []
    wanted = max((d.ranks for d in cuda_stages.values()), default=0)
    if (engine_need or cuda_stages) and per_node == 0:
        engine_user = "engine.kind sglang" if e.kind == "sglang" else f"engine.kind {e.kind} on device cuda"
        users = ([engine_user] if engine_need else []) + [
            f"{name}.distributed.device cuda" for name in cuda_stages
        ]
        verb = "needs" if len(users) == 1 else "need"
        plan.checks.append(
            PlanCheck("gpus", False, f"{' and '.join(users)} {verb} GPUs, but cluster.gpus_per_node is 0")
        )
    elif per_node:
        start = engine_need
        if c.engine_nodes is not None:
            room = c.engine_nodes * per_node
            fits = engine_need <= room and c.engine_nodes <= c.nodes
            plan.checks.append(PlanCheck(
                "engines", fits,
                f"{engines} engines x {engine_each} GPU{'s' if engine_each > 1 else ''} = {engine_need} GPUs in cluster.engine_nodes "
                f"{c.engine_nodes} x {per_node} GPUs ({room})"
                + ("" if engine_need <= room else f": {engine_need - room} GPUs short")
                + ("" if c.engine_nodes <= c.nodes else f"; the cluster has only {c.nodes} nodes"),
            ))  # fmt: skip
            start = room
        start = min(start, total_gpus)
        engine_gpus = list(range(min(engine_need, total_gpus)))
        available = total_gpus - start
        want = c.trainer_gpus if c.trainer_gpus is not None else (wanted if cuda_stages else 0)
        given = c.trainer_gpus if c.trainer_gpus is not None else (available if cuda_stages else 0)
        short = max(0, engine_need - min(engine_need, total_gpus)) + max(0, want - available)
        layout = f"{c.nodes} node{'s' if c.nodes > 1 else ''} x {per_node}"
        who = (
            [f"engines {engine_need} ({engines} x {engine_each} GPU{'s' if engine_each > 1 else ''})"]
            if engine_need
            else []
        )
        if want:
            ranks = ", ".join(f"{name}.distributed.ranks {d.ranks}" for name, d in cuda_stages.items())
            who.append(
                f"the trainer {want} ({'cluster.trainer_gpus' if c.trainer_gpus is not None else ranks})"
            )
        detail = f"the cluster has {total_gpus} GPUs ({layout})" + (f"; {' and '.join(who)}" if who else "")
        if c.engine_nodes is not None and want:
            detail += f", after the engines' {c.engine_nodes} node{'s' if c.engine_nodes != 1 else ''}"
        if short:
            detail += f": {short} GPUs short"
        plan.checks.append(PlanCheck("gpus", short == 0, detail))
        trainer_gpus = list(range(start, start + min(given, available)))
        if c.trainer_gpus is not None and not cuda_stages:
            plan.checks.append(PlanCheck(
                "trainer_gpus", False,
                f"cluster.trainer_gpus {c.trainer_gpus}, but no trainer runs on cuda (sft/grpo.distributed.device)",
            ))  # fmt: skip
        for name, d in cuda_stages.items():
            if d.ranks <= available and trainer_gpus:
                ok = d.ranks == len(trainer_gpus)
                plan.checks.append(PlanCheck(
                    f"ranks.{name}", ok,
                    f"{name}.distributed.ranks {d.ranks} vs {len(trainer_gpus)} trainer GPU"
                    f"{'s' if len(trainer_gpus) > 1 else ''} "
                    f"({_where(trainer_gpus, per_node)}): one rank per GPU"
                    + ("" if ok else "; set the ranks, or cluster.trainer_gpus, or give the engines the rest"),
                ))  # fmt: skip
        spans = [i for i in range(engines) if engine_each and (i * engine_each) // per_node
                 != (i * engine_each + engine_each - 1) // per_node]  # fmt: skip
        if spans:
            plan.checks.append(PlanCheck(
                "engines.nodes", False,
                f"engine {spans[0]} (tp_size {engine_each}) would span two nodes: tp_size must divide "
                f"cluster.gpus_per_node {per_node}",
            ))  # fmt: skip
        idle = total_gpus - len(engine_gpus) - len(trainer_gpus)
        if idle > 0 and not short:
            plan.notes.append(f"{idle} GPUs run nothing")

    return engine_gpus, trainer_gpus


def _model_checks(
    cfg: PipelineConfig, arch: Architecture, stages: dict[str, DistributedConfig], checks: list[PlanCheck]
) -> None:
    e = cfg.engine
    if arch.max_positions:
        ok = e.max_context_tokens <= arch.max_positions
        checks.append(PlanCheck(
            "context", ok, f"engine.max_context_tokens {e.max_context_tokens:,} vs the model's "
            f"max_position_embeddings {arch.max_positions:,}",
        ))  # fmt: skip
    if e.kind == "sglang":
        ok = arch.num_heads % e.tp_size == 0
        checks.append(PlanCheck(
            "engine.tp_size", ok, f"tp_size {e.tp_size} {'divides' if ok else 'does not divide'} the model's "
            f"{arch.num_heads} attention heads (SGLang splits heads over its GPUs)",
        ))  # fmt: skip
    for name, d in stages.items():
        if d.backend != "megatron":
            continue
        m = d.megatron
        problems = []
        if arch.num_heads % m.tensor_parallel or arch.num_kv_heads % m.tensor_parallel:
            problems.append(
                f"tensor_parallel {m.tensor_parallel} must divide the {arch.num_heads} heads and "
                f"{arch.num_kv_heads} KV heads"
            )
        if arch.num_layers % m.pipeline_parallel:
            problems.append(
                f"pipeline_parallel {m.pipeline_parallel} must divide the {arch.num_layers} layers"
            )
        if m.expert_parallel > 1 and (not arch.moe or arch.num_experts % m.expert_parallel):
            problems.append(
                f"expert_parallel {m.expert_parallel} must divide the model's {arch.num_experts} experts"
            )
        checks.append(PlanCheck(
            f"megatron.{name}", not problems,
            "; ".join(problems) or f"TP {m.tensor_parallel}, PP {m.pipeline_parallel}, CP {m.context_parallel}, "
            f"EP {m.expert_parallel} fit the model",
        ))  # fmt: skip


def _stage_label(name: str, d: DistributedConfig) -> str:
    extra = ""
    if d.backend == "megatron":
        m = d.megatron
        extra = f" TP{m.tensor_parallel} PP{m.pipeline_parallel} CP{m.context_parallel} EP{m.expert_parallel}"
    return f"{name}: {d.backend}{extra}, {d.param_dtype}"


def _placement_lines(
    cfg: PipelineConfig,
    plan: Plan,
    engine_gpus: list[int],
    trainer_gpus: list[int],
    cuda_stages: dict[str, DistributedConfig],
) -> None:
    c, e = cfg.cluster, cfg.engine
    per_node = c.gpus_per_node
    each = _engine_gpus_each(cfg)
    engines = _engine_count(cfg)
    started = "; at engine.urls, started by you" if e.urls and e.kind != "local" else ""
    if engine_gpus:
        for node in sorted({g // per_node for g in engine_gpus}):
            mine = [
                i for i in range(engines) if (i * each) // per_node == node and i * each < len(engine_gpus)
            ]
            if not mine:
                continue
            gpus = [g for g in engine_gpus if g // per_node == node]
            plan.placement.append(
                f"{_where(gpus, per_node)}: engine{'s' if len(mine) > 1 else ''} {_span(mine[0], mine[-1])} "
                f"({e.kind}, {each} GPU"
                f"{'s' if each > 1 else ''} each{started})"
            )
    else:
        where = "in the stage's process" if e.kind == "local" else f"{engines} processes"
        plan.placement.append(f"engines: {e.kind} on cpu, {where} (node 0's host{started})")
    if trainer_gpus:
        for node in sorted({g // per_node for g in trainer_gpus}):
            gpus = [g for g in trainer_gpus if g // per_node == node]
            first, last = gpus[0] - trainer_gpus[0], gpus[-1] - trainer_gpus[0]
            labels = "; ".join(_stage_label(name, d) for name, d in cuda_stages.items())
            plan.placement.append(
                f"{_where(gpus, per_node)}: trainer rank{'s' if last > first else ''} {_span(first, last)} ({labels})"
            )
    for name, d in _trainer_stages(cfg).items():
        if d.device == "cpu":
            plan.placement.append(
                f"trainer ({_stage_label(name, d)}): {d.ranks} cpu process{'es' if d.ranks > 1 else ''} on the "
                "host of the node swerl runs on"
            )


def _gpu_memory(
    cfg: PipelineConfig,
    plan: Plan,
    arch: Architecture,
    engine_gpus: list[int],
    trainer_gpus: list[int],
    cuda_stages: dict[str, DistributedConfig],
) -> None:
    c, e = cfg.cluster, cfg.engine
    per_node = c.gpus_per_node
    gpu_bytes = c.gpu_memory_gib * GIB
    usable = gpu_bytes * c.usable_memory_fraction
    each = _engine_gpus_each(cfg)
    beside = cfg.grpo.mode == "async" and cfg.grpo.eval.every > 0
    if engine_gpus:
        items, kv_words = engine_memory(arch, cfg)
        items = {"weights": items["weights"], f"KV ({kv_words})": items["KV"]}
        if e.kind == "sglang":
            fraction = e.mem_fraction_static
            said = (
                "engine.mem_fraction_static"
                if fraction is not None
                else "assumed: mem_fraction_static is None"
            )
            fraction = fraction if fraction is not None else SGLANG_ASSUMED_MEM_FRACTION
            budget = gpu_bytes * fraction
            budget_text = f"{_size(budget)} ({c.gpu_memory_gib:g} GiB x {fraction:g}, {said})"
            kv_head_share = max(1, math.ceil(arch.num_kv_heads / e.tp_size))
            per_token = arch.num_layers * kv_head_share * arch.head_dim * 2 * 2
            pool = max(0, int((budget - items["weights"]) // per_token))
            extra = f"SGLang's KV pool: the rest of the budget, ~{pool:,} tokens"
            if beside:
                ok = 2 * fraction <= 1
                plan.checks.append(PlanCheck(
                    "engine.eval_beside", ok,
                    f"grpo.eval.every {cfg.grpo.eval.every} opens a second engine set on the same GPUs: 2 x "
                    f"mem_fraction_static {fraction:g} = {2 * fraction:g} of each GPU"
                    + ("" if ok else ": over 1"),
                ))  # fmt: skip
        else:
            budget = usable
            budget_text = f"{_size(budget)} ({c.gpu_memory_gib:g} GiB x {c.usable_memory_fraction:g})"
            extra = ""
            if beside:
                items = {f"{k} x 2 (eval engines beside)": 2 * v for k, v in items.items()}
        engines = _engine_count(cfg)
        for node in sorted({g // per_node for g in engine_gpus}):
            gpus = [g for g in engine_gpus if g // per_node == node]
            mine = [i for i in range(engines) if i * each // per_node == node]
            line = MemoryLine(
                where=_where(gpus, per_node),
                who=f"engine{'s' if len(mine) > 1 else ''} {_span(mine[0], mine[-1])}" + _each(gpus),
                items=items, budget=budget, budget_text=budget_text, extra=extra,
            )  # fmt: skip
            plan.gpu_memory.append(line)
            plan.checks.append(PlanCheck(f"memory.engines.node{node}", line.ok,
                                         line.fits() if line.ok else line.shortfall()))  # fmt: skip
    if trainer_gpus:
        budget_text = f"{_size(usable)} ({c.gpu_memory_gib:g} GiB x {c.usable_memory_fraction:g})"
        for name, d in cuda_stages.items():
            items = trainer_memory(arch, cfg, name)
            tokens = trainer_tokens(cfg, name)
            for node in sorted({g // per_node for g in trainer_gpus}):
                gpus = [g for g in trainer_gpus if g // per_node == node]
                first, last = gpus[0] - trainer_gpus[0], gpus[-1] - trainer_gpus[0]
                line = MemoryLine(
                    where=_where(gpus, per_node),
                    who=f"{name} {d.backend} rank{'s' if len(gpus) > 1 else ''} {_span(first, last)}, {tokens:,} "
                    f"tokens per micro-batch" + _each(gpus),
                    items=items, budget=usable, budget_text=budget_text,
                )  # fmt: skip
                plan.gpu_memory.append(line)
                plan.checks.append(PlanCheck(f"memory.{name}.node{node}", line.ok,
                                             line.fits() if line.ok else line.shortfall()))  # fmt: skip


def _host_memory(
    cfg: PipelineConfig,
    plan: Plan,
    arch: Architecture,
    engine_gpus: list[int],
    trainer_gpus: list[int],
    stages: dict[str, DistributedConfig],
    host_gib: float,
    host_source: str,
) -> None:
    """Per node, the peak over stages of what its host holds (module docstring)."""
    c, e = cfg.cluster, cfg.engine
    per_node = max(c.gpus_per_node, 1)
    nodes = c.nodes if c.gpus_per_node else 1
    driver = trainer_gpus[0] // per_node if trainer_gpus else 0
    P = arch.params().total
    by_stage: dict[str, dict[int, dict[str, int]]] = {}

    def add(stage: str, node: int, item: str, value: float) -> None:
        slot = by_stage.setdefault(stage, {}).setdefault(node, {})
        slot[item] = slot.get(item, 0) + int(value)

    proc_gpu, proc_cpu = PROCESS_HOST_GIB * GIB, PROCESS_HOST_GIB_CPU * GIB
    for stage in ("sft", "grpo", "evaluate"):
        add(stage, driver, "swerl's process", proc_gpu if c.gpus_per_node else proc_cpu)
    engines = _engine_count(cfg)
    each = _engine_gpus_each(cfg)
    for stage in ("grpo", "evaluate"):  # engines at engine.urls are planned where engine.* says they run
        if engine_gpus and e.kind != "local":  # a local engine runs in swerl's own process
            for i in range(engines):
                processes = 2 + each if e.kind == "sglang" else 1
                add(stage, (i * each) // per_node, "engine processes", processes * proc_gpu)
        elif not engine_gpus:
            items, _ = engine_memory(arch, cfg)
            add(stage, driver, "engines (cpu)", engines * (items["weights"] + items["KV"]))
            if e.kind != "local":
                add(stage, driver, "engine processes", engines * proc_cpu)
    for name, d in stages.items():
        if d.device == "cuda":
            nodes_of = [g // per_node for g in trainer_gpus]
            alone = d.backend != "torch" or (name == "grpo" and cfg.grpo.trainer_process)
            for node in set(nodes_of) if alone else ():  # a torch trainer may run in swerl's own process
                add(name, node, "trainer ranks", nodes_of.count(node) * proc_gpu)
            if trainer_gpus:
                add(name, driver, "full model (rank 0, fp32)", 4 * P)
        else:
            per_rank = sum(trainer_memory(arch, cfg, name).values())
            add(name, driver, "trainer (cpu)", d.ranks * per_rank)
            if d.backend != "torch":
                add(name, driver, "trainer ranks", d.ranks * proc_cpu)
                add(name, driver, "full model (rank 0, fp32)", 4 * P)
    budget = host_gib * GIB * c.usable_memory_fraction
    budget_text = f"{_size(budget)} ({host_gib:,.1f} GiB x {c.usable_memory_fraction:g}, {host_source})"
    for node in range(nodes):
        peak_stage, peak = max(
            ((stage, by_stage.get(stage, {}).get(node, {})) for stage in ("sft", "grpo", "evaluate")),
            key=lambda pair: sum(pair[1].values()),
        )
        where = f"node {node}" if c.gpus_per_node else "this machine"
        line = MemoryLine(
            where=where, who=f"{peak_stage} stage", items=peak, budget=budget, budget_text=budget_text
        )
        plan.host_memory.append(line)
        plan.checks.append(PlanCheck(f"host_memory.node{node}", line.ok,
                                     line.fits() if line.ok else line.shortfall()))  # fmt: skip


def _port_checks(cfg: PipelineConfig, plan: Plan, engine_gpus: list[int], trainer_gpus: list[int]) -> None:
    c, e = cfg.cluster, cfg.engine
    per_node = max(c.gpus_per_node, 1)
    engines = _engine_count(cfg)
    each = _engine_gpus_each(cfg)
    driver = trainer_gpus[0] // per_node if trainer_gpus else 0
    used: list[tuple[int, int, str]] = []  # (node, port, owner)
    if e.kind == "local":
        plan.processes.append("engine: in swerl's process (no port)")
    elif e.urls:
        plan.processes.append(f"engines: {', '.join(e.urls)} (engine.urls)")
    else:
        count = 2 + each if e.kind == "sglang" else 1
        ports = (
            f"ports {e.base_port}-{e.base_port + engines - 1}"
            if e.base_port
            else "free ports picked at launch"
        )
        plan.processes.append(
            f"engines: {engines} x {count} process{'es' if count > 1 else ''} ({e.kind}), host {e.host}, {ports}"
        )
        if e.base_port:
            last = e.base_port + engines - 1
            ok = last <= 65535
            plan.checks.append(PlanCheck("ports.engines", ok, f"engine ports {e.base_port}-{last}"
                                         + ("" if ok else ": past 65535")))  # fmt: skip
            for i in range(engines):
                node = (i * each) // per_node if engine_gpus else driver
                used.append((node, e.base_port + i, f"engine {i}"))
    plan.processes.append(f"swerl run (stages, router, rollouts): node {driver}")
    for name, d in _trainer_stages(cfg).items():
        if d.backend == "torch":
            alone = name == "grpo" and cfg.grpo.trainer_process
            where = "1 child process" if alone else "in swerl's process"
            plan.processes.append(f"{name} trainer: {where}")
            continue
        port = f":{d.master_port}" if d.master_port else ", port picked at launch"
        plan.processes.append(
            f"{name} trainer: {d.ranks} rank processes ({d.group_backend}), rendezvous {d.master_addr}{port}"
        )
        if d.master_port:
            used.append((driver, d.master_port, f"{name} rendezvous"))
    ws = e.weight_sync
    if ws.method == "distributed":
        port = f":{ws.master_port}" if ws.master_port else ", port picked at launch"
        plan.processes.append(f"weight sync: process group {ws.group_name} at {ws.master_addr}{port}")
        if ws.master_port:
            used.append((driver, ws.master_port, "weight sync group"))
    else:
        plan.processes.append("weight sync: through disk (update_weights_from_disk)")
    clashes: dict[tuple[int, int], list[str]] = {}
    for node, number, owner in used:
        clashes.setdefault((node, number), []).append(owner)
    # sft and grpo run one after the other: their rendezvous may share a port
    bad = {k: v for k, v in clashes.items() if len(v) > 1 and set(v) != {"sft rendezvous", "grpo rendezvous"}}
    if used:
        plan.checks.append(PlanCheck(
            "ports", not bad,
            "; ".join(f"node {node} port {number}: {' and '.join(owners)}" for (node, number), owners in bad.items())
            or f"{len(used)} fixed ports, no two on one node alike",
        ))  # fmt: skip


def _launch_notes(cfg: PipelineConfig, plan: Plan, engine_gpus: list[int], trainer_gpus: list[int]) -> None:
    """What swerl itself starts where, against the plan's placement (honest about what is not built)."""
    c, e = cfg.cluster, cfg.engine
    per_node = max(c.gpus_per_node, 1)
    if not c.gpus_per_node:
        return
    driver = trainer_gpus[0] // per_node if trainer_gpus else 0
    engine_nodes = sorted({g // per_node for g in engine_gpus})
    trainer_nodes = sorted({g // per_node for g in trainer_gpus})
    elsewhere = [n for n in engine_nodes if n != driver]
    if elsewhere and e.urls:
        plan.notes.append(
            "engines at engine.urls are planned as engine.* describes them (max_batch_size, max_context_tokens, "
            "mem_fraction_static, tp_size): start them with those values"
        )
    elif elsewhere:
        plan.notes.append(
            f"swerl launches engines on the machine it runs on (node {driver} here): the engines of node"
            f"{'s' if len(elsewhere) > 1 else ''} {', '.join(map(str, elsewhere))} are started there with the same "
            "arguments and listed in engine.urls (engine.host must then be reachable, not loopback)"
        )
    if len(trainer_nodes) > 1:
        plan.notes.append(
            f"the trainer spans nodes {', '.join(map(str, trainer_nodes))}: swerl.train.ranks starts ranks on its "
            "own node only; a multi-node trainer needs torchrun on each node (not built)"
        )
    shared = sorted(set(engine_nodes) & set(trainer_nodes))
    if shared and e.kind == "local":
        plan.notes.append(
            "the local engine runs in swerl's own process on its first visible GPU, as does a one-process trainer: "
            "they share that GPU whatever the placement says (engine.kind http_local or sglang keeps them apart)"
        )
    elif shared and not e.urls:
        local = [g % per_node for g in trainer_gpus if g // per_node == shared[0]]
        plan.notes.append(
            f"engines and trainer share node {shared[0]}: swerl starts trainer rank r on cuda:r and engine i on GPUs "
            f"from i x tp_size; start swerl with CUDA_VISIBLE_DEVICES={','.join(map(str, local))} so the ranks land "
            "on their GPUs (SGLang engines set their own CUDA_VISIBLE_DEVICES)"
        )
