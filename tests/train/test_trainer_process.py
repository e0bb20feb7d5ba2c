"""The GRPO trainer in a process of its own (swerl.train.trainer_process): the same numbers as the trainer in this
process, exceptions carried back, a killed child named as such. Real spawned processes, a real tiny Qwen3 model;
that the child also ends with a SIGKILLed run is checked by tests/stages/test_grpo_async_crash.py."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from swerl.model.loading import load_model_and_tokenizer, load_tokenizer
from swerl.model.tokenizer import save_tokenizer
from swerl.train.checkpoint import StreamPosition
from swerl.train.grpo_trainer import GRPOTrainer
from swerl.train.trainer_process import TrainerProcess, TrainerProcessDied
from tests.tiny_models import tiny_qwen3
from tests.train.test_grpo_trainer import CONTEXT, synthetic_groups
from tests.trainer_helpers import grpo_trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

OPTIONS: dict[str, Any] = dict(lr=3e-3, ppo_epochs=2, num_minibatches=2, micro_batch_tokens=32, seed=5)


def make_trainer(tokenizer_dir: str, threads: int) -> GRPOTrainer:
    """The factory both sides use (module level: the spawned child imports it)."""
    torch.set_num_threads(threads)
    tokenizer = load_tokenizer(tokenizer_dir)
    return grpo_trainer(tiny_qwen3(tokenizer, CONTEXT), tokenizer=tokenizer, **OPTIONS)


@pytest.fixture
def tokenizer_dir(tokenizer: PreTrainedTokenizerBase, tmp_path: Path) -> str:
    out = tmp_path / "tokenizer"
    save_tokenizer(tokenizer, out)
    # load_tokenizer checks for a model directory: give it the files it looks for (never loaded as weights here)
    tiny_qwen3(tokenizer, CONTEXT).save_pretrained(out)
    return str(out)


def test_a_trainer_process_trains_exactly_as_the_trainer_in_this_process(tokenizer_dir: str, tmp_path: Path) -> None:
    vocab = len(load_tokenizer(tokenizer_dir))
    batches = [synthetic_groups(seed=10 + step, vocab=vocab) for step in range(3)]
    here = make_trainer(tokenizer_dir, 1)
    with TrainerProcess(make_trainer, tokenizer_dir, 1) as there:
        assert there.pid != os.getpid() and there.step == 0
        for batch in batches:
            expected, actual = here.train_step(batch), there.train_step(batch)
            assert there.step == here.step
            assert actual["loss"] != 0 and actual["optimizer_updates"] == 4
            timeless = {key for key in expected if not key.startswith("time_")}
            assert {key: actual[key] for key in timeless} == {key: expected[key] for key in timeless}
        exported = there.export_weights(tmp_path / "exports")
        assert exported.name.endswith(f"{here.step:08d}")
        checkpoint = there.save(tmp_path / "checkpoints", StreamPosition(epoch=1, example_index=3, num_examples=9))
        final = there.save_model(tmp_path / "final")
    for directory in (exported, final):
        model, _ = load_model_and_tokenizer(directory)
        for (name, mine), theirs in zip(here.model.state_dict().items(), model.state_dict().values(), strict=True):
            assert torch.equal(mine, theirs), name
    # The child's checkpoint resumes a trainer in this process at the same position.
    resumed = make_trainer(tokenizer_dir, 1)
    state = resumed.load(checkpoint)
    assert (state.step, state.epoch, state.example_index, resumed.step) == (3, 1, 3, 3)


def test_an_exception_in_the_child_is_raised_here_and_the_child_keeps_serving(tokenizer_dir: str) -> None:
    vocab = len(load_tokenizer(tokenizer_dir))
    groups = synthetic_groups(seed=1, vocab=vocab)
    bad = [[t.model_copy(update={"token_ids": [vocab + 100] * len(t.token_ids)}) for t in group] for group in groups]
    with TrainerProcess(make_trainer, tokenizer_dir, 1) as there:
        with pytest.raises(IndexError):  # the embedding lookup of an id beyond the vocabulary, in the child
            there.train_step(bad)
        assert there.step == 0
        there.train_step(groups)
        assert there.step == 1
        with pytest.raises(FileNotFoundError):
            there.load("/nonexistent/checkpoint")


def test_a_child_that_dies_is_reported_with_its_exit_code(tokenizer_dir: str) -> None:
    groups = synthetic_groups(seed=1, vocab=len(load_tokenizer(tokenizer_dir)))
    there = TrainerProcess(make_trainer, tokenizer_dir, 1)
    try:
        assert there.pid is not None
        os.kill(there.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        with pytest.raises(TrainerProcessDied, match="exit code -9"):
            while time.monotonic() < deadline:  # the call may race the death; it must fail once it is seen
                there.train_step(groups)
                time.sleep(0.05)
    finally:
        there.close()


def test_a_factory_that_fails_fails_the_first_call_of_a_lazy_start(tmp_path: Path) -> None:
    there = TrainerProcess(make_trainer, "/nonexistent/model", 1, wait=False)  # returns before the child is up
    with pytest.raises(FileNotFoundError, match="not a local directory"):
        there.export_weights(tmp_path)
    with pytest.raises(TrainerProcessDied, match="not running"):
        there.export_weights(tmp_path)
    there.close()
