"""The local engine's KV cache and model step: per-slot KV buffers and a Qwen3 forward over them.

SlotCache holds, per layer, keys and values of (slots, H_kv, capacity, D): the running batch's row i lives in slot
i, holding its first `lengths[i]` positions; a step writes each new token's keys and values in place at its
position, and attention reads each slot up to its own length (masked past it). A request joining takes the next
free slot; one leaving hands its slot to the batch's last row (one row's KV moves), so joins and leaves never
rebuild or copy the batch. Capacity grows by doubling up to `max_tokens` (the engine's context cap), the only
time the whole buffer is copied.

SlotModel runs a Hugging Face Qwen3 (dense or MoE) on those buffers with the model's own modules (norms,
projections, MLP or experts) and none of its per-call machinery (cache objects, mask builders): the new tokens of
every row go through the projections and MLP as one flat batch (decode rows and prefills alike). Decode rows
attend in one call over their slots padded to the longest (GQA packed into a (B, H_kv, G, D) query, as
transformers does for one token; a length mask where lengths differ) unless padding would cost more than a call
per row (ROW_CALL_KEYS), then each over its own slot up to its own length; a prefill from position 0 runs SDPA's
causal kernel, one after a cached prefix a causal mask offset by the prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel


class SlotCache:
    """Per-layer keys and values of (slots, H_kv, capacity, D); slot i holds lengths[i] positions."""

    def __init__(
        self, layers: int, slots: int, kv_heads: int, head_dim: int, max_tokens: int, dtype: torch.dtype,
        device: torch.device, initial_capacity: int = 256,
    ) -> None:  # fmt: skip
        self.shape = (slots, kv_heads, head_dim)
        self.max_tokens = max_tokens
        self.dtype, self.device = dtype, device
        self.capacity = min(initial_capacity, max_tokens)
        self.keys = [self._empty(self.capacity) for _ in range(layers)]
        self.values = [self._empty(self.capacity) for _ in range(layers)]
        self.lengths = [0] * slots

    def _empty(self, capacity: int) -> torch.Tensor:
        slots, heads, dim = self.shape
        # zeros, not empty: attention reads (masked) columns past a row's length and must see finite numbers
        return torch.zeros(slots, heads, capacity, dim, dtype=self.dtype, device=self.device)

    def reserve(self, tokens: int) -> None:
        """Make room for `tokens` positions per slot (doubling; at most max_tokens)."""
        if tokens <= self.capacity:
            return
        if tokens > self.max_tokens:
            raise ValueError(f"{tokens} positions asked for, the KV cache holds at most {self.max_tokens}")
        capacity = self.capacity
        while capacity < tokens:
            capacity *= 2
        capacity = min(capacity, self.max_tokens)
        for buffers in (self.keys, self.values):
            for index, old in enumerate(buffers):
                new = self._empty(capacity)
                new[:, :, : self.capacity] = old
                buffers[index] = new
        self.capacity = capacity

    def move(self, source: int, target: int) -> None:
        """Copy slot source's positions into slot target (a leaving row's slot taken by the batch's last)."""
        length = self.lengths[source]
        for buffers in (self.keys, self.values):
            for buffer in buffers:
                buffer[target, :, :length] = buffer[source, :, :length]
        self.lengths[target] = length
        self.lengths[source] = 0

    def extract(self, slot: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A copy of slot's first `length` positions, per layer ((H_kv, length, D) keys, values)."""
        return [
            (keys[slot, :, :length].clone(), values[slot, :, :length].clone())
            for keys, values in zip(self.keys, self.values, strict=True)
        ]

    def load(self, slot: int, layers: list[tuple[torch.Tensor, torch.Tensor]], length: int) -> None:
        """Fill slot's first `length` positions from extract()'s copy (at least that long)."""
        self.reserve(length)
        for (keys, values), key_buffer, value_buffer in zip(layers, self.keys, self.values, strict=True):
            key_buffer[slot, :, :length] = keys[:, :length]
            value_buffer[slot, :, :length] = values[:, :length]
        self.lengths[slot] = length


@dataclass
class StepRows:
    """One model step over slots first..first+len(counts)-1: row i (slot first + i) feeds counts[i] new tokens from
    position starts[i] (one: a decode row; more: a prefill)."""

    tokens: list[int]  # every row's new tokens, row after row
    starts: list[int]
    counts: list[int]
    first: int = 0


class SlotModel:
    """A Qwen3 forward (dense or MoE) over a SlotCache, built from a loaded Hugging Face Qwen3ForCausalLM."""

    def __init__(self, model: PreTrainedModel, max_tokens: int) -> None:
        config = model.config
        self.model = model
        inner = model.model  # type: ignore[attr-defined]  # Qwen3Model
        self.embed = inner.embed_tokens
        self.layers = list(inner.layers)
        self.norm = inner.norm
        self.lm_head = model.lm_head  # type: ignore[attr-defined]
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.groups = self.heads // self.kv_heads
        self.scaling = self.head_dim**-0.5
        self.max_tokens = max_tokens
        self.rope_table()

    @torch.inference_mode()
    def rope_table(self) -> None:
        """cos and sin of every position below max_tokens, as the model's rotary embedding computes them."""
        device = self.embed.weight.device
        dtype = self.embed.weight.dtype
        positions = torch.arange(self.max_tokens, device=device)[None]
        probe = torch.zeros(1, dtype=dtype, device=device)
        cos, sin = self.model.model.rotary_emb(probe, positions)  # type: ignore[attr-defined]
        self.cos, self.sin = cos[0], sin[0]  # (max_tokens, D)

    def new_cache(self, slots: int) -> SlotCache:
        weight = self.embed.weight
        return SlotCache(
            len(self.layers),
            slots,
            self.kv_heads,
            self.head_dim,
            self.max_tokens,
            weight.dtype,
            weight.device,
        )

    @torch.inference_mode()
    def step(self, cache: SlotCache, rows: StepRows) -> torch.Tensor:
        """Write the rows' new tokens into the cache and return each row's next-token logits (rows, V), float32."""
        device = cache.device
        first = rows.first
        ends = [start + n for start, n in zip(rows.starts, rows.counts, strict=True)]
        cache.reserve(max(ends))
        slots = torch.tensor([first + i for i, n in enumerate(rows.counts) for _ in range(n)], device=device)
        positions = torch.tensor(
            [p for start, n in zip(rows.starts, rows.counts, strict=True) for p in range(start, start + n)],
            device=device,
        )
        tokens = torch.tensor(rows.tokens, device=device)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # (N, 1, D)
        attention_rows = _Rows.of(rows, device)
        hidden = self.embed(tokens)[None]  # (1, N, hidden)
        total = hidden.shape[1]
        for layer, keys, values in zip(self.layers, cache.keys, cache.values, strict=True):
            attention = layer.self_attn
            normed = layer.input_layernorm(hidden)
            query = attention.q_norm(attention.q_proj(normed).view(total, self.heads, self.head_dim))
            key = attention.k_norm(attention.k_proj(normed).view(total, self.kv_heads, self.head_dim))
            value = attention.v_proj(normed).view(total, self.kv_heads, self.head_dim)
            query = query * cos + _rotate_half(query) * sin
            key = key * cos + _rotate_half(key) * sin
            keys[slots, :, positions] = key
            values[slots, :, positions] = value
            output = attention_rows.attend(self, query, keys, values)
            hidden = hidden + attention.o_proj(output[None])
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        last = torch.cumsum(torch.tensor(rows.counts, device=device), 0) - 1  # each row's last new token
        logits = self.lm_head(self.norm(hidden[0, last]))
        for index, end in enumerate(ends):
            cache.lengths[first + index] = end
        return logits.float()


ROW_CALL_KEYS = 256
"""What one attention call per row costs beyond its keys, in keys of padding: decode rows of lengths L_i attend
in one call padded to the longest when rows x longest <= sum(L_i) + ROW_CALL_KEYS x rows, else one call each
(measured on the 2-core development machine: a per-row SDPA call costs ~28 us, a key ~0.09 us)."""


@dataclass
class _Rows:
    """The step's attention: the leading decode rows (one new token each) in one call padded to the longest of
    them (GQA packed: a (B, H_kv, G, D) query; a mask only where lengths differ) when padding costs less than a
    call per row, else each row over its own slot up to its own length; a prefill row from position 0 runs SDPA's
    causal kernel (as a forward without a cache does), one after a cached prefix gets a mask (query i sees keys up
    to start + i)."""

    first: int  # row 0's slot
    offsets: list[int]  # each row's first query among the step's flat queries
    starts: list[int]
    counts: list[int]
    masks: list[torch.Tensor | None]
    together: int  # leading decode rows attended in one padded call (0: none)
    together_keys: int
    together_mask: torch.Tensor | None

    @staticmethod
    def of(rows: StepRows, device: torch.device) -> _Rows:
        offsets = [0]
        for n in rows.counts[:-1]:
            offsets.append(offsets[-1] + n)
        masks = [
            None
            if start == 0 or n == 1
            else torch.arange(start + n, device=device)[None]
            <= start + torch.arange(n, device=device)[:, None]
            for start, n in zip(rows.starts, rows.counts, strict=True)
        ]
        decoding = next((i for i, n in enumerate(rows.counts) if n != 1), len(rows.counts))
        ends = [start + 1 for start in rows.starts[:decoding]]
        longest = max(ends, default=0)
        together, mask = 0, None
        if decoding > 1 and decoding * longest <= sum(ends) + ROW_CALL_KEYS * decoding:
            together = decoding
            if min(ends) < longest:
                lengths = torch.tensor(ends, device=device)
                mask = (torch.arange(longest, device=device)[None] < lengths[:, None]).view(
                    decoding, 1, 1, longest
                )
        return _Rows(rows.first, offsets, rows.starts, rows.counts, masks, together, longest, mask)

    def attend(
        self, model: SlotModel, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor
    ) -> torch.Tensor:
        """Attention of the step's flat queries (N, H, D) -> (N, H * D)."""
        outputs = []
        width = model.heads * model.head_dim
        if self.together:
            count, end = self.together, self.first + self.together
            packed = query[:count].view(count, model.kv_heads, model.groups, model.head_dim)
            out = F.scaled_dot_product_attention(
                packed, keys[self.first : end, :, : self.together_keys],
                values[self.first : end, :, : self.together_keys], attn_mask=self.together_mask,
                scale=model.scaling,
            )  # fmt: skip
            outputs.append(out.reshape(count, width))
        for row in range(self.together, len(self.counts)):
            offset, start, n, mask = self.offsets[row], self.starts[row], self.counts[row], self.masks[row]
            slot = self.first + row
            row_keys = keys[slot : slot + 1, :, : start + n]
            row_values = values[slot : slot + 1, :, : start + n]
            if n == 1:
                packed = query[offset].view(1, model.kv_heads, model.groups, model.head_dim)
                out = F.scaled_dot_product_attention(packed, row_keys, row_values, scale=model.scaling)
                outputs.append(out.view(1, width))
                continue
            out = F.scaled_dot_product_attention(
                query[offset : offset + n].transpose(0, 1)[None], row_keys, row_values, attn_mask=mask,
                is_causal=start == 0, scale=model.scaling, enable_gqa=model.groups > 1,
            )  # fmt: skip  # (1, H, n, D)
            outputs.append(out[0].transpose(0, 1).reshape(n, width))
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
