"""The synchronous GRPO trainer of the torch backend: groups of trajectories in, one policy update out.

One `train_step` reads top to bottom: score the groups (advantages over valid attempts) -> lay the valid
trajectories out as right-padded (B, T) micro-batches (the loss's view; each forward packs a micro-batch's rows
padding-free and runs the LM head only at scored tokens) -> fix the old log-probs -> clipped, TIS-weighted policy
loss with gradient accumulation -> clip -> AdamW. `export_weights` hands the new policy to an engine
(`update_weights_from_disk`), `save`/`load` make a resumed run continue exactly. Plain constructor arguments only; a builder maps a config onto them.

Contracts worth knowing before changing anything:
- Invalid attempts. An infra_error trajectory (reward None) is excluded from its group's baseline and from the
  loss: it never enters a batch, so its tokens cannot touch the gradient. A group with fewer than two valid
  attempts has no baseline and is dropped (counted in `groups_dropped`).
- Alignment. `_logprobs` gives out[:, t] = log p(token t + 1 | tokens <= t), as `gather_logprobs` over full
  logits would, at the scored positions (0 elsewhere): the log-prob of token t comes from the logits at t - 1. A trajectory's behaviour_logprobs[t] and loss_mask[t] describe token t, so
  both are shifted by one (`[:, 1:]`) before they meet the trainer's log-probs. A first token is never scored.
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

import collections
import logging
import math
import shutil
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np
import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swerl.engine.weight_sync import GroupBackend, TensorSpec, open_group, send_tensors, torch_dtype
from swerl.model.loading import save_model_and_tokenizer
from swerl.model.tokenizer import save_tokenizer
from swerl.rollout.step import PolicyTrainer
from swerl.train.checkpoint import TrainerState, load_checkpoint, save_checkpoint
from swerl.train.distributed import RankContext, clip_gradients, full_state_dict, is_sharded, shard_model
from swerl.train.grpo import (
    ImportanceSums,
    ISLevel,
    PolicyLossStats,
    group_advantages,
    importance_sums,
    policy_loss,
    token_entropy,
    token_logprobs,
)
from swerl.train.packing import kept_logits, use_packed_attention
from swerl.train.sft import build_optimizer, seed_everything
from swerl.trajectory import EpisodeStatus, Trajectory

logger = logging.getLogger(__name__)

EXPORT_PREFIX = "weights_v"


# ----------------------------------------------------------------------------------------------------------------
# Scoring and batching: pure functions


@dataclass(frozen=True)
class ScoredGroups:
    """The valid trajectories of the kept groups with their advantages, and what scoring dropped."""

    trajectories: list[Trajectory]  # valid attempts of groups with a baseline, in group order
    advantages: list[float]  # one per trajectory
    groups_dropped: int  # fewer than two valid attempts
    groups_without_signal: int  # kept, but every valid attempt got the same reward (advantage 0)


def score_groups(groups: Sequence[Sequence[Trajectory]], scale_by_std: bool) -> ScoredGroups:
    """GRPO advantages per group over its valid (non-infra_error) attempts; invalid attempts are left out."""
    trajectories: list[Trajectory] = []
    advantages: list[float] = []
    dropped = without_signal = 0
    for group in groups:
        valid = [trajectory.reward is not None for trajectory in group]
        rewards = [trajectory.reward if trajectory.reward is not None else math.nan for trajectory in group]
        scored = group_advantages(rewards, valid, scale_by_std=scale_by_std)
        if scored.dropped:
            dropped += 1
            continue
        without_signal += not scored.has_signal
        for trajectory, is_valid, advantage in zip(group, valid, scored.advantages.tolist(), strict=True):
            if is_valid:
                trajectories.append(trajectory)
                advantages.append(advantage)
    return ScoredGroups(trajectories, advantages, dropped, without_signal)


@dataclass(frozen=True)
class MicroBatch:
    """Right-padded trajectories; every tensor is (B, T) and indexed like the trajectories' token arrays."""

    input_ids: Tensor  # (B, T) int64; padding holds pad_token_id
    loss_mask: Tensor  # (B, T) float32; 1 on sampled tokens, 0 on prompt, observations and padding
    behaviour_logprobs: Tensor  # (B, T) float32; the engine's log-prob of token t, 0 off the mask
    advantages: Tensor  # (B, T) float32; the trajectory's advantage on its sampled tokens, 0 elsewhere
    lengths: Tensor  # (B,) int64; real tokens of each row (the rest is padding)

    def to(self, device: torch.device) -> MicroBatch:
        return MicroBatch(*(tensor.to(device) for tensor in vars(self).values()))

    @property
    def num_loss_tokens(self) -> int:
        """Tokens scored by the loss: sampled tokens after the first position (see the module docstring)."""
        return int(self.loss_mask[:, 1:].sum())


def collate(trajectories: Sequence[Trajectory], advantages: Sequence[float], pad_token_id: int) -> MicroBatch:
    """Lay trajectories out as a right-padded (B, T) micro-batch with per-token advantages.

    The (B, T) arrays are the loss's view; the torch trainer's forward packs the rows padding-free (`_logprobs`).
    """
    length = max(len(trajectory.token_ids) for trajectory in trajectories)
    shape = (len(trajectories), length)
    input_ids = torch.full(shape, pad_token_id, dtype=torch.long)
    loss_mask = torch.zeros(shape)
    behaviour = torch.zeros(shape)
    for row, trajectory in enumerate(trajectories):
        end = len(trajectory.token_ids)
        input_ids[row, :end] = torch.tensor(trajectory.token_ids)
        loss_mask[row, :end] = torch.tensor(trajectory.loss_mask, dtype=torch.float32)
        behaviour[row, :end] = torch.tensor(trajectory.behaviour_logprobs, dtype=torch.float32)
    per_row = torch.tensor(list(advantages), dtype=torch.float32).unsqueeze(-1)  # (B, 1)
    lengths = torch.tensor([len(trajectory.token_ids) for trajectory in trajectories], dtype=torch.long)
    return MicroBatch(input_ids, loss_mask, behaviour, per_row * loss_mask, lengths)


def sequence_mean_scales(loss_tokens: Sequence[int]) -> list[float]:
    """Per-trajectory advantage factors that turn the token-mean loss into the sequence mean.

    The token mean (DAPO) sums every scored token of a minibatch and divides by their count, so a trajectory weighs
    in proportion to its length: in a GRPO group whose failed attempts ran to the turn cap, the failures' tokens
    outnumber the success's, and tokens they share (the tool-call format) get a net push down. The sequence mean
    (the original GRPO) averages each trajectory's token mean: every trajectory weighs the same, and a group's
    advantages, which sum to zero, cancel on what its attempts share. With c_i = total / (N * L_i) for trajectory
    i of L_i scored tokens among N trajectories of `total` tokens, sum_i c_i A_i sum_t pg_it / total equals
    (1 / N) sum_i A_i sum_t pg_it / L_i; c_i > 0, so no clipping decision changes. A trajectory with no scored
    token gets 0.
    """
    total, count = sum(loss_tokens), len(loss_tokens)
    return [total / (count * tokens) if tokens > 0 else 0.0 for tokens in loss_tokens]


def plan_micro_batches(lengths: Sequence[int], micro_batch_tokens: int) -> list[list[int]]:
    """Indices of rows per micro-batch, longest first, so that rows x longest row <= micro_batch_tokens.

    A row longer than micro_batch_tokens gets a micro-batch of its own.
    """
    order = sorted(range(len(lengths)), key=lambda index: (-lengths[index], index))
    plan: list[list[int]] = []
    for index in order:
        if plan and (len(plan[-1]) + 1) * lengths[plan[-1][0]] <= micro_batch_tokens:
            plan[-1].append(index)
        else:
            plan.append([index])
    return plan


def rollout_stats(groups: Sequence[Sequence[Trajectory]], scored: ScoredGroups) -> dict[str, float]:
    """Rewards, statuses and infrastructure errors of the groups as sampled (before any update)."""
    everything = [trajectory for group in groups for trajectory in group]
    valid = [trajectory for trajectory in everything if trajectory.reward is not None]
    statuses = collections.Counter(trajectory.status.value for trajectory in everything)
    causes = collections.Counter(
        trajectory.infra_cause or "unknown"
        for trajectory in everything
        if trajectory.status is EpisodeStatus.INFRA_ERROR
    )
    count = max(1, len(valid))
    stats: dict[str, float] = {
        "groups": float(len(groups)),
        "groups_dropped": float(scored.groups_dropped),
        "groups_without_signal": float(scored.groups_without_signal),
        "trajectories": float(len(everything)),
        "trajectories_trained": float(len(scored.trajectories)),
        "reward_mean": sum(trajectory.reward or 0.0 for trajectory in valid) / count,
        "resolved_rate": statuses[EpisodeStatus.RESOLVED.value] / count,
        "response_tokens_mean": sum(trajectory.sampled_tokens for trajectory in valid) / count,
        "turns_mean": sum(trajectory.num_turns for trajectory in valid) / count,
        "infra_errors": float(sum(causes.values())),
    }
    stats.update({f"status/{status.value}": float(statuses[status.value]) for status in EpisodeStatus})
    stats.update({f"infra_error/{cause}": float(number) for cause, number in sorted(causes.items())})
    return stats


# ----------------------------------------------------------------------------------------------------------------
# The trainer


LossAggregation = Literal["token_mean", "sequence_mean"]


class Trainer(PolicyTrainer, Protocol):
    """What the GRPO stage needs of a trainer (the loops' PolicyTrainer plus state in and out): GRPOTrainer in this
    process, or a TrainerProcess serving one."""

    def save(
        self,
        checkpoint_dir: str | Path,
        *,
        epoch: int = 0,
        example_index: int = 0,
        num_examples: int = 0,
        data_fingerprint: str = "",
        keep_last: int = 2,
    ) -> Path: ...

    def load(self, path: str | Path, *, optimizer: bool = True) -> TrainerState: ...

    def save_model(self, out_dir: str | Path) -> Path: ...


@dataclass(frozen=True)
class UpdateSettings:
    """How one GRPO step updates the policy; every field required (grpo.algorithm maps onto it, field by field).

    lr, weight_decay: AdamW (weight decay on matrices only, as in SFT).
    grad_clip: max total gradient norm; None measures without clipping.
    clip_eps_low, clip_eps_high: PPO ratio clip range [1 - low, 1 + high] (DAPO's clip-higher when high > low).
    tis_cap: truncation of the importance weight exp(old - behaviour) against the engine's log-probs.
    tis_level: "token" (each token's weight) or "sequence" (the product over the trajectory).
    mis_low, mis_high: masked importance sampling bounds (None: off); mis_level as tis_level.
    kl_coef: weight of the k3 KL penalty against the trainer's ref_model (ignored without one).
    scale_adv_by_std: divide advantages by the group's reward std (GRPO) or not (Dr. GRPO).
    loss_aggregation: "token_mean" (every scored token of a minibatch weighs the same, DAPO) or "sequence_mean"
        (every trajectory weighs the same; sequence_mean_scales). The KL term stays a token mean.
    micro_batch_tokens: most padded tokens (rows x longest row) in one forward/backward; the forward computes
        only the real ones (`GRPOTrainer._logprobs`).
    ppo_epochs, num_minibatches: optimizer updates per step = ppo_epochs x num_minibatches; old log-probs are
        fixed before the first.
    """

    lr: float
    weight_decay: float
    grad_clip: float | None
    clip_eps_low: float
    clip_eps_high: float
    tis_cap: float
    tis_level: ISLevel
    mis_low: float
    mis_high: float | None
    mis_level: ISLevel
    kl_coef: float
    scale_adv_by_std: bool
    loss_aggregation: LossAggregation
    micro_batch_tokens: int
    ppo_epochs: int
    num_minibatches: int

    def __post_init__(self) -> None:
        if self.micro_batch_tokens < 2 or self.ppo_epochs < 1 or self.num_minibatches < 1:
            raise ValueError(
                f"need micro_batch_tokens >= 2 ({self.micro_batch_tokens}), ppo_epochs >= 1 ({self.ppo_epochs}) "
                f"and num_minibatches >= 1 ({self.num_minibatches})"
            )
        if self.loss_aggregation not in ("token_mean", "sequence_mean"):
            raise ValueError(
                f"loss_aggregation must be token_mean or sequence_mean, not {self.loss_aggregation!r}"
            )


class GRPOTrainer:
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
        if (
            ranks is not None
        ):  # sharded here unless the caller loaded it sharded (distributed.load_sharded_model)
            model = model if is_sharded(model) else shard_model(model, ranks)
            if ref_model is not None and not is_sharded(ref_model):
                ref_model = shard_model(ref_model, ranks, trainable=False)
        self.settings = settings
        self.model = use_packed_attention(model).train()
        self.optimizer = build_optimizer(model, settings.lr, settings.weight_decay, betas, adam_eps)
        # (lr, weight decay) per parameter group as these settings build them: restored after a checkpoint loads
        self._hyperparameters = [(g["lr"], g["weight_decay"]) for g in self.optimizer.param_groups]
        self.grad_clip = settings.grad_clip
        self.clip_eps_low, self.clip_eps_high = settings.clip_eps_low, settings.clip_eps_high
        self.tis_cap, self.tis_level = settings.tis_cap, settings.tis_level
        self.mis_low, self.mis_high, self.mis_level = settings.mis_low, settings.mis_high, settings.mis_level
        self.ref_model = (
            use_packed_attention(ref_model).eval().requires_grad_(False) if ref_model is not None else None
        )
        self.kl_coef = settings.kl_coef if ref_model is not None else 0.0
        self.scale_adv_by_std = settings.scale_adv_by_std
        self.loss_aggregation = settings.loss_aggregation
        self.micro_batch_tokens = settings.micro_batch_tokens
        self.ppo_epochs, self.num_minibatches = settings.ppo_epochs, settings.num_minibatches
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

    # -- one step ---------------------------------------------------------------------------------------------

    def train_step(self, groups: Sequence[Sequence[Trajectory]]) -> dict[str, float]:
        """One GRPO step on groups of attempts (one group per task); returns its statistics.

        The loops (rollout/sync_loop.py, async_loop.py) never send a batch whose groups would all be dropped: such
        a batch is not a step, and `grpo.schedule.max_empty_steps` of them in a row fail the stage. Called with one
        anyway, it makes no update but still counts (self.step, the weight version, advances). Rollout statistics (reward_mean,
        resolved_rate, response_tokens_mean, turns_mean) are over every valid attempt, dropped groups included.
        """
        started = time.perf_counter()
        scored = score_groups(groups, self.scale_adv_by_std)
        self._scored = [(trajectory.group_id, trajectory.attempt) for trajectory in scored.trajectories]
        stats = rollout_stats(groups, scored)
        minibatches = self._minibatches(scored)  # [minibatch][micro-batch]
        micro_batches = [micro for minibatch in minibatches for micro in minibatch]
        observed = _Observed(self.tis_cap)
        mine = self._my_micro_batches(len(micro_batches))

        recompute_started = time.perf_counter()
        old, reference = self._fixed_logprobs(micro_batches, mine, observed)
        recompute_seconds = time.perf_counter() - recompute_started

        update_started = time.perf_counter()
        updates: list[tuple[float, float]] = []  # (loss, pre-clip grad norm) per optimizer update
        for _ in range(self.ppo_epochs):
            position = 0  # micro-batches are numbered across the minibatches, as _fixed_logprobs numbers them
            for minibatch in minibatches:
                updates.append(self._update(minibatch, position, mine, old, reference, observed))
                position += len(minibatch)
        update_seconds = time.perf_counter() - update_started

        self.step += 1
        if self.ranks is not None:
            observed.reduce(self.ranks)
        stats.update(observed.summary(len(updates)))
        stats.update(
            loss=sum(loss for loss, _ in updates) / max(1, len(updates)),
            grad_norm=sum(norm for _, norm in updates) / max(1, len(updates)),
            optimizer_updates=float(len(updates)),
            micro_batches=float(len(micro_batches)),
            loss_tokens=float(sum(micro.num_loss_tokens for micro in micro_batches)),
            step=float(self.step),
            time_logprob_recompute_s=recompute_seconds,
            time_update_s=update_seconds,
            time_step_s=time.perf_counter() - started,
        )
        return stats

    def scored_attempts(self) -> list[tuple[str, int]]:
        """(group_id, attempt) of every trajectory the last train_step put in a group baseline and the loss: the
        trainer's own account, which the async loop keeps in the ledger so that a run can be audited against its
        journal (benchmarks/chaos.py checks that no infra_error attempt is among them)."""
        return list(self._scored)

    @property
    def _single_update(self) -> bool:
        return self.ppo_epochs * self.num_minibatches == 1

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

    def _fixed_logprobs(
        self, micro_batches: Sequence[MicroBatch], mine: set[int], observed: _Observed
    ) -> tuple[dict[int, Tensor], dict[int, Tensor]]:
        """Old (and reference) log-probs per micro-batch, fixed before the first update. With a single update the
        old log-probs come from the update's own forward pass instead (same weights, one pass saved): `_update`
        fills them in. Sharded: this rank's micro-batches only (plus its share of zero passes)."""
        old: dict[int, Tensor] = {}
        reference: dict[int, Tensor] = {}
        if not micro_batches:
            return old, reference
        for index, real in self._passes(range(len(micro_batches)), mine):
            micro = micro_batches[index]
            if self.ref_model is not None:
                ref = self._logprobs(self.ref_model, micro, grad=False)[0]
                if real:
                    reference[index] = ref
            if not self._single_update:
                logprobs, logits = self._logprobs(self.model, micro, grad=False)
                if real:
                    old[index] = logprobs
                    observed.add(micro, old[index], logits, self.logprob_temperature)
        return old, reference

    def _update(
        self,
        minibatch: Sequence[MicroBatch],
        first_index: int,
        mine: set[int],
        old: dict[int, Tensor],
        reference: dict[int, Tensor],
        observed: _Observed,
    ) -> tuple[float, float]:
        """One optimizer update on a minibatch, accumulated over its micro-batches; returns (loss, grad norm).

        Sharded: this rank's micro-batches, the loss scaled by the world size (FSDP2 averages gradients over
        ranks: the average of N x each rank's gradient is the one-process gradient), zero passes to even out."""
        normalizer = float(max(1, sum(micro.num_loss_tokens for micro in minibatch)))
        scale = float(self.ranks.world_size) if self.ranks is not None else 1.0
        self.optimizer.zero_grad(set_to_none=True)
        update_loss = 0.0
        indices = range(first_index, first_index + len(minibatch))
        for index, real in self._passes(indices, mine):
            micro = minibatch[index - first_index]
            logprobs, logits = self._logprobs(self.model, micro, grad=True)  # (B, T-1), (K, V)
            if not real:  # a zero pass: the same collectives, no gradient, nothing recorded
                (logprobs.sum() * 0.0).backward()
                continue
            if self._single_update:
                old[index] = logprobs.detach()
                observed.add(micro, old[index], logits, self.logprob_temperature)
            # Shift the per-token arrays by one: logprobs[:, t] is the log-prob of token t + 1.
            loss, loss_stats = policy_loss(
                logprobs,
                old[index],
                micro.behaviour_logprobs[:, 1:],
                micro.advantages[:, 1:],
                micro.loss_mask[:, 1:],
                self.clip_eps_low,
                self.clip_eps_high,
                self.tis_cap,
                ref_logprobs=reference.get(index),
                kl_coef=self.kl_coef,
                normalizer=normalizer,
                tis_level=self.tis_level,
                mis_low=self.mis_low,
                mis_high=self.mis_high,
                mis_level=self.mis_level,
            )
            (loss * scale).backward()
            update_loss += float(loss.detach())
            observed.add_loss(loss_stats)
        if self.ranks is not None:
            update_loss = self.ranks.sum([update_loss])[0]
        return update_loss, self._optimizer_step()

    def _minibatches(self, scored: ScoredGroups) -> list[list[MicroBatch]]:
        """Split the step's trajectories into num_minibatches random parts, each into micro-batches."""
        count = len(scored.trajectories)
        if count == 0:
            return []
        order = np.random.default_rng([self.seed, self.step]).permutation(count).tolist()
        parts = [order[part :: self.num_minibatches] for part in range(self.num_minibatches)]
        minibatches = []
        for part in parts:
            if not part:
                continue
            lengths = [len(scored.trajectories[index].token_ids) for index in part]
            plan = plan_micro_batches(lengths, self.micro_batch_tokens)
            advantages = [scored.advantages[index] for index in part]
            if self.loss_aggregation == "sequence_mean":
                # scored tokens as MicroBatch.num_loss_tokens counts them (the first position is never scored)
                tokens = [sum(scored.trajectories[index].loss_mask[1:]) for index in part]
                advantages = [a * c for a, c in zip(advantages, sequence_mean_scales(tokens), strict=True)]
            minibatches.append(
                [
                    collate(
                        [scored.trajectories[part[row]] for row in rows],
                        [advantages[row] for row in rows],
                        self.pad_token_id,
                    ).to(self.device)
                    for rows in plan
                ]
            )
        return minibatches

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
            logits = kept_logits(
                model, micro.input_ids[real].unsqueeze(0), positions, keep, self.bf16
            )  # (K, V)
            selected = token_logprobs(
                logits, micro.input_ids[:, 1:][scored], self.logprob_temperature
            )  # (K,)
            logprobs = torch.zeros(scored.shape, dtype=selected.dtype, device=selected.device)
            logprobs = logprobs.index_put(scored.nonzero(as_tuple=True), selected)  # (B, T-1)
        return logprobs, logits

    def _optimizer_step(self) -> float:
        """Clip, step; returns the total gradient norm before clipping."""
        grad_norm = clip_gradients(list(self.model.parameters()), self.grad_clip)
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
        if final.exists():
            shutil.rmtree(final)
        temp.rename(final)
        exports = sorted(path for path in root.glob(f"{EXPORT_PREFIX}*") if path.is_dir())
        for old in exports[: -self.keep_exports]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    # -- weights to engines over a process group (engine.weight_sync.method: distributed) --------------------

    def weight_specs(self, dtype: str) -> list[TensorSpec]:
        """Name, dtype and full shape of every tensor the engines get (the model's state dict under its HF names),
        in the dtype they travel in."""
        return [
            TensorSpec(name, dtype, tuple(tensor.shape)) for name, tensor in self.model.state_dict().items()
        ]

    def open_weight_group(
        self, master_addr: str, master_port: int, world_size: int, backend: str, timeout_s: float,
        group_name: str, socket_ifname: str | None = None,
    ) -> None:  # fmt: skip
        """Rank 0 hosts the weight group as its rank 0 (the engines join as ranks 1..world_size-1 meanwhile); the
        other ranks have no part in it. A group formed before is closed first."""
        if not self.is_main:
            return
        old = getattr(self, "_weight_group", None)
        if old is not None:
            old.close()
        backend_name: GroupBackend = "nccl" if backend == "nccl" else "gloo"
        self._weight_group = open_group(
            master_addr, master_port, 0, world_size, backend_name, timeout_s, self.device,
            group_name=group_name, socket_ifname=socket_ifname,
        )  # fmt: skip

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
        """Checkpoint model, optimizer, global RNGs and step (swerl.train.checkpoint); returns its directory.

        epoch, example_index, num_examples and data_fingerprint are the caller's task-stream position, stored as
        they are in the TrainerState that `load` returns. The reference model is not saved (it never changes).
        """
        state = TrainerState(self.step, epoch, example_index, self.seed, num_examples, data_fingerprint)
        return save_checkpoint(
            checkpoint_dir, self.model, self.optimizer, state, self.tokenizer, keep_last, self.ranks
        )

    def load(self, path: str | Path, *, optimizer: bool = True) -> TrainerState:
        """Restore a checkpoint written by `save` (same model architecture and seed); returns its state.

        optimizer: also its AdamW state (moments, step counts); False keeps this trainer's fresh optimizer (a GRPO
        phase with reset_optimizer). Either way the optimizer then runs at this trainer's settings (lr, weight
        decay): a checkpoint's saved hyperparameters never override them, so a later phase's learning-rate drop
        takes effect while its moments carry on."""
        state = load_checkpoint(path, self.model, self.optimizer if optimizer else None, self.ranks)
        if state.shuffle_seed != self.seed:
            raise ValueError(
                f"checkpoint {path} was trained with seed {state.shuffle_seed}, this run has {self.seed}"
            )
        for group, (lr, weight_decay) in zip(self.optimizer.param_groups, self._hyperparameters, strict=True):
            group["lr"], group["weight_decay"] = lr, weight_decay
        self.step = state.step
        logger.info("GRPO: resumed from %s at step %d", path, state.step)
        return state


class _Observed:
    """Sums over a step, per scored token: entropy and the trainer-engine mismatch (ImportanceSums, recorded once
    per micro-batch, when its old log-probs are fixed) and the loss diagnostics (recorded at every micro-step)."""

    def __init__(self, tis_cap: float) -> None:
        self.tis_cap = tis_cap
        self.mismatch = ImportanceSums()
        self.entropy = 0.0
        self.step_tokens = self.clipped = self.pg_loss = self.kl = self.mis_masked = 0.0

    @torch.no_grad()
    def add(self, micro: MicroBatch, old: Tensor, logits: Tensor, temperature: float) -> None:
        """logits (K, V): at the micro-batch's K scored tokens (GRPOTrainer._logprobs), where entropy is taken."""
        mask = micro.loss_mask[:, 1:]  # (B, T-1): the scored tokens, shifted like old
        self.entropy += float(token_entropy(logits.detach().float() / temperature).sum())
        self.mismatch += importance_sums(old, micro.behaviour_logprobs[:, 1:], mask, self.tis_cap)

    def add_loss(self, stats: PolicyLossStats) -> None:
        self.step_tokens += stats.num_tokens
        self.clipped += stats.clip_fraction * stats.num_tokens
        self.mis_masked += stats.mis_mask_fraction * stats.num_tokens
        self.pg_loss += stats.pg_loss  # already divided by the minibatch's tokens: sums to its mean
        self.kl += stats.kl

    def reduce(self, ranks: RankContext) -> None:
        """Every sum over all ranks (each rank recorded its own micro-batches)."""
        m = self.mismatch
        names = [name for name in vars(m) if isinstance(getattr(m, name), float | int)]
        local = [self.entropy, self.step_tokens, self.clipped, self.pg_loss, self.kl, self.mis_masked]
        total = ranks.sum(local + [float(getattr(m, name)) for name in names])
        self.entropy, self.step_tokens, self.clipped, self.pg_loss, self.kl, self.mis_masked = total[:6]
        for name, value in zip(names, total[6:], strict=True):
            setattr(m, name, type(getattr(m, name))(value))

    def summary(self, num_updates: int) -> dict[str, float]:
        updates = max(1, num_updates)
        return {
            "entropy_mean": self.entropy / max(1.0, self.mismatch.tokens),
            "logprob_diff_mean": self.mismatch.logprob_diff_mean,
            "ess_ratio": self.mismatch.ess_ratio,
            "tis_clip_fraction": self.mismatch.over_cap_fraction,
            "clip_fraction": self.clipped / max(1.0, self.step_tokens),
            "mis_mask_fraction": self.mis_masked / max(1.0, self.step_tokens),
            "pg_loss": self.pg_loss / updates,
            "kl": self.kl / updates,
        }
