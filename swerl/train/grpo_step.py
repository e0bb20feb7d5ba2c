"""One GRPO step, whatever the backend: scoring, batching, the update settings and the step's skeleton.

The torch trainer (swerl.train.grpo_trainer.GRPOTrainer: one process or FSDP2 ranks) and the megatron trainer
(swerl.train.megatron_backend.MegatronGRPOTrainer) share everything here and differ only in how a forward,
backward and optimizer step run on their model. `BaseGRPOTrainer.train_step` reads top to bottom: score the
groups (advantages over valid attempts) -> split the valid trajectories into minibatches drawn from (seed, step),
each laid out as right-padded (B, T) micro-batches -> fix the old log-probs (`_fixed_logprobs`) -> one optimizer
update per minibatch and PPO epoch (`_update`: the clipped, TIS-weighted policy loss with gradient accumulation,
then the optimizer step) -> the step's sums over ranks (`_reduce`) -> the statistics, with the same names on both
backends.

`Trainer` is what the GRPO stage needs of a trainer: these two, or a process (or ranks) serving one
(swerl.train.trainer_process.RemoteTrainer). Its `save(checkpoint_dir, position)` takes the caller's task-stream
position as one record (swerl.train.checkpoint.StreamPosition).
"""

from __future__ import annotations

import abc
import collections
import math
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Literal, Protocol, TypeVar

import numpy as np
import torch
from torch import Tensor

from swerl.rollout.step import PolicyTrainer
from swerl.train.checkpoint import StreamPosition, TrainerState
from swerl.train.grpo import ImportanceSums, ISLevel, LossSettings, PolicyLossStats, group_advantages
from swerl.trajectory import EpisodeStatus, Trajectory

EXPORT_PREFIX = "weights_v"


class Trainer(PolicyTrainer, Protocol):
    """What the GRPO stage needs of a trainer (the loops' PolicyTrainer plus state in and out): GRPOTrainer or
    MegatronGRPOTrainer in this process, or a TrainerProcess (or ranks) serving one."""

    def save(self, checkpoint_dir: str | Path, position: StreamPosition, *, keep_last: int = 2) -> Path:
        """Checkpoint the trainer with the caller's data-stream position (stored as is in the TrainerState that
        `load` returns); the newest keep_last checkpoints are kept; returns the checkpoint's directory."""
        ...

    def load(self, path: str | Path, *, optimizer: bool = True) -> TrainerState: ...

    def save_model(self, out_dir: str | Path) -> Path: ...


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
        """Tokens scored by the loss: sampled tokens after the first position (a first token is never scored)."""
        return int(self.loss_mask[:, 1:].sum())


def collate(trajectories: Sequence[Trajectory], advantages: Sequence[float], pad_token_id: int) -> MicroBatch:
    """Lay trajectories out as a right-padded (B, T) micro-batch with per-token advantages.

    The (B, T) arrays are the loss's view; the torch trainer's forward packs the rows padding-free
    (GRPOTrainer._logprobs), megatron's shifts them (megatron_settings.token_arrays).
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


LossAggregation = Literal["token_mean", "sequence_mean"]


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
    micro_batch_tokens: most padded tokens (rows x longest row) in one forward/backward; the torch forward computes
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
            raise ValueError(f"loss_aggregation must be token_mean or sequence_mean, not {self.loss_aggregation!r}")

    def loss_settings(self, reference: bool) -> LossSettings:
        """The loss's part, as policy_loss takes it; without a reference model (`reference` False) no KL term."""
        return LossSettings(
            clip_eps_low=self.clip_eps_low,
            clip_eps_high=self.clip_eps_high,
            tis_cap=self.tis_cap,
            tis_level=self.tis_level,
            mis_low=self.mis_low,
            mis_high=self.mis_high,
            mis_level=self.mis_level,
            kl_coef=self.kl_coef if reference else 0.0,
        )

    @property
    def single_update(self) -> bool:
        """One optimizer update per step: the old log-probs come from that update's own forward pass."""
        return self.ppo_epochs * self.num_minibatches == 1


def split_minibatches(
    scored: ScoredGroups, settings: UpdateSettings, seed: int, step: int, pad_token_id: int
) -> list[list[MicroBatch]]:
    """The step's trajectories in num_minibatches parts drawn from (seed, step) by their own generator, each
    planned into micro-batches of at most micro_batch_tokens padded tokens (on the CPU); sequence-mean factors on
    the advantages where asked."""
    count = len(scored.trajectories)
    if count == 0:
        return []
    parts_wanted = settings.num_minibatches
    order = np.random.default_rng([seed, step]).permutation(count).tolist()
    parts = [order[part::parts_wanted] for part in range(parts_wanted)]
    minibatches = []
    for part in parts:
        if not part:
            continue
        lengths = [len(scored.trajectories[index].token_ids) for index in part]
        plan = plan_micro_batches(lengths, settings.micro_batch_tokens)
        advantages = [scored.advantages[index] for index in part]
        if settings.loss_aggregation == "sequence_mean":
            # scored tokens as MicroBatch.num_loss_tokens counts them (the first position is never scored)
            tokens = [sum(scored.trajectories[index].loss_mask[1:]) for index in part]
            advantages = [a * c for a, c in zip(advantages, sequence_mean_scales(tokens), strict=True)]
        minibatches.append(
            [
                collate(
                    [scored.trajectories[part[row]] for row in rows],
                    [advantages[row] for row in rows],
                    pad_token_id,
                )
                for rows in plan
            ]
        )
    return minibatches


# ----------------------------------------------------------------------------------------------------------------
# The step skeleton


_MISMATCH_FIELDS = ("tokens", "abs_log_weight", "weight", "weight_square", "over_cap")


@dataclass
class StepSums:
    """A rank's sums over the scored tokens of one step, added over ranks at its end (`_reduce`): entropy and the
    trainer-engine mismatch (recorded once per micro-batch, when its old log-probs are fixed) and the loss
    diagnostics (recorded at every micro-step of every update)."""

    entropy: float = 0.0
    tokens: float = 0.0  # tokens the loss scored, summed over updates
    clipped: float = 0.0
    mis_masked: float = 0.0
    pg_loss: float = 0.0  # each micro-step's (already divided by its minibatch's tokens: sums to its mean)
    kl: float = 0.0
    loss: float = 0.0  # after _reduce: the sum over updates of each update's loss
    mismatch: ImportanceSums = field(default_factory=ImportanceSums)

    def add_loss(self, stats: PolicyLossStats) -> None:
        self.tokens += stats.num_tokens
        self.clipped += stats.clip_fraction * stats.num_tokens
        self.mis_masked += stats.mis_mask_fraction * stats.num_tokens
        self.pg_loss += stats.pg_loss
        self.kl += stats.kl

    def _names(self, with_loss: bool) -> list[str]:
        return ["entropy", "tokens", "clipped", "mis_masked", "pg_loss", "kl"] + (["loss"] if with_loss else [])

    def vector(self, with_loss: bool) -> list[float]:
        """Every sum (`loss` only with_loss), the mismatch's last: what a reduction over ranks adds up."""
        names = self._names(with_loss)
        return [float(getattr(self, name)) for name in names] + [
            float(getattr(self.mismatch, name)) for name in _MISMATCH_FIELDS
        ]

    def load(self, values: Sequence[float], with_loss: bool) -> None:
        """Set the sums from `vector`'s layout (the reduced values)."""
        names = self._names(with_loss)
        for name, value in zip(names, values[: len(names)], strict=True):
            setattr(self, name, float(value))
        for name, value in zip(_MISMATCH_FIELDS, values[len(names) :], strict=True):
            setattr(self.mismatch, name, float(value))

    def summary(self, num_updates: int) -> dict[str, float]:
        updates = max(1, num_updates)
        return {
            "entropy_mean": self.entropy / max(1.0, self.mismatch.tokens),
            "logprob_diff_mean": self.mismatch.logprob_diff_mean,
            "ess_ratio": self.mismatch.ess_ratio,
            "tis_clip_fraction": self.mismatch.over_cap_fraction,
            "clip_fraction": self.clipped / max(1.0, self.tokens),
            "mis_mask_fraction": self.mis_masked / max(1.0, self.tokens),
            "pg_loss": self.pg_loss / updates,
            "kl": self.kl / updates,
        }


FixedT = TypeVar("FixedT")


class BaseGRPOTrainer(abc.ABC, Generic[FixedT]):
    """The GRPO step both trainers run (see the module docstring); a backend supplies `_fixed_logprobs`, `_update`
    and `_reduce` on its model. FixedT: what `_fixed_logprobs` hands to every `_update` of the step.

    A subclass sets settings, loss_settings (settings.loss_settings), seed, pad_token_id, keep_exports, step (0)
    and _scored ([]) when it is built.
    """

    settings: UpdateSettings
    loss_settings: LossSettings
    seed: int
    pad_token_id: int
    keep_exports: int
    step: int  # train_step calls done; the version of the weights they produced
    _scored: list[tuple[str, int]]

    def train_step(self, groups: Sequence[Sequence[Trajectory]]) -> dict[str, float]:
        """One GRPO step on groups of attempts (one group per task); returns its statistics.

        The loops (rollout/sync_loop.py, async_loop.py) never send a batch whose groups would all be dropped: such
        a batch is not a step, and `grpo.schedule.max_empty_steps` of them in a row fail the stage. Called with one
        anyway, it makes no update but still counts (self.step, the weight version, advances). Rollout statistics
        (reward_mean, resolved_rate, response_tokens_mean, turns_mean) are over every valid attempt, dropped groups
        included. Sharded: every rank is called with the same groups and returns the same statistics.
        """
        started = time.perf_counter()
        scored = score_groups(groups, self.settings.scale_adv_by_std)
        self._scored = [(trajectory.group_id, trajectory.attempt) for trajectory in scored.trajectories]
        stats = rollout_stats(groups, scored)
        minibatches = self._minibatches(scored)  # [minibatch][micro-batch]
        micro_batches = [micro for minibatch in minibatches for micro in minibatch]
        sums = StepSums()

        recompute_started = time.perf_counter()
        fixed = self._fixed_logprobs(minibatches, sums)
        recompute_seconds = time.perf_counter() - recompute_started

        update_started = time.perf_counter()
        norms: list[float] = []  # pre-clip gradient norm per optimizer update
        for _ in range(self.settings.ppo_epochs):
            first = 0  # micro-batches are numbered across the minibatches, as _fixed_logprobs numbers them
            for minibatch in minibatches:
                norms.append(self._update(minibatch, first, fixed, sums))
                first += len(minibatch)
        update_seconds = time.perf_counter() - update_started

        self.step += 1
        self._reduce(sums)
        updates = max(1, len(norms))
        stats.update(sums.summary(len(norms)))
        stats.update(
            loss=sums.loss / updates,
            grad_norm=sum(norms) / updates,
            optimizer_updates=float(len(norms)),
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

    def _minibatches(self, scored: ScoredGroups) -> list[list[MicroBatch]]:
        """The step's minibatches of micro-batches (split_minibatches)."""
        return split_minibatches(scored, self.settings, self.seed, self.step, self.pad_token_id)

    @abc.abstractmethod
    def _fixed_logprobs(self, minibatches: Sequence[Sequence[MicroBatch]], sums: StepSums) -> FixedT:
        """Whatever the updates need fixed before the first (old and reference log-probs), recording entropy and the
        trainer-engine mismatch of each micro-batch whose old log-probs it fixes."""

    @abc.abstractmethod
    def _update(self, minibatch: Sequence[MicroBatch], first: int, fixed: FixedT, sums: StepSums) -> float:
        """One optimizer update on a minibatch (its micro-batches numbered from `first` in the step), its loss
        diagnostics and loss added to sums; returns the gradient norm before clipping."""

    @abc.abstractmethod
    def _reduce(self, sums: StepSums) -> None:
        """The step's sums added over all ranks (nothing in one process)."""

    def _publish_export(self, temp: Path, final: Path) -> None:
        """A written export renamed into place (replacing one of the same version); only the newest keep_exports
        exports are kept."""
        if final.exists():
            shutil.rmtree(final)
        temp.rename(final)
        exports = sorted(path for path in final.parent.glob(f"{EXPORT_PREFIX}*") if path.is_dir())
        for stale in exports[: -self.keep_exports]:
            shutil.rmtree(stale, ignore_errors=True)
