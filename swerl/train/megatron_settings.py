"""The megatron backend's settings and layouts as pure functions: everything of `grpo.distributed.backend: megatron`
that does not need megatron installed (tested on CPU, tests/train/test_megatron_backend.py); the trainer that runs
them is swerl.train.megatron_backend.

- The guard: `require_megatron()` names every missing piece (Python >= 3.12, megatron-core, megatron-bridge, CUDA)
  and how to install them (docs/gpu.md).
- The config mapped onto megatron's arguments: parallel sizes and megatron-core's divisibility rules
  (`parallel_sizes`), `parallel_state.initialize_model_parallel`'s arguments, the bridge's model-provider fields
  (`provider_overrides`: parallelism, dtype, recomputation, no dropout, no MoE auxiliary loss, the fusions that
  need transformer-engine off without it), megatron's DDP and optimizer configs, and what the backend refuses
  (`check_supported`).
- The step's layout: the data-parallel share of a step's micro-batches, sequence lengths megatron accepts, the
  context-parallel split of a sequence, a micro-batch shifted so each position carries its next token's target
  (`token_arrays`), the entropy from vocabulary-parallel logits, the lr and weight decay on megatron's parameter
  groups.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from swerl.config.train import DistributedConfig, MegatronConfig
from swerl.train.grpo_step import MicroBatch, UpdateSettings

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
        raise ValueError(f"megatron: ranks {ranks} is not divisible by tensor x pipeline x context parallel ({model})")
    expert_grid = megatron.expert_tensor_parallel * megatron.expert_parallel * megatron.pipeline_parallel
    if ranks % expert_grid:
        raise ValueError(
            f"megatron: ranks {ranks} is not divisible by expert_tensor x expert x pipeline parallel ({expert_grid})"
        )
    return ParallelSizes(
        megatron.tensor_parallel,
        megatron.pipeline_parallel,
        megatron.context_parallel,
        megatron.expert_parallel,
        megatron.expert_tensor_parallel,
        ranks // model,
        ranks // expert_grid,
    )


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
        "variable_seq_lengths": m.pipeline_parallel > 1,  # micro-batches differ in shape: sent before each send
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

    reduce = group is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1
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
