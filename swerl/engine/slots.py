"""The local engine's KV cache and model step: per-slot KV buffers and a Qwen3 forward over them.

SlotCache holds, per layer, keys and values of (slots, H_kv, capacity, D): the running batch's row i lives in slot
i, holding its first `lengths[i]` positions; a step writes each new token's keys and values in place at its
position, and attention reads each slot up to its own length (masked past it). A request joining takes the next
free slot; one leaving hands its slot to the batch's last row (one row's KV moves), so joins and leaves never
rebuild or copy the batch. Capacity grows by doubling up to `max_tokens` (the engine's context cap), the only
time the whole buffer is copied.

SlotModel runs a Hugging Face Qwen3 (dense or MoE) on those buffers with the model's own weights and none of its
per-call machinery (cache objects, mask builders): the new tokens of every row go through the projections and MLP
as one flat batch (decode rows and prefills alike), q, k and v as one matmul of their concatenated weights, a
dense MLP's gate and up as another (_FusedWeights, rebuilt when a weight update changes the model's parameters),
q_norm and k_norm and RoPE as one op sequence over q's and k's heads together (the same values as the model's
own modules: bit for bit, checked with the CPU build's MKL). Decode rows (slots in batch order) attend in runs of
consecutive slots, each run one call padded to its longest row (GQA packed into a (B, H_kv, G, D) query, as
transformers does for one token; a length mask where lengths differ), the runs chosen to read the fewest keys
counting ROW_CALL_KEYS per call; a prefill from position 0 runs SDPA's causal kernel, one after a cached prefix
a causal mask offset by the prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel


class SlotCache:
    """Per-layer keys and values of (slots, H_kv, capacity, D); slot i holds lengths[i] positions."""

    def __init__(
        self,
        layers: int,
        slots: int,
        kv_heads: int,
        head_dim: int,
        max_tokens: int,
        dtype: torch.dtype,
        device: torch.device,
        initial_capacity: int = 256,
    ) -> None:
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
        self._fused: list[_FusedWeights] = []
        self._fused_sources = [parameter for layer in self.layers for parameter in _FusedWeights.sources(layer)]
        self._fused_versions: list[int] = []

    @torch.inference_mode()
    def rope_table(self) -> None:
        """cos and sin of every position below max_tokens, as the model's rotary embedding computes them."""
        device = self.embed.weight.device
        dtype = self.embed.weight.dtype
        positions = torch.arange(self.max_tokens, device=device)[None]
        probe = torch.zeros(1, dtype=dtype, device=device)
        cos, sin = self.model.model.rotary_emb(probe, positions)  # type: ignore[attr-defined]
        self.cos, self.sin = cos[0], sin[0]  # (max_tokens, D)
        # rotate_half(x) * sin == cat(x2, x1) * cat(-sin1, sin2) exactly (a sign moved between factors)
        half = self.head_dim // 2
        self.sin_signed = torch.cat((-self.sin[:, :half], self.sin[:, half:]), dim=-1)

    def fused_weights(self) -> list[_FusedWeights]:
        """Each layer's concatenated weights, rebuilt when any source parameter changed (its version counter: a
        weight update copies into the parameters in place, load_state_dict and the weight group alike)."""
        versions = [parameter._version for parameter in self._fused_sources]
        if versions != self._fused_versions:
            self._fused = [_FusedWeights.of(layer, self.heads, self.kv_heads) for layer in self.layers]
            self._fused_versions = versions
        return self._fused

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
        fused = self.fused_weights()
        slots = torch.tensor([first + i for i, n in enumerate(rows.counts) for _ in range(n)], device=device)
        positions = torch.tensor(
            [p for start, n in zip(rows.starts, rows.counts, strict=True) for p in range(start, start + n)],
            device=device,
        )
        tokens = torch.tensor(rows.tokens, device=device)
        cos, sin = self.cos[positions][:, None], self.sin_signed[positions][:, None]  # (N, 1, D)
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        half = dim // 2
        # each new key's row in a layer's buffer seen as (slots * H_kv * capacity, D)
        flat = (slots[:, None] * kv_heads + torch.arange(kv_heads, device=device)) * cache.capacity
        flat = (flat + positions[:, None]).view(-1)
        attention_rows = _Rows.of(rows, device, cache.dtype)
        hidden = self.embed(tokens)  # (N, hidden)
        total = hidden.shape[0]
        for layer, weights, keys, values in zip(self.layers, fused, cache.keys, cache.values, strict=True):
            attention = layer.self_attn
            qkv = F.linear(layer.input_layernorm(hidden), weights.qkv, weights.qkv_bias)
            query_key = qkv[:, : (heads + kv_heads) * dim].view(total, heads + kv_heads, dim)
            value = qkv[:, (heads + kv_heads) * dim :].view(total, kv_heads, dim)
            query_key = _rms_norm(query_key, weights.query_key_norm, weights.norm_eps)  # q_norm, k_norm
            rotated = torch.cat((query_key[..., half:], query_key[..., :half]), dim=-1)
            query_key = query_key * cos + rotated * sin
            query, key = query_key[:, :heads], query_key[:, heads:]
            keys.view(-1, dim).index_copy_(0, flat, key.reshape(-1, dim))
            values.view(-1, dim).index_copy_(0, flat, value.reshape(-1, dim))
            output = attention_rows.attend(self, query, keys, values)
            hidden = hidden + attention.o_proj(output)
            normed = layer.post_attention_layernorm(hidden)
            if weights.gate_up is None:  # MoE experts: the model's own block
                hidden = hidden + layer.mlp(normed[None])[0]
            else:
                mlp = layer.mlp
                gate, up = F.linear(normed, weights.gate_up).split(weights.intermediate, dim=-1)
                hidden = hidden + mlp.down_proj(mlp.act_fn(gate) * up)
        last = torch.cumsum(torch.tensor(rows.counts, device=device), 0) - 1  # each row's last new token
        logits = self.lm_head(self.norm(hidden[last]))
        for index, end in enumerate(ends):
            cache.lengths[first + index] = end
        return logits.float()


@dataclass
class _FusedWeights:
    """One layer's concatenated weights: q, k, v projections (rows q, then k, then v: one matmul gives all three,
    each column as its own projection computes it), q_norm's and k_norm's weights per head, and a dense MLP's
    gate and up projections (None for a MoE block, run as the model's own)."""

    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    query_key_norm: torch.Tensor  # (H + H_kv, D)
    norm_eps: float
    gate_up: torch.Tensor | None
    intermediate: int

    @staticmethod
    def sources(layer: Any) -> list[torch.Tensor]:
        """The parameters the fused weights copy."""
        attention, mlp = layer.self_attn, layer.mlp
        modules = [attention.q_proj, attention.k_proj, attention.v_proj, attention.q_norm, attention.k_norm]
        modules += [getattr(mlp, name) for name in ("gate_proj", "up_proj") if hasattr(mlp, name)]
        return [parameter for module in modules for parameter in module.parameters()]

    @staticmethod
    def of(layer: Any, heads: int, kv_heads: int) -> _FusedWeights:
        attention = layer.self_attn
        projections = (attention.q_proj, attention.k_proj, attention.v_proj)
        biases = [projection.bias for projection in projections]
        if attention.q_norm.variance_epsilon != attention.k_norm.variance_epsilon:
            raise ValueError("q_norm and k_norm with different eps are not supported")
        norm = torch.cat((attention.q_norm.weight.expand(heads, -1), attention.k_norm.weight.expand(kv_heads, -1)))
        mlp = layer.mlp
        dense = all(isinstance(getattr(mlp, name, None), torch.nn.Linear) for name in ("gate_proj", "up_proj"))
        dense = dense and mlp.gate_proj.bias is None and mlp.up_proj.bias is None
        return _FusedWeights(
            qkv=torch.cat([projection.weight for projection in projections]).detach(),
            qkv_bias=None if any(bias is None for bias in biases) else torch.cat(biases).detach(),
            query_key_norm=norm.detach(),
            norm_eps=attention.q_norm.variance_epsilon,
            gate_up=torch.cat((mlp.gate_proj.weight, mlp.up_proj.weight)).detach() if dense else None,
            intermediate=mlp.gate_proj.out_features if dense else 0,
        )


def _rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm's forward, op for op (the same bits), with the weight broadcast over (..., H, D) per head."""
    dtype = hidden.dtype
    hidden = hidden.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return weight * hidden.to(dtype)


ROW_CALL_KEYS = 256
"""What one attention call costs beyond its keys, in keys: decode rows attend in runs of consecutive slots, one
call per run padded to its longest row, the runs chosen to minimise sum(rows x longest + ROW_CALL_KEYS) over the
calls (measured on the 2-core development machine: an SDPA call costs ~28 us, a key ~0.09 us)."""


def decode_runs(ends: list[int]) -> list[tuple[int, int]]:
    """Split decode rows of key lengths `ends` (in slot order) into runs [a, b) of consecutive rows, each attended
    in one call padded to its longest: the split reading the fewest keys, counting ROW_CALL_KEYS per call (exact,
    by dynamic programming over the split points; O(rows^2))."""
    call_keys = ROW_CALL_KEYS
    count = len(ends)
    best = [0] + [0] * count  # best[b]: the cost of rows [0, b)
    cut = [0] * (count + 1)  # cut[b]: where the last run of that best split starts
    for end in range(1, count + 1):
        longest, best[end] = 0, -1
        for begin in range(end - 1, -1, -1):
            longest = max(longest, ends[begin])
            cost = best[begin] + (end - begin) * longest + call_keys
            if best[end] < 0 or cost < best[end]:
                best[end], cut[end] = cost, begin
    runs = []
    end = count
    while end > 0:
        runs.append((cut[end], end))
        end = cut[end]
    return runs[::-1]


@dataclass
class _Rows:
    """The step's attention: the leading decode rows (one new token each) in runs of consecutive slots
    (decode_runs), each run one call padded to its longest row (GQA packed: a (B, H_kv, G, D) query; an additive
    mask only where lengths differ, built once for every layer); a prefill row from position 0 runs SDPA's causal
    kernel (as a forward without a cache does), one after a cached prefix gets a mask (query i sees keys up to
    start + i)."""

    first: int  # row 0's slot
    offsets: list[int]  # each row's first query among the step's flat queries
    starts: list[int]
    counts: list[int]
    masks: list[torch.Tensor | None]
    decoding: int  # the leading decode rows, attended in runs
    runs: list[tuple[int, int, int, torch.Tensor | None]]  # (first row, end row, keys, additive mask or None)

    @staticmethod
    def of(rows: StepRows, device: torch.device, dtype: torch.dtype) -> _Rows:
        offsets = [0]
        for n in rows.counts[:-1]:
            offsets.append(offsets[-1] + n)
        masks = [
            None
            if start == 0 or n == 1
            else torch.arange(start + n, device=device)[None] <= start + torch.arange(n, device=device)[:, None]
            for start, n in zip(rows.starts, rows.counts, strict=True)
        ]
        decoding = next((i for i, n in enumerate(rows.counts) if n != 1), len(rows.counts))
        ends = [start + 1 for start in rows.starts[:decoding]]
        runs: list[tuple[int, int, int, torch.Tensor | None]] = []
        split = decode_runs(ends)
        every: torch.Tensor | None = None  # every decode row's additive mask, up to the longest row
        if any(min(ends[begin:end]) < max(ends[begin:end]) for begin, end in split):
            # SDPA's own conversion of a boolean mask (0 where seen, -inf past the row), once for every layer
            hidden = torch.arange(max(ends), device=device)[None] >= torch.tensor(ends, device=device)[:, None]
            every = torch.zeros(len(ends), 1, 1, max(ends), dtype=dtype, device=device)
            every.masked_fill_(hidden.view(len(ends), 1, 1, max(ends)), float("-inf"))
        for begin, end in split:
            longest = max(ends[begin:end])
            mask = None
            if every is not None and min(ends[begin:end]) < longest:
                mask = every[begin:end, :, :, :longest]
            runs.append((begin, end, longest, mask))
        return _Rows(rows.first, offsets, rows.starts, rows.counts, masks, decoding, runs)

    def attend(self, model: SlotModel, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Attention of the step's flat queries (N, H, D) -> (N, H * D)."""
        outputs = []
        width = model.heads * model.head_dim
        for begin, end, length, mask in self.runs:
            count, slot = end - begin, self.first + begin
            packed = query[begin:end].reshape(count, model.kv_heads, model.groups, model.head_dim)
            out = F.scaled_dot_product_attention(
                packed,
                keys[slot : slot + count, :, :length],
                values[slot : slot + count, :, :length],
                attn_mask=mask,
                scale=model.scaling,
            )
            outputs.append(out.reshape(count, width))
        for row in range(self.decoding, len(self.counts)):
            offset, start, n, mask = self.offsets[row], self.starts[row], self.counts[row], self.masks[row]
            slot = self.first + row
            row_keys = keys[slot : slot + 1, :, : start + n]
            row_values = values[slot : slot + 1, :, : start + n]
            if n == 1:
                packed = query[offset].reshape(1, model.kv_heads, model.groups, model.head_dim)
                out = F.scaled_dot_product_attention(packed, row_keys, row_values, scale=model.scaling)
                outputs.append(out.view(1, width))
                continue
            out = F.scaled_dot_product_attention(
                query[offset : offset + n].transpose(0, 1)[None],
                row_keys,
                row_values,
                attn_mask=mask,
                is_causal=start == 0,
                scale=model.scaling,
                enable_gqa=model.groups > 1,
            )  # (1, H, n, D)
            outputs.append(out[0].transpose(0, 1).reshape(n, width))
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)
