"""The trainer tests' tokenizer, shared by test_grpo_trainer, test_trainer_process and test_distributed (test_sft,
test_packing and test_megatron_backend train theirs on their own text: their module's `tokenizer` replaces it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.tiny_models import TRAINER_CORPUS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from tests.tiny_models import TinyModels


@pytest.fixture(scope="session")
def tokenizer(tiny_models: TinyModels) -> PreTrainedTokenizerBase:
    return tiny_models.tokenizer(TRAINER_CORPUS * 20, vocab_size=300)
