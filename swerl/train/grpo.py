"""GRPO math as pure functions: group advantages, next-token log-probs, entropy, and the clipped policy loss
with truncated importance sampling (TIS) against the inference engine's behaviour policy.

Three policies appear in an asynchronous step (all log-probs are per sampled token):
- behaviour: the engine that sampled the tokens (its weights may be several versions old, and its numerics
  differ from the trainer's);
- old: the trainer's log-probs at the start of the step, recomputed from the same weights as the engine's
  version where possible (for one optimizer step per batch, old == current, detached);
- current: the trainer's log-probs being optimised.
The PPO ratio current/old is clipped; the importance weight old/behaviour, detached, corrects for the gap between
trainer and engine (numerics, and the policy lag of an asynchronous step). Two corrections, each at token or
sequence level (a sequence's weight is the product of its tokens' weights):
- TIS (truncated importance sampling): the weight is capped at `tis_cap` and multiplies the token's loss;
- MIS (masked importance sampling): tokens (or whole sequences) whose weight leaves [mis_low, mis_high] get no
  loss at all, so a sample the trainer's policy would hardly have produced cannot dominate the step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

ISLevel = Literal["token", "sequence"]


@dataclass(frozen=True)
class GroupAdvantages:
    """Advantages of one GRPO group; `dropped` when fewer than two attempts were valid (no baseline)."""

    advantages: Tensor  # (G,) float32; 0 for invalid attempts and for dropped groups
    valid: Tensor  # (G,) bool; False for infrastructure-error attempts
    dropped: bool

    @property
    def has_signal(self) -> bool:
        """Whether any attempt gets a non-zero advantage (all-equal rewards teach nothing)."""
        return bool(self.advantages.abs().sum() > 0)


@dataclass(frozen=True)
class PolicyLossStats:
    """Diagnostics of one policy_loss call, each a mean over the loss-masked tokens."""

    num_tokens: int
    pg_loss: float  # the policy-gradient part of the loss (normalised like the loss)
    kl: float  # k3 estimate of KL(current || reference); 0 without a reference
    clip_fraction: float  # tokens whose PPO ratio was clipped (no gradient)
    ratio_mean: float  # current / old
    tis_mean: float  # truncated importance weight old / behaviour
    tis_clip_fraction: float  # tokens whose raw weight exceeded the cap
    logprob_diff_mean: float  # |old - behaviour|: trainer vs engine log-prob mismatch
    ess_ratio: float  # (sum w)^2 / (n sum w^2) of the raw weights; 1 when trainer and engine agree
    mis_mask_fraction: float = 0.0  # tokens masked out by MIS (their own or their sequence's weight out of bounds)


def group_advantages(
    rewards: Sequence[float] | Tensor,
    valid: Sequence[bool] | Tensor | None = None,
    scale_by_std: bool = False,
    eps: float = 1e-6,
) -> GroupAdvantages:
    """Per-group advantages reward - mean over valid attempts, optionally divided by (std + eps).

    Invalid attempts (infrastructure errors) get advantage 0 and are excluded from the mean and std, so the
    policy is never blamed for the infrastructure. std is the sample standard deviation (Bessel-corrected, as in
    DeepSeekMath's GRPO and TRL) over valid attempts. A group with fewer than two valid attempts has no baseline:
    all its advantages are 0 and it is reported as dropped.
    """
    reward_tensor = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)  # (G,)
    if valid is None:
        valid_mask = torch.ones_like(reward_tensor, dtype=torch.bool)
    else:
        valid_mask = torch.as_tensor(valid, dtype=torch.bool).reshape(-1)  # (G,)
    if valid_mask.shape != reward_tensor.shape:
        raise ValueError(f"rewards {tuple(reward_tensor.shape)} and valid {tuple(valid_mask.shape)} differ")
    num_valid = int(valid_mask.sum())
    if num_valid < 2:
        return GroupAdvantages(torch.zeros_like(reward_tensor, dtype=torch.float32), valid_mask, dropped=True)
    # Invalid rewards may be NaN or garbage: select before any arithmetic so they cannot leak in.
    valid_rewards = reward_tensor[valid_mask]  # (V,)
    centred = valid_rewards - valid_rewards.mean()
    if scale_by_std:
        centred = centred / (valid_rewards.std(correction=1) + eps)
    advantages = torch.zeros_like(reward_tensor)
    advantages[valid_mask] = centred
    return GroupAdvantages(advantages.to(torch.float32), valid_mask, dropped=False)


def gather_logprobs(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probs of the next tokens: out[:, t] = log p(tokens[:, t + 1] | tokens[:, : t + 1]).

    logits (B, T, V) from a causal LM on tokens (B, T); returns (B, T - 1). Masks and engine log-probs indexed
    by token position must be shifted the same way (`mask[:, 1:]`). Divide by the engine's sampling temperature
    so that trainer and engine log-probs describe the same distribution. Computed in float32 at least.
    """
    if logits.dim() != 3 or tokens.shape != logits.shape[:2]:
        raise ValueError(f"logits {tuple(logits.shape)} must be (B, T, V) over tokens {tuple(tokens.shape)}")
    return token_logprobs(logits[:, :-1], tokens[:, 1:], temperature)  # (B, T-1)


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """log p(target) under logits / temperature, position by position: logits (..., V), targets (...) -> (...).

    The computation gather_logprobs makes at every position, for logits already taken where their targets are
    (the torch trainer's LM head runs only at scored positions). Computed in float32 at least.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    scores = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature  # (..., V)
    # gather - logsumexp avoids materialising a second (..., V) tensor of log-softmax values.
    return scores.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scores, dim=-1)


def token_entropy(logits: Tensor) -> Tensor:
    """Entropy of the next-token distribution at every position: (B, T, V) -> (B, T), in float32 at least."""
    scores = logits.to(torch.promote_types(logits.dtype, torch.float32))
    log_probs = torch.log_softmax(scores, dim=-1)
    return -(log_probs.exp() * log_probs).sum(dim=-1)


@dataclass
class ImportanceSums:
    """Sums over scored tokens of the raw importance weight w = exp(old - behaviour), the trainer-engine mismatch.

    Sums, not means, so that micro-batches add up: a step's ESS is (sum w)^2 / (n sum w^2) over all of its tokens,
    not a mean of per-micro-batch ratios. policy_loss reports one call's, the trainer a whole step's.
    """

    tokens: float = 0.0
    abs_log_weight: float = 0.0  # sum |old - behaviour|
    weight: float = 0.0  # sum w
    weight_square: float = 0.0  # sum w^2
    over_cap: float = 0.0  # tokens whose w exceeds the TIS cap

    def __iadd__(self, other: ImportanceSums) -> ImportanceSums:
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)
        return self

    @property
    def logprob_diff_mean(self) -> float:
        return self.abs_log_weight / max(1.0, self.tokens)

    @property
    def ess_ratio(self) -> float:
        """1 when trainer and engine agree on every token; 1/n when one token carries all the weight."""
        return self.weight**2 / (self.tokens * self.weight_square) if self.weight_square > 0 else 1.0

    @property
    def over_cap_fraction(self) -> float:
        return self.over_cap / max(1.0, self.tokens)


@torch.no_grad()
def importance_sums(old: Tensor, behaviour: Tensor, mask: Tensor, tis_cap: float) -> ImportanceSums:
    """ImportanceSums of the tokens where mask is 1 (old, behaviour, mask: (B, T); off-mask fillers ignored)."""
    keep = mask.bool()
    log_weight = torch.where(keep, old - behaviour, 0.0)  # (B, T)
    weight = torch.where(keep, torch.exp(log_weight), 0.0)  # (B, T)
    return ImportanceSums(
        tokens=float(keep.sum()),
        abs_log_weight=float(log_weight.abs().sum()),
        weight=float(weight.sum()),
        weight_square=float((weight * weight).sum()),
        over_cap=float(((weight > tis_cap) & keep).sum()),
    )


def _masked_mean(values: Tensor, mask: Tensor, count: Tensor) -> float:
    return float((values * mask).sum() / count)


@dataclass(frozen=True)
class LossSettings:
    """What shapes policy_loss, as one record: built once from the resolved grpo.algorithm
    (UpdateSettings.loss_settings), held by the trainers and passed to every call. The defaults are the corrections
    switched off (token level, no MIS, no KL), grpo.algorithm's defaults too.

    clip_eps_low, clip_eps_high: the PPO ratio's clip range [1 - low, 1 + high].
    tis_cap: truncation of the importance weight exp(old - behaviour); tis_level token or sequence.
    mis_low, mis_high: masked importance sampling bounds (mis_high None: off); mis_level token or sequence.
    kl_coef: weight of the k3 KL penalty (used only where reference log-probs are given).
    """

    clip_eps_low: float
    clip_eps_high: float
    tis_cap: float
    tis_level: ISLevel = "token"
    mis_low: float = 0.0
    mis_high: float | None = None
    mis_level: ISLevel = "token"
    kl_coef: float = 0.0


def _check_loss_bounds(settings: LossSettings) -> None:
    clip_eps_low, clip_eps_high = settings.clip_eps_low, settings.clip_eps_high
    if not 0 <= clip_eps_low < 1 or clip_eps_high < 0:
        raise ValueError(f"need 0 <= clip_eps_low < 1 and clip_eps_high >= 0, got {clip_eps_low}, {clip_eps_high}")
    if settings.tis_cap <= 0:
        raise ValueError(f"tis_cap must be > 0, got {settings.tis_cap}")
    mis_low, mis_high = settings.mis_low, settings.mis_high
    if mis_high is not None and not 0 <= mis_low <= 1 <= mis_high:
        raise ValueError(f"need 0 <= mis_low <= 1 <= mis_high, got {mis_low}, {mis_high}")


def _importance_weights(token_log_weight: Tensor, settings: LossSettings) -> tuple[Tensor, Tensor, Tensor]:
    """From log(old / behaviour) per token (B, T): the TIS log-weight, the truncated weight, and the MIS keep-mask
    (all True without MIS), each (B, T), at token or sequence level (a row is one trajectory)."""
    sequence_log_weight = token_log_weight.sum(dim=-1, keepdim=True).expand_as(token_log_weight)  # (B, T)
    tis_log_weight = token_log_weight if settings.tis_level == "token" else sequence_log_weight
    # Capped in log space: a long sequence's product of weights may overflow exp().
    tis_weight = torch.exp(tis_log_weight.clamp(max=math.log(settings.tis_cap)))  # (B, T)
    if settings.mis_high is None:
        return tis_log_weight, tis_weight, torch.ones_like(token_log_weight, dtype=torch.bool)
    mis_log_weight = token_log_weight if settings.mis_level == "token" else sequence_log_weight
    low = math.log(settings.mis_low) if settings.mis_low > 0 else -math.inf
    return (
        tis_log_weight,
        tis_weight,
        (mis_log_weight >= low) & (mis_log_weight <= math.log(settings.mis_high)),
    )


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    behaviour_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    settings: LossSettings,
    ref_logprobs: Tensor | None = None,
    normalizer: float | None = None,
) -> tuple[Tensor, PolicyLossStats]:
    """Token-level clipped GRPO loss with truncated importance sampling and an optional k3 KL penalty.

    Per token t with ratio r = exp(logprobs - old_logprobs) and advantage A (eps_*, tis_cap, kl_coef, ... are
    `settings`' fields):
        pg_t = -w_t * min(r A, clip(r, 1 - eps_low, 1 + eps_high) A),  w_t = min(exp(old - behaviour), tis_cap)
        kl_t = exp(ref - logprobs) - (ref - logprobs) - 1   (k3, >= 0, unbiased for KL(current || ref))
        loss = sum_t mask_t (pg_t + kl_coef kl_t) / normalizer
    The weight w is detached. With tis_level="sequence", w_t = min(prod_s exp(old_s - behaviour_s), tis_cap) over
    the row's masked tokens (each row is one trajectory). With mis_high set, a token whose weight (mis_level
    "token") or whose row's weight (mis_level "sequence") is outside [mis_low, mis_high] is masked out of pg_t
    (it still counts in the normalizer: masking is not renormalisation). A token is clipped (gets no gradient) when
    A > 0 and r > 1 + eps_high, or A < 0 and r < 1 - eps_low; exactly on a boundary it is not clipped.

    Normalisation is token-level across the whole batch (as DAPO): every masked token weighs the same, so long
    trajectories are not down-weighted per token. `normalizer` defaults to the number of masked tokens here;
    with gradient accumulation pass the masked-token count of the whole optimizer batch to every micro-batch,
    so that the summed micro-batch losses equal the batch's token mean.

    Shapes: logprobs, old_logprobs, behaviour_logprobs, loss_mask, ref_logprobs (B, T); advantages (B,) or
    (B, T). old, behaviour and ref log-probs are treated as constants.
    """
    # Over 60 lines for its docstring, the loss's contract; the body is one pass: ratio and clip -> importance
    # weights -> policy-gradient term -> KL (the diagnostics are _loss_stats).
    _check_loss_bounds(settings)
    keep = loss_mask.bool()  # (B, T)
    mask = keep.to(logprobs.dtype)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)  # (B, 1): one advantage per trajectory
    advantages = torch.where(keep, advantages.to(logprobs.dtype), 0.0)  # (B, T)
    # Off-mask positions (prompt, tool output, padding) may hold fillers such as 0 or -inf: replace them by the
    # current log-probs so every intermediate stays finite and 0 * inf never turns the loss or gradient to NaN.
    current = logprobs.detach()
    old_logprobs = torch.where(keep, old_logprobs.detach(), current)
    behaviour_logprobs = torch.where(keep, behaviour_logprobs.detach(), current)
    num_tokens = mask.sum()
    denominator = torch.as_tensor(normalizer if normalizer is not None else num_tokens.clamp(min=1.0))

    ratio = torch.exp(logprobs - old_logprobs)  # (B, T)
    eps_low, eps_high = settings.clip_eps_low, settings.clip_eps_high
    clipped = ((advantages > 0) & (ratio > 1 + eps_high)) | ((advantages < 0) & (ratio < 1 - eps_low))
    # Value equals PPO's min(r A, clip(r) A); the clipped branch is a constant, so clipped tokens get no gradient.
    clipped_ratio = ratio.detach().clamp(1 - eps_low, 1 + eps_high)
    surrogate = torch.where(clipped, clipped_ratio, ratio) * advantages  # (B, T)

    token_log_weight = torch.where(keep, old_logprobs - behaviour_logprobs, 0.0)  # (B, T)
    tis_log_weight, tis_weight, mis_keep = _importance_weights(token_log_weight, settings)
    pg_per_token = torch.where(mis_keep, -tis_weight * surrogate, 0.0)  # (B, T)
    pg_loss = (pg_per_token * mask).sum() / denominator

    kl_value = torch.zeros((), dtype=logprobs.dtype)
    loss = pg_loss
    if ref_logprobs is not None:
        log_ratio_ref = torch.where(keep, ref_logprobs.detach(), current) - logprobs  # (B, T)
        kl_per_token = torch.exp(log_ratio_ref) - log_ratio_ref - 1
        kl_value = (kl_per_token * mask).sum() / denominator
        loss = loss + settings.kl_coef * kl_value

    per_token = (clipped, ratio, tis_log_weight, tis_weight, mis_keep)
    return loss, _loss_stats(mask, num_tokens, pg_loss, kl_value, per_token, old_logprobs, behaviour_logprobs, settings)


@torch.no_grad()
def _loss_stats(
    mask: Tensor,
    num_tokens: Tensor,
    pg_loss: Tensor,
    kl_value: Tensor,
    per_token: tuple[Tensor, Tensor, Tensor, Tensor, Tensor],
    old_logprobs: Tensor,
    behaviour_logprobs: Tensor,
    settings: LossSettings,
) -> PolicyLossStats:
    """policy_loss's diagnostics, each a mean over the masked tokens; per_token: its (clipped, ratio, TIS log-weight,
    TIS weight, MIS keep-mask), each (B, T)."""
    clipped, ratio, tis_log_weight, tis_weight, mis_keep = per_token
    tis_cap = settings.tis_cap
    count = num_tokens.clamp(min=1.0)
    mismatch = importance_sums(old_logprobs, behaviour_logprobs, mask, tis_cap)
    return PolicyLossStats(
        num_tokens=int(num_tokens),
        pg_loss=float(pg_loss.detach()),
        kl=float(kl_value.detach()),
        clip_fraction=_masked_mean(clipped.to(mask.dtype), mask, count),
        ratio_mean=_masked_mean(ratio, mask, count),
        tis_mean=_masked_mean(tis_weight, mask, count),
        tis_clip_fraction=_masked_mean((tis_log_weight > math.log(tis_cap)).to(mask.dtype), mask, count),
        logprob_diff_mean=mismatch.logprob_diff_mean,
        ess_ratio=mismatch.ess_ratio,
        mis_mask_fraction=_masked_mean((~mis_keep).to(mask.dtype), mask, count),
    )
