"""Tiny Qwen3 models as the tests build them: the shapes, tiny_qwen3, and TinyModels, the cache behind conftest's
`tiny_models` fixture (each tokenizer trained, each saved model written, once per test session).

build_tiny_model seeds its own generator (the caller's is untouched), so the same tokenizer, shape, positions and
seed give the same weights wherever and however often a model is built: a cached tokenizer or saved folder is what
each test built for itself before. A test that trains a model gets a fresh one from tiny_qwen3; spawned children
(a trainer process, FSDP2 ranks) cannot take a fixture and call tiny_qwen3 themselves.

Imports only swerl.model (torch, transformers): the GPU check runs tests/train/test_megatron_backend.py with swerl's
trainer dependencies alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DENSE: dict[str, Any] = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
"""The trainer and engine tests' tiny Qwen3."""
SMALL: dict[str, Any] = dict(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=64)
"""One layer: the policy of the emulated-engine runs (benchmarks/grpo_async.py's tiny_trainer has the same)."""
MOE: dict[str, Any] = dict(moe=True, num_experts=4, num_experts_per_tok=2)
"""Given with a shape: its Qwen3-MoE variant (4 experts, 2 per token)."""

TRAINER_CORPUS = [
    "task 0: name a letter\n",
    "name a digit: 0 1 2 3 4 5 6 7 8 9\n",
    "the quick brown fox jumps over the lazy dog\n",
    "def add(left, right):\n    return left + right\n",
]
"""What the trainer tests' tokenizer (tests/train/conftest.py) is trained on, 20 times over, to 300 tokens."""


def tiny_qwen3(
    tokenizer: PreTrainedTokenizerBase,
    positions: int,
    seed: int = 0,
    shape: dict[str, Any] = DENSE,
    **overrides: Any,
) -> PreTrainedModel:
    """A fresh build_tiny_model: `shape` with `overrides` (other sizes, MOE), `positions` max positions, `seed`."""
    from swerl.model.loading import build_tiny_model

    return build_tiny_model(tokenizer, **(shape | overrides), max_position_embeddings=positions, seed=seed)


class TinyModels:
    """Tokenizers and saved models under `root`, each made once: ask again with the same arguments, get the same
    object (a tokenizer) or folder (a saved model). Never change what it hands out: other tests share it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._tokenizers: dict[tuple[tuple[str, ...], int], tuple[Path, PreTrainedTokenizerBase]] = {}
        self._saved: dict[tuple[Any, ...], Path] = {}

    def tokenizer(self, corpus: Sequence[str], vocab_size: int) -> PreTrainedTokenizerBase:
        """train_tokenizer(corpus, vocab_size): a byte-level BPE in Hugging Face format."""
        return self._trained(corpus, vocab_size)[1]

    def tokenizer_dir(self, corpus: Sequence[str], vocab_size: int) -> Path:
        """The folder train_tokenizer(corpus, vocab_size) saved it in (for a test that loads it from disk)."""
        return self._trained(corpus, vocab_size)[0]

    def _trained(self, corpus: Sequence[str], vocab_size: int) -> tuple[Path, PreTrainedTokenizerBase]:
        from swerl.model.tokenizer import train_tokenizer

        key = (tuple(corpus), vocab_size)
        if key not in self._tokenizers:
            out = self.root / f"tokenizer-{len(self._tokenizers)}"
            self._tokenizers[key] = out, train_tokenizer(list(corpus), vocab_size=vocab_size, out_dir=out)
        return self._tokenizers[key]

    def saved(
        self,
        tokenizer: PreTrainedTokenizerBase,
        positions: int,
        seed: int = 0,
        shape: dict[str, Any] = DENSE,
        **overrides: Any,
    ) -> Path:
        """tiny_qwen3(tokenizer, positions, seed, shape, **overrides) saved with its tokenizer: a model folder."""
        from swerl.model.loading import save_model_and_tokenizer

        key = (id(tokenizer), positions, seed, tuple(sorted((shape | overrides).items())))
        if key not in self._saved:
            model = tiny_qwen3(tokenizer, positions, seed, shape, **overrides)
            self._saved[key] = save_model_and_tokenizer(model, tokenizer, self.root / f"model-{len(self._saved)}")
        return self._saved[key]
