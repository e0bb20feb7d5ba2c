"""Padding-free packed rows (swerl.train.packing): per-sequence sdpa equals each sequence alone (to fp32 rounding of
the differently shaped matrix products), and a switched model still does everything else (padding masks, a KV cache)
exactly as plain sdpa."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from swerl.train.packing import PACKED_SDPA, concatenate, kept_logits, sequence_bounds, use_packed_attention
from tests.tiny_models import TinyModels, tiny_qwen3

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tokenizer(tiny_models: TinyModels) -> PreTrainedTokenizerBase:
    corpus = [
        "def add(left, right):\n    return left + right\n",
        "the quick brown fox jumps over the lazy dog\n",
    ]
    return tiny_models.tokenizer(corpus * 20, vocab_size=300)


def eval_model(tokenizer: PreTrainedTokenizerBase, moe: bool = False) -> PreTrainedModel:
    """The tiny model (256 positions, seed 0) in eval mode."""
    return tiny_qwen3(tokenizer, 256, moe=moe).eval()


def test_sequence_bounds_split_at_every_restart() -> None:
    assert sequence_bounds(torch.tensor([0, 1, 2, 0, 1, 0, 0, 1])) == [0, 3, 5, 6, 8]
    assert sequence_bounds(torch.tensor([0, 1, 2])) == [0, 3]
    assert sequence_bounds(torch.tensor([5, 6, 7])) == [0, 3]  # an offset without a restart is one sequence


@pytest.mark.parametrize("moe", [False, True])
def test_a_packed_row_gives_each_sequence_its_lone_logits(tokenizer, moe: bool) -> None:
    model = use_packed_attention(eval_model(tokenizer, moe))
    assert model.config._attn_implementation == PACKED_SDPA
    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randint(0, len(tokenizer), (length,), generator=generator).tolist() for length in (9, 1, 23)]
    input_ids, position_ids = concatenate(sequences)
    assert position_ids.tolist() == [[*range(9), 0, *range(23)]]
    keep = torch.ones_like(input_ids, dtype=torch.bool)
    with torch.no_grad():
        packed = kept_logits(model, input_ids, position_ids, keep)  # (N, V)
        lone = [model(input_ids=torch.tensor([ids]), use_cache=False).logits[0] for ids in sequences]
        plain = copy.deepcopy(model)
        plain.config._attn_implementation = "sdpa"  # transformers' block-diagonal mask over the whole row
        masked = plain(input_ids=input_ids, position_ids=position_ids, use_cache=False).logits[0]
    torch.testing.assert_close(packed, torch.cat(lone), rtol=0, atol=1e-6)
    torch.testing.assert_close(masked, packed, rtol=1e-5, atol=1e-5)
    # Without the restarts the sequences attend to each other: the check can tell.
    with torch.no_grad():
        leaky = model(input_ids=input_ids, use_cache=False).logits[0]
    assert not torch.allclose(leaky[9:], packed[9:], atol=1e-4)
    # Only the kept positions go through the LM head, in order.
    some = torch.zeros_like(keep)
    some[0, [3, 9, 30]] = True
    with torch.no_grad():
        torch.testing.assert_close(kept_logits(model, input_ids, position_ids, some), packed[[3, 9, 30]])


def test_a_switched_model_keeps_padding_masks_and_the_kv_cache_exact(tokenizer, tmp_path: Path) -> None:
    plain = eval_model(tokenizer)
    switched = use_packed_attention(copy.deepcopy(plain))
    ids = torch.randint(0, len(tokenizer), (2, 12), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(ids)
    attention_mask[1, :5] = 0  # left padding
    with torch.no_grad():
        for model_inputs in (
            dict(input_ids=ids, attention_mask=attention_mask),
            dict(input_ids=ids),
        ):
            assert torch.equal(
                switched(**model_inputs, use_cache=False).logits,
                plain(**model_inputs, use_cache=False).logits,
            )
        outputs = []
        for model in (plain, switched):
            cache = DynamicCache(config=model.config)
            model(input_ids=ids[:, :8], past_key_values=cache, use_cache=True)
            outputs.append(model(input_ids=ids[:, 8:], past_key_values=cache, use_cache=True).logits)
    assert torch.equal(outputs[0], outputs[1])
    switched.save_pretrained(tmp_path)  # the switch is the trainer's: it never reaches a saved config
    assert PACKED_SDPA not in json.dumps(json.loads((tmp_path / "config.json").read_text()))
