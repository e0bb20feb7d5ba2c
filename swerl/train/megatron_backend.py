"""The megatron trainer backend (`grpo.distributed.backend: megatron`): GRPO on megatron-core, with Hugging Face
weights in and out through megatron-bridge's AutoBridge.

Where it runs. One process per GPU, launched like the FSDP2 ranks (swerl.train.ranks: torchrun's RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); each rank builds a `MegatronGRPOTrainer` with the same
arguments and is called with the same groups. It needs the `megatron` extra (megatron-core and megatron-bridge,
Python >= 3.12) and CUDA: megatron-core cannot run a forward on CPU (RoPE and the attention buffer call CUDA, MoE
layers need CUDA streams). Nothing here imports megatron at module level: this module loads on any machine, and
`require_megatron()` names what is missing (docs/gpu.md says how to make the environment). Everything that needs no
megatron (the guard, the config mapped onto megatron's arguments, the step's layouts) is in
swerl.train.megatron_settings; this module is the trainer that runs them.

What is shared with the torch backend (swerl.train.grpo_step.BaseGRPOTrainer, the step's skeleton), never copied:
scoring (`score_groups`: group advantages over valid attempts), the rollout statistics, the minibatch split drawn
from (seed, step), the micro-batch plan and right-padded collation, the sequence-mean advantage factors, the step's
sums and statistics (the same names as GRPOTrainer's), and the loss itself (`swerl.train.grpo.policy_loss` with
the trainer's LossSettings: clipped PPO ratio, TIS/MIS, token-level normalisation by the minibatch's scored
tokens).

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
import json
import logging
import math
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from swerl.config.grpo import GRPOConfig
from swerl.config.train import DistributedConfig
from swerl.model.loading import check_model_dir, load_tokenizer
from swerl.model.tokenizer import save_tokenizer
from swerl.train.checkpoint import (
    RANK_RNG_FILE,
    STATE_FILE,
    StreamPosition,
    TrainerState,
    capture_rng_state,
    check_checkpoint_dir,
    check_seed,
    checkpoint_name,
    restore_rng_state,
    sharded_checkpoint,
)
from swerl.train.grpo import importance_sums, policy_loss
from swerl.train.grpo_step import EXPORT_PREFIX, BaseGRPOTrainer, MicroBatch, StepSums, UpdateSettings
from swerl.train.megatron_settings import (
    TokenArrays,
    check_supported,
    data_parallel_share,
    ddp_config_kwargs,
    has_transformer_engine,
    optimizer_config_kwargs,
    parallel_sizes,
    parallel_state_kwargs,
    provider_overrides,
    require_megatron,
    sequence_multiple,
    set_lr_and_weight_decay,
    token_arrays,
    vocab_parallel_entropy,
)
from swerl.train.sft import seed_everything

logger = logging.getLogger(__name__)

MEGATRON_DIR = "megatron"
"""Folder of a checkpoint holding megatron's distributed checkpoint (model and optimizer shards)."""


# ----------------------------------------------------------------------------------------------------------------
# The trainer


@dataclass
class _Pass:
    """One forward of a step on this rank: the micro-batch's index in the step, whether it counts (a zero pass
    repeats another and adds nothing), its arrays and its minibatch's scored-token count."""

    index: int
    real: bool
    arrays: TokenArrays
    normalizer: float


class MegatronGRPOTrainer(BaseGRPOTrainer[dict[int, Tensor]]):
    """GRPO on megatron-core; the trainer protocol of swerl.train.grpo_step.Trainer, run on every rank. The step is
    BaseGRPOTrainer's; the old log-probs it fixes are a dict of this rank's micro-batches' (empty with a single
    update, whose forward records them).

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
        self.loss_settings = settings.loss_settings(reference=False)  # check_supported refused kl_coef > 0
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
        for name, value in provider_overrides(self.config, transformer_engine=self.transformer_engine).items():
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
        optimizer_config = OptimizerConfig(**optimizer_config_kwargs(self.settings, self.config, betas, adam_eps))
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

    # -- one step (BaseGRPOTrainer.train_step runs it) ------------------------------------------------------

    def _passes(self, minibatch: Sequence[MicroBatch], first: int) -> list[_Pass]:
        """This rank's forwards over a minibatch: its data-parallel share, then zero passes to even the count."""
        from megatron.core import parallel_state

        normalizer = float(max(1, sum(micro.num_loss_tokens for micro in minibatch)))
        mine, extra = data_parallel_share(len(minibatch), self.sizes.data, parallel_state.get_data_parallel_rank())
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

    def _record(self, item: _Pass, logprobs: Tensor, logits: Tensor, sums: StepSums) -> None:
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
        sums.mismatch += importance_sums(
            logprobs.detach(), item.arrays.behaviour_logprobs, mask, self.loss_settings.tis_cap
        )

    def _fixed_logprobs(self, minibatches: Sequence[Sequence[MicroBatch]], sums: StepSums) -> dict[int, Tensor]:
        """Old log-probs of every micro-batch this rank computes, fixed before the first update (no gradient); with
        a single update none (its own forward records them)."""
        old: dict[int, Tensor] = {}
        if self.settings.single_update:
            return old
        passes: list[_Pass] = []
        first = 0
        for minibatch in minibatches:
            passes += self._passes(minibatch, first)
            first += len(minibatch)

        def keep(item: _Pass, logprobs: Tensor, logits: Tensor) -> Tensor:
            if item.real:
                old[item.index] = logprobs.detach()
                self._record(item, logprobs, logits, sums)
            return logprobs.sum() * 0.0

        with torch.no_grad():
            self._forward_backward(passes, keep, forward_only=True)
        return old

    def _update(self, minibatch: Sequence[MicroBatch], first: int, old: dict[int, Tensor], sums: StepSums) -> float:
        """One optimizer update on a minibatch; returns the gradient norm before clipping. Its loss goes into
        sums.loss per counted micro-batch (the last pipeline stage's TP rank 0), added over ranks by `_reduce`."""
        from megatron.core import parallel_state

        passes = self._passes(minibatch, first)
        scale = float(len(passes) * self.sizes.data)  # undoes the schedule's / passes and DDP's / DP
        counts = parallel_state.get_tensor_model_parallel_rank() == 0
        record_old = self.settings.single_update
        for chunk in self.model:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()

        def loss_of(item: _Pass, logprobs: Tensor, logits: Tensor) -> Tensor:
            if not item.real:
                return logprobs.sum() * 0.0
            if record_old:
                old[item.index] = logprobs.detach()
                self._record(item, logprobs, logits, sums)
            loss, loss_stats = policy_loss(
                logprobs,
                old[item.index],
                item.arrays.behaviour_logprobs,
                item.arrays.advantages,
                item.arrays.loss_mask,
                self.loss_settings,
                normalizer=item.normalizer,
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

    def _reduce(self, sums: StepSums) -> None:
        """Every rank's sums added over all ranks (only the last pipeline stage's TP rank 0 holds any), float64."""
        import torch.distributed as dist

        tensor = torch.tensor(sums.vector(with_loss=True), dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        sums.load(tensor.tolist(), with_loss=True)

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
            self._publish_export(temp, final)
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
        state["optimizer"] = self.optimizer.sharded_state_dict(state, is_loading=is_loading, metadata=metadata)
        return state

    def save(self, checkpoint_dir: str | Path, position: StreamPosition, *, keep_last: int = 2) -> Path:
        """A checkpoint of swerl.train.checkpoint's layout plus megatron/ (model and optimizer shards, every rank
        writing its own) and each rank's RNG states; written under a temporary name rank 0 renames once every
        rank has written; the newest keep_last are kept. Collective."""
        import torch.distributed as dist
        from megatron.core import dist_checkpointing, tensor_parallel

        state = TrainerState.at(self.step, self.seed, position)
        with sharded_checkpoint(
            checkpoint_dir, state, keep_last, self.is_main, self._shared_name, dist.barrier, subdirs=[MEGATRON_DIR]
        ) as temp:
            dist_checkpointing.save(self._sharded_state_dict(is_loading=False), str(temp / MEGATRON_DIR))
            rng = {
                "swerl": capture_rng_state(),
                "megatron": tensor_parallel.get_cuda_rng_tracker().get_states(),
            }
            torch.save(rng, temp / RANK_RNG_FILE.format(rank=self.rank))
            self._write_hf(temp)
            if self.is_main:
                payload = {
                    "trainer_state": asdict(state),
                    "optimizer": None,
                    "sharded": f"megatron x {self.config.ranks}",
                    "rng": capture_rng_state(),
                }
                torch.save(payload, temp / STATE_FILE)
        return Path(checkpoint_dir) / checkpoint_name(state.step)

    def load(self, path: str | Path, *, optimizer: bool = True) -> TrainerState:
        """Restore a checkpoint `save` wrote (same parallel layout up to data-parallel resharding, same seed);
        collective. optimizer False (a GRPO phase's reset_optimizer) is not built here (the config refuses it)."""
        if not optimizer:
            raise ValueError(
                "the megatron backend loads its optimizer state with its weights: reset_optimizer is not built for it"
            )
        from megatron.core import dist_checkpointing, tensor_parallel

        directory = check_checkpoint_dir(path)
        if not (directory / MEGATRON_DIR).is_dir():
            raise ValueError(
                f"checkpoint {directory} has no {MEGATRON_DIR}/ folder: it was not written by the megatron backend"
            )
        loaded = dist_checkpointing.load(self._sharded_state_dict(is_loading=True), str(directory / MEGATRON_DIR))
        from megatron.core.utils import unwrap_model

        unwrap_model(self.model[0]).load_state_dict(loaded["model"], strict=True)
        self.optimizer.load_state_dict(loaded["optimizer"])
        set_lr_and_weight_decay(self.optimizer.param_groups, self.settings.lr, self.settings.weight_decay)
        payload = torch.load(directory / STATE_FILE, map_location="cpu", weights_only=False)
        state = TrainerState(**payload["trainer_state"])
        check_seed(state, self.seed, directory)
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


def build_megatron_trainer(start_dir: Path, g: GRPOConfig, temperature: float, seed: int) -> MegatronGRPOTrainer:
    """The GRPO stage's trainer in each rank of a megatron run (swerl.stages.grpo.build_rank_trainer calls it)."""
    settings = UpdateSettings(**g.algorithm.model_dump())
    return MegatronGRPOTrainer(start_dir, g.distributed, settings, seed, logprob_temperature=temperature)
