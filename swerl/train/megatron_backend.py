"""The megatron trainer backend (`grpo.distributed.backend: megatron`): GRPO on megatron-core, with Hugging Face
weights in and out through megatron-bridge's AutoBridge.

Where it runs. One process per GPU, launched like the FSDP2 ranks (swerl.train.ranks: torchrun's RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); each rank builds a `MegatronGRPOTrainer` with the same
arguments and is called with the same groups. It needs the `megatron` extra (megatron-core and megatron-bridge,
Python >= 3.12) and CUDA: megatron-core cannot run a forward on CPU (RoPE and the attention buffer call CUDA, MoE
layers need CUDA streams). Nothing here imports megatron at module level: this module loads on any machine, and
`require_megatron()` names what is missing (docs/gpu.md says how to make the environment).

What is shared with the torch backend (swerl.train.grpo_trainer), imported, never copied: scoring
(`score_groups`: group advantages over valid attempts), the rollout statistics, the minibatch split drawn from
(seed, step), the micro-batch plan and right-padded collation, the sequence-mean advantage factors, and the loss
itself (`swerl.train.grpo.policy_loss`: clipped PPO ratio, TIS/MIS, token-level normalisation by the minibatch's
scored tokens). The statistics have the same names as GRPOTrainer's.

What is Megatron's:
- Parallelism from `distributed.megatron` (MegatronConfig): tensor, pipeline, context, expert and expert-tensor
  parallel sizes go to `parallel_state.initialize_model_parallel` and onto the bridge's model provider
  (`provider_overrides`); what remains of the ranks is data parallel.
- The model: `AutoBridge.from_hf_pretrained(model_dir).to_megatron_provider()` builds the megatron-core GPTModel
  of the HF config (dense Qwen3 or Qwen3-MoE) and loads the HF weights into its TP/PP/EP shards; wrapped in
  megatron's DistributedDataParallel (bf16 params with `param_dtype: bfloat16`, gradients reduced in
  `reduce_dtype`). Without transformer-engine the layers are megatron-core's local ones (torch attention, no
  grouped GEMM, no fused permutation); with it, the bridge's default transformer-engine layers.
- The optimizer: `get_megatron_optimizer` (Adam with decoupled weight decay, i.e. AdamW; fp32 master weights;
  `distributed_optimizer: true` shards its state over data-parallel ranks). Learning rate and weight decay are set
  on its parameter groups directly (no scheduler: GRPO's lr is constant): weight decay on matrices only, as the
  torch backend's build_optimizer (Megatron's wd_mult 0 for 1-D parameters and biases).
- The step: micro-batches through `get_forward_backward_func()` (megatron's schedule, pipelined when pp > 1); log-
  probs of the next tokens from the vocab-parallel logits (`tensor_parallel.vocab_parallel_cross_entropy` on
  logits / temperature), entropy from them with the TP all-reduces (`vocab_parallel_entropy`).

The math that keeps it the one-process update (as the FSDP2 ranks do, see swerl.train.distributed):
- Micro-batch i of a step goes to data-parallel rank i mod DP; every DP rank makes the same number of passes
  (zero-loss repeats fill in: expert-parallel all-to-alls and pipeline sends need every rank in step).
- Each micro-batch's loss is divided by its minibatch's scored-token count (policy_loss's normalizer), then
  multiplied by (passes per rank x DP): megatron's schedule divides a loss by the number of micro-batches (and
  multiplies by CP), and its DDP scales gradients by 1 / (DP x CP) before summing them, so the gradient that
  reaches the optimizer is the sum over all micro-batches, the one-process gradient.
- Reported sums (loss, entropy, importance weights, clip counts) come from the last pipeline stage's TP rank 0 of
  every data-parallel and context-parallel rank, all-reduced in float64, so every rank returns the same stats.
- The MoE auxiliary load-balancing loss is off (coefficient 0): the torch backend's loss has none, and a GRPO step
  must be the same objective on both.

Not supported yet (each refused at construction with its reason): a KL reference model (kl_coef > 0), context
parallelism without transformer-engine (megatron-core's local attention has no CP), sequence-level TIS/MIS with
context parallelism (a trajectory's weight would span ranks), and weight broadcasts to engines over a process
group (`engine.weight_sync.method: distributed`; exports to disk work).

Checkpoints (`save`/`load`): the layout of swerl.train.checkpoint (an HF folder later stages load,
trainer_state.pt/.json, rng_rank<r>.pt) plus `megatron/`, megatron's distributed checkpoint of model and
optimizer shards (dist_checkpointing, data-parallel reshardable). Exports (`export_weights`) and `save_model`:
`bridge.save_hf_pretrained`, collective; rank 0 writes, into a temporary folder it renames.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import logging
import math
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from swerl.config.grpo import GRPOConfig
from swerl.config.train import DistributedConfig, MegatronConfig
from swerl.model.loading import check_model_dir, load_tokenizer
from swerl.model.tokenizer import save_tokenizer
from swerl.train.checkpoint import (
    RANK_RNG_FILE,
    STATE_FILE,
    TrainerState,
    capture_rng_state,
    check_checkpoint_dir,
    checkpoint_name,
    restore_rng_state,
    sharded_checkpoint,
)
from swerl.train.grpo import ImportanceSums, PolicyLossStats, importance_sums, policy_loss
from swerl.train.grpo_trainer import (
    EXPORT_PREFIX,
    MicroBatch,
    ScoredGroups,
    UpdateSettings,
    collate,
    plan_micro_batches,
    rollout_stats,
    score_groups,
    sequence_mean_scales,
)
from swerl.train.sft import seed_everything
from swerl.trajectory import Trajectory

logger = logging.getLogger(__name__)

MEGATRON_DIR = "megatron"
"""Folder of a checkpoint holding megatron's distributed checkpoint (model and optimizer shards)."""

MIN_PYTHON = (3, 12)
"""megatron-core >= 0.17 and megatron-bridge >= 0.4 require it (their Requires-Python)."""

INSTALL_HINT = (
    "in a Python 3.12 virtualenv on a CUDA machine, torch==2.13.0 (the CUDA wheel) first, then "
    "uv pip install -e '.[megatron]' --override overrides.txt, the file holding transformers==5.23.0 "
    "(megatron-bridge 0.6.2 pins transformers<=5.12.1; docs/gpu.md gives the exact versions and steps)"
)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class MegatronUnavailable(RuntimeError):
    """The megatron backend was selected where it cannot run; the message names every missing piece."""


# ----------------------------------------------------------------------------------------------------------------
# What the backend needs, and the config mapped onto megatron's arguments: pure functions (tested on CPU)


def missing_pieces(
    python: tuple[int, int] | None = None,
    has_module: Callable[[str], bool] | None = None,
    cuda_available: Callable[[], bool] | None = None,
) -> list[str]:
    """What keeps the megatron backend from running here, each said plainly; [] when nothing does."""
    python = python if python is not None else (sys.version_info.major, sys.version_info.minor)
    has_module = has_module if has_module is not None else _has_module
    cuda_available = cuda_available if cuda_available is not None else torch.cuda.is_available
    missing = []
    if python < MIN_PYTHON:
        missing.append(
            f"Python {python[0]}.{python[1]}: megatron-core >= 0.17 and megatron-bridge >= 0.4 need Python >= 3.12"
        )
    if not has_module("megatron.core"):
        missing.append("megatron-core is not installed (module megatron.core)")
    if not has_module("megatron.bridge"):
        missing.append("megatron-bridge is not installed (module megatron.bridge)")
    if not cuda_available():
        missing.append("no CUDA device: megatron-core runs its forward on GPUs only")
    return missing


def require_megatron(**probes: Any) -> None:
    """Raise MegatronUnavailable naming what is missing (Python version, megatron-core, megatron-bridge, CUDA) and
    how to install it; return quietly where the backend can run. `probes` replace the checks (tests)."""
    missing = missing_pieces(**probes)
    if missing:
        raise MegatronUnavailable(
            "grpo/sft.distributed.backend megatron cannot run here: "
            + "; ".join(missing)
            + f". Install: {INSTALL_HINT}."
        )


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # the parent package is missing or broken
        return False


def has_transformer_engine() -> bool:
    return _has_module("transformer_engine")


@dataclass(frozen=True)
class ParallelSizes:
    """How `ranks` GPUs split under a MegatronConfig (megatron-core's rules, checked before it runs)."""

    tensor: int
    pipeline: int
    context: int
    expert: int
    expert_tensor: int
    data: int  # ranks / (tensor x pipeline x context)
    expert_data: int  # ranks / (expert_tensor x expert x pipeline)


def parallel_sizes(ranks: int, megatron: MegatronConfig) -> ParallelSizes:
    """The data-parallel sizes that remain; ValueError with megatron-core's divisibility rule that fails."""
    model = megatron.tensor_parallel * megatron.pipeline_parallel * megatron.context_parallel
    if ranks % model:
        raise ValueError(
            f"megatron: ranks {ranks} is not divisible by tensor x pipeline x context parallel ({model})"
        )
    expert_grid = megatron.expert_tensor_parallel * megatron.expert_parallel * megatron.pipeline_parallel
    if ranks % expert_grid:
        raise ValueError(
            f"megatron: ranks {ranks} is not divisible by expert_tensor x expert x pipeline parallel ({expert_grid})"
        )
    return ParallelSizes(
        megatron.tensor_parallel, megatron.pipeline_parallel, megatron.context_parallel, megatron.expert_parallel,
        megatron.expert_tensor_parallel, ranks // model, ranks // expert_grid,
    )  # fmt: skip


def parallel_state_kwargs(megatron: MegatronConfig) -> dict[str, Any]:
    """Arguments of megatron.core.parallel_state.initialize_model_parallel."""
    return {
        "tensor_model_parallel_size": megatron.tensor_parallel,
        "pipeline_model_parallel_size": megatron.pipeline_parallel,
        "context_parallel_size": megatron.context_parallel,
        "expert_model_parallel_size": megatron.expert_parallel,
        "expert_tensor_parallel_size": megatron.expert_tensor_parallel,
    }


def recompute_fields(recompute: str) -> dict[str, Any]:
    """MegatronConfig.recompute as TransformerConfig's recompute fields (full: every layer, uniformly)."""
    if recompute == "none":
        return {"recompute_granularity": None, "recompute_method": None, "recompute_num_layers": None}
    if recompute == "selective":
        return {"recompute_granularity": "selective", "recompute_method": None, "recompute_num_layers": None}
    if recompute == "full":
        return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    raise ValueError(f"megatron.recompute must be none, selective or full, not {recompute!r}")


def provider_overrides(config: DistributedConfig, *, transformer_engine: bool) -> dict[str, Any]:
    """Fields set on megatron-bridge's GPTModelProvider (a megatron-core TransformerConfig) before it builds the
    model: the parallel sizes, the dtype, recomputation, and what keeps the objective the torch backend's (no
    dropout, no MoE auxiliary loss). Without transformer-engine: the fusions that need it (or apex) off, and the
    MoE experts as a sequential list (the local layers have no grouped GEMM)."""
    m = config.megatron
    bf16 = config.param_dtype == "bfloat16"
    fields: dict[str, Any] = {
        "tensor_model_parallel_size": m.tensor_parallel,
        "pipeline_model_parallel_size": m.pipeline_parallel,
        "context_parallel_size": m.context_parallel,
        "expert_model_parallel_size": m.expert_parallel,
        "expert_tensor_parallel_size": m.expert_tensor_parallel,
        "sequence_parallel": m.sequence_parallel,
        "bf16": bf16,
        "fp16": False,
        "params_dtype": _DTYPES[config.param_dtype],
        "pipeline_dtype": _DTYPES[config.param_dtype],
        "autocast_dtype": _DTYPES[config.param_dtype],
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "calculate_per_token_loss": False,  # the loss arrives normalised (policy_loss's normalizer)
        "variable_seq_lengths": m.pipeline_parallel
        > 1,  # micro-batches differ in shape: sent before each send
        "moe_aux_loss_coeff": 0.0,
        "moe_router_load_balancing_type": "none",
        **recompute_fields(m.recompute),
    }
    if not transformer_engine:
        fields.update(
            moe_grouped_gemm=False,
            moe_permute_fusion=False,
            gradient_accumulation_fusion=False,
            masked_softmax_fusion=False,
            apply_rope_fusion=False,
            persist_layer_norm=False,
            cross_entropy_loss_fusion=False,
        )
    return fields


def ddp_config_kwargs(config: DistributedConfig) -> dict[str, Any]:
    """Arguments of megatron.core.distributed.DistributedDataParallelConfig (no overlap: the step is synchronous
    and every rank's gradients are summed once, after its last micro-batch)."""
    return {
        "grad_reduce_in_fp32": config.reduce_dtype == "float32",
        "overlap_grad_reduce": False,
        "overlap_param_gather": False,
        "use_distributed_optimizer": config.megatron.distributed_optimizer,
        "check_for_nan_in_grad": True,
        "average_in_collective": False,
    }


def optimizer_config_kwargs(
    settings: UpdateSettings, config: DistributedConfig, betas: tuple[float, float], eps: float
) -> dict[str, Any]:
    """Arguments of megatron.core.optimizer.OptimizerConfig: AdamW (decoupled decay) at the step's constant lr,
    clipped at grad_clip (0: measured, not clipped), fp32 master weights under bf16."""
    return {
        "optimizer": "adam",
        "lr": settings.lr,
        "min_lr": settings.lr,
        "weight_decay": settings.weight_decay,
        "adam_beta1": betas[0],
        "adam_beta2": betas[1],
        "adam_eps": eps,
        "decoupled_weight_decay": True,
        "clip_grad": settings.grad_clip or 0.0,
        "bf16": config.param_dtype == "bfloat16",
        "fp16": False,
        "params_dtype": _DTYPES[config.param_dtype],
        "use_distributed_optimizer": config.megatron.distributed_optimizer,
    }


def check_supported(config: DistributedConfig, settings: UpdateSettings, *, transformer_engine: bool) -> None:
    """Refuse, with the reason, what this backend does not do (yet)."""
    m = config.megatron
    if config.backend != "megatron":
        raise ValueError(f"MegatronGRPOTrainer needs distributed.backend megatron, not {config.backend!r}")
    if settings.kl_coef > 0:
        raise NotImplementedError(
            "megatron backend: kl_coef > 0 needs a reference model, which this backend does not build; "
            "use kl_coef 0 (the recipe's default) or backend fsdp2"
        )
    if m.context_parallel > 1 and not transformer_engine:
        raise NotImplementedError(
            "megatron backend: context_parallel > 1 needs transformer-engine (megatron-core's local attention has "
            "no context parallelism); install it (docs/gpu.md) or set context_parallel 1"
        )
    sequence_level = settings.tis_level == "sequence" or (
        settings.mis_high is not None and settings.mis_level == "sequence"
    )
    if m.context_parallel > 1 and sequence_level:
        raise NotImplementedError(
            "megatron backend: sequence-level TIS/MIS with context_parallel > 1 (a trajectory's weight would span "
            "ranks); use token level or context_parallel 1"
        )
    parallel_sizes(config.ranks, m)


def data_parallel_share(count: int, data_parallel: int, rank: int) -> tuple[list[int], int]:
    """(indices of a data-parallel rank's items among `count`, extra zero-loss passes): item i goes to rank
    i mod DP, and every rank makes ceil(count / DP) passes (RankContext.share's rule)."""
    mine = list(range(rank, count, data_parallel))
    return mine, -(-count // data_parallel) - len(mine)


def sequence_multiple(megatron: MegatronConfig) -> int:
    """Sequence lengths megatron accepts are multiples of this: 2 x CP (each CP rank holds two chunks) and TP with
    sequence parallelism (the sequence is split over TP ranks between layers)."""
    multiple = 2 * megatron.context_parallel if megatron.context_parallel > 1 else 1
    if megatron.sequence_parallel:
        multiple = math.lcm(multiple, megatron.tensor_parallel)
    return multiple


def context_parallel_positions(length: int, context_parallel: int, rank: int) -> list[int]:
    """The token positions a context-parallel rank holds: the sequence in 2 x CP chunks, rank r taking chunks r and
    2 CP - 1 - r (megatron's load balance for causal attention). length must be a multiple of 2 x CP."""
    if context_parallel == 1:
        return list(range(length))
    chunks = 2 * context_parallel
    if length % chunks:
        raise ValueError(f"sequence length {length} is not a multiple of 2 x context_parallel ({chunks})")
    size = length // chunks
    first, second = rank, chunks - 1 - rank
    return list(range(first * size, (first + 1) * size)) + list(range(second * size, (second + 1) * size))


@dataclass(frozen=True)
class TokenArrays:
    """A micro-batch laid out for a megatron forward: every (B, L) tensor is indexed by the input position t, and
    its per-token arrays describe the prediction made there, of token t + 1 (targets[:, t] = input_ids[:, t + 1]):
    the shift the torch backend does with [:, 1:]. The last position predicts nothing (mask 0)."""

    input_ids: Tensor  # (B, L) int64
    position_ids: Tensor  # (B, L) int64
    targets: Tensor  # (B, L) int64; pad_token_id where nothing is predicted
    loss_mask: Tensor  # (B, L) float32
    behaviour_logprobs: Tensor  # (B, L) float32
    advantages: Tensor  # (B, L) float32

    def to(self, device: torch.device) -> TokenArrays:
        return TokenArrays(*(tensor.to(device) for tensor in vars(self).values()))


def token_arrays(
    micro: MicroBatch, pad_token_id: int, multiple: int = 1, context_parallel: int = 1, cp_rank: int = 0
) -> TokenArrays:
    """The micro-batch shifted so each position carries its next token's target, mask, behaviour log-prob and
    advantage; padded (mask 0) to a multiple of `multiple`; this context-parallel rank's positions only."""
    rows, length = micro.input_ids.shape
    padded = -(-length // multiple) * multiple
    grow = padded - length

    def shifted(values: Tensor, fill: float | int) -> Tensor:
        tail = torch.full((rows, 1 + grow), fill, dtype=values.dtype)
        return torch.cat([values[:, 1:], tail], dim=1)  # (B, padded)

    input_ids = torch.cat([micro.input_ids, torch.full((rows, grow), pad_token_id, dtype=torch.long)], dim=1)
    arrays = TokenArrays(
        input_ids=input_ids,
        position_ids=torch.arange(padded, dtype=torch.long).expand(rows, padded).contiguous(),
        targets=shifted(micro.input_ids, pad_token_id),
        loss_mask=shifted(micro.loss_mask, 0.0),
        behaviour_logprobs=shifted(micro.behaviour_logprobs, 0.0),
        advantages=shifted(micro.advantages, 0.0),
    )
    if context_parallel == 1:
        return arrays
    index = torch.tensor(context_parallel_positions(padded, context_parallel, cp_rank))
    return TokenArrays(*(tensor[:, index].contiguous() for tensor in vars(arrays).values()))


def vocab_parallel_entropy(logits: Tensor, group: Any = None) -> Tensor:
    """Entropy of the next-token distribution per position from logits split over the vocabulary across `group`
    (each rank holds (..., V / TP)); every rank gets the full entropy (..., ). No gradient: a metric. With no
    group (or one rank) it is swerl.train.grpo.token_entropy.
        H = log Z - sum_v p_v (x_v - max),  Z = sum_v exp(x_v - max)"""
    import torch.distributed as dist

    reduce = (
        group is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1
    )
    with torch.no_grad():
        scores = logits.detach().to(torch.promote_types(logits.dtype, torch.float32))
        top = scores.max(dim=-1, keepdim=True).values
        if reduce:
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        shifted = scores - top
        exp = shifted.exp()
        total = exp.sum(dim=-1)
        weighted = (exp * shifted).sum(dim=-1)
        if reduce:
            both = torch.stack([total, weighted])
            dist.all_reduce(both, group=group)
            total, weighted = both[0], both[1]
        return torch.log(total) - weighted / total


def set_lr_and_weight_decay(param_groups: Sequence[dict[str, Any]], lr: float, weight_decay: float) -> None:
    """The step's lr and weight decay on megatron's optimizer parameter groups, as its scheduler would set them
    (lr x lr_mult; weight decay x wd_mult, which megatron makes 0 for 1-D parameters and biases)."""
    for group in param_groups:
        group["lr"] = lr * float(group.get("lr_mult", 1.0))
        group["weight_decay"] = weight_decay * float(group.get("wd_mult", 1.0))


# ----------------------------------------------------------------------------------------------------------------
# The trainer


@dataclass
class _StepSums:
    """A rank's sums over the scored tokens it computed in one step (reduced over ranks at the end)."""

    entropy: float = 0.0
    tokens: float = 0.0
    clipped: float = 0.0
    mis_masked: float = 0.0
    pg_loss: float = 0.0
    kl: float = 0.0
    loss: float = 0.0

    def add_loss(self, stats: PolicyLossStats) -> None:
        self.tokens += stats.num_tokens
        self.clipped += stats.clip_fraction * stats.num_tokens
        self.mis_masked += stats.mis_mask_fraction * stats.num_tokens
        self.pg_loss += stats.pg_loss
        self.kl += stats.kl


_MISMATCH_FIELDS = ("tokens", "abs_log_weight", "weight", "weight_square", "over_cap")


@dataclass
class _Pass:
    """One forward of a step on this rank: the micro-batch's index in the step, whether it counts (a zero pass
    repeats another and adds nothing), its arrays and its minibatch's scored-token count."""

    index: int
    real: bool
    arrays: TokenArrays
    normalizer: float


class MegatronGRPOTrainer:
    """GRPO on megatron-core; the trainer protocol of swerl.train.grpo_trainer.Trainer, run on every rank.

    Args:
        model_dir: the start model, a local Hugging Face folder (config, safetensors weights, tokenizer).
        config: grpo.distributed (backend megatron, device cuda, ranks, param_dtype, reduce_dtype, megatron).
        settings: how each step updates the policy (UpdateSettings, from grpo.algorithm).
        seed: seeds python, numpy, torch and megatron's model-parallel CUDA RNGs; draws the minibatch split.
        logprob_temperature: the engine's sampling temperature (log-probs of logits / temperature).
        betas, adam_eps: Adam's moment decay and epsilon (the torch backend's defaults).
        keep_exports: exported weight folders kept under an export dir.
    """

    def __init__(
        self,
        model_dir: str | Path,
        config: DistributedConfig,
        settings: UpdateSettings,
        seed: int = 0,
        *,
        logprob_temperature: float = 1.0,
        betas: tuple[float, float] = (0.9, 0.999),
        adam_eps: float = 1e-8,
        keep_exports: int = 2,
    ) -> None:
        require_megatron()
        if keep_exports < 1:
            raise ValueError(f"keep_exports must be >= 1, got {keep_exports}")
        if logprob_temperature <= 0:
            raise ValueError(f"logprob_temperature must be > 0, got {logprob_temperature}")
        self.transformer_engine = has_transformer_engine()
        check_supported(config, settings, transformer_engine=self.transformer_engine)
        self.model_dir = Path(model_dir)
        check_model_dir(self.model_dir)
        self.config, self.settings, self.seed = config, settings, seed
        self.logprob_temperature = logprob_temperature
        self.keep_exports = keep_exports
        self.sizes = parallel_sizes(config.ranks, config.megatron)
        self.step = 0
        self._scored: list[tuple[str, int]] = []
        seed_everything(seed)
        self._init_distributed()
        self.tokenizer = load_tokenizer(self.model_dir)
        pad = json.loads((self.model_dir / "config.json").read_text()).get("pad_token_id")
        self.pad_token_id = int(pad) if pad is not None else 0
        self.bridge, self.model = self._build_model(betas, adam_eps)

    # -- construction -----------------------------------------------------------------------------------------

    def _init_distributed(self) -> None:
        """Join the ranks' group (env://, NCCL), then megatron's parallel groups and its model-parallel RNGs."""
        import torch.distributed as dist
        from megatron.core import parallel_state, tensor_parallel

        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world != self.config.ranks:
            raise ValueError(f"megatron: WORLD_SIZE is {world}, distributed.ranks says {self.config.ranks}")
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"local rank {local_rank} has no GPU: torch sees {torch.cuda.device_count()}")
        torch.cuda.set_device(local_rank)
        self.device = torch.device("cuda", local_rank)
        if self.config.socket_ifname:
            os.environ.setdefault("NCCL_SOCKET_IFNAME", self.config.socket_ifname)
            os.environ.setdefault("GLOO_SOCKET_IFNAME", self.config.socket_ifname)
        if not dist.is_initialized():
            dist.init_process_group(
                backend="nccl",
                timeout=datetime.timedelta(seconds=self.config.collective_timeout_s),
                device_id=self.device,
            )
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(
                **parallel_state_kwargs(self.config.megatron),
                distributed_timeout_minutes=max(1, math.ceil(self.config.collective_timeout_s / 60)),
            )
        tensor_parallel.model_parallel_cuda_manual_seed(self.seed)
        self.rank = dist.get_rank()

    def _build_model(self, betas: tuple[float, float], adam_eps: float) -> tuple[Any, list[Any]]:
        """The bridge, the DDP-wrapped model chunks (HF weights loaded into this rank's shards), the optimizer."""
        from megatron.bridge import AutoBridge
        from megatron.bridge.models.gpt_provider import local_layer_spec
        from megatron.core.distributed import DistributedDataParallelConfig, finalize_model_grads
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        bridge = AutoBridge.from_hf_pretrained(str(self.model_dir), trust_remote_code=False)
        provider = bridge.to_megatron_provider(load_weights=True)
        for name, value in provider_overrides(
            self.config, transformer_engine=self.transformer_engine
        ).items():
            setattr(provider, name, value)
        if not self.transformer_engine:
            provider.transformer_layer_spec = local_layer_spec
        provider.finalize()
        bf16 = self.config.param_dtype == "bfloat16"
        model = provider.provide_distributed_model(
            ddp_config=DistributedDataParallelConfig(**ddp_config_kwargs(self.config)),
            wrap_with_ddp=True,
            bf16=bf16,
            fp16=False,
        )
        optimizer_config = OptimizerConfig(
            **optimizer_config_kwargs(self.settings, self.config, betas, adam_eps)
        )
        self.optimizer = get_megatron_optimizer(optimizer_config, model)
        set_lr_and_weight_decay(self.optimizer.param_groups, self.settings.lr, self.settings.weight_decay)
        # What megatron's own training loop sets on the model config before its first step.
        model_config = _model_config(model[0])
        model_config.grad_scale_func = self.optimizer.scale_loss
        model_config.finalize_model_grads_func = finalize_model_grads
        model_config.no_sync_func = None
        for chunk in model:
            chunk.train()
        return bridge, model

    # -- one step ---------------------------------------------------------------------------------------------

    def train_step(self, groups: Sequence[Sequence[Trajectory]]) -> dict[str, float]:
        """One GRPO step on groups of attempts (as GRPOTrainer.train_step: the same scoring, split and loss, the
        same statistics); every rank is called with the same groups and returns the same statistics."""
        started = time.perf_counter()
        scored = score_groups(groups, self.settings.scale_adv_by_std)
        self._scored = [(trajectory.group_id, trajectory.attempt) for trajectory in scored.trajectories]
        stats = rollout_stats(groups, scored)
        minibatches = self._minibatches(scored)
        count = sum(len(minibatch) for minibatch in minibatches)
        sums, mismatch = _StepSums(), ImportanceSums()
        single_update = self.settings.ppo_epochs * self.settings.num_minibatches == 1

        recompute_started = time.perf_counter()
        old: dict[int, Tensor] = {}
        if not single_update:
            old = self._old_logprobs(minibatches, sums, mismatch)
        recompute_seconds = time.perf_counter() - recompute_started

        update_started = time.perf_counter()
        norms: list[float] = []
        updates = 0
        for _ in range(self.settings.ppo_epochs):
            first = 0
            for minibatch in minibatches:
                norms.append(self._update(minibatch, first, old, sums, mismatch, record_old=single_update))
                updates += 1
                first += len(minibatch)
        update_seconds = time.perf_counter() - update_started

        self.step += 1
        totals = self._reduce(sums, mismatch)
        updates_ = max(1, updates)
        stats.update(
            entropy_mean=totals["entropy"] / max(1.0, totals["m_tokens"]),
            logprob_diff_mean=totals["m_abs_log_weight"] / max(1.0, totals["m_tokens"]),
            ess_ratio=(
                totals["m_weight"] ** 2 / (totals["m_tokens"] * totals["m_weight_square"])
                if totals["m_weight_square"] > 0
                else 1.0
            ),
            tis_clip_fraction=totals["m_over_cap"] / max(1.0, totals["m_tokens"]),
            clip_fraction=totals["clipped"] / max(1.0, totals["tokens"]),
            mis_mask_fraction=totals["mis_masked"] / max(1.0, totals["tokens"]),
            pg_loss=totals["pg_loss"] / updates_,
            kl=totals["kl"] / updates_,
            loss=totals["loss"] / updates_,
            grad_norm=sum(norms) / updates_,
            optimizer_updates=float(updates),
            micro_batches=float(count),
            loss_tokens=float(sum(micro.num_loss_tokens for minibatch in minibatches for micro in minibatch)),
            step=float(self.step),
            time_logprob_recompute_s=recompute_seconds,
            time_update_s=update_seconds,
            time_step_s=time.perf_counter() - started,
        )
        return stats

    def scored_attempts(self) -> list[tuple[str, int]]:
        """(group_id, attempt) of every trajectory the last train_step scored (GRPOTrainer's account)."""
        return list(self._scored)

    def _minibatches(self, scored: ScoredGroups) -> list[list[MicroBatch]]:
        """GRPOTrainer's split: num_minibatches parts drawn from (seed, step), each planned into micro-batches of
        at most micro_batch_tokens padded tokens, sequence-mean factors on the advantages where asked."""
        count = len(scored.trajectories)
        if count == 0:
            return []
        parts_wanted = self.settings.num_minibatches
        order = np.random.default_rng([self.seed, self.step]).permutation(count).tolist()
        parts = [order[part::parts_wanted] for part in range(parts_wanted)]
        minibatches = []
        for part in parts:
            if not part:
                continue
            lengths = [len(scored.trajectories[index].token_ids) for index in part]
            plan = plan_micro_batches(lengths, self.settings.micro_batch_tokens)
            advantages = [scored.advantages[index] for index in part]
            if self.settings.loss_aggregation == "sequence_mean":
                tokens = [sum(scored.trajectories[index].loss_mask[1:]) for index in part]
                advantages = [a * c for a, c in zip(advantages, sequence_mean_scales(tokens), strict=True)]
            minibatches.append(
                [
                    collate(
                        [scored.trajectories[part[row]] for row in rows],
                        [advantages[row] for row in rows],
                        self.pad_token_id,
                    )
                    for rows in plan
                ]
            )
        return minibatches

    def _passes(self, minibatch: Sequence[MicroBatch], first: int) -> list[_Pass]:
        """This rank's forwards over a minibatch: its data-parallel share, then zero passes to even the count."""
        from megatron.core import parallel_state

        normalizer = float(max(1, sum(micro.num_loss_tokens for micro in minibatch)))
        mine, extra = data_parallel_share(
            len(minibatch), self.sizes.data, parallel_state.get_data_parallel_rank()
        )
        multiple = sequence_multiple(self.config.megatron)
        cp, cp_rank = self.sizes.context, parallel_state.get_context_parallel_rank()

        def arrays(position: int) -> TokenArrays:
            micro = minibatch[position]
            return token_arrays(micro, self.pad_token_id, multiple, cp, cp_rank).to(self.device)

        passes = [_Pass(first + position, True, arrays(position), normalizer) for position in mine]
        passes += [_Pass(first, False, arrays(0), normalizer) for _ in range(extra)]
        return passes

    def _forward_backward(
        self, passes: list[_Pass], loss_of: Callable[[_Pass, Tensor, Tensor], Tensor], forward_only: bool
    ) -> None:
        """Megatron's schedule over the passes; loss_of(pass, log-probs, logits) gives each pass's loss (on the last
        pipeline stage)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        queue = iter(passes)

        def forward_step(data_iterator: Iterator[Any], model: Any) -> tuple[Tensor, Callable[..., Any]]:
            del data_iterator  # the passes come from `queue`, in the schedule's order
            item = next(queue)
            logits = model(
                input_ids=item.arrays.input_ids, position_ids=item.arrays.position_ids, attention_mask=None
            )  # (B, L, V / TP) on the last pipeline stage

            def loss_func(output: Tensor) -> tuple[Tensor, dict[str, Any]]:
                logprobs = self._logprobs(output, item.arrays.targets)
                return loss_of(item, logprobs, output), {}

            return logits, loss_func

        longest = max(item.arrays.input_ids.shape[1] for item in passes)
        rows = max(item.arrays.input_ids.shape[0] for item in passes)
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(range(len(passes))),
            model=self.model,
            num_microbatches=len(passes),
            seq_length=longest // self.sizes.context,
            micro_batch_size=rows,
            forward_only=forward_only,
        )

    def _logprobs(self, logits: Tensor, targets: Tensor) -> Tensor:
        """log p(target | prefix) per position from vocab-parallel logits (B, L, V / TP), at the engine's
        temperature, in float32 (megatron's vocab-parallel cross entropy: the TP all-reduces inside)."""
        from megatron.core import tensor_parallel

        scores = logits.float() / self.logprob_temperature
        return -tensor_parallel.vocab_parallel_cross_entropy(scores, targets)  # (B, L)

    def _record(
        self, item: _Pass, logprobs: Tensor, logits: Tensor, sums: _StepSums, mismatch: ImportanceSums
    ) -> None:
        """Entropy and the trainer-engine mismatch of a real pass, once per micro-batch (the TP rank 0 counts)."""
        from megatron.core import parallel_state

        entropy = vocab_parallel_entropy(
            logits.detach().float() / self.logprob_temperature,
            parallel_state.get_tensor_model_parallel_group(),
        )  # (B, L)
        if parallel_state.get_tensor_model_parallel_rank() != 0:
            return
        mask = item.arrays.loss_mask
        sums.entropy += float((entropy * mask).sum())
        mismatch += importance_sums(
            logprobs.detach(), item.arrays.behaviour_logprobs, mask, self.settings.tis_cap
        )

    def _old_logprobs(
        self, minibatches: Sequence[Sequence[MicroBatch]], sums: _StepSums, mismatch: ImportanceSums
    ) -> dict[int, Tensor]:
        """Old log-probs of every micro-batch this rank computes, fixed before the first update (no gradient)."""
        old: dict[int, Tensor] = {}
        passes: list[_Pass] = []
        first = 0
        for minibatch in minibatches:
            passes += self._passes(minibatch, first)
            first += len(minibatch)

        def keep(item: _Pass, logprobs: Tensor, logits: Tensor) -> Tensor:
            if item.real:
                old[item.index] = logprobs.detach()
                self._record(item, logprobs, logits, sums, mismatch)
            return logprobs.sum() * 0.0

        with torch.no_grad():
            self._forward_backward(passes, keep, forward_only=True)
        return old

    def _update(
        self,
        minibatch: Sequence[MicroBatch],
        first: int,
        old: dict[int, Tensor],
        sums: _StepSums,
        mismatch: ImportanceSums,
        record_old: bool,
    ) -> float:
        """One optimizer update on a minibatch; returns the gradient norm before clipping."""
        from megatron.core import parallel_state

        passes = self._passes(minibatch, first)
        scale = float(len(passes) * self.sizes.data)  # undoes the schedule's / passes and DDP's / DP
        counts = parallel_state.get_tensor_model_parallel_rank() == 0
        for chunk in self.model:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()

        def loss_of(item: _Pass, logprobs: Tensor, logits: Tensor) -> Tensor:
            if not item.real:
                return logprobs.sum() * 0.0
            if record_old:
                old[item.index] = logprobs.detach()
                self._record(item, logprobs, logits, sums, mismatch)
            s = self.settings
            loss, loss_stats = policy_loss(
                logprobs,
                old[item.index],
                item.arrays.behaviour_logprobs,
                item.arrays.advantages,
                item.arrays.loss_mask,
                s.clip_eps_low,
                s.clip_eps_high,
                s.tis_cap,
                normalizer=item.normalizer,
                tis_level=s.tis_level,
                mis_low=s.mis_low,
                mis_high=s.mis_high,
                mis_level=s.mis_level,
            )
            if counts:
                sums.loss += float(loss.detach())
                sums.add_loss(loss_stats)
            return loss * scale

        self._forward_backward(passes, loss_of, forward_only=False)
        succeeded, grad_norm, _ = self.optimizer.step()
        if not succeeded:
            raise RuntimeError("megatron optimizer step failed (non-finite gradients)")
        return float(grad_norm) if grad_norm is not None else 0.0

    def _reduce(self, sums: _StepSums, mismatch: ImportanceSums) -> dict[str, float]:
        """Every rank's sums added over all ranks (only the last pipeline stage's TP rank 0 holds any), float64."""
        import torch.distributed as dist

        names = list(vars(sums)) + [f"m_{name}" for name in _MISMATCH_FIELDS]
        values = list(vars(sums).values()) + [float(getattr(mismatch, name)) for name in _MISMATCH_FIELDS]
        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return dict(zip(names, tensor.tolist(), strict=True))

    # -- weights out, state in and out ------------------------------------------------------------------------

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def _shared_name(self, name: str | None) -> str:
        """rank 0's `name` on every rank (a barrier too)."""
        import torch.distributed as dist

        box = [name]
        dist.broadcast_object_list(box, src=0, device=self.device)
        return str(box[0])

    def _write_hf(self, out: Path) -> None:
        """The policy as a Hugging Face folder at out: weights gathered from every shard (collective), config and
        tokenizer of the start model (rank 0 writes)."""
        import torch.distributed as dist

        self.bridge.save_hf_pretrained(self.model, out, show_progress=False)
        if self.is_main:
            save_tokenizer(self.tokenizer, out)
        dist.barrier()

    def export_weights(self, out_dir: str | Path, version: int | None = None) -> Path:
        """The policy in HF format at out_dir/weights_v<version> (GRPOTrainer.export_weights' contract: written
        under a temporary name and renamed, newest keep_exports kept); collective, rank 0 writes."""
        version = self.step if version is None else version
        root = Path(out_dir)
        final = root / f"{EXPORT_PREFIX}{version:08d}"
        name = None
        if self.is_main:
            name = f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
            (root / name).mkdir(parents=True)
        temp = root / self._shared_name(name)  # also the barrier: the folder exists from here
        self._write_hf(temp)
        if self.is_main:
            if final.exists():
                shutil.rmtree(final)
            temp.rename(final)
            exports = sorted(path for path in root.glob(f"{EXPORT_PREFIX}*") if path.is_dir())
            for stale in exports[: -self.keep_exports]:
                shutil.rmtree(stale, ignore_errors=True)
        return final

    def save_model(self, out_dir: str | Path) -> Path:
        """The policy (and tokenizer) in Hugging Face format under out_dir, for the next stage; collective."""
        out = Path(out_dir)
        if self.is_main:
            out.mkdir(parents=True, exist_ok=True)
        self._write_hf(out)
        return out

    def _sharded_state_dict(self, is_loading: bool) -> dict[str, Any]:
        """Model and optimizer shards as megatron's distributed checkpointing names them (the GPTModel unwrapped
        from DDP and Float16Module, as megatron's own checkpointing does)."""
        from megatron.core.utils import unwrap_model

        metadata = {"distrib_optim_sharding_type": "dp_reshardable"}
        state: dict[str, Any] = {"model": unwrap_model(self.model[0]).sharded_state_dict(metadata=metadata)}
        state["optimizer"] = self.optimizer.sharded_state_dict(
            state, is_loading=is_loading, metadata=metadata
        )
        return state

    def save(
        self,
        checkpoint_dir: str | Path,
        *,
        epoch: int = 0,
        example_index: int = 0,
        num_examples: int = 0,
        data_fingerprint: str = "",
        keep_last: int = 2,
    ) -> Path:
        """A checkpoint of swerl.train.checkpoint's layout plus megatron/ (model and optimizer shards, every rank
        writing its own) and each rank's RNG states; written under a temporary name rank 0 renames once every
        rank has written; the newest keep_last are kept. Collective."""
        import torch.distributed as dist
        from megatron.core import dist_checkpointing, tensor_parallel

        state = TrainerState(self.step, epoch, example_index, self.seed, num_examples, data_fingerprint)
        with sharded_checkpoint(checkpoint_dir, state, keep_last, self.is_main, self._shared_name, dist.barrier,
                                subdirs=[MEGATRON_DIR]) as temp:  # fmt: skip
            dist_checkpointing.save(self._sharded_state_dict(is_loading=False), str(temp / MEGATRON_DIR))
            rng = {
                "swerl": capture_rng_state(),
                "megatron": tensor_parallel.get_cuda_rng_tracker().get_states(),
            }
            torch.save(rng, temp / RANK_RNG_FILE.format(rank=self.rank))
            self._write_hf(temp)
            if self.is_main:
                payload = {"trainer_state": asdict(state), "optimizer": None,
                           "sharded": f"megatron x {self.config.ranks}", "rng": capture_rng_state()}  # fmt: skip
                torch.save(payload, temp / STATE_FILE)
        return Path(checkpoint_dir) / checkpoint_name(state.step)

    def load(self, path: str | Path, *, optimizer: bool = True) -> TrainerState:
        """Restore a checkpoint `save` wrote (same parallel layout up to data-parallel resharding, same seed);
        collective. optimizer False (a GRPO phase's reset_optimizer) is not built here (the config refuses it)."""
        if not optimizer:
            raise ValueError("the megatron backend loads its optimizer state with its weights: reset_optimizer "
                             "is not built for it")  # fmt: skip
        from megatron.core import dist_checkpointing, tensor_parallel

        directory = check_checkpoint_dir(path)
        if not (directory / MEGATRON_DIR).is_dir():
            raise ValueError(
                f"checkpoint {directory} has no {MEGATRON_DIR}/ folder: it was not written by the megatron backend"
            )
        loaded = dist_checkpointing.load(
            self._sharded_state_dict(is_loading=True), str(directory / MEGATRON_DIR)
        )
        from megatron.core.utils import unwrap_model

        unwrap_model(self.model[0]).load_state_dict(loaded["model"], strict=True)
        self.optimizer.load_state_dict(loaded["optimizer"])
        set_lr_and_weight_decay(self.optimizer.param_groups, self.settings.lr, self.settings.weight_decay)
        payload = torch.load(directory / STATE_FILE, map_location="cpu", weights_only=False)
        state = TrainerState(**payload["trainer_state"])
        if state.shuffle_seed != self.seed:
            raise ValueError(
                f"checkpoint {directory} was trained with seed {state.shuffle_seed}, this run has {self.seed}"
            )
        rng_file = directory / RANK_RNG_FILE.format(rank=self.rank)
        if rng_file.is_file():
            rng = torch.load(rng_file, map_location="cpu", weights_only=False)
            restore_rng_state(rng["swerl"])
            tensor_parallel.get_cuda_rng_tracker().set_states(rng["megatron"])
        self.step = state.step
        logger.info("GRPO (megatron): resumed from %s at step %d", directory, state.step)
        return state

    # -- weights to engines over a process group: not with this backend yet ------------------------------------

    def weight_specs(self, dtype: str) -> list[Any]:
        raise NotImplementedError(
            "megatron backend: engine.weight_sync.method distributed is not supported yet; use method disk"
        )

    def open_weight_group(self, *args: Any, **kwargs: Any) -> None:
        self.weight_specs("")

    def broadcast_weights(self, names: Sequence[str], dtype: str) -> int:
        self.weight_specs(dtype)
        return 0


def _model_config(chunk: Any) -> Any:
    """The TransformerConfig of a (wrapped) megatron model chunk."""
    from megatron.core.utils import get_model_config

    return get_model_config(chunk)


def build_megatron_trainer(
    start_dir: Path, g: GRPOConfig, temperature: float, seed: int
) -> MegatronGRPOTrainer:
    """The GRPO stage's trainer in each rank of a megatron run (swerl.stages.grpo.build_rank_trainer calls it)."""
    settings = UpdateSettings(**g.algorithm.model_dump())
    return MegatronGRPOTrainer(start_dir, g.distributed, settings, seed, logprob_temperature=temperature)
