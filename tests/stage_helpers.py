"""The agent stages as the stage tests run them on the CPU pipeline's micro tasks: configs sized for 2 busy cores, and
Env, a file:// store and a sqlite MLflow of a test module's own. The fixtures that run the pipeline's first stages
with them (env, curate, traces, sft) are in tests/conftest.py and tests/stages/conftest.py."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from swerl.config.agent import AgentConfig
from swerl.config.engine import EngineConfig
from swerl.config.grpo import GRPOConfig
from swerl.config.train import SFTConfig, TinyModelConfig
from swerl.model.loading import load_model_and_tokenizer
from swerl.stages.common import DurableCheckpoints
from swerl.stages.runner import Manifest, StageOutcome, run_stage, stage_key
from swerl.storage import Store
from swerl.tracking import Tracker

TEST_COMMAND = "python run_tests.py -q"
MODIFIERS = ["flip_comparison", "swap_binop", "negate_condition", "off_by_one", "swap_call_args"]
CONTEXT = 1536  # the tiny model's positions: every oracle trace of these tasks fits (the longest is ~1400)

AGENT = AgentConfig(
    max_turns=4,
    max_trajectory_tokens=1024,
    max_new_tokens_per_turn=16,
    max_malformed_calls=2,
    command_timeout_s=20,
    test_timeout_s=30,
    episode_timeout_s=120,
    infra_retries=1,
)
ENGINE = EngineConfig.model_validate({"max_batch_size": 4, "max_context_tokens": 1024, "local": {"threads": 1}})
TINY = TinyModelConfig(
    vocab_size=500,
    hidden_size=32,
    num_layers=1,
    num_heads=4,
    num_kv_heads=2,
    ffn_size=64,
    max_positions=CONTEXT,
)
SFT = SFTConfig(
    tiny=TINY,
    seq_len=CONTEXT,
    rows_per_micro_batch=2,
    max_steps=6,
    lr=5e-3,
    warmup_steps=1,
    checkpoint_every=2,
    keep_checkpoints=2,
    threads=1,
)
GRPO = GRPOConfig.model_validate(
    {
        "threads": 1,
        "schedule": {"steps": 2, "tasks_per_step": 2, "checkpoint_every": 1},
        "rollout": {"attempts_per_task": 2, "concurrency": 4},
    }
)


@dataclass
class Env:
    store: Store
    tracker: Tracker

    def run(
        self, stage: str, fn: Any, cfg: Any, inputs: list[Manifest] | None = None, force: bool = False
    ) -> StageOutcome:
        log = logging.getLogger(f"swerl.test.{stage}")
        store, tracker = self.store, self.tracker
        return run_stage(
            stage,
            fn,
            cfg,
            store=store,
            tracker=tracker,
            parent=None,
            inputs=inputs,
            seed=0,
            log=log,
            force=force,
        )

    def artifact(self, manifest: Manifest, name: str) -> bytes:
        return self.store.read_bytes(self.store.rel_of(manifest.artifact(name).uri))

    def json(self, manifest: Manifest, name: str) -> Any:
        return json.loads(self.artifact(manifest, name))

    def metric_history(self, manifest: Manifest, key: str) -> list[tuple[int, float]]:
        assert manifest.mlflow_run_id
        history = self.tracker.client.get_metric_history(manifest.mlflow_run_id, key)
        return sorted((m.step, m.value) for m in history)


def stage_key_of(stage: str, cfg: Any, inputs: list[Manifest] | None = None) -> str:
    return stage_key(stage, cfg, inputs or [], 0)


def state_dict(directory: Path) -> dict[str, torch.Tensor]:
    model, _ = load_model_and_tokenizer(directory)
    return model.state_dict()


def crash_after_sync(monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    """DurableCheckpoints.sync raises once `step`'s checkpoint has reached the store (undo: monkeypatch.undo())."""
    original = DurableCheckpoints.sync

    def crashing_sync(self: DurableCheckpoints) -> list[str]:
        done = original(self)
        if step in done:
            raise RuntimeError(f"injected crash after {step} was synced")
        return done

    monkeypatch.setattr(DurableCheckpoints, "sync", crashing_sync)
