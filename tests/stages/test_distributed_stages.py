"""The SFT and GRPO stages with their trainer over 2 FSDP2 gloo ranks, on the CPU pipeline's real micro tasks, real
sandboxes and the local engine: the same results as the one-process trainer (tolerance:
tests/train/test_distributed.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from swerl.config.train import DistributedConfig
from swerl.stages.common import get_dir
from swerl.stages.grpo import GRPOStage, run_grpo
from swerl.stages.runner import Manifest
from swerl.stages.sft import SFTStage, run_sft
from tests.stage_helpers import AGENT, ENGINE, GRPO, SFT, Env, crash_after_sync, state_dict
from tests.train.test_distributed import ATOL, RTOL

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread", "micro_cache")]

TWO_RANKS = DistributedConfig(backend="fsdp2", ranks=2, start_timeout_s=300, collective_timeout_s=300)


def _close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor, rtol=0, atol=ATOL, msg=name)


def test_the_sft_stage_on_two_ranks_trains_the_one_process_model(
    env: Env,
    curate: Manifest,
    traces: Manifest,
    sft: Manifest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = SFTStage.build(SFT.model_copy(update={"distributed": TWO_RANKS}), AGENT, ENGINE)
    manifest = env.run("sft-2ranks", run_sft, cfg, [curate, traces]).manifest
    one = env.json(sft, "sft_report.json")
    two = env.json(manifest, "sft_report.json")
    assert two["steps"] == one["steps"] == SFT.max_steps
    assert (one["trainer"]["ranks"], two["trainer"]["ranks"], two["trainer"]["backend"]) == (1, 2, "fsdp2")
    assert len(set(two["trainer"]["pids"])) == 2
    assert two["final_loss"] == pytest.approx(one["final_loss"], rel=RTOL)
    two_ranks = state_dict(get_dir(env.store, manifest, "model", tmp_path / "two"))
    _close(two_ranks, state_dict(get_dir(env.store, sft, "model", tmp_path / "one")))
    assert (tmp_path / "two" / "tokenizer.json").is_file()

    # A crash after step 4's sharded checkpoint reached the store: the rerun starts 2 new ranks from it (through
    # the store: shards, rank RNG files, DCP metadata) and ends bitwise equal to the uninterrupted 2-rank run.
    crash_after_sync(monkeypatch, "step_00000004")
    with pytest.raises(RuntimeError, match="injected crash"):
        env.run("sft-2ranks-crash", run_sft, cfg, [curate, traces])
    monkeypatch.undo()
    resumed = env.run("sft-2ranks-crash", run_sft, cfg, [curate, traces]).manifest
    report = env.json(resumed, "sft_report.json")
    assert (report["resumed_from"], report["steps_this_attempt"], report["steps"]) == ("step_00000004", 2, 6)
    weights = state_dict(get_dir(env.store, resumed, "model", tmp_path / "resumed"))
    assert all(torch.equal(weights[k], two_ranks[k]) for k in two_ranks)


def _grpo(
    distributed: DistributedConfig | None = None, steps: int = 1, kind: str = "local", **weight_sync: Any
) -> GRPOStage:
    """Synchronous steps, episodes one at a time (the engine's seeded sampling then sees the same arrival order in
    every run, so runs whose engines hold the same weights train on the same groups)."""
    grpo = GRPO.model_validate(
        GRPO.model_dump()
        | {
            "schedule": GRPO.schedule.model_dump() | {"steps": steps},
            "rollout": GRPO.rollout.model_dump() | {"concurrency": 1},
        }
        | ({"distributed": distributed.model_dump()} if distributed else {})
    )
    engine = ENGINE.model_copy(update={"kind": kind, "weight_sync": ENGINE.weight_sync.model_copy(update=weight_sync)})
    return GRPOStage(grpo=grpo, agent=AGENT, engine=engine)


SAME_GROUPS = ("reward_mean", "trajectories_trained", "loss_tokens", "response_tokens_mean")


def _same_step(actual: dict[str, float], expected: dict[str, float]) -> None:
    assert expected["trajectories_trained"] > 0 and expected["loss_tokens"] > 0
    for key in SAME_GROUPS:
        assert actual[key] == expected[key], key  # the same groups
    for key in ("loss", "grad_norm", "entropy_mean"):
        assert actual[key] == pytest.approx(expected[key], rel=RTOL, abs=1e-7), key


def test_the_grpo_stage_on_two_ranks_with_the_weights_over_a_process_group(
    env: Env,
    curate: Manifest,
    sft: Manifest,
    tmp_path: Path,
) -> None:
    """1 process through disk into the in-process engine (the default), 2 ranks through disk, 2 ranks over a gloo
    weight group into a local engine server (its own process, behind the router): the same first step; the two 2-rank
    runs also the same second step, whose rollouts the synced engine sampled (a sync that loaded other weights would
    sample other tokens)."""
    one = env.json(env.run("grpo-1rank", run_grpo, _grpo(), [curate, sft]).manifest, "grpo_report.json")
    disk = env.json(env.run("grpo-2ranks", run_grpo, _grpo(TWO_RANKS, 2), [curate, sft]).manifest, "grpo_report.json")
    group = env.json(
        env.run(
            "grpo-2ranks-group",
            run_grpo,
            _grpo(TWO_RANKS, 2, "http_local", method="distributed", bucket_mb=1),
            [curate, sft],
        ).manifest,
        "grpo_report.json",
    )
    _same_step(disk["history"][0], one["history"][0])
    _same_step(group["history"][0], one["history"][0])
    second_disk, second_group = disk["history"][1], group["history"][1]
    for key in SAME_GROUPS:
        assert second_group[key] == second_disk[key], key
    assert second_group["loss"] == pytest.approx(second_disk["loss"], rel=RTOL)
    assert (one["trainer"]["ranks"], group["trainer"]["ranks"], group["trainer"]["backend"]) == (
        1,
        2,
        "fsdp2",
    )
    weights = state_dict(get_dir(env.store, sft, "model", tmp_path / "sft"))
    for stats in group["history"]:  # per-sync seconds and bytes: every tensor of the state dict in fp32, once
        assert stats["weight_sync/bytes"] == sum(tensor.numel() * 4 for tensor in weights.values())
        assert stats["weight_sync/tensors"] == len(weights)
        assert stats["weight_sync/buckets"] >= 1 and stats["weight_sync/seconds"] > 0
    assert disk["history"][0]["weight_sync/bytes"] > 0  # the exported safetensors


def test_a_distributed_weight_sync_with_evaluation_beside_training_is_refused(
    env: Env,
    curate: Manifest,
    sft: Manifest,
) -> None:
    cfg = _grpo(method="distributed")
    cfg = cfg.model_copy(
        update={
            "grpo": cfg.grpo.model_copy(update={"mode": "async", "eval": cfg.grpo.eval.model_copy(update={"every": 1})})
        }
    )
    with pytest.raises(ValueError, match="exports none"):
        env.run("grpo-refused", run_grpo, cfg, [curate, sft])
