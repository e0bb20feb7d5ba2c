"""SFT trainer: packing without leakage, label shift, assistant-only loss, schedule, overfit, exact resume."""

from __future__ import annotations

import copy
import math
import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from swerl.model.chat import render_messages
from swerl.model.loading import load_model_and_tokenizer
from swerl.train.checkpoint import check_checkpoint_dir, latest_checkpoint, list_checkpoints
from swerl.train.sft import (
    IGNORE_INDEX,
    DataPosition,
    StepMetrics,
    block_causal_mask,
    build_optimizer,
    collate_rows,
    epoch_order,
    lr_at,
    pack_rows,
    packed_logits,
    prepare_examples,
    shifted_labels,
    summed_target_nll,
    train_sft,
)
from tests.tiny_models import TinyModels, tiny_qwen3

CONVERSATIONS = [
    [
        {"role": "user", "content": "Run the tests."},
        {"role": "assistant", "content": "pytest -q"},
        {"role": "user", "content": "1 failed, 2 passed"},
        {"role": "assistant", "content": "cat -n mod.py | sed -n 3,5p"},
    ],
    [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "Fix clamp."},
        {"role": "assistant", "content": "sed -i '4s/ <= / < /' mod.py"},
    ],
    [{"role": "user", "content": "What next?"}, {"role": "assistant", "content": "submit"}],
    [
        {"role": "user", "content": "3 passed"},
        {"role": "assistant", "content": "All tests pass: submit"},
        {"role": "user", "content": "Done."},
    ],
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tokenizer(tiny_models: TinyModels):
    corpus = [str(message["content"]) for conversation in CONVERSATIONS for message in conversation]
    corpus += ["user assistant system\n", "def clamp(value, low, high):\n    return min(value, high)\n"]
    return tiny_models.tokenizer(corpus * 20, vocab_size=320)


def tiny_model(tokenizer, seed: int = 0, **overrides: Any) -> PreTrainedModel:
    return tiny_qwen3(tokenizer, 256, seed, **overrides)


@pytest.fixture(scope="module")
def examples(tokenizer) -> list[tuple[list[int], list[int]]]:
    return [render_messages(tokenizer, conversation) for conversation in CONVERSATIONS]


def lone_logits(model: PreTrainedModel, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]  # (n, V)


# ----------------------------------------------------------------------------------------------------------------
# Labels and packing


def test_shifted_labels_target_the_next_masked_token_only() -> None:
    assert shifted_labels([5, 6, 7, 8, 9], [0, 1, 1, 0, 1]) == [6, 7, IGNORE_INDEX, 9, IGNORE_INDEX]
    assert shifted_labels([5], [1]) == [IGNORE_INDEX]  # a first token is never a target


def test_collate_restarts_positions_and_never_labels_across_a_boundary() -> None:
    examples = [([1, 2, 3], shifted_labels([1, 2, 3], [0, 1, 1])), ([4, 5], shifted_labels([4, 5], [1, 1]))]
    batch = collate_rows([[0, 1]], examples, seq_len=7)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5]]  # no padding: the row's 2 empty slots are not laid out
    # the last token of example 0 (3) must not target the first of example 1 (4), though 4 has mask 1
    assert batch.labels.tolist() == [[2, 3, IGNORE_INDEX, 5, IGNORE_INDEX]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert batch.segment_ids.tolist() == [[1, 1, 1, 2, 2]]
    assert (batch.num_tokens, batch.num_targets, batch.num_slots) == (5, 3, 7)
    assert batch.targets.tolist() == [2, 3, 5]
    # two rows of a micro-batch are laid end to end as one row, in order
    both = collate_rows([[1], [0]], examples, seq_len=4)
    assert both.input_ids.tolist() == [[4, 5, 1, 2, 3]] and both.position_ids.tolist() == [[0, 1, 0, 1, 2]]
    assert (both.num_tokens, both.num_targets, both.num_slots) == (5, 3, 8)
    expected = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]],
        dtype=torch.bool,
    )
    assert torch.equal(block_causal_mask(batch.segment_ids)[0, 0, :5, :5], expected)


def test_pack_rows_covers_each_epoch_once_and_is_deterministic() -> None:
    lengths = [5, 3, 7, 2, 6, 4, 1]
    rows, position = pack_rows(lengths, num_rows=20, seq_len=8, position=DataPosition(0, 0), shuffle_seed=3)
    assert rows == pack_rows(lengths, 20, 8, DataPosition(0, 0), 3)[0]
    assert all(len(row) >= 1 and sum(lengths[i] for i in row) <= 8 for row in rows)
    flat = [example for row in rows for example in row]
    assert position.epoch >= 2
    for epoch in range(position.epoch):  # whole epochs, each in its own shuffled order
        assert flat[epoch * len(lengths) : (epoch + 1) * len(lengths)] == epoch_order(len(lengths), 3, epoch)
    # resuming from any intermediate position continues exactly as one uninterrupted call
    first, middle = pack_rows(lengths, 7, 8, DataPosition(0, 0), 3)
    rest, end = pack_rows(lengths, 13, 8, middle, 3)
    assert first + rest == rows and end == position


# ----------------------------------------------------------------------------------------------------------------
# No cross-sample attention


@pytest.mark.parametrize(("attention", "moe"), [("sdpa", False), ("eager", False), ("sdpa", True)])
def test_packed_logits_equal_lone_logits_and_ignore_neighbours(tokenizer, examples, attention: str, moe: bool) -> None:
    model = tiny_model(tokenizer, moe=moe)
    model.set_attn_implementation(attention)
    model.eval()
    data = prepare_examples(examples, seq_len=160, vocab_size=model.config.vocab_size)
    row = [0, 1, 2]
    seq_len = sum(len(data.examples[i][0]) for i in row) + 5
    batch = collate_rows([row], data.examples, seq_len)
    everywhere = torch.ones_like(batch.input_ids, dtype=torch.bool)
    with torch.no_grad():
        packed = packed_logits(model, batch, bf16=False, keep=everywhere)  # (N, V)
        at_targets = packed_logits(model, batch, bf16=False)  # (K, V): the LM head at the targets only
    torch.testing.assert_close(at_targets, packed[batch.is_target[0]], rtol=1e-6, atol=1e-6)
    start = 0
    for example in row:
        ids = data.examples[example][0]
        torch.testing.assert_close(packed[start : start + len(ids)], lone_logits(model, ids), rtol=1e-5, atol=1e-5)
        start += len(ids)

    # Perturb every token of example 0: examples 1 and 2, later in the row, must not move at all.
    perturbed = copy.deepcopy(data.examples)
    ids0 = perturbed[0][0]
    perturbed[0] = ([(token + 7) % model.config.vocab_size for token in ids0], perturbed[0][1])
    with torch.no_grad():
        moved = packed_logits(model, collate_rows([row], perturbed, seq_len), bf16=False, keep=everywhere)
    n0 = len(ids0)
    assert not torch.allclose(moved[:n0], packed[:n0])
    torch.testing.assert_close(moved[n0:start], packed[n0:start], rtol=0, atol=1e-6)

    # The same mask passed explicitly gives the same logits; plain positions (no restart) leak and differ.
    with torch.no_grad():
        explicit = model(
            input_ids=batch.input_ids,
            position_ids=batch.position_ids,
            attention_mask=_explicit_mask(batch.segment_ids, attention),
            use_cache=False,
        ).logits[0]
        leaky = model(input_ids=batch.input_ids, use_cache=False).logits[0]
    torch.testing.assert_close(explicit[:start], packed[:start], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(leaky[n0:start], packed[n0:start], atol=1e-4)


def _explicit_mask(segment_ids: torch.Tensor, attention: str) -> torch.Tensor:
    mask = block_causal_mask(segment_ids)
    if attention == "sdpa":
        return mask
    return torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)  # additive, for eager


# ----------------------------------------------------------------------------------------------------------------
# Loss and gradients against a float64 brute force


def brute_force_loss(model: PreTrainedModel, examples: list[tuple[list[int], list[int]]]) -> torch.Tensor:
    """Mean over all masked next tokens of -log p, each example alone, in float64, one position at a time."""
    total = torch.zeros((), dtype=torch.float64)
    count = 0
    for ids, mask in examples:
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]  # (n, V) float64
        for t in range(len(ids) - 1):
            if mask[t + 1]:
                total = total - torch.log_softmax(logits[t], dim=-1)[ids[t + 1]]
                count += 1
    return total / count


def test_packed_loss_and_gradient_match_float64_brute_force(tokenizer, examples) -> None:
    model = tiny_model(tokenizer)
    model.eval()
    reference = copy.deepcopy(model).double()
    data = prepare_examples(examples, seq_len=128, vocab_size=model.config.vocab_size)
    rows = [[0, 2], [1, 3]]  # two rows of two examples, one row per micro-batch
    micro_batches = [collate_rows([row], data.examples, 128) for row in rows]
    step_targets = sum(batch.num_targets for batch in micro_batches)
    assert step_targets == sum(sum(mask[1:]) for _, mask in examples)
    loss = sum(
        summed_target_nll(packed_logits(model, batch, bf16=False), batch.targets) / step_targets
        for batch in micro_batches
    )
    assert isinstance(loss, torch.Tensor)
    loss.backward()
    expected = brute_force_loss(reference, examples)
    expected.backward()
    assert abs(loss.item() - expected.item()) < 1e-5 * expected.item()
    for (name, parameter), twin in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert parameter.grad is not None and twin.grad is not None, name
        torch.testing.assert_close(parameter.grad.double(), twin.grad, rtol=1e-4, atol=1e-6, msg=name)


def _summed_loss_and_gradient(model: PreTrainedModel, run: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = run()
    loss.backward()
    return loss.detach(), [parameter.grad.clone() for parameter in model.parameters() if parameter.grad is not None]


@pytest.mark.parametrize("moe", [False, True])
def test_a_packed_micro_batch_is_the_sum_of_its_examples_alone_and_of_the_padded_layout(
    tokenizer, examples, moe: bool
) -> None:
    """One padding-free row of four examples (two rows of the packing): its summed loss and gradient equal the sum
    of the four examples' losses computed one at a time, and those of the padded layout trained before (rows of
    seq_len, padding at the tail, full logits, transformers' block-diagonal mask), within fp32 noise."""
    model = tiny_model(tokenizer, moe=moe)
    data = prepare_examples(examples, seq_len=256, vocab_size=model.config.vocab_size)
    rows = [[0, 2], [1, 3]]
    seq_len = max(sum(len(data.examples[example][0]) for example in row) for row in rows) + 3
    batch = collate_rows(rows, data.examples, seq_len)
    assert batch.num_tokens == sum(len(ids) for ids, _ in data.examples) < batch.num_slots

    def packed() -> torch.Tensor:
        return summed_target_nll(packed_logits(model, batch, bf16=False), batch.targets)

    def alone() -> torch.Tensor:
        total = torch.zeros(())
        for example in [0, 2, 1, 3]:
            ids, labels = data.examples[example]
            logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]
            total = total + torch.nn.functional.cross_entropy(
                logits, torch.tensor(labels), ignore_index=IGNORE_INDEX, reduction="sum"
            )
        return total

    def padded() -> torch.Tensor:
        input_ids = torch.zeros((2, seq_len), dtype=torch.long)
        labels = torch.full((2, seq_len), IGNORE_INDEX)
        positions = torch.zeros((2, seq_len), dtype=torch.long)
        segments = torch.zeros((2, seq_len), dtype=torch.long)
        for r, row in enumerate(rows):
            start = 0
            for segment, example in enumerate(row, start=1):
                ids, example_labels = data.examples[example]
                input_ids[r, start : start + len(ids)] = torch.tensor(ids)
                labels[r, start : start + len(ids)] = torch.tensor(example_labels)
                positions[r, start : start + len(ids)] = torch.arange(len(ids))
                segments[r, start : start + len(ids)] = segment
                start += len(ids)
            positions[r, start:] = torch.arange(seq_len - start)
        mask = block_causal_mask(segments)
        logits = model(input_ids=input_ids, position_ids=positions, attention_mask=mask, use_cache=False).logits
        return torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )

    loss, gradient = _summed_loss_and_gradient(model, packed)
    for reference in (alone, padded):
        expected, expected_gradient = _summed_loss_and_gradient(model, reference)
        torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-5)
        assert len(gradient) == len(expected_gradient) == len(list(model.parameters()))
        for ours, theirs in zip(gradient, expected_gradient, strict=True):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def _gradient(model: PreTrainedModel, ids: list[int], mask: list[int]) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    batch = collate_rows([[0]], [(ids, shifted_labels(ids, mask))], len(ids) + 2)
    (summed_target_nll(packed_logits(model, batch, bf16=False), batch.targets) / batch.num_targets).backward()
    return torch.cat([parameter.grad.flatten() for parameter in model.parameters() if parameter.grad is not None])


def test_tokens_with_mask_zero_are_inputs_but_never_targets(tokenizer, examples) -> None:
    model = tiny_model(tokenizer)
    ids, mask = examples[0]
    assert mask[-1] == 0  # the "\n" after the last <|im_end|>: a target of nothing, input to nothing scored
    base = _gradient(model, ids, mask)
    other = (ids[-1] + 1) % model.config.vocab_size
    assert torch.equal(_gradient(model, [*ids[:-1], other], mask), base)  # only a target, and masked
    # The same token with mask 1 is a target: now it moves the gradient.
    assert not torch.equal(
        _gradient(model, [*ids[:-1], other], [*mask[:-1], 1]), _gradient(model, ids, [*mask[:-1], 1])
    )
    # A masked token inside the prompt is an input to the scored positions after it: it moves the gradient.
    inner = mask.index(1) - 2
    assert mask[inner] == 0
    swapped = [*ids[:inner], (ids[inner] + 1) % model.config.vocab_size, *ids[inner + 1 :]]
    assert not torch.equal(_gradient(model, swapped, mask), base)


# ----------------------------------------------------------------------------------------------------------------
# Optimizer, schedule, training


def test_lr_schedule_matches_closed_form() -> None:
    values = [lr_at(step, 1.0, warmup_steps=4, max_steps=14, min_lr_ratio=0.1) for step in range(14)]
    assert values[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert values[4] == pytest.approx(1.0)
    assert values[7] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 3)))  # 0.775
    assert values[13] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(values[4:], values[5:], strict=False))
    assert lr_at(0, 2.0, warmup_steps=0, max_steps=1, min_lr_ratio=0.0) == pytest.approx(2.0)


def test_weight_decay_applies_to_matrices_only(tokenizer) -> None:
    model = tiny_model(tokenizer)
    optimizer = build_optimizer(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8)
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and all(p.dim() == 2 for p in decayed["params"])
    assert plain["weight_decay"] == 0.0 and all(p.dim() == 1 for p in plain["params"])
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))


def test_overfits_four_conversations_and_reports_metrics(tokenizer, examples) -> None:
    model = tiny_model(tokenizer, hidden_size=128, intermediate_size=256)  # hidden 64 plateaus near 30%
    metrics: list[StepMetrics] = []
    result = train_sft(
        model,
        examples,
        seq_len=96,
        max_steps=20,
        rows_per_micro_batch=2,
        grad_accum_steps=2,
        lr=3e-3,
        min_lr_ratio=1.0,
        warmup_steps=2,
        weight_decay=0.0,
        on_step=metrics.append,
    )
    losses = [m.loss for m in metrics]
    assert losses[-1] < 0.2 * losses[0], losses
    assert [m.step for m in metrics] == list(range(1, 21)) and result.state.step == 20
    assert [m.lr for m in metrics] == pytest.approx([lr_at(s, 3e-3, 2, 20, 1.0) for s in range(20)])
    assert all(m.tokens_per_second > 0 and m.grad_norm > 0 and m.num_targets > 0 for m in metrics)
    assert all(m.num_tokens <= 4 * 96 and 0 <= m.padding_fraction < 1 for m in metrics)


def test_stop_ends_the_run_early_on_the_schedule_of_max_steps(tokenizer, examples, tmp_path: Path) -> None:
    """The stage's time guard: stop ends a run where it says, the cosine still ends at max_steps (the rates of the
    steps taken are those of the full run), and the final checkpoint holds the step it ended at."""
    asked: list[int] = []

    def stop(step: int) -> bool:
        asked.append(step)
        return step == 4

    metrics: list[StepMetrics] = []
    result = train_sft(
        tiny_model(tokenizer),
        examples,
        seq_len=96,
        max_steps=1000,
        rows_per_micro_batch=1,
        warmup_steps=2,
        lr=1e-3,
        min_lr_ratio=0.1,
        on_step=metrics.append,
        stop=stop,
        checkpoint_dir=tmp_path,
    )
    assert asked == [0, 1, 2, 3, 4] and result.state.step == 4 and [m.step for m in metrics] == [1, 2, 3, 4]
    assert [m.lr for m in metrics] == pytest.approx([lr_at(s, 1e-3, 2, 1000, 0.1) for s in range(4)])
    assert [path.name for path in list_checkpoints(tmp_path)] == ["step_00000004"]


def _burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(i * i for i in range(10_000))


def _train_a_few_steps(tokenizer: Any, examples: Any) -> dict[str, torch.Tensor]:
    model = tiny_model(tokenizer, seed=3)
    train_sft(
        model,
        examples,
        seq_len=64,
        max_steps=8,
        rows_per_micro_batch=2,
        grad_accum_steps=2,
        lr=3e-3,
        warmup_steps=2,
        seed=11,
    )
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_same_seed_gives_bit_identical_weights_on_a_loaded_machine(tokenizer, examples) -> None:
    """Step counts, not time, decide what is trained: the same SFT run beside CPU burners (one per core) gives the
    same weights bit for bit as on the idle machine."""
    idle = _train_a_few_steps(tokenizer, examples)
    context = multiprocessing.get_context("spawn")
    burners = [context.Process(target=_burn, args=(120.0,), daemon=True) for _ in range(os.cpu_count() or 2)]
    for burner in burners:
        burner.start()
    try:
        time.sleep(0.5)  # the burners are running
        assert all(burner.is_alive() for burner in burners)
        loaded = _train_a_few_steps(tokenizer, examples)
        assert all(burner.is_alive() for burner in burners)  # they were beside it the whole time
    finally:
        for burner in burners:
            burner.terminate()
            burner.join()
    assert idle.keys() == loaded.keys()
    assert all(torch.equal(idle[k], loaded[k]) for k in idle), [k for k in idle if not torch.equal(idle[k], loaded[k])]


def test_bf16_autocast_trains_float32_weights_to_a_close_loss(tokenizer, examples) -> None:
    losses = {}
    for bf16 in (False, True):
        model = tiny_model(tokenizer)
        metrics: list[StepMetrics] = []
        train_sft(
            model,
            examples,
            seq_len=96,
            max_steps=2,
            rows_per_micro_batch=1,
            lr=3e-4,
            warmup_steps=0,
            bf16=bf16,
            on_step=metrics.append,
        )
        losses[bf16] = [m.loss for m in metrics]
        assert all(parameter.dtype == torch.float32 for parameter in model.parameters())
    assert losses[True] == pytest.approx(losses[False], rel=2e-2)
    assert losses[True] != losses[False]  # autocast really ran in bfloat16


def test_grad_norm_is_reported_before_clipping(tokenizer, examples) -> None:
    model = tiny_model(tokenizer)
    metrics: list[StepMetrics] = []
    train_sft(
        model,
        examples,
        seq_len=96,
        max_steps=1,
        rows_per_micro_batch=1,
        lr=3e-4,
        warmup_steps=0,
        max_grad_norm=1e-3,
        on_step=metrics.append,
    )
    assert metrics[0].grad_norm > 1e-2


def test_resume_equals_uninterrupted_run(tokenizer, examples, tmp_path: Path) -> None:
    args: dict[str, Any] = dict(
        seq_len=64, max_steps=6, rows_per_micro_batch=1, grad_accum_steps=2, lr=3e-3, warmup_steps=2, seed=7
    )
    straight_metrics: list[StepMetrics] = []
    straight = tiny_model(tokenizer)
    train_sft(straight, examples, **args, on_step=straight_metrics.append)

    first = tiny_model(tokenizer)
    train_sft(first, examples, **args, checkpoint_dir=tmp_path, checkpoint_every=3, tokenizer=tokenizer)
    checkpoints = list_checkpoints(tmp_path)
    assert [path.name for path in checkpoints] == ["step_00000003", "step_00000006"]
    assert not list(tmp_path.glob(".tmp-*"))
    torch.manual_seed(12345)  # the global RNG a resume must restore, whatever happened in between
    resumed_metrics: list[StepMetrics] = []
    resumed = tiny_model(tokenizer, seed=99)  # other initial weights: the checkpoint must replace them
    result = train_sft(resumed, examples, **args, resume_from=checkpoints[0], on_step=resumed_metrics.append)
    assert result.state.step == 6
    assert [m.loss for m in resumed_metrics] == [m.loss for m in straight_metrics[3:]]
    for (name, a), b in zip(straight.named_parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b), name
    # the final checkpoint is an HF model directory later stages load as is
    loaded, _ = load_model_and_tokenizer(latest_checkpoint(tmp_path) or tmp_path)
    for (name, a), b in zip(straight.named_parameters(), loaded.parameters(), strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="other data"):
        train_sft(tiny_model(tokenizer), examples[:3], **args, resume_from=checkpoints[0])


def test_keep_last_prunes_old_checkpoints(tokenizer, examples, tmp_path: Path) -> None:
    model = tiny_model(tokenizer)
    train_sft(
        model,
        examples,
        seq_len=96,
        max_steps=5,
        rows_per_micro_batch=1,
        lr=3e-4,
        warmup_steps=0,
        checkpoint_dir=tmp_path,
        checkpoint_every=1,
        keep_last=2,
    )
    assert [path.name for path in list_checkpoints(tmp_path)] == ["step_00000004", "step_00000005"]
    assert isinstance(AutoModelForCausalLM.from_pretrained(tmp_path / "step_00000005"), PreTrainedModel)


# ----------------------------------------------------------------------------------------------------------------
# Clear errors


def test_data_errors_and_counts(tokenizer, examples) -> None:
    vocab = 320
    with pytest.raises(ValueError, match="empty"):
        prepare_examples([], seq_len=64, vocab_size=vocab)
    with pytest.raises(ValueError, match="no SFT example left"):
        prepare_examples([([1, 2, 3], [1, 0, 0])], seq_len=64, vocab_size=vocab)  # mask only on the first token
    with pytest.raises(ValueError, match="loss-mask values"):
        prepare_examples([([1, 2, 3], [0, 1])], seq_len=64, vocab_size=vocab)
    with pytest.raises(ValueError, match="vocab"):
        prepare_examples([([1, 2, vocab], [0, 1, 1])], seq_len=64, vocab_size=vocab)
    longest = max(len(ids) for ids, _ in examples)
    shortest = min(len(ids) for ids, _ in examples)
    data = prepare_examples([*examples, ([1, 2], [0, 0])], seq_len=longest - 1, vocab_size=vocab)
    assert (data.skipped_no_target, data.dropped_overlong, data.truncated_overlong) == (1, 1, 0)
    data = prepare_examples(examples, seq_len=longest - 1, vocab_size=vocab, truncate_overlong=True)
    assert (data.dropped_overlong, data.truncated_overlong) == (0, 1)
    assert max(len(ids) for ids, _ in data.examples) == longest - 1
    with pytest.raises(ValueError, match="no SFT example left"):
        prepare_examples(examples, seq_len=shortest - 1, vocab_size=vocab)


def test_checkpoint_without_model_files_is_refused(tokenizer, examples, tmp_path: Path) -> None:
    (tmp_path / "step_00000001").mkdir()
    with pytest.raises(FileNotFoundError, match=r"config\.json.*model weights.*trainer state"):
        check_checkpoint_dir(tmp_path / "step_00000001")
    with pytest.raises(FileNotFoundError, match="missing"):
        train_sft(
            tiny_model(tokenizer),
            examples,
            seq_len=96,
            max_steps=1,
            rows_per_micro_batch=1,
            lr=3e-4,
            warmup_steps=0,
            resume_from=tmp_path / "step_00000001",
        )
