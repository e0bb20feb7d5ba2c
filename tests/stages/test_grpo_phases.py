"""GRPO in phases (grpo.phases), for real: two asynchronous phases of the GRPO stage on the CPU pipeline's parts.

A tiny Qwen3 in the local engine, real bubblewrap sandboxes on clean micro repositories, real grading, a file://
store and a sqlite MLflow (the inputs, a curate manifest and an sft manifest, are written by literal stage
functions, as in tests/stages/test_grpo_async_crash.py). Phase 2 runs in a subprocess so that it can be SIGKILLed.

What must hold: phase 2 starts from phase 1's final checkpoint (weights and AdamW state by value, at phase 2's
learning rate; a fresh optimizer with reset_optimizer), its steps continue phase 1's (MLflow's step axis too), the
groups phase 1 left unconsumed carry into phase 2 (nothing finished is lost, nothing trained twice), and a SIGKILL
in phase 2 resumes in phase 2 without rerunning phase 1.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from swerl.config import PipelineConfig
from swerl.stages.runner import Manifest, run_stage
from swerl.tracking import StageRun
from swerl.train.checkpoint import COMPLETE_MARKER
from tests.stages.test_grpo_async_crash import AGENT, ENGINE, make_inputs, stores

ROOT = Path(__file__).resolve().parents[2]
B, N = 2, 2
LR1, LR2 = 1e-3, 2.5e-4


def pipeline_config(phase2: dict[str, Any] | None = None) -> PipelineConfig:
    """Base GRPO settings and two phases: `wide` (2 steps) and `tight` (2 steps, a tighter trajectory cap, a
    quarter of the learning rate)."""
    tight = {
        "name": "tight",
        "steps": 2,
        "agent": {"max_trajectory_tokens": 384},
        "grpo": {"algorithm": {"lr": LR2}},
    } | (phase2 or {})
    return PipelineConfig.model_validate(
        {
            "agent": AGENT.model_dump(),
            "engine": ENGINE.model_dump(),
            "grpo": {
                "mode": "async",
                "threads": 1,
                "schedule": {"steps": 99, "tasks_per_step": B, "checkpoint_every": 1, "keep_checkpoints": 4},
                "rollout": {
                    "attempts_per_task": N,
                    "max_in_flight": 8,
                    "max_staleness": 1,
                    "max_extra_groups_per_step": 1,
                },
                "algorithm": {"lr": LR1},
                "phases": [{"name": "wide", "steps": 2}, tight],
            },
        }
    )


def run_phase(root: Path, index: int, cfg: PipelineConfig, parent_id: str | None = None) -> Manifest:
    from swerl.stages.grpo import phase_stage, run_grpo

    store, tracker = stores(root)
    inputs = [Manifest.model_validate_json((root / f"{name}.json").read_text()) for name in ("curate", "sft")]
    if index:
        inputs.append(Manifest.model_validate_json((root / "grpo-wide.json").read_text()))
    stage = cfg.grpo_phases()[index].stage
    parent = StageRun(tracker.client, parent_id) if parent_id else None
    manifest = run_stage(
        stage, run_grpo, phase_stage(cfg, index), store=store, tracker=tracker, parent=parent, inputs=inputs
    ).manifest
    (root / f"{stage}.json").write_text(manifest.model_dump_json())
    return manifest


def child(root: Path, phase2: str) -> None:
    """Phase 2 in its own process (resuming whatever a killed run left)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    run_phase(root, 1, pipeline_config(json.loads(phase2)), os.environ.get("PARENT_RUN") or None)


def spawn(root: Path, phase2: dict[str, Any], parent_id: str) -> subprocess.Popen[bytes]:
    env = os.environ | {"PYTHONPATH": str(ROOT), "PARENT_RUN": parent_id}
    log = open(root / "phase2.log", "ab")  # noqa: SIM115 - the child writes it
    return subprocess.Popen(
        [sys.executable, __file__, str(root), json.dumps(phase2)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def report_of(root: Path, manifest: Manifest, name: str = "grpo_report.json") -> dict[str, Any]:
    store, _ = stores(root)
    return dict(json.loads(store.read_bytes(store.rel_of(manifest.artifacts[name].uri))))


def checkpoint_state(root: Path, handoff: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """A checkpoint's optimizer payload (model weights under 'model') read from the store."""
    from safetensors.torch import load_file

    from swerl.train.checkpoint import STATE_FILE, CheckpointMirror

    store, _ = stores(root)
    local = CheckpointMirror(store, handoff["checkpoints"], root / "read").restore(name or handoff["checkpoint"])
    payload = torch.load(local / STATE_FILE, map_location="cpu", weights_only=False)
    payload["model"] = {k: v for f in sorted(local.glob("*.safetensors")) for k, v in load_file(f).items()}
    return dict(payload)


@pytest.mark.slow
def test_two_phases_hand_over_weights_optimizer_and_rollouts_and_survive_a_sigkill(tmp_path: Path) -> None:
    os.environ.setdefault("SWERL_CACHE_DIR", str(tmp_path / "swerl-cache"))
    for manifest in make_inputs(tmp_path):
        (tmp_path / f"{manifest.stage}.json").write_text(manifest.model_dump_json())
    cfg = pipeline_config()
    _, tracker = stores(tmp_path)
    with tracker.run("phases-pipeline") as parent:
        parent_id = parent.run_id
    p1 = run_phase(tmp_path, 0, cfg, parent_id)
    r1 = report_of(tmp_path, p1)
    h1 = report_of(tmp_path, p1, "phase_handoff.json")
    assert r1["steps"] == 2 and r1["phase"]["first_step"] == 0 and h1["step"] == 2
    assert h1["journals"] and h1["data_position"] == r1["data_position"]

    # Phase 2, killed once its first checkpoint (step 3) is in the store, then rerun to the end.
    process = spawn(tmp_path, {}, parent_id)
    log = tmp_path / "phase2.log"
    deadline = time.monotonic() + 300
    while not list((tmp_path / "store/stages/grpo-tight").glob(f"*/checkpoints/step_00000003/{COMPLETE_MARKER}")):
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    assert process.poll() is None, "phase 2 ended before the kill"
    process.kill()
    process.wait()
    first_start = log.read_text(errors="replace")
    assert "starts at step 2" in first_start and "grpo-wide's checkpoint" in first_start, first_start[-3000:]
    # the engine served phase 1's final weights (not the SFT model's) at phase 2's first step
    assert re.search(rf"engine starts from \S+/phase_start/{h1['checkpoint']} at weight version 2", first_start)
    process = spawn(tmp_path, {}, parent_id)
    assert process.wait(timeout=600) == 0, log.read_text()[-3000:]
    p2 = Manifest.model_validate_json((tmp_path / "grpo-tight.json").read_text())
    r2 = report_of(tmp_path, p2)

    # Phase 1 was not rerun: its manifest is the one published before.
    store, _ = stores(tmp_path)
    assert Manifest.model_validate_json(store.read_bytes(store.rel_of(p1.uri))).attempt == p1.attempt

    # The rerun resumed in phase 2, from its own checkpoint; steps continue: phase 2 trained steps 3 and 4; phase
    # 1's ledger carried into phase 2's.
    assert r2["resumed"] == "step_00000003", r2["resumed"]
    assert r2["steps"] == 4 and r2["phase"] == r2["phase"] | {
        "first_step": 2,
        "steps": 2,
        "previous": "grpo-wide",
    }
    assert [int(h["step"]) for h in r2["history"]][-1] == 4
    ledger = r2["ledger"]
    seqs = [seq for seq, _, _ in ledger]
    assert len(seqs) == len(set(seqs)), "a group was consumed twice"
    trained = Counter(step for _, step, reason in ledger if reason == "trained")
    assert trained == {1: B, 2: B, 3: B, 4: B}, trained
    assert r2["data_position"] >= r1["data_position"]

    # Nothing phase 1 finished was lost: every group of phase 1's journal that phase 1 did not consume is consumed
    # in phase 2 or still waits there (phase 2 reads phase 1's journal with its own).
    h2 = report_of(tmp_path, p2, "phase_handoff.json")
    assert h2["journals"][0] == h1["journals"][0] and len(h2["journals"]) == 2
    consumed1 = {seq for seq, _, _ in r1["ledger"]}
    finished1 = {
        int(f.rsplit("/g", 1)[1])
        for f in store.list(h1["journals"][0])
        if any(n.rsplit("/", 1)[1].startswith("r") for n in store.list(f))
    }
    carried = finished1 - consumed1
    from swerl.rollout.journal import RolloutJournal

    left = RolloutJournal(store, h2["journals"][1], h2["journals"][:1]).load(set(seqs)).groups
    assert carried <= set(seqs) | set(left), (carried, seqs, sorted(left))
    # and phase 2's first start took every one of them back (whole to the buffer, or its missing attempts rerun)
    resume = re.search(r"grpo async: data position (\d+), resume (\{.*?\})", first_start)
    assert resume is not None and int(resume[1]) >= r1["data_position"]
    counts = json.loads(resume[2].replace("'", '"'))
    assert counts["reloaded_groups"] + counts["partial_groups"] == len(carried), (counts, carried)
    print(f"phase 1 left {len(carried)} finished group(s) unconsumed; phase 2 restored {counts}")

    # Phase 2 started from phase 1's AdamW state, by value: its first checkpoint's step counters are phase 1's
    # plus one update, at phase 2's learning rate.
    s1 = checkpoint_state(tmp_path, h1)
    s3 = checkpoint_state(tmp_path, h2, "step_00000003")
    o1, o3 = s1["optimizer"], s3["optimizer"]
    for index, state in o3["state"].items():
        assert float(state["step"]) == float(o1["state"][index]["step"]) + 1, index
    assert {g["lr"] for g in o3["param_groups"]} == {LR2}
    assert {g["lr"] for g in o1["param_groups"]} == {LR1}

    # MLflow: one run per phase under the pipeline's run (phase 2's rerun continues its killed attempt's run), the
    # step axis continuing from phase 1 into phase 2.
    client = tracker.client
    runs: dict[str, list[str]] = {}
    for found in client.search_runs([tracker.experiment_id], f"tags.mlflow.parentRunId = '{parent_id}'"):
        runs.setdefault(found.data.tags["swerl.stage"], []).append(found.info.run_id)
    assert len(runs["grpo-wide"]) == 1 and len(runs["grpo-tight"]) == 1, runs

    def history(stage: str, metric: str) -> dict[int, float]:
        return {m.step: m.value for run in runs[stage] for m in client.get_metric_history(run, metric)}

    assert sorted(history("grpo-wide", "train/reward_mean")) == [1, 2]
    assert sorted(history("grpo-tight", "train/reward_mean")) == [3, 4]


@pytest.mark.slow
def test_a_phase_with_reset_optimizer_starts_with_fresh_adamw_state(tmp_path: Path) -> None:
    """The same handoff with reset_optimizer: the weights and step carry, the optimizer state does not."""
    from swerl.stages.grpo import build_trainer, phase_stage

    os.environ.setdefault("SWERL_CACHE_DIR", str(tmp_path / "swerl-cache"))
    for manifest in make_inputs(tmp_path):
        (tmp_path / f"{manifest.stage}.json").write_text(manifest.model_dump_json())
    cfg = pipeline_config({"reset_optimizer": True})
    p1 = run_phase(tmp_path, 0, cfg)
    h1 = report_of(tmp_path, p1, "phase_handoff.json")
    s1 = checkpoint_state(tmp_path, h1)
    store, _ = stores(tmp_path)
    from swerl.train.checkpoint import CheckpointMirror

    start = CheckpointMirror(store, h1["checkpoints"], tmp_path / "start").restore(h1["checkpoint"])
    sft_dir = tmp_path / "sft_model"
    from swerl.stages.common import get_dir

    get_dir(store, Manifest.model_validate_json((tmp_path / "sft.json").read_text()), "model", sft_dir)
    g2 = phase_stage(cfg, 1).grpo
    for reset in (False, True):
        trainer = build_trainer(sft_dir, g2, 1.0, 0)
        trainer.load(start, optimizer=not reset)
        weights = dict(trainer.model.state_dict())
        assert all(torch.equal(weights[k], v) for k, v in s1["model"].items() if k in weights)
        assert trainer.step == 2
        assert {g["lr"] for g in trainer.optimizer.param_groups} == {LR2}
        state = trainer.optimizer.state_dict()["state"]
        if reset:
            assert state == {}
        else:
            assert state.keys() == s1["optimizer"]["state"].keys()
            for index, values in state.items():
                for name, value in values.items():
                    assert torch.equal(torch.as_tensor(value), torch.as_tensor(s1["optimizer"]["state"][index][name]))


@pytest.mark.slow
def test_sync_phases_continue_the_step_and_the_data_position(tmp_path: Path) -> None:
    """Synchronous GRPO in phases: phase 2 continues phase 1's step and task position (B tasks a step)."""
    os.environ.setdefault("SWERL_CACHE_DIR", str(tmp_path / "swerl-cache"))
    for manifest in make_inputs(tmp_path):
        (tmp_path / f"{manifest.stage}.json").write_text(manifest.model_dump_json())
    data = pipeline_config().model_dump(mode="json", by_alias=True)
    data["grpo"] |= {"mode": "sync", "rollout": {"attempts_per_task": N, "concurrency": 4}}
    data["grpo"]["phases"] = [
        {"name": "wide", "steps": 1},
        {"name": "tight", "steps": 1, "grpo": {"algorithm": {"lr": LR2}}},
    ]
    cfg = PipelineConfig.model_validate(data)
    h1 = report_of(tmp_path, run_phase(tmp_path, 0, cfg), "phase_handoff.json")
    p2 = run_phase(tmp_path, 1, cfg)
    r2, h2 = report_of(tmp_path, p2), report_of(tmp_path, p2, "phase_handoff.json")
    assert (h1["step"], h1["data_position"], h1["journals"]) == (1, B, [])
    assert r2["steps"] == 2 and r2["phase"]["first_step"] == 1 and [int(h["step"]) for h in r2["history"]] == [2]
    assert h2["data_position"] == 2 * B and r2["mode"] == "sync"


if __name__ == "__main__":
    child(Path(sys.argv[1]), sys.argv[2])
