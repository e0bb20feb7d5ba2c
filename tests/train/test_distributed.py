"""The trainer over FSDP2 ranks (swerl.train.distributed, swerl.train.ranks): 2 gloo ranks, real spawned processes
and a real tiny Qwen3 (dense and MoE), against the one-process trainer on the same data.

Tolerance. The ranks compute the one-process update up to the order of floating-point sums (each rank sums its
own micro-batches; gloo reduce-scatters and all-reduces the rest): in fp32, per-step losses and gradient norms agree
to RTOL and the weights after a few AdamW steps to ATOL (measured: ~1e-7 and ~3e-7). A resumed run of the same
world size is bitwise equal to an uninterrupted one (same ranks, same order of every sum).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from swerl.config.train import DistributedConfig, SFTConfig
from swerl.model.loading import load_model_and_tokenizer, load_tokenizer
from swerl.model.tokenizer import save_tokenizer
from swerl.train.checkpoint import StreamPosition
from swerl.train.distributed import init_rank, load_sharded_model
from swerl.train.grpo_trainer import GRPOTrainer
from swerl.train.ranks import DistributedTrainer, SFTRanks
from swerl.train.sft import SFTTrainer, run_sft_steps, train_sft
from swerl.train.trainer_process import TrainerProcessDied
from tests.tiny_models import MOE, tiny_qwen3
from tests.train.test_grpo_trainer import CONTEXT, synthetic_groups
from tests.trainer_helpers import grpo_trainer

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]

RTOL = 1e-5
ATOL = 1e-5
TWO_RANKS = DistributedConfig(backend="fsdp2", ranks=2, start_timeout_s=300, collective_timeout_s=120)
GRPO_OPTIONS: dict[str, Any] = dict(lr=3e-3, micro_batch_tokens=48, seed=5)
SFT_OPTIONS: dict[str, Any] = dict(
    seq_len=64, max_steps=4, rows_per_micro_batch=1, grad_accum_steps=3, lr=3e-3, warmup_steps=1, seed=3
)
TRAP_FILE = "SWERL_TEST_TRAP"
"""Rank 1, when its environment names a file here, writes it in its second step once the gradients are computed
(after the ranks reduced them, before the optimizer step), then sleeps: the test kills the group there."""


def _trap(step: int) -> None:
    path = os.environ.get(TRAP_FILE)
    if path and os.environ.get("RANK") == "1" and step == 1:
        Path(path).write_text("mid-step")
        time.sleep(600)


class TrappedGRPO(GRPOTrainer):
    def _optimizer_step(self) -> float:
        _trap(self.step)  # the step's number before it ends: 1 in the second step
        return super()._optimizer_step()


def grpo_rank(model_dir: str, config: DistributedConfig, trap: str | None = None) -> GRPOTrainer:
    """Factory of one rank (module level: spawned children import it)."""
    torch.set_num_threads(1)
    if trap:
        os.environ[TRAP_FILE] = trap
    ranks = init_rank(config)
    model, tokenizer = load_sharded_model(Path(model_dir), ranks), load_tokenizer(model_dir)
    trainer = grpo_trainer(model, tokenizer=tokenizer, ranks=ranks, **GRPO_OPTIONS)
    trainer.__class__ = TrappedGRPO
    return trainer


def sft_rank(model_dir: str, examples: list[tuple[list[int], list[int]]], config: DistributedConfig) -> SFTTrainer:
    torch.set_num_threads(1)
    ranks = init_rank(config)
    model, tokenizer = load_model_and_tokenizer(model_dir)
    return SFTTrainer(
        model, examples, tokenizer=tokenizer, pad_token_id=tokenizer.pad_token_id, ranks=ranks, **SFT_OPTIONS
    )


def _model_dir(tokenizer: PreTrainedTokenizerBase, out: Path, moe: bool = False) -> str:
    model = tiny_qwen3(tokenizer, CONTEXT, **(MOE if moe else {}))
    model.save_pretrained(out)
    save_tokenizer(tokenizer, out)
    return str(out)


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_model_and_tokenizer(directory)[0].state_dict()


def _assert_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    assert actual.keys() == expected.keys()
    worst = 0.0
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor, rtol=0, atol=ATOL, msg=name)
        worst = max(worst, float((actual[name] - tensor).abs().max()))
    return worst


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_two_gloo_ranks_make_the_one_process_grpo_steps(
    tokenizer: PreTrainedTokenizerBase,
    tmp_path: Path,
    moe: bool,
) -> None:
    model_dir = _model_dir(tokenizer, tmp_path / "start", moe)
    vocab = len(tokenizer)
    batches = [synthetic_groups(seed=20 + step, vocab=vocab, num_groups=4) for step in range(3)]
    model, _ = load_model_and_tokenizer(model_dir)
    here = grpo_trainer(model, tokenizer=tokenizer, **GRPO_OPTIONS)
    with DistributedTrainer(grpo_rank, model_dir, TWO_RANKS, config=TWO_RANKS) as there:
        assert len(set(there.pids)) == 2 and os.getpid() not in there.pids
        for batch in batches:
            expected, actual = here.train_step(batch), there.train_step(batch)
            assert actual["micro_batches"] >= 3  # an odd count too: a rank makes a zero pass
            assert there.step == here.step
            for key in ("loss", "grad_norm", "pg_loss", "entropy_mean", "ess_ratio", "loss_tokens"):
                assert actual[key] == pytest.approx(expected[key], rel=RTOL, abs=1e-7), key
        exported = there.export_weights(tmp_path / "exports")
        final = there.save_model(tmp_path / "final")
    assert exported.name.endswith(f"{here.step:08d}")
    for directory in (exported, final):
        _assert_close(_weights(directory), {k: v.detach() for k, v in here.model.state_dict().items()})
    assert (final / "tokenizer.json").is_file()


def test_two_gloo_ranks_make_the_one_process_sft_steps(
    tokenizer: PreTrainedTokenizerBase,
    tmp_path: Path,
) -> None:
    model_dir = _model_dir(tokenizer, tmp_path / "start")
    generator = torch.Generator().manual_seed(0)
    examples = []
    for _ in range(14):
        length = int(torch.randint(12, 40, (1,), generator=generator))
        ids = torch.randint(5, len(tokenizer), (length,), generator=generator).tolist()
        mask = [0] * (length // 3) + [1] * (length - length // 3)
        examples.append((ids, mask))
    model, _ = load_model_and_tokenizer(model_dir)
    losses: list[float] = []
    train_sft(
        model, examples, pad_token_id=tokenizer.pad_token_id, on_step=lambda m: losses.append(m.loss), **SFT_OPTIONS
    )
    with SFTRanks(sft_rank, model_dir, examples, TWO_RANKS, config=TWO_RANKS) as ranks:
        distributed: list[float] = []
        run_sft_steps(ranks, SFT_OPTIONS["max_steps"], on_step=lambda m: distributed.append(m.loss))
        final = ranks.save_model(tmp_path / "final")
        checkpoint = ranks.save(tmp_path / "checkpoints")
    assert distributed == pytest.approx(losses, rel=RTOL)
    assert len(losses) == SFT_OPTIONS["max_steps"] and losses[-1] < losses[0]
    _assert_close(_weights(final), {k: v.detach() for k, v in model.state_dict().items()})
    # the checkpoint: full HF weights beside the shards, rank RNG files, the optimizer state sharded
    assert (checkpoint / "sharded" / ".metadata").is_file()
    assert sorted(p.name for p in checkpoint.glob("rng_rank*.pt")) == ["rng_rank00000.pt", "rng_rank00001.pt"]
    _assert_close(_weights(checkpoint), {k: v.detach() for k, v in model.state_dict().items()})


def test_a_sigkill_mid_step_resumes_exactly(
    tokenizer: PreTrainedTokenizerBase,
    tmp_path: Path,
) -> None:
    """Uninterrupted: 3 steps. Interrupted: 1 step, checkpoint, step 2 killed (SIGKILL of rank 1 after its
    gradients were reduced, before the optimizer step); a new group resumes from the checkpoint and makes steps
    2 and 3. The two runs end bitwise equal."""
    model_dir = _model_dir(tokenizer, tmp_path / "start")
    batches = [synthetic_groups(seed=40 + step, vocab=len(tokenizer), num_groups=4) for step in range(3)]
    with DistributedTrainer(grpo_rank, model_dir, TWO_RANKS, config=TWO_RANKS) as straight:
        for batch in batches:
            straight.train_step(batch)
        expected = _weights(straight.save_model(tmp_path / "straight"))

    trap = tmp_path / "trap"
    group = DistributedTrainer(grpo_rank, model_dir, TWO_RANKS, str(trap), config=TWO_RANKS)
    try:
        group.train_step(batches[0])
        checkpoint = group.save(tmp_path / "checkpoints", StreamPosition(epoch=0, example_index=4, num_examples=12))
        killer = threading.Thread(target=_kill_when_trapped, args=(trap, group.pids[1]), daemon=True)
        killer.start()
        with pytest.raises(TrainerProcessDied, match="trainer rank"):
            group.train_step(batches[1])
        killer.join(30)
        assert trap.read_text() == "mid-step"
    finally:
        group.close(timeout_s=10)
    assert all(not rank._process.is_alive() for rank in group.ranks)  # the survivor is stopped, not left waiting

    with DistributedTrainer(grpo_rank, model_dir, TWO_RANKS, config=TWO_RANKS) as resumed:
        state = resumed.load(checkpoint)
        assert (state.step, state.example_index, resumed.step) == (1, 4, 1)
        for batch in batches[1:]:
            resumed.train_step(batch)
        actual = _weights(resumed.save_model(tmp_path / "resumed"))
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name


def _kill_when_trapped(trap: Path, pid: int | None) -> None:
    deadline = time.monotonic() + 120
    while not trap.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)


def test_a_rank_that_cannot_start_fails_the_group_with_its_error(tmp_path: Path) -> None:
    with pytest.raises(TrainerProcessDied, match=r"rank \d failed.*not a local directory"):
        DistributedTrainer(grpo_rank, str(tmp_path / "no-model"), TWO_RANKS, config=TWO_RANKS)


def test_distributed_config_refuses_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="ranks 2 needs backend fsdp2"):
        DistributedConfig(ranks=2)
    with pytest.raises(ValueError, match="nccl needs device cuda"):
        DistributedConfig(backend="fsdp2", process_group="nccl")
    with pytest.raises(ValueError, match="megatron runs on GPUs only"):
        DistributedConfig(backend="megatron")
    with pytest.raises(ValueError, match="must divide ranks"):
        DistributedConfig(backend="megatron", device="cuda", ranks=6, megatron={"tensor_parallel": 4})
    with pytest.raises(ValueError, match=r"expert_parallel x pipeline_parallel \(16\) must divide ranks \(8\)"):
        DistributedConfig(backend="megatron", device="cuda", ranks=8, megatron={"expert_parallel": 16})
    # megatron-core's own grid: TP 2 with EP 8 on 8 ranks is valid (the experts have a grid of their own)
    DistributedConfig(backend="megatron", device="cuda", ranks=8, megatron={"tensor_parallel": 2, "expert_parallel": 8})
    with pytest.raises(ValueError, match="megatron trains GRPO only"):
        SFTConfig(distributed={"backend": "megatron", "device": "cuda"})
