"""KV-cache batching and token sampling for the local engine, with SGLang's sampling semantics."""

from __future__ import annotations

import hashlib
from typing import Any, Generic, TypeVar

import torch
from transformers.cache_utils import Cache, DynamicLayer

Row = TypeVar("Row")


def sample_token(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator,
    return_original_logprob: bool = False,
) -> tuple[int, float]:
    """Sample one token from logits (V,) as SGLang does; returns (token id, its log-prob).

    top_p keeps the smallest set of most likely tokens whose mass reaches top_p (a token is dropped when the mass
    before it already exceeds top_p) and renormalises; the log-prob reported is that of the unfiltered
    (temperature-scaled) distribution.
    """
    scores = logits.float()  # (V,)
    if temperature == 0:
        log_probs = torch.log_softmax(scores, dim=-1)
        token = int(torch.argmax(scores))
        return token, float(log_probs[token])
    log_probs = torch.log_softmax(scores / temperature, dim=-1)  # (V,)
    probs = log_probs.exp()
    if top_p < 1.0:
        sorted_probs, sorted_ids = probs.sort(descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before > top_p, 0.0)
        token = int(sorted_ids[torch.multinomial(sorted_probs, 1, generator=generator)])
    else:
        token = int(torch.multinomial(probs, 1, generator=generator))
    reported = torch.log_softmax(scores, dim=-1) if return_original_logprob else log_probs
    return token, float(reported[token])


def request_seed(seed: int, number: int) -> int:
    """A 32-bit seed for request `number` (torch's CPU generator keeps only the low 32 bits of a seed)."""
    digest = hashlib.blake2b(f"{seed}:{number}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little")


class GrowingLayer(DynamicLayer):
    """A DynamicLayer that appends into spare capacity in place, where DynamicLayer concatenates (copying the
    whole (B, H_kv, T, D) cache at every decode step). keys and values are views of the first T columns."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self.length = keys.shape[2]
        self.key_buffer, self.value_buffer = keys, values  # no spare room yet: the first append makes some
        self.keys, self.values = keys, values

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        new_length = self.length + key_states.shape[2]
        if new_length > self.key_buffer.shape[2]:  # double: a batch's appends cost O(T) copies in all
            self.key_buffer = _with_capacity(self.key_buffer[:, :, : self.length], 2 * new_length)
            self.value_buffer = _with_capacity(self.value_buffer[:, :, : self.length], 2 * new_length)
        self.key_buffer[:, :, self.length : new_length] = key_states
        self.value_buffer[:, :, self.length : new_length] = value_states
        self.length = new_length
        self.keys = self.key_buffer[:, :, :new_length]
        self.values = self.value_buffer[:, :, :new_length]
        return self.keys, self.values


def _with_capacity(tensor: torch.Tensor, capacity: int) -> torch.Tensor:
    batch, heads, length, dim = tensor.shape
    buffer = tensor.new_empty(batch, heads, capacity, dim)  # columns past the length are never read
    buffer[:, :, :length] = tensor
    return buffer


class RunningBatch(Generic[Row]):
    """The decode batch: rows in admission order, a left-padded KV cache and its padding mask.

    Every row's tokens are right-aligned in the cache (left padding), so a decode step appends one column for all
    rows; its position id is the row's own token count, and the mask hides the padding from attention.
    """

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.rows: list[Row] = []
        self.cache: Cache | None = None  # GrowingLayers of (B, H_kv, T, D)
        self.mask = torch.zeros(0, 0, dtype=torch.long)  # (B, T) 1 on real tokens
        self.positions: list[int] = []  # per row: tokens in the cache = position of the next input

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, joining: list[tuple[Row, Cache]]) -> None:
        """Append rows with their prefilled (1, H_kv, P, D) caches, left-padding every cache to the longest."""
        lengths = [_filled_layers(cache)[0].get_seq_length() for _, cache in joining]
        caches = ([self.cache] if self.cache is not None else []) + [cache for _, cache in joining]
        device = _tensor(_filled_layers(joining[0][1])[0].keys).device
        masks = ([self.mask] if self.rows else []) + [
            torch.ones(1, n, dtype=torch.long, device=device) for n in lengths
        ]
        length = max(mask.shape[1] for mask in masks)
        layers = []
        for parts in zip(*(_filled_layers(cache) for cache in caches), strict=True):
            keys = torch.cat([_left_pad(part.keys, length, dim=2) for part in parts], dim=0)
            values = torch.cat([_left_pad(part.values, length, dim=2) for part in parts], dim=0)
            layers.append(GrowingLayer(keys, values))
        self.cache = Cache(layers=list(layers))
        self.mask = torch.cat([_left_pad(mask, length, dim=1) for mask in masks], dim=0)
        self.rows += [row for row, _ in joining]
        self.positions += lengths

    def keep(self, keep: list[bool]) -> None:
        """Drop the rows not kept, then the leading columns that are padding in every remaining row."""
        if all(keep):
            return
        self.rows = [row for row, kept in zip(self.rows, keep, strict=True) if kept]
        self.positions = [pos for pos, kept in zip(self.positions, keep, strict=True) if kept]
        if not self.rows or self.cache is None:
            self.clear()
            return
        indices = torch.tensor([i for i, kept in enumerate(keep) if kept], device=self.mask.device)
        start = int(self.mask.shape[1] - max(self.positions))
        self.mask = self.mask[indices, start:]
        layers = [
            GrowingLayer(_tensor(layer.keys)[indices, :, start:], _tensor(layer.values)[indices, :, start:])
            for layer in _filled_layers(self.cache)
        ]
        self.cache = Cache(layers=list(layers))


def _filled_layers(cache: Cache) -> list[DynamicLayer]:
    """The cache's layers, each holding (B, H_kv, T, D) keys and values."""
    layers = list(cache.layers)
    if not all(isinstance(layer, DynamicLayer) and layer.keys is not None for layer in layers):
        raise TypeError(
            f"expected filled full-attention DynamicLayers, got {[type(x).__name__ for x in layers]}"
        )
    return layers  # type: ignore[return-value]


def _tensor(tensor: torch.Tensor | None) -> torch.Tensor:
    assert tensor is not None, "a filled cache layer"
    return tensor


def _left_pad(tensor: torch.Tensor | None, length: int, dim: int) -> torch.Tensor:
    tensor = _tensor(tensor)
    missing = length - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
