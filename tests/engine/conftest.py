"""The engine server, router and weight-sync tests' models (test_engine_local and test_engine_launcher make their
own, on other text and context lengths)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.engine_helpers import CORPUS, POSITIONS, VOCAB

if TYPE_CHECKING:
    from tests.tiny_models import TinyModels


@pytest.fixture(scope="session")
def models(tiny_models: TinyModels) -> dict[str, Path]:
    """Two same-architecture tiny models (v0, v1) and one of another architecture (wide), saved; read only."""
    tokenizer = tiny_models.tokenizer(CORPUS * 20, vocab_size=VOCAB)
    return {
        name: tiny_models.saved(tokenizer, POSITIONS, seed, hidden_size=hidden)
        for name, seed, hidden in (("v0", 0, 64), ("v1", 1, 64), ("wide", 2, 96))
    }
