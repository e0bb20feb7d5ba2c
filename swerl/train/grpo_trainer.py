"""The synchronous GRPO trainer of the torch backend: groups of trajectories in, one policy update out.

One `train_step` reads top to bottom: score the groups (advantages over valid attempts) -> lay the valid
trajectories out as right-padded (B, T) micro-batches (the loss's view; each forward packs a micro-batch's rows
padding-free and runs the LM head only at scored tokens) -> fix the old log-probs -> clipped, TIS-weighted policy
loss with gradient accumulation -> clip -> AdamW. The step's skeleton, scoring and batching are shared with the
megatron trainer (swerl.train.grpo_step.BaseGRPOTrainer); this module is the torch forward, backward and step.
`export_weights` hands the new policy to an engine (`update_weights_from_disk`), `save`/`load` make a resumed run
continue exactly. Plain constructor arguments only; a builder maps a config onto them.

Contracts worth knowing before changing anything:
- Invalid attempts. An infra_error trajectory (reward None) is excluded from its group's baseline and from the
  loss: it never enters a batch, so its tokens cannot touch the gradient. A group with fewer than two valid
  attempts has no baseline and is dropped (counted in `groups_dropped`).
- Alignment. `_logprobs` gives out[:, t] = log p(token t + 1 | tokens <= t), as `gather_logprobs` over full
  logits would, at the scored positions (0 elsewhere): the log-prob of token t comes from the logits at t - 1. A
  trajectory's behaviour_logprobs[t] and loss_mask[t] describe token t, so both are shifted by one (`[:, 1:]`)
  before they meet the trainer's log-probs. A first token is never scored.
- Old log-probs. With one optimizer update per step (ppo_epochs = num_minibatches = 1, the default) old is the
  detached current log-probs of the same forward pass: the PPO ratio is exactly 1 and only TIS acts. With more
  updates, a no-grad pass fixes old for every trajectory before the first update.
- Normalisation. Token-level over the minibatch: every micro-batch's summed loss is divided by the masked-token
  count of its whole minibatch, so the accumulated gradient is that of the minibatch's token mean, whatever the
  micro-batching (tested).
- Determinism. `seed` seeds python, numpy and torch at construction; the minibatch split of step s is drawn
  from (seed, s) by its own generator. A checkpoint holds model, optimizer, global RNG states and the step, so
  K steps + save + load + (N - K) steps equals N steps (tested bitwise in fp32 on CPU).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swerl.engine.weight_sync import GroupBackend, TensorSpec, open_group, send_tensors, torch_dtype
from swerl.model.loading import save_model_and_tokenizer
from swerl.model.tokenizer import save_tokenizer
from swerl.train.checkpoint import StreamPosition, TrainerState, check_seed, load_checkpoint, save_checkpoint
from swerl.train.distributed import RankContext, clip_gradients, full_state_dict, is_sharded, shard_model
from swerl.train.grpo import importance_sums, policy_loss, token_entropy, token_logprobs
from swerl.train.grpo_step import (
    EXPORT_PREFIX,
    BaseGRPOTrainer,
    MicroBatch,
    ScoredGroups,
    StepSums,
    UpdateSettings,
)
from swerl.train.packing import kept_logits, use_packed_attention
from swerl.train.sft import build_optimizer, seed_everything

logger = logging.getLogger(__name__)


@dataclass
class _Fixed:
    """What a step's updates read, fixed before the first: old and reference log-probs per micro-batch (numbered
    across the step's minibatches) and the micro-batches this rank computes."""

    old: dict[int, Tensor]
    reference: dict[int, Tensor]
    mine: set[int]


class GRPOTrainer(BaseGRPOTrainer[_Fixed]):
    """Synchronous GRPO on a Hugging Face causal LM (torch; CPU or one GPU).

    Args:
        model: the policy, trained in place (parameters stay float32; bf16 autocasts the forward).
        settings: how each step updates it (UpdateSettings, from grpo.algorithm).
        betas, adam_eps: AdamW's moment decay and epsilon (not run settings: the usual values).
        ref_model: a frozen reference policy for the KL penalty; None for no penalty (the recipe's default).
        logprob_temperature: the temperature the engine's log-probs describe (engine.base.logprob_temperature).
        bf16: autocast forward passes to bfloat16.
        seed: seeds the global RNGs at construction and the minibatch split of every step.
        tokenizer: saved with exports and checkpoints when given.
        ranks: this process's FSDP2 rank (swerl.train.distributed): the model (and ref_model) are sharded over the
            ranks, every rank is called with the same groups and runs its share of the micro-batches; None: one
            process.
        pad_token_id: padding id; defaults to the model config's (else 0). Padding is never attended to by real
            tokens (right padding, causal attention) and never scored.
        keep_exports: exported weight directories kept under an export dir (older ones are removed).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        settings: UpdateSettings,
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        adam_eps: float = 1e-8,
        ref_model: PreTrainedModel | None = None,
        logprob_temperature: float = 1.0,
        bf16: bool = False,
        seed: int = 0,
        tokenizer: PreTrainedTokenizerBase | None = None,
        pad_token_id: int | None = None,
        keep_exports: int = 2,
        ranks: RankContext | None = None,
    ) -> None:
        if keep_exports < 1:
            raise ValueError(f"keep_exports must be >= 1, got {keep_exports}")
        if logprob_temperature <= 0:
            raise ValueError(f"logprob_temperature must be > 0, got {logprob_temperature}")
        seed_everything(seed)
        self.ranks = ranks
        # sharded here unless the caller loaded it sharded (distributed.load_sharded_model)
        if ranks is not None:
            model = model if is_sharded(model) else shard_model(model, ranks)
            if ref_model is not None and not is_sharded(ref_model):
                ref_model = shard_model(ref_model, ranks, trainable=False)
        self.settings = settings
        self.model = use_packed_attention(model).train()
        self.optimizer = build_optimizer(model, settings.lr, settings.weight_decay, betas, adam_eps)
        # (lr, weight decay) per parameter group as these settings build them: restored after a checkpoint loads
        self._hyperparameters = [(g["lr"], g["weight_decay"]) for g in self.optimizer.param_groups]
        self.ref_model = use_packed_attention(ref_model).eval().requires_grad_(False) if ref_model is not None else None
        self.loss_settings = settings.loss_settings(reference=ref_model is not None)
        self.logprob_temperature = logprob_temperature
        self.bf16 = bf16
        self.seed = seed
        self.tokenizer = tokenizer
        if pad_token_id is None:
            pad_token_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
        self.pad_token_id = pad_token_id
        self.keep_exports = keep_exports
        self.step = 0  # train_step calls done; the version of the weights they produced
        self._scored: list[tuple[str, int]] = []

    # -- one step (BaseGRPOTrainer.train_step runs it) ------------------------------------------------------

    def _minibatches(self, scored: ScoredGroups) -> list[list[MicroBatch]]:
        return [[micro.to(self.device) for micro in minibatch] for minibatch in super()._minibatches(scored)]

    def _my_micro_batches(self, count: int) -> set[int]:
        """The step's micro-batches (numbered across minibatches) this rank computes: all in one process."""
        if self.ranks is None:
            return set(range(count))
        return set(self.ranks.share(count)[0])

    def _passes(self, indices: Sequence[int], mine: set[int]) -> list[tuple[int, bool]]:
        """(index, real) of the forward passes this rank makes over `indices`: its own, then zero-loss repeats of
        indices[0] so that every rank makes the same number (FSDP's collectives run once per pass)."""
        own = [(index, True) for index in indices if index in mine]
        if self.ranks is None:
            return own
        passes = -(-len(indices) // self.ranks.world_size)
        return own + [(indices[0], False)] * (passes - len(own))

    def _fixed_logprobs(self, minibatches: Sequence[Sequence[MicroBatch]], sums: StepSums) -> _Fixed:
        """Old (and reference) log-probs per micro-batch, fixed before the first update. With a single update the
        old log-probs come from the update's own forward pass instead (same weights, one pass saved): `_update`
        fills them in. Sharded: this rank's micro-batches only (plus its share of zero passes)."""
        micro_batches = [micro for minibatch in minibatches for micro in minibatch]
        fixed = _Fixed({}, {}, self._my_micro_batches(len(micro_batches)))
        if not micro_batches:
            return fixed
        for index, real in self._passes(range(len(micro_batches)), fixed.mine):
            micro = micro_batches[index]
            if self.ref_model is not None:
                ref = self._logprobs(self.ref_model, micro, grad=False)[0]
                if real:
                    fixed.reference[index] = ref
            if not self.settings.single_update:
                logprobs, logits = self._logprobs(self.model, micro, grad=False)
                if real:
                    fixed.old[index] = logprobs
                    self._record(sums, micro, fixed.old[index], logits)
        return fixed

    @torch.no_grad()
    def _record(self, sums: StepSums, micro: MicroBatch, old: Tensor, logits: Tensor) -> None:
        """Entropy and the trainer-engine mismatch of a micro-batch whose old log-probs are fixed; logits (K, V):
        at its K scored tokens (`_logprobs`), where entropy is taken."""
        mask = micro.loss_mask[:, 1:]  # (B, T-1): the scored tokens, shifted like old
        sums.entropy += float(token_entropy(logits.detach().float() / self.logprob_temperature).sum())
        sums.mismatch += importance_sums(old, micro.behaviour_logprobs[:, 1:], mask, self.loss_settings.tis_cap)

    def _update(self, minibatch: Sequence[MicroBatch], first: int, fixed: _Fixed, sums: StepSums) -> float:
        """One optimizer update on a minibatch, accumulated over its micro-batches; returns the grad norm.

        Sharded: this rank's micro-batches, the loss scaled by the world size (FSDP2 averages gradients over
        ranks: the average of N x each rank's gradient is the one-process gradient), zero passes to even out."""
        normalizer = float(max(1, sum(micro.num_loss_tokens for micro in minibatch)))
        scale = float(self.ranks.world_size) if self.ranks is not None else 1.0
        self.optimizer.zero_grad(set_to_none=True)
        update_loss = 0.0
        for index, real in self._passes(range(first, first + len(minibatch)), fixed.mine):
            micro = minibatch[index - first]
            logprobs, logits = self._logprobs(self.model, micro, grad=True)  # (B, T-1), (K, V)
            if not real:  # a zero pass: the same collectives, no gradient, nothing recorded
                (logprobs.sum() * 0.0).backward()
                continue
            if self.settings.single_update:
                fixed.old[index] = logprobs.detach()
                self._record(sums, micro, fixed.old[index], logits)
            # Shift the per-token arrays by one: logprobs[:, t] is the log-prob of token t + 1.
            loss, loss_stats = policy_loss(
                logprobs,
                fixed.old[index],
                micro.behaviour_logprobs[:, 1:],
                micro.advantages[:, 1:],
                micro.loss_mask[:, 1:],
                self.loss_settings,
                ref_logprobs=fixed.reference.get(index),
                normalizer=normalizer,
            )
            (loss * scale).backward()
            update_loss += float(loss.detach())
            sums.add_loss(loss_stats)
        if self.ranks is not None:
            update_loss = self.ranks.sum([update_loss])[0]
        sums.loss += update_loss
        return self._optimizer_step()

    def _reduce(self, sums: StepSums) -> None:
        """Every sum over all ranks (each rank recorded its own micro-batches); the loss is summed per update."""
        if self.ranks is not None:
            sums.load(self.ranks.sum(sums.vector(with_loss=False)), with_loss=False)

    def _logprobs(self, model: PreTrainedModel, micro: MicroBatch, grad: bool) -> tuple[Tensor, Tensor]:
        """Next-token log-probs (B, T-1) of a micro-batch under model, and its logits (K, V) at the K scored tokens.

        Padding-free and only where the loss looks: the rows' real tokens are laid end to end as one row with
        restarting position ids (swerl.train.packing: attention per trajectory, as if each ran alone), and the LM
        head and log-softmax run only at the positions whose next token is scored (loss_mask[:, 1:]). logprobs
        holds them there, in the (B, T-1) layout the loss reads, and 0 at every unscored position (the loss, the
        entropy and the importance statistics read scored positions only). A micro-batch without any scored token
        gives (0, V) logits, and its backward still reaches every parameter (with zeros), as a sharded model's ranks
        need.
        """
        length = micro.input_ids.shape[1]
        real = torch.arange(length, device=micro.input_ids.device) < micro.lengths.unsqueeze(-1)  # (B, T)
        scored = micro.loss_mask[:, 1:].bool()  # (B, T-1): log-prob t is that of token t + 1
        keep = torch.zeros_like(real)
        keep[:, :-1] = scored  # scored implies real: the mask is 0 on padding
        keep = keep[real].unsqueeze(0)  # (1, N), in the packed row's order (row-major)
        positions = torch.arange(length, device=real.device).expand_as(real)[real].unsqueeze(0)  # (1, N)
        with torch.set_grad_enabled(grad):
            logits = kept_logits(model, micro.input_ids[real].unsqueeze(0), positions, keep, self.bf16)  # (K, V)
            selected = token_logprobs(logits, micro.input_ids[:, 1:][scored], self.logprob_temperature)  # (K,)
            logprobs = torch.zeros(scored.shape, dtype=selected.dtype, device=selected.device)
            logprobs = logprobs.index_put(scored.nonzero(as_tuple=True), selected)  # (B, T-1)
        return logprobs, logits

    def _optimizer_step(self) -> float:
        """Clip, step; returns the total gradient norm before clipping."""
        grad_norm = clip_gradients(list(self.model.parameters()), self.settings.grad_clip)
        self.optimizer.step()
        return grad_norm

    @property
    def device(self) -> torch.device:
        return self.ranks.device if self.ranks is not None else self.model.device

    @property
    def is_main(self) -> bool:
        """Writes exports, models and checkpoint metadata (rank 0; always in one process)."""
        return self.ranks is None or self.ranks.is_main

    def _save_pretrained(self, out: Path) -> None:
        """The policy in HF format at out (and the tokenizer); sharded: gathered to rank 0, which alone writes."""
        if self.ranks is None:
            self.model.save_pretrained(out, safe_serialization=True)
        else:
            weights = full_state_dict(self.model, self.ranks)  # collective
            if self.ranks.is_main:
                self.model.save_pretrained(out, state_dict=weights, safe_serialization=True)
        if self.tokenizer is not None and self.is_main:
            save_tokenizer(self.tokenizer, out)

    # -- weights out, state in and out ------------------------------------------------------------------------

    def export_weights(self, out_dir: str | Path, version: int | None = None) -> Path:
        """Write the policy (and tokenizer) in HF format to out_dir/weights_v<version>, atomically.

        version defaults to `self.step`; pass the path and version to engine.update_weights_from_disk. The
        directory is written under a temporary name and renamed, so an engine never reads a partial one. Only the
        newest keep_exports exports are kept: call this after the engine finished loading the previous one.
        """
        version = self.step if version is None else version
        root = Path(out_dir)
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"{EXPORT_PREFIX}{version:08d}"
        temp = root / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        self._save_pretrained(temp)
        if not self.is_main:
            return final
        self._publish_export(temp, final)
        return final

    # -- weights to engines over a process group (engine.weight_sync.method: distributed) --------------------

    def weight_specs(self, dtype: str) -> list[TensorSpec]:
        """Name, dtype and full shape of every tensor the engines get (the model's state dict under its HF names),
        in the dtype they travel in."""
        return [TensorSpec(name, dtype, tuple(tensor.shape)) for name, tensor in self.model.state_dict().items()]

    def open_weight_group(
        self,
        master_addr: str,
        master_port: int,
        world_size: int,
        backend: str,
        timeout_s: float,
        group_name: str,
        socket_ifname: str | None = None,
    ) -> None:
        """Rank 0 hosts the weight group as its rank 0 (the engines join as ranks 1..world_size-1 meanwhile); the
        other ranks have no part in it. A group formed before is closed first."""
        if not self.is_main:
            return
        old = getattr(self, "_weight_group", None)
        if old is not None:
            old.close()
        backend_name: GroupBackend = "nccl" if backend == "nccl" else "gloo"
        self._weight_group = open_group(
            master_addr,
            master_port,
            0,
            world_size,
            backend_name,
            timeout_s,
            self.device,
            group_name=group_name,
            socket_ifname=socket_ifname,
        )

    def broadcast_weights(self, names: Sequence[str], dtype: str) -> int:
        """One bucket: every rank gathers each named tensor in full (a collective when sharded), rank 0 broadcasts
        them in order to the weight group; returns the bytes sent (0 on other ranks)."""
        state = self.model.state_dict()
        tensors = []
        for name in names:
            tensor = state[name]
            full = getattr(tensor, "full_tensor", None)
            tensors.append((full() if full is not None else tensor).detach().to(torch_dtype(dtype)))
        if not self.is_main:
            return 0
        group = getattr(self, "_weight_group", None)
        if group is None:
            raise RuntimeError("broadcast_weights before open_weight_group: there is no weight group")
        return send_tensors(group, tensors)

    def save_model(self, out_dir: str | Path) -> Path:
        """The policy (and tokenizer, when given) in Hugging Face format under out_dir, for the next stage."""
        if self.tokenizer is not None and self.ranks is None:
            return save_model_and_tokenizer(self.model, self.tokenizer, out_dir)
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self._save_pretrained(out)
        return out

    def save(self, checkpoint_dir: str | Path, position: StreamPosition, *, keep_last: int = 2) -> Path:
        """Checkpoint model, optimizer, global RNGs and step (swerl.train.checkpoint); returns its directory.

        position is the caller's task-stream position, stored as it is in the TrainerState that `load` returns.
        The reference model is not saved (it never changes).
        """
        state = TrainerState.at(self.step, self.seed, position)
        return save_checkpoint(checkpoint_dir, self.model, self.optimizer, state, self.tokenizer, keep_last, self.ranks)

    def load(self, path: str | Path, *, optimizer: bool = True) -> TrainerState:
        """Restore a checkpoint written by `save` (same model architecture and seed); returns its state.

        optimizer: also its AdamW state (moments, step counts); False keeps this trainer's fresh optimizer (a GRPO
        phase with reset_optimizer). Either way the optimizer then runs at this trainer's settings (lr, weight
        decay): a checkpoint's saved hyperparameters never override them, so a later phase's learning-rate drop
        takes effect while its moments carry on."""
        state = load_checkpoint(path, self.model, self.optimizer if optimizer else None, self.ranks)
        check_seed(state, self.seed, path)
        for group, (lr, weight_decay) in zip(self.optimizer.param_groups, self._hyperparameters, strict=True):
            group["lr"], group["weight_decay"] = lr, weight_decay
        self.step = state.step
        logger.info("GRPO: resumed from %s at step %d", path, state.step)
        return state
