"""Supervised fine-tuning of a causal LM on tokenized conversations with an assistant-only loss (torch backend).

Reads top to bottom: prepare the examples -> pack them into rows -> one optimizer step (micro-batches, gradient
accumulation, clipping, AdamW, warm-up + cosine lr) -> checkpoint. `train_sft` is the loop; the rest are the
pieces it calls, each testable alone. Plain arguments only: a builder maps the stage config onto them.

Contracts worth knowing before changing anything:
- What a step holds. Examples are packed next-fit, in a per-epoch shuffled order, into rows of at most `seq_len`
  tokens; a step is rows_per_micro_batch x grad_accum_steps rows, so a micro-batch's token budget is
  rows_per_micro_batch x seq_len. The rows decide which examples train together, nothing more: the share of
  their slots left empty is reported (padding_fraction), never computed.
- Padding-free compute. A micro-batch is laid out as ONE row of its examples' real tokens end to end (its rows in
  order), position ids restarting at 0 at every example, no attention mask (swerl.train.packing). Attention runs
  per example (sdpa: one kernel call per example; flash-attention: varlen from the position ids; eager and flex:
  transformers' block-diagonal mask), so a token sees only earlier tokens of its own example, with the positions
  (RoPE) it would have alone; the LM head runs only at target positions. A micro-batch's summed loss therefore
  equals the sum of its examples' losses computed alone, in value and gradient (tests/train/test_sft.py checks that,
  that packed and lone logits agree, and that changing a neighbour changes nothing).
- Labels. labels[t] = input_ids[t + 1] where loss_mask[t + 1] == 1 and t + 1 is in the same example, else
  IGNORE_INDEX; logits[t] is scored against labels[t]. Tokens with mask 0 are still inputs, never targets.
  A "target" below is one such (t, t + 1) pair; an example's first token can never be one.
- Loss. The loss of one optimizer step is the mean negative log-likelihood over ALL targets of the step, across
  every row and micro-batch: each micro-batch's summed loss is divided by the step's total target count before
  backward, so the accumulated gradient is exactly the gradient of that mean and every assistant token weighs
  the same, wherever packing put it (no per-row or per-micro-batch averaging).
- Examples without a target are skipped and counted; examples longer than `seq_len` are dropped (default) or
  truncated to their first `seq_len` tokens (`truncate_overlong=True`), counted either way and logged. Nothing
  is lost silently: the counts come back in SFTResult.data and are logged at start.
- Determinism. `seed` seeds python, numpy and torch at start; epoch e's order is a permutation drawn from
  (seed, e) by its own generator. A checkpoint holds the optimizer, the global RNG states and the data position
  (epoch, index into the shuffled order, shuffle seed), so N steps == K steps + resume for N - K steps (tested
  bitwise in fp32 on CPU). The lr is a pure function of the step: there is no scheduler object to save.
"""

from __future__ import annotations

import hashlib
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swerl.model.tokenizer import save_tokenizer
from swerl.train.checkpoint import TrainerState, load_checkpoint, save_checkpoint
from swerl.train.distributed import RankContext, clip_gradients, full_state_dict, is_sharded, shard_model
from swerl.train.packing import kept_logits, use_packed_attention

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100  # the label of a position that is not a target


# ----------------------------------------------------------------------------------------------------------------
# Data: validate, label, pack


@dataclass(frozen=True)
class PreparedData:
    """The kept examples as (input_ids, labels) and what preparation did to the rest."""

    examples: list[tuple[list[int], list[int]]]  # labels already shifted: labels[t] is the target of position t
    num_given: int
    skipped_no_target: int  # no token with loss_mask 1 after the first position
    dropped_overlong: int  # longer than seq_len, truncate_overlong=False
    truncated_overlong: int  # longer than seq_len, cut to seq_len tokens, truncate_overlong=True
    num_targets: int  # targets over all kept examples (one epoch)
    fingerprint: str  # sha256 over the kept examples: a resume on other data is refused


def shifted_labels(input_ids: Sequence[int], loss_mask: Sequence[int]) -> list[int]:
    """labels[t] = input_ids[t + 1] if loss_mask[t + 1] else IGNORE_INDEX; the last position has no target."""
    labels = [next_id if keep else IGNORE_INDEX for next_id, keep in zip(input_ids[1:], loss_mask[1:], strict=True)]
    return [*labels, IGNORE_INDEX]


def prepare_examples(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    seq_len: int,
    vocab_size: int,
    truncate_overlong: bool = False,
) -> PreparedData:
    """Validate (input_ids, loss_mask) pairs, label them, and apply the documented skip/drop/truncate rules."""
    if not examples:
        raise ValueError("the SFT dataset is empty")
    kept: list[tuple[list[int], list[int]]] = []
    skipped = dropped = truncated = 0
    digest = hashlib.sha256()
    for index, (input_ids, loss_mask) in enumerate(examples):
        ids, mask = list(input_ids), list(loss_mask)
        if len(ids) != len(mask):
            raise ValueError(f"example {index}: {len(ids)} input ids but {len(mask)} loss-mask values")
        if not set(mask) <= {0, 1}:
            raise ValueError(f"example {index}: loss_mask must hold only 0 and 1")
        if ids and not 0 <= min(ids) <= max(ids) < vocab_size:
            raise ValueError(f"example {index}: token ids must lie in [0, {vocab_size}) (the model's vocab)")
        if len(ids) > seq_len:
            if not truncate_overlong:
                dropped += 1
                continue
            ids, mask = ids[:seq_len], mask[:seq_len]
            truncated += 1
        if not any(mask[1:]):
            skipped += 1
            continue
        labels = shifted_labels(ids, mask)
        kept.append((ids, labels))
        digest.update(np.asarray(ids, dtype=np.int64).tobytes())
        digest.update(np.asarray(labels, dtype=np.int64).tobytes())
    if not kept:
        raise ValueError(
            f"no SFT example left to train on: {len(examples)} given, {skipped} without a target, "
            f"{dropped} longer than seq_len {seq_len} (dropped)"
        )
    num_targets = sum(sum(label != IGNORE_INDEX for label in labels) for _, labels in kept)
    return PreparedData(kept, len(examples), skipped, dropped, truncated, num_targets, digest.hexdigest())


@dataclass(frozen=True)
class DataPosition:
    """The next example to pack: index into epoch's shuffled order (index == len means the epoch is done)."""

    epoch: int
    index: int


def epoch_order(num_examples: int, shuffle_seed: int, epoch: int) -> list[int]:
    """The shuffled order of one epoch, from its own generator: independent of every global RNG."""
    return np.random.default_rng([shuffle_seed, epoch]).permutation(num_examples).tolist()


def pack_rows(
    lengths: Sequence[int], num_rows: int, seq_len: int, position: DataPosition, shuffle_seed: int
) -> tuple[list[list[int]], DataPosition]:
    """Next-fit packing of example indices into num_rows rows of at most seq_len tokens, from position on.

    An example that does not fit ends the row and starts the next one; a row never spans two epochs. Every
    example fits an empty row (prepare_examples guarantees it), so each row holds at least one example.
    """
    rows: list[list[int]] = []
    epoch, index = position.epoch, position.index
    order = epoch_order(len(lengths), shuffle_seed, epoch)
    for _ in range(num_rows):
        row: list[int] = []
        used = 0
        while True:
            if index == len(order):
                if row:  # the epoch ends this row
                    break
                epoch, index = epoch + 1, 0
                order = epoch_order(len(lengths), shuffle_seed, epoch)
            example = order[index]
            if used + lengths[example] > seq_len:
                break
            row.append(example)
            used += lengths[example]
            index += 1
        rows.append(row)
    return rows, DataPosition(epoch, index)


@dataclass(frozen=True)
class PackedBatch:
    """One micro-batch: the examples of its rows end to end as one row of N real tokens, no padding (1, N)."""

    input_ids: Tensor  # (1, N) int64
    labels: Tensor  # (1, N) int64; target of each position, IGNORE_INDEX where none
    position_ids: Tensor  # (1, N) int64; 0, 1, ... restarting at every example
    segment_ids: Tensor  # (1, N) int64; 1, 2, ... per example
    num_tokens: int  # N
    num_targets: int
    num_slots: int  # rows x seq_len: the packing budget the examples were drawn against

    @property
    def is_target(self) -> Tensor:
        """(1, N) bool: the positions that have a target (the LM head runs there only)."""
        return self.labels != IGNORE_INDEX

    @property
    def targets(self) -> Tensor:
        """(K,) int64: the targets, in position order."""
        return self.labels[self.is_target]


def collate_rows(
    rows: Sequence[Sequence[int]], examples: Sequence[tuple[list[int], list[int]]], seq_len: int
) -> PackedBatch:
    """Lay packed rows of example indices out as one padding-free row: every example of every row, in order."""
    order = [example for row in rows for example in row]
    input_ids = torch.tensor([token for example in order for token in examples[example][0]], dtype=torch.long)
    labels = torch.tensor([label for example in order for label in examples[example][1]], dtype=torch.long)
    position_ids = torch.cat([torch.arange(len(examples[example][0])) for example in order])
    segment_ids = torch.cat(
        [torch.full((len(examples[example][0]),), segment) for segment, example in enumerate(order, start=1)]
    )
    num_targets = int((labels != IGNORE_INDEX).sum())
    return PackedBatch(
        input_ids.unsqueeze(0),
        labels.unsqueeze(0),
        position_ids.unsqueeze(0),
        segment_ids.unsqueeze(0),
        int(input_ids.numel()),
        num_targets,
        len(rows) * seq_len,
    )


def next_micro_batches(
    data: PreparedData,
    position: DataPosition,
    shuffle_seed: int,
    seq_len: int,
    rows_per_micro_batch: int,
    grad_accum_steps: int,
) -> tuple[list[PackedBatch], DataPosition]:
    """The micro-batches of one optimizer step, packed from position on, and the position after them."""
    lengths = [len(ids) for ids, _ in data.examples]
    rows, position = pack_rows(lengths, rows_per_micro_batch * grad_accum_steps, seq_len, position, shuffle_seed)
    micro_batches = [
        collate_rows(rows[start : start + rows_per_micro_batch], data.examples, seq_len)
        for start in range(0, len(rows), rows_per_micro_batch)
    ]
    return micro_batches, position


def block_causal_mask(segment_ids: Tensor) -> Tensor:
    """(B, T) segment ids -> (B, 1, T, T) bool, True where query t may attend key s: same segment and s <= t.

    The mask transformers derives from restarting position ids (eager and flex attention use it; sdpa runs per
    example instead, swerl.train.packing); kept as the reference the tests compare to.
    """
    same_segment = segment_ids[:, :, None] == segment_ids[:, None, :]  # (B, T, T)
    length = segment_ids.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=segment_ids.device).tril()  # (T, T)
    return (same_segment & causal).unsqueeze(1)


# ----------------------------------------------------------------------------------------------------------------
# Optimisation: loss, optimizer, schedule


def packed_logits(model: PreTrainedModel, batch: PackedBatch, bf16: bool, keep: Tensor | None = None) -> Tensor:
    """Logits (K, V) of a packed batch at the K positions where keep (1, N) is True (default: its targets), each
    example attending only to itself (see the module docstring)."""
    device = model.device
    keep = batch.is_target if keep is None else keep
    return kept_logits(
        use_packed_attention(model),
        batch.input_ids.to(device),
        batch.position_ids.to(device),
        keep.to(device),
        bf16,
    )


def summed_target_nll(logits: Tensor, targets: Tensor) -> Tensor:
    """Sum over targets of -log p(target | prefix), in float32 at least; logits (K, V) at the targets, targets (K,)."""
    scores = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(scores, targets.to(scores.device), reduction="sum")


def build_optimizer(
    model: torch.nn.Module, lr: float, weight_decay: float, betas: tuple[float, float], eps: float
) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices (linear and embedding weights) only; norms and biases are not decayed."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for parameter in model.parameters():  # parameters() yields a tied embedding once
        if parameter.requires_grad:
            (decay if parameter.dim() >= 2 else no_decay).append(parameter)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


def lr_at(step: int, peak_lr: float, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """Learning rate of optimizer step `step` (0-based): linear warm-up, then cosine decay to peak * min_lr_ratio.

    step < warmup:  peak * (step + 1) / warmup        (the first step already trains, at peak / warmup)
    otherwise:      peak * (r + (1 - r) * (1 + cos(pi * p)) / 2),  p = (step - warmup) / max(1, max_steps - 1 - warmup)
    so the last step (max_steps - 1) runs at exactly peak * min_lr_ratio.
    """
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - 1 - warmup_steps))
    return peak_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


# ----------------------------------------------------------------------------------------------------------------
# The loop


@dataclass(frozen=True)
class StepMetrics:
    """What one optimizer step reports to the on_step hook (the stage forwards it to MLflow)."""

    step: int  # 1-based: the number of optimizer steps done after this one
    epoch: int  # epoch of the next example to pack
    loss: float  # mean NLL over the step's targets, before the update
    lr: float
    grad_norm: float  # total L2 norm of the gradient before clipping
    num_tokens: int  # tokens in the step (all real: micro-batches hold no padding)
    num_targets: int  # assistant tokens scored (the loss denominator)
    padding_fraction: float  # share of the step's row slots (rows x seq_len) left empty by packing; not computed
    tokens_per_second: float  # num_tokens / wall time of the step (forward, backward, optimizer)
    seconds: float


@dataclass(frozen=True)
class SFTResult:
    """The end of a train_sft call."""

    state: TrainerState
    data: PreparedData
    last_metrics: StepMetrics | None  # None when resumed at or past max_steps
    checkpoint: Path | None  # the final checkpoint, when checkpoint_dir was given


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train_step(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    micro_batches: Sequence[PackedBatch],
    lr: float,
    max_grad_norm: float | None,
    bf16: bool,
    ranks: RankContext | None = None,
) -> tuple[float, float]:
    """One optimizer step over the micro-batches; returns (mean loss over the step's targets, pre-clip grad norm).

    max_grad_norm None or 0 disables clipping (the norm is still measured). A non-finite gradient norm raises
    FloatingPointError before the update, so one bad batch cannot poison the weights or a later checkpoint.
    With `ranks` (FSDP2) every rank gets the same micro-batches and runs its share of them (swerl.train.distributed
    says why the result is the one-process step's).
    """
    step_targets = sum(batch.num_targets for batch in micro_batches)
    optimizer.zero_grad(set_to_none=True)
    mine, extra = ranks.share(len(micro_batches)) if ranks else (list(range(len(micro_batches))), 0)
    scale = ranks.world_size if ranks else 1  # FSDP2 averages gradients over ranks; the step needs their sum
    step_loss = 0.0
    for index in [*mine, *([None] * extra)]:
        batch = micro_batches[index if index is not None else 0]
        loss = summed_target_nll(packed_logits(model, batch, bf16), batch.targets) / step_targets
        (loss * (scale if index is not None else 0)).backward()  # a zero pass keeps the ranks' collectives even
        if index is not None:
            step_loss += float(loss.detach())
    if ranks is not None:
        step_loss = ranks.sum([step_loss])[0]
    grad_norm = clip_gradients(list(model.parameters()), max_grad_norm)
    if not math.isfinite(grad_norm):
        raise FloatingPointError(f"non-finite gradient norm {grad_norm} (loss {step_loss})")
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    return step_loss, grad_norm


class SFTTrainer:
    """One SFT run, a step at a time: the data prepared, the optimizer, the trainer state and the data position.

    `train_sft` drives it in one process; the SFT stage drives N of them (one per FSDP2 rank, built with `ranks`)
    through swerl.train.ranks with the same loop (`run_sft_steps`). Arguments as train_sft's.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        examples: Sequence[tuple[Sequence[int], Sequence[int]]],
        *,
        seq_len: int,
        max_steps: int,
        rows_per_micro_batch: int,
        grad_accum_steps: int = 1,
        lr: float,
        min_lr_ratio: float = 0.1,
        warmup_steps: int,
        weight_decay: float = 0.1,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        max_grad_norm: float | None = 1.0,
        bf16: bool = False,
        seed: int = 0,
        truncate_overlong: bool = False,
        pad_token_id: int | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        resume_from: str | Path | None = None,
        ranks: RankContext | None = None,
    ) -> None:
        _check_arguments(seq_len, max_steps, rows_per_micro_batch, grad_accum_steps, warmup_steps, min_lr_ratio)
        del pad_token_id  # accepted for callers of the padded layout: packed micro-batches hold no padding
        self.data = prepare_examples(examples, seq_len, model.config.vocab_size, truncate_overlong)
        _log_data(self.data, seq_len, truncate_overlong)
        if ranks is not None and not is_sharded(model):  # else loaded sharded (distributed.load_sharded_model)
            model = shard_model(model, ranks)
        self.model, self.ranks, self.tokenizer = model, ranks, tokenizer
        self.optimizer, self.state = _start(model, self.data, seed, resume_from, lr, weight_decay, betas, eps, ranks)
        self.position = DataPosition(self.state.epoch, self.state.example_index)
        self.seq_len, self.max_steps = seq_len, max_steps
        self.rows_per_micro_batch, self.grad_accum_steps = rows_per_micro_batch, grad_accum_steps
        self.lr, self.min_lr_ratio, self.warmup_steps = lr, min_lr_ratio, warmup_steps
        self.max_grad_norm, self.bf16 = max_grad_norm, bf16
        self.last_metrics: StepMetrics | None = None

    @property
    def step(self) -> int:
        return self.state.step

    def train_step(self) -> StepMetrics:
        """Pack the next rows, one optimizer step, advance the state; returns the step's metrics."""
        step, started = self.state.step, time.perf_counter()
        micro_batches, self.position = next_micro_batches(
            self.data,
            self.position,
            self.state.shuffle_seed,
            self.seq_len,
            self.rows_per_micro_batch,
            self.grad_accum_steps,
        )
        step_lr = lr_at(step, self.lr, self.warmup_steps, self.max_steps, self.min_lr_ratio)
        loss, grad_norm = train_step(
            self.model, self.optimizer, micro_batches, step_lr, self.max_grad_norm, self.bf16, self.ranks
        )
        metrics = _step_metrics(step + 1, self.position, loss, step_lr, grad_norm, micro_batches, started)
        self.state = replace(self.state, step=step + 1, epoch=self.position.epoch, example_index=self.position.index)
        self.last_metrics = metrics
        return metrics

    def save(self, checkpoint_dir: str | Path, keep_last: int = 2) -> Path:
        """A checkpoint of the current state (every rank together when sharded)."""
        return save_checkpoint(
            checkpoint_dir, self.model, self.optimizer, self.state, self.tokenizer, keep_last, self.ranks
        )

    def save_model(self, out_dir: str | Path) -> Path:
        """The model (and tokenizer) in Hugging Face format; sharded: gathered, written by rank 0 alone."""
        out = Path(out_dir)
        if self.ranks is None or not is_sharded(self.model):
            self.model.save_pretrained(out)
        else:
            weights = full_state_dict(self.model, self.ranks)
            if self.ranks.is_main:
                self.model.save_pretrained(out, state_dict=weights)
            self.ranks.barrier()
        if self.tokenizer is not None and (self.ranks is None or self.ranks.is_main):
            save_tokenizer(self.tokenizer, out)
        return out

    def trainer_state(self) -> TrainerState:
        return self.state


class SteppedTrainer(Protocol):
    """What run_sft_steps drives: an SFTTrainer, or the ranks serving one each."""

    @property
    def step(self) -> int: ...

    def train_step(self) -> StepMetrics: ...

    def save(self, checkpoint_dir: str | Path, keep_last: int = 2) -> Path: ...


def run_sft_steps(
    trainer: SteppedTrainer,
    max_steps: int,
    *,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int = 0,
    keep_last: int = 2,
    on_step: Callable[[StepMetrics], None] | None = None,
    stop: Callable[[int], bool] | None = None,
) -> tuple[StepMetrics | None, Path | None]:
    """The loop: steps until max_steps (or stop), checkpoints on schedule and at the end; (last metrics, final
    checkpoint)."""
    metrics: StepMetrics | None = None
    while trainer.step < max_steps:
        if stop is not None and stop(trainer.step):
            break
        metrics = trainer.train_step()
        if on_step is not None:
            on_step(metrics)
        due = checkpoint_every > 0 and trainer.step % checkpoint_every == 0 and trainer.step < max_steps
        if checkpoint_dir is not None and due:
            trainer.save(checkpoint_dir, keep_last)
    final = None
    if checkpoint_dir is not None and metrics is not None:
        final = trainer.save(checkpoint_dir, keep_last)
    return metrics, final


def train_sft(
    model: PreTrainedModel,
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    seq_len: int,
    max_steps: int,
    rows_per_micro_batch: int,
    grad_accum_steps: int = 1,
    lr: float,
    min_lr_ratio: float = 0.1,
    warmup_steps: int,
    weight_decay: float = 0.1,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
    max_grad_norm: float | None = 1.0,
    bf16: bool = False,
    seed: int = 0,
    truncate_overlong: bool = False,
    pad_token_id: int | None = None,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int = 0,
    keep_last: int = 2,
    tokenizer: PreTrainedTokenizerBase | None = None,
    resume_from: str | Path | None = None,
    on_step: Callable[[StepMetrics], None] | None = None,
    stop: Callable[[int], bool] | None = None,
    ranks: RankContext | None = None,
) -> SFTResult:
    """Train `model` in place for max_steps optimizer steps on (input_ids, loss_mask) examples.

    Each step packs rows_per_micro_batch * grad_accum_steps rows of at most seq_len tokens (next-fit) and computes
    each micro-batch (rows_per_micro_batch rows) as one padding-free row of its examples; pad_token_id is unused
    (accepted for earlier callers). bf16 autocasts forward and
    loss inputs to bfloat16 (weights, gradients and optimizer state stay float32). Checkpoints go to
    checkpoint_dir every checkpoint_every steps (0: only at the end) and at the end, keeping the newest
    keep_last; tokenizer, when given, is saved with each. resume_from is a checkpoint directory of a run with the
    same data and seed (checkpoint.latest_checkpoint finds the newest); the run continues from its step.
    rows_per_micro_batch, lr and warmup_steps have no default here: sft.* (swerl/config/train.py) holds them, and
    the stage passes what it resolved (swerl.stages.sft.sft_arguments).

    stop, when given, is called with the number of steps done before every step; True ends the run there (the
    final checkpoint is still written). It is the stage's wall-clock guard: the step count, and so the schedule
    (the cosine ends at max_steps whatever stop does), never depends on time, only where a guarded run ends.
    ranks: this process's FSDP2 rank (every rank calls train_sft with the same arguments); the model is sharded.
    """
    # Over 60 lines: 46 are the signature and docstring; the body hands each keyword on to SFTTrainer, once.
    trainer = SFTTrainer(
        model,
        examples,
        seq_len=seq_len,
        max_steps=max_steps,
        rows_per_micro_batch=rows_per_micro_batch,
        grad_accum_steps=grad_accum_steps,
        lr=lr,
        min_lr_ratio=min_lr_ratio,
        warmup_steps=warmup_steps,
        weight_decay=weight_decay,
        betas=betas,
        eps=eps,
        max_grad_norm=max_grad_norm,
        bf16=bf16,
        seed=seed,
        truncate_overlong=truncate_overlong,
        pad_token_id=pad_token_id,
        tokenizer=tokenizer,
        resume_from=resume_from,
        ranks=ranks,
    )
    metrics, final = run_sft_steps(
        trainer,
        max_steps,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        keep_last=keep_last,
        on_step=on_step,
        stop=stop,
    )
    return SFTResult(trainer.state, trainer.data, metrics, final)


def _start(
    model: PreTrainedModel,
    data: PreparedData,
    seed: int,
    resume_from: str | Path | None,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
    ranks: RankContext | None = None,
) -> tuple[torch.optim.AdamW, TrainerState]:
    """Train mode, every RNG seeded, the optimizer, and the trainer state at step 0 or restored from resume_from."""
    model.train()
    seed_everything(seed)
    optimizer = build_optimizer(model, lr, weight_decay, betas, eps)
    if resume_from is None:
        return optimizer, TrainerState(0, 0, 0, seed, len(data.examples), data.fingerprint)
    return optimizer, _resume(resume_from, model, optimizer, seed, data, ranks)


def _step_metrics(
    step: int,
    position: DataPosition,
    loss: float,
    lr: float,
    grad_norm: float,
    micro_batches: Sequence[PackedBatch],
    started: float,
) -> StepMetrics:
    """What the step that began at perf_counter() `started` did."""
    seconds = time.perf_counter() - started
    num_tokens = sum(batch.num_tokens for batch in micro_batches)
    return StepMetrics(
        step=step,
        epoch=position.epoch,
        loss=loss,
        lr=lr,
        grad_norm=grad_norm,
        num_tokens=num_tokens,
        num_targets=sum(batch.num_targets for batch in micro_batches),
        padding_fraction=1.0 - num_tokens / sum(batch.num_slots for batch in micro_batches),
        tokens_per_second=num_tokens / seconds,
        seconds=seconds,
    )


def _check_arguments(
    seq_len: int,
    max_steps: int,
    rows_per_micro_batch: int,
    grad_accum_steps: int,
    warmup_steps: int,
    min_lr_ratio: float,
) -> None:
    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2 (one input and one target), got {seq_len}")
    if max_steps < 1 or rows_per_micro_batch < 1 or grad_accum_steps < 1:
        raise ValueError(
            f"max_steps ({max_steps}), rows_per_micro_batch ({rows_per_micro_batch}) and grad_accum_steps "
            f"({grad_accum_steps}) must all be >= 1"
        )
    if not 0 <= warmup_steps < max_steps:
        raise ValueError(f"warmup_steps must lie in [0, max_steps={max_steps}), got {warmup_steps}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio must lie in [0, 1], got {min_lr_ratio}")


def _log_data(data: PreparedData, seq_len: int, truncate_overlong: bool) -> None:
    logger.info(
        "SFT data: %d examples kept of %d, %d targets per epoch",
        len(data.examples),
        data.num_given,
        data.num_targets,
    )
    if data.skipped_no_target:
        logger.warning("SFT data: skipped %d examples without any target token", data.skipped_no_target)
    if data.dropped_overlong:
        logger.warning(
            "SFT data: dropped %d examples longer than seq_len %d (truncate_overlong=%s)",
            data.dropped_overlong,
            seq_len,
            truncate_overlong,
        )
    if data.truncated_overlong:
        logger.warning("SFT data: truncated %d examples to their first %d tokens", data.truncated_overlong, seq_len)


def _resume(
    path: str | Path,
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    seed: int,
    data: PreparedData,
    ranks: RankContext | None = None,
) -> TrainerState:
    state = load_checkpoint(path, model, optimizer, ranks)
    if state.shuffle_seed != seed:
        raise ValueError(f"checkpoint {path} was trained with seed {state.shuffle_seed}, this run has {seed}")
    if (state.num_examples, state.data_fingerprint) != (len(data.examples), data.fingerprint):
        raise ValueError(
            f"checkpoint {path} was trained on other data ({state.num_examples} examples, fingerprint "
            f"{state.data_fingerprint[:12]}) than this run ({len(data.examples)}, {data.fingerprint[:12]})"
        )
    logger.info(
        "SFT: resumed from %s at step %d (epoch %d, index %d)",
        path,
        state.step,
        state.epoch,
        state.example_index,
    )
    return state
