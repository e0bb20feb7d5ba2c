"""Padding-free training forwards: several sequences laid end to end in one row, attention per sequence.

Both trainers (SFT and the torch GRPO backend) run each micro-batch as ONE row of its real tokens, without
padding: the sequences (SFT examples, GRPO trajectories) are concatenated, position ids restart at 0 at every
sequence, and no attention mask is passed. A token must then attend only to the earlier tokens of its own
sequence, with the positions (RoPE) it would have alone. How that happens depends on the attention kernel:

- `sdpa` (the CPU default): transformers would turn the restarting position ids into a dense block-diagonal
  (N, N) mask (masking_utils.find_packed_sequence_indices), so attention would cost N^2 for a row of N tokens
  however short its sequences. `use_packed_attention` switches such a model to `PACKED_SDPA`, registered here: the
  same torch sdpa kernel, called once per sequence with is_causal (sum of L_i^2, no mask built). Each sequence
  then makes exactly the attention call it would make alone; packed and lone outputs differ only by the rounding
  of differently shaped matrix products (tests/train/test_packing.py). Anything else (a padding mask, a KV cache, a
  query shorter than its keys) goes to transformers' own sdpa path with transformers' own mask, unchanged.
- `flash_attention_*`: transformers reads the restarts as varlen sequence boundaries (cu_seqlens); nothing to do.
- `eager`, `flex_attention`: transformers builds the block-diagonal mask; exact, but quadratic in N.

The language-model head is applied only where its output is used (`logits_to_keep` with a boolean mask: the
SFT targets, the GRPO loss-mask positions), so a row's logits are (K, V) for its K kept positions, not (N, V).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

PACKED_SDPA = "swerl_packed_sdpa"  # the attention implementation name registered with transformers below


def sequence_bounds(position_ids: Tensor) -> list[int]:
    """Start offsets of the sequences of one row of position ids, and its length at the end: [0, s1, ..., N].

    A sequence starts wherever a position is not its predecessor + 1 (transformers' rule for packed rows).
    """
    restarts = torch.nonzero(position_ids[1:] != position_ids[:-1] + 1).flatten().add(1).tolist()
    return [0, *restarts, int(position_ids.shape[0])]


def packed_sdpa_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    position_ids: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """sdpa, once per packed sequence: query (B, H, N, D), key/value (B, H_kv, N, D) -> (B, N, H, D).

    Only a full forward without any mask (no cache, no padding: `_packed_mask` returned None) is split, by the
    restarts of position_ids; everything else is transformers' sdpa_attention_forward as it is.
    """
    length = query.shape[2]
    if attention_mask is not None or position_ids is None or key.shape[2] != length or length < 2:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)  # type: ignore[no-any-return]
    rows = []
    for row in range(query.shape[0]):
        bounds = sequence_bounds(position_ids[row if position_ids.shape[0] > 1 else 0])
        parts = [
            sdpa_attention_forward(
                module,
                query[row : row + 1, :, start:end],
                key[row : row + 1, :, start:end],
                value[row : row + 1, :, start:end],
                None,
                **kwargs,
            )[0]
            for start, end in zip(bounds[:-1], bounds[1:], strict=True)
        ]  # each (1, L, H, D)
        rows.append(parts[0] if len(parts) == 1 else torch.cat(parts, dim=1))
    return (rows[0] if len(rows) == 1 else torch.cat(rows, dim=0)), None


def _packed_mask(
    *,
    attention_mask: Tensor | None = None,
    q_length: int = 0,
    kv_length: int = 0,
    q_offset: int = 0,
    **kwargs: Any,
) -> Tensor | None:
    """No mask for a full forward without padding (packed_sdpa_attention splits it); sdpa's mask otherwise."""
    if attention_mask is None and q_offset == 0 and q_length == kv_length:
        return None
    return sdpa_mask(attention_mask=attention_mask, q_length=q_length, kv_length=kv_length, q_offset=q_offset, **kwargs)


AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED_SDPA, _packed_mask)


def use_packed_attention(model: PreTrainedModel) -> PreTrainedModel:
    """Switch an sdpa model to PACKED_SDPA (in place; other kernels handle packed rows themselves, see above).

    Models with sliding-window layers keep transformers' masks (per-sequence sdpa has no window). The switch is
    not saved: save_pretrained writes no attention implementation into config.json.
    """
    layer_types = getattr(model.config, "layer_types", None) or ["full_attention"]
    if model.config._attn_implementation == "sdpa" and set(layer_types) == {"full_attention"}:
        model.config._attn_implementation = PACKED_SDPA
    return model


def concatenate(sequences: Sequence[Sequence[int]], device: torch.device | None = None) -> tuple[Tensor, Tensor]:
    """Token ids laid end to end as one row (1, N) and its position ids (1, N), restarting at 0 per sequence."""
    input_ids = torch.tensor([token for sequence in sequences for token in sequence], dtype=torch.long)
    position_ids = torch.cat([torch.arange(len(sequence)) for sequence in sequences])
    return input_ids.unsqueeze(0).to(device), position_ids.unsqueeze(0).to(device)


def kept_logits(
    model: PreTrainedModel, input_ids: Tensor, position_ids: Tensor, keep: Tensor, bf16: bool = False
) -> Tensor:
    """Logits (K, V) at the K positions where keep (1, N) bool is True, of one packed row (1, N) under model.

    One forward through the model's own __call__ (so FSDP2's hooks run), attention per sequence (module
    docstring), the LM head only at the kept positions. None kept: (0, V) logits, whose backward still reaches
    every parameter (with zero gradients), as a sharded model's ranks need.
    """
    device = input_ids.device
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
        output = model(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=None,  # a mask would turn the per-sequence path off (and cost N^2)
            use_cache=False,
            logits_to_keep=keep,
        )
    return output.logits  # type: ignore[no-any-return]
