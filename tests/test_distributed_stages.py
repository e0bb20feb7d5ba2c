"""The SFT and GRPO stages with their trainer over 2 FSDP2 gloo ranks, on the CPU pipeline's real micro tasks, real
sandboxes and the local engine: the same results as the one-process trainer (tolerance: tests/test_distributed.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from swerl.config import DistributedConfig
from swerl.stages.common import get_dir
from swerl.stages.grpo import GRPOStage, run_grpo
from swerl.stages.runner import Manifest
from swerl.stages.sft import SFTStage, run_sft
from tests.test_distributed import ATOL, RTOL
from tests.test_stages import AGENT, ENGINE, GRPO, SFT, Env, state_dict
from tests.test_stages import curate as curate  # noqa: F401 - module-scoped fixtures
from tests.test_stages import env as env  # noqa: F401
from tests.test_stages import sft as sft  # noqa: F401
from tests.test_stages import traces as traces  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread", "micro_cache")]

TWO_RANKS = DistributedConfig(backend="fsdp2", ranks=2, start_timeout_s=300, collective_timeout_s=300)


def _close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor, rtol=0, atol=ATOL, msg=name)


def test_the_sft_stage_on_two_ranks_trains_the_one_process_model(
    env: Env,  # noqa: F811
    curate: Manifest,  # noqa: F811
    traces: Manifest,  # noqa: F811
    sft: Manifest,  # noqa: F811
    tmp_path: Path,
) -> None:
    cfg = SFTStage.build(SFT.model_copy(update={"distributed": TWO_RANKS}), AGENT, ENGINE)
    manifest = env.run("sft-2ranks", run_sft, cfg, [curate, traces]).manifest
    one = env.json(sft, "sft_report.json")
    two = env.json(manifest, "sft_report.json")
    assert two["steps"] == one["steps"] == SFT.max_steps
    assert (one["trainer"]["ranks"], two["trainer"]["ranks"], two["trainer"]["backend"]) == (1, 2, "fsdp2")
    assert len(set(two["trainer"]["pids"])) == 2
    assert two["final_loss"] == pytest.approx(one["final_loss"], rel=RTOL)
    _close(state_dict(get_dir(env.store, manifest, "model", tmp_path / "two")),
           state_dict(get_dir(env.store, sft, "model", tmp_path / "one")))  # fmt: skip
    assert (tmp_path / "two" / "tokenizer.json").is_file()


def _grpo(distributed: DistributedConfig | None = None, **weight_sync: Any) -> GRPOStage:
    """One synchronous step, episodes one at a time (the engine's seeded sampling then sees the same arrival
    order in both runs, so both train on the same groups)."""
    grpo = GRPO.model_validate(
        GRPO.model_dump()
        | {
            "schedule": GRPO.schedule.model_dump() | {"steps": 1},
            "rollout": GRPO.rollout.model_dump() | {"concurrency": 1},
        }
        | ({"distributed": distributed.model_dump()} if distributed else {})
    )
    engine = ENGINE.model_copy(update={"weight_sync": ENGINE.weight_sync.model_copy(update=weight_sync)})
    return GRPOStage(grpo=grpo, agent=AGENT, engine=engine)


def test_the_grpo_stage_on_two_ranks_matches_the_one_process_first_step(
    env: Env,  # noqa: F811
    curate: Manifest,  # noqa: F811
    sft: Manifest,  # noqa: F811
    tmp_path: Path,
) -> None:
    one = env.json(env.run("grpo-1rank", run_grpo, _grpo(), [curate, sft]).manifest, "grpo_report.json")
    manifest = env.run("grpo-2ranks", run_grpo, _grpo(TWO_RANKS), [curate, sft]).manifest
    two = env.json(manifest, "grpo_report.json")
    first, second = one["history"][0], two["history"][0]
    assert first["trajectories_trained"] > 0 and first["loss_tokens"] > 0
    for key in ("reward_mean", "trajectories_trained", "loss_tokens", "response_tokens_mean"):
        assert second[key] == first[key], key  # the same groups
    for key in ("loss", "grad_norm", "entropy_mean"):
        assert second[key] == pytest.approx(first[key], rel=RTOL, abs=1e-7), key
    assert two["steps"] == 1
    assert (one["trainer"]["ranks"], two["trainer"]["ranks"], two["trainer"]["backend"]) == (1, 2, "fsdp2")
