"""The trace tests' tokenizer, shared by test_agent_traces and test_traces_wild (test_agent_episode trains its own on
a repository's source: its module's `tokenizer` replaces this one)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from transformers import AutoTokenizer

from swerl.agent.tools import system_prompt
from swerl.model.toolcall import format_tool_call

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from tests.tiny_models import TinyModels


@pytest.fixture(scope="session")
def tokenizer(tiny_models: TinyModels) -> PreTrainedTokenizerBase:
    """A 400-token BPE of the system prompt and one tool call, as loaded back from its folder."""
    corpus = [system_prompt(), format_tool_call("bash", {"command": "ls -la"})] * 10
    return AutoTokenizer.from_pretrained(tiny_models.tokenizer_dir(corpus, 400), local_files_only=True)
