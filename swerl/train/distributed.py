"""The trainer across N processes: torch.distributed ranks, FSDP2 sharding, sharded checkpoints, full exports.

One rank is one process (one GPU on cuda; gloo on CPU). `init_rank` joins the group from the torchrun-style
environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, set by swerl.train.ranks or torchrun) and
returns the `RankContext` the trainers take; `shard_model` wraps every decoder layer and then the root with
`fully_shard` on a one-dimensional device mesh given explicitly (the default device type segfaults on CPU-only
ranks of a machine that has GPUs), under a MixedPrecisionPolicy.

How the single-process trainers become data-parallel without changing their math (swerl.train.sft,
swerl.train.grpo_trainer):
- Every rank holds the whole step's data (the parent sends each rank the same groups; SFT ranks pack the same
  rows from the same seed). Micro-batch i of a step goes to rank i mod N (`RankContext.share`). FSDP needs every
  rank to run the same number of forward and backward passes (each one all-gathers and reduce-scatters), so a
  rank with one micro-batch fewer runs a pass whose loss is multiplied by 0 (`share` says how many).
- The loss of a micro-batch is divided by the whole step's target count, as in one process, and multiplied by
  N: FSDP2 averages gradients over ranks, so the averaged gradient is the sum of the ranks' gradients, which is
  the one-process gradient. Multiplying by N = 2^k is exact in floating point.
- What a step reports (loss, entropy, mismatch sums) is summed over ranks (`RankContext.sum`), in float64.
- Gradient clipping uses the global norm (clip_grad_norm_ on DTensor gradients reduces across the mesh).
So N ranks compute the one-process update up to the order of floating-point sums (tests/train/test_distributed.py
states the tolerance).

Checkpoints (`save_sharded` / `load_sharded`): model and optimizer state through torch.distributed.checkpoint
(each rank writes its shards, no rank ever holds the whole optimizer state), each rank's RNG states in a file of
its own. Exports and the next stage's model are full Hugging Face folders: `full_state_dict` gathers the
parameters to rank 0 (CPU), which alone writes.
"""

from __future__ import annotations

import datetime
import logging
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn

from swerl.config.train import DistributedConfig
from swerl.model.loading import check_model_dir

logger = logging.getLogger(__name__)

DCP_DIR = "sharded"
"""Folder of a checkpoint holding torch.distributed.checkpoint's shards of model and optimizer state."""

ModuleT = TypeVar("ModuleT", bound=nn.Module)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class RankContext:
    """This process's place among the trainer ranks."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    mesh: Any  # torch.distributed.device_mesh.DeviceMesh (typed loosely: its stubs are partial)
    config: DistributedConfig

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        dist.barrier()

    def sum(self, values: Sequence[float]) -> list[float]:
        """Each value summed over all ranks (float64; every rank gets the sums)."""
        if self.world_size == 1:
            return [float(value) for value in values]
        tensor = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return [float(value) for value in tensor.tolist()]

    def share(self, count: int) -> tuple[list[int], int]:
        """(indices of this rank's items among `count`, extra zero-loss passes): item i goes to rank i mod N, and
        every rank makes ceil(count / N) passes."""
        mine = list(range(self.rank, count, self.world_size))
        passes = -(-count // self.world_size)
        return mine, passes - len(mine)

    def broadcast_object(self, value: Any) -> Any:
        """rank 0's `value` on every rank."""
        box = [value]
        dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        return box[0]


def rank_environment() -> tuple[int, int, int]:
    """(RANK, WORLD_SIZE, LOCAL_RANK) from the environment, checked; ValueError naming the variable."""
    values = []
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        text = os.environ.get(name)
        if text is None or not text.isdigit():
            raise ValueError(f"trainer rank: environment variable {name} is {text!r}, not a non-negative integer")
        values.append(int(text))
    rank, world, local = values
    if rank >= world:
        raise ValueError(f"trainer rank: RANK {rank} is not below WORLD_SIZE {world}")
    return rank, world, local


def init_rank(config: DistributedConfig) -> RankContext:
    """Join the trainer's process group (env:// rendezvous) and build the device mesh; once per process."""
    rank, world, local = rank_environment()
    device = device_of(config, local)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if config.socket_ifname:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", config.socket_ifname)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", config.socket_ifname)
    if not dist.is_initialized():
        dist.init_process_group(
            backend=config.group_backend,
            timeout=datetime.timedelta(seconds=config.collective_timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))
    return RankContext(rank, world, local, device, mesh, config)


def device_of(config: DistributedConfig, local_rank: int = 0) -> torch.device:
    """The device of a rank (cuda: GPU local_rank), checked: a clear error when CUDA is asked for and absent."""
    if config.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("distributed.device is cuda but torch sees no GPU (torch.cuda.is_available() is False)")
    if local_rank >= torch.cuda.device_count():
        raise RuntimeError(f"local rank {local_rank} has no GPU: torch sees {torch.cuda.device_count()}")
    return torch.device("cuda", local_rank)


def dtype_of(name: str) -> torch.dtype:
    return _DTYPES[name]


def decoder_layers(model: nn.Module) -> Sequence[nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (model.model.layers), each sharded on its own."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList) or len(layers) == 0:
        raise ValueError(f"{type(model).__name__}: no decoder layers at model.model.layers to shard")
    return list(layers)


def shard_model(model: ModuleT, ctx: RankContext, *, trainable: bool = True) -> ModuleT:
    """FSDP2: every decoder layer, then the root (embeddings, final norm, head), sharded over the ranks' mesh.

    The parameters stay float32 (the sharded master copy the optimizer steps); forward and backward run in
    distributed.param_dtype and gradients are reduced in reduce_dtype. With activation_checkpointing each layer's
    activations are recomputed in the backward (non-reentrant checkpointing, transformers' own switch).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    config = ctx.config
    if not any(parameter.is_meta for parameter in model.parameters()):  # a meta model is allocated after sharding
        model.to(ctx.device)
    if trainable and config.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[operator]
    policy = MixedPrecisionPolicy(param_dtype=dtype_of(config.param_dtype), reduce_dtype=dtype_of(config.reduce_dtype))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=ctx.mesh, mp_policy=policy, reshard_after_forward=config.reshard_after_forward)
    fully_shard(model, mesh=ctx.mesh, mp_policy=policy, reshard_after_forward=config.reshard_after_forward)
    return model


def load_sharded_model(model_dir: Path, ctx: RankContext, attn_implementation: str | None = None) -> Any:
    """The model of a local HF folder, sharded, without every rank holding all of it: rank 0 loads the weights
    (float32, CPU), the other ranks build the architecture on the meta device; after fully_shard each rank
    allocates only its shards and rank 0 broadcasts the weights tensor by tensor (set_model_state_dict with
    broadcast_from_rank0), then the buffers that are not in a state dict (rotary inv_freq). Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    check_model_dir(model_dir)  # never a hub id: a clear error naming what the folder lacks
    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    if ctx.is_main:
        model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32, **extra)
        weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    else:
        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, **extra)
        weights = {}
    shard_model(model, ctx)
    if not ctx.is_main:
        model.to_empty(device=ctx.device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, weights, options=options)
    persistent = set(model.state_dict())
    for name, buffer in model.named_buffers():
        if name not in persistent:
            dist.broadcast(buffer, src=0)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def clip_gradients(parameters: Sequence[Tensor], max_norm: float | None) -> float:
    """Clip to max_norm (None or 0: measure only) by the global norm over all ranks; returns the norm before."""
    grads = [parameter for parameter in parameters if parameter.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(grads, max_norm or math.inf)
    full = getattr(norm, "full_tensor", None)  # a DTensor when the gradients are sharded
    return float(full() if full is not None else norm)


def full_state_dict(model: nn.Module, ctx: RankContext | None) -> dict[str, Tensor]:
    """Every parameter and buffer unsharded, on CPU, on rank 0 (an empty dict on the others); collective."""
    if ctx is None or not is_sharded(model):
        return {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options)
    return cast(dict[str, Tensor], state) if ctx.is_main else {}


def iter_full_parameters(model: nn.Module, ctx: RankContext | None) -> Iterator[tuple[str, Tensor]]:
    """(name, full tensor) of every entry of the model's state dict, one at a time, on every rank (collective per
    sharded tensor: all ranks must iterate together). For weight broadcasts, which need one tensor at a time."""
    for name, tensor in model.state_dict().items():
        full = getattr(tensor, "full_tensor", None)
        yield name, (full() if full is not None else tensor).detach()


def save_sharded(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Model and optimizer shards (torch.distributed.checkpoint) under directory/sharded; collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(directory / DCP_DIR))


def load_sharded(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Restore what save_sharded wrote into a sharded model (and optimizer); any world size reads it (DCP
    reshards); collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if optimizer is None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        model_only = {"model": get_model_state_dict(model)}
        dcp.load(model_only, checkpoint_id=str(directory / DCP_DIR))
        set_model_state_dict(model, model_only["model"])
    else:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=str(directory / DCP_DIR))
        set_state_dict(
            model,
            optimizer,
            model_state_dict=cast(Any, state["model"]),
            optim_state_dict=cast(Any, state["optimizer"]),
        )
