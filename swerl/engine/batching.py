"""The local engine's running batch (rows in KV slots) and token sampling, with SGLang's sampling semantics."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Generic, TypeVar

import torch

from swerl.engine.slots import SlotCache

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


def sample_rows(
    logits: torch.Tensor,
    temperatures: Sequence[float],
    top_ps: Sequence[float],
    generators: Sequence[torch.Generator],
    return_original_logprob: bool = False,
) -> tuple[list[int], list[float]]:
    """sample_token for every row of logits (B, V) at once: row i with its own temperature, top_p and generator.

    The same tokens and log-probs as sample_token row by row: torch.multinomial draws one sample as
    argmax(probs / noise), noise exponential from the generator over the (V,) row, so each row's noise comes from
    its own generator (a row's token never depends on the other rows) and the rest is one vectorised op per group
    (greedy rows; sampled rows without and with top-p).
    """
    count, vocab = logits.shape
    scores = logits.float()
    tokens = torch.zeros(count, dtype=torch.long)
    logprobs = torch.zeros(count)
    greedy = [i for i in range(count) if temperatures[i] == 0]
    if greedy:
        index = torch.tensor(greedy)
        rows = scores[index]
        chosen = rows.argmax(dim=-1)
        tokens[index] = chosen
        logprobs[index] = torch.log_softmax(rows, dim=-1).gather(1, chosen[:, None])[:, 0]
    sampled = [i for i in range(count) if temperatures[i] != 0]
    if not sampled:
        return tokens.tolist(), logprobs.tolist()
    rows = scores[torch.tensor(sampled)]
    temperature = torch.tensor([[temperatures[i]] for i in sampled])
    log_probs = torch.log_softmax(rows / temperature, dim=-1)  # (S, V)
    probs = log_probs.exp()
    noise = torch.empty(len(sampled), vocab)
    for row, i in enumerate(sampled):
        noise[row].exponential_(generator=generators[i])
    chosen = torch.zeros(len(sampled), dtype=torch.long)
    plain = [row for row, i in enumerate(sampled) if top_ps[i] >= 1.0]
    if plain:
        index = torch.tensor(plain)
        chosen[index] = (probs[index] / noise[index]).argmax(dim=-1)
    nucleus = [row for row, i in enumerate(sampled) if top_ps[i] < 1.0]
    if nucleus:
        index = torch.tensor(nucleus)
        top_p = torch.tensor([[top_ps[sampled[row]]] for row in nucleus])
        sorted_probs, sorted_ids = probs[index].sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(mass_before > top_p, 0.0)
        picked = (sorted_probs / noise[index]).argmax(dim=-1, keepdim=True)
        chosen[index] = sorted_ids.gather(1, picked)[:, 0]
    reported = torch.log_softmax(rows, dim=-1) if return_original_logprob else log_probs
    index = torch.tensor(sampled)
    tokens[index] = chosen
    logprobs[index] = reported.gather(1, chosen[:, None])[:, 0]
    return tokens.tolist(), logprobs.tolist()


class RunningBatch(Generic[Row]):
    """The decode batch: row i holds KV slot i of `cache`. A joining row takes the next slot; a leaving row's slot
    goes to the last row (its KV moves there), so the rows always fill slots 0..len-1."""

    def __init__(self, cache: SlotCache) -> None:
        self.cache = cache
        self.rows: list[Row] = []

    def clear(self) -> None:
        self.rows = []
        self.cache.lengths = [0] * len(self.cache.lengths)

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, rows: list[Row]) -> int:
        """Append rows (their slots empty); returns the first one's slot."""
        first = len(self.rows)
        if first + len(rows) > len(self.cache.lengths):
            raise ValueError(f"{first + len(rows)} rows, the KV cache has {len(self.cache.lengths)} slots")
        self.rows += rows
        return first

    def keep(self, keep: list[bool]) -> None:
        """Drop the rows not kept; each freed slot is taken by the last row (highest dropped slot first)."""
        for index in sorted((i for i, kept in enumerate(keep) if not kept), reverse=True):
            last = len(self.rows) - 1
            if index != last:
                self.cache.move(last, index)
                self.rows[index] = self.rows[last]
            else:
                self.cache.lengths[index] = 0
            self.rows.pop()
