"""Stores that heal: damaged files are named and skipped, moved stores are reused, old things are removed."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from pydantic import BaseModel
from transformers import LlamaConfig, LlamaForCausalLM

from swerl.rollout.journal import FinishedAttempt, Ledger, RolloutJournal
from swerl.stages import runner
from swerl.stages.runner import StageContext, StageResult, load_manifest, manifest_path, run_stage
from swerl.storage import CorruptStoreFile, Store, StoreFileMissing, open_store
from swerl.tracking import OWNER_HOST_TAG, OWNER_PID_TAG, Tracker, process_owner
from swerl.train.checkpoint import (
    CheckpointCorrupt,
    CheckpointMirror,
    TrainerState,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from swerl.trajectory import EpisodeStatus, Trajectory

# ----------------------------------------------------------------------------------------------------------------
# Store reads name the file


def test_damaged_json_names_its_uri(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/s")
    store.write_bytes("a/b.json", b'{"x": [1, 2')
    with pytest.raises(CorruptStoreFile) as err:
        store.read_json("a/b.json")
    assert store.uri("a/b.json") in str(err.value)
    with pytest.raises(StoreFileMissing, match="a/missing.json"):
        store.read_bytes("a/missing.json")


# ----------------------------------------------------------------------------------------------------------------
# Stages: damaged manifests rerun, moved stores are reused, dead workdirs go


class Cfg(BaseModel):
    n: int = 1


class CountingStage:
    def __init__(self) -> None:
        self.calls = 0
        self.workdirs: list[Path] = []

    def __call__(self, cfg: Cfg, ctx: StageContext) -> StageResult:
        self.calls += 1
        self.workdirs.append(ctx.workdir)
        ctx.write_artifact("out.json", json.dumps({"n": cfg.n}).encode())
        return StageResult(metrics={"n": float(cfg.n)})


@pytest.fixture(scope="module")
def tracker(mlflow_server: str) -> Tracker:
    return Tracker(mlflow_server, f"heal-{uuid.uuid4().hex[:8]}")


def _run(stage: CountingStage, store: Store, tracker: Tracker, name: str = "toy", **kw):  # type: ignore[no-untyped-def]
    return run_stage(name, stage, Cfg(), store=store, tracker=tracker, parent=None, **kw)


def test_damaged_manifest_means_not_done_and_the_stage_reruns(
    tmp_path: Path, tracker: Tracker, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(f"file://{tmp_path}/s")
    fn = CountingStage()
    first = _run(fn, store, tracker)
    rel = manifest_path("toy", first.manifest.key)
    data = store.read_bytes(rel)
    store.write_bytes(rel, data[: len(data) // 2])  # truncated
    with caplog.at_level(logging.WARNING):
        assert load_manifest(store, "toy", first.manifest.key) is None
        again = _run(fn, store, tracker)
    assert not again.skipped and fn.calls == 2
    assert store.uri(rel) in caplog.text
    assert _run(fn, store, tracker).skipped  # the rerun's manifest is whole


def test_store_copied_elsewhere_is_reused_without_recomputing(tmp_path: Path, tracker: Tracker) -> None:
    old = open_store(f"file://{tmp_path}/old")
    fn = CountingStage()
    first = _run(fn, old, tracker)
    second = _run(fn, old, tracker, name="next", inputs=[first.manifest])
    stored = json.loads(old.read_bytes(manifest_path("next", second.manifest.key)))
    assert "://" not in json.dumps(stored["artifacts"]) and "://" not in stored["inputs"][0]["uri"]

    shutil.copytree(tmp_path / "old", tmp_path / "new")
    shutil.rmtree(tmp_path / "old")
    new = open_store(f"file://{tmp_path}/new")
    a = _run(fn, new, tracker)
    b = _run(fn, new, tracker, name="next", inputs=[a.manifest])
    assert a.skipped and b.skipped and fn.calls == 2
    record = b.manifest.artifact("out.json")
    assert record.uri.startswith(new.root_uri + "/")
    assert json.loads(new.read_bytes(new.rel_of(record.uri))) == {"n": 1}
    assert b.manifest.inputs[0].uri == new.uri(manifest_path("toy", a.manifest.key))


def test_old_absolute_manifests_still_read(tmp_path: Path, tracker: Tracker) -> None:
    store = open_store(f"file://{tmp_path}/s")
    fn = CountingStage()
    first = _run(fn, store, tracker)
    rel = manifest_path("toy", first.manifest.key)
    store.write_bytes(rel, first.manifest.model_dump_json().encode())  # the old format: absolute URIs
    loaded = load_manifest(store, "toy", first.manifest.key)
    assert loaded is not None and loaded.fingerprint == first.manifest.fingerprint
    assert store.read_bytes(store.rel_of(loaded.artifact("out.json").uri)) == b'{"n": 1}'
    # ... and a copied store of old manifests is rebased by their stages/ part
    shutil.copytree(tmp_path / "s", tmp_path / "moved")
    moved = open_store(f"file://{tmp_path}/moved")
    again = load_manifest(moved, "toy", first.manifest.key)
    assert again is not None
    assert moved.read_bytes(moved.rel_of(again.artifact("out.json").uri)) == b'{"n": 1}'


def test_killed_stage_workdir_is_removed_by_the_next_run_and_a_live_one_is_kept(
    tmp_path: Path, tracker: Tracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "WORK_ROOT", tmp_path / "work")
    # A stage process that is SIGKILLed while running: its workdir stays behind.
    script = f"""
import os, signal, sys
sys.path.insert(0, {str(Path.cwd())!r})
from pathlib import Path
from pydantic import BaseModel
from swerl.stages import runner
from swerl.storage import open_store
from swerl.tracking import Tracker
runner.WORK_ROOT = Path({str(tmp_path / "work")!r})
class Cfg(BaseModel):
    n: int = 1
def fn(cfg, ctx):
    (ctx.workdir / "big.bin").write_bytes(b"x" * 100000)
    os.kill(os.getpid(), signal.SIGKILL)
runner.run_stage("toy", fn, Cfg(), store=open_store({f"file://{tmp_path}/s"!r}),
                 tracker=Tracker({tracker.uri!r}, "heal-killed"), parent=None)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    left = [p for p in (tmp_path / "work").iterdir() if p.is_dir()]
    assert len(left) == 1 and (left[0] / "big.bin").exists()
    # A live stage's workdir (this process owns it) of the same stage.
    live = runner._make_workdir("toy", "k", "live")
    fn = CountingStage()
    _run(fn, open_store(f"file://{tmp_path}/s"), tracker)
    assert not left[0].exists() and not Path(str(left[0]) + ".owner").exists()
    assert live.is_dir()
    assert not fn.workdirs[0].exists()


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints: fall back past damaged ones, keep the newest N


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(cfg)


def _save(root: Path, steps: list[int], keep: int = 10) -> None:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in steps:
        model(input_ids=torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
        opt.step()
        opt.zero_grad()
        state = TrainerState(
            step=step, epoch=0, example_index=step, shuffle_seed=0, num_examples=9, data_fingerprint="f"
        )
        save_checkpoint(root, model, opt, state, keep_last=keep)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_damaged_newest_local_checkpoint_falls_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _save(tmp_path, [1, 2])
    _truncate(tmp_path / "step_00000002" / "trainer_state.pt")
    with caplog.at_level(logging.WARNING):
        assert latest_checkpoint(tmp_path) == tmp_path / "step_00000001"
    assert "step_00000002" in caplog.text and "step_00000001" in caplog.text
    with pytest.raises(CheckpointCorrupt, match="step_00000002"):
        load_checkpoint(tmp_path / "step_00000002", _model())
    assert load_checkpoint(tmp_path / "step_00000001", _model()).step == 1


@pytest.mark.parametrize("damage", ["weights", "marker", "missing"])
def test_store_checkpoint_mirror_falls_back_to_newest_intact(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = open_store(f"file://{tmp_path}/s")
    local = tmp_path / "local"
    _save(local, [1, 2, 3])
    mirror = CheckpointMirror(store, "stages/sft/K/checkpoints", local, keep=10)
    assert mirror.sync() == ["step_00000001", "step_00000002", "step_00000003"]
    prefix = "stages/sft/K/checkpoints/step_00000003"
    if damage == "weights":
        data = store.read_bytes(f"{prefix}/model.safetensors")
        store.write_bytes(f"{prefix}/model.safetensors", data[: len(data) // 2])
    elif damage == "marker":
        store.write_bytes(f"{prefix}/COMPLETE", b'["config.js')
    else:
        store.remove(f"{prefix}/trainer_state.pt")
    fresh = tmp_path / "fresh"
    with caplog.at_level(logging.WARNING):
        restored = CheckpointMirror(store, "stages/sft/K/checkpoints", fresh).restore_latest()
    assert restored == fresh / "step_00000002"
    assert load_checkpoint(restored, _model()).step == 2
    assert store.uri(prefix) in caplog.text


def test_store_checkpoints_are_kept_per_retention_plus_protected(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/s")
    local = tmp_path / "local"
    _save(local, [1, 2, 3, 4, 5])
    mirror = CheckpointMirror(store, "ck", local, keep=2, protect={"step_00000001"})
    mirror.sync()
    names = [rel.rsplit("/", 1)[-1] for rel in store.list("ck")]
    assert names == ["step_00000001", "step_00000004", "step_00000005"]


# ----------------------------------------------------------------------------------------------------------------
# Journal and ledger


def test_damaged_journal_entry_is_skipped_named_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = open_store(f"file://{tmp_path}/s")
    journal = RolloutJournal(store, "j")
    for attempt in range(2):
        traj = Trajectory(task_id="t", attempt=attempt, status=EpisodeStatus.RESOLVED, reward=1.0)
        journal.record(FinishedAttempt(0, 0, traj, 1.0, 2.0))
    rel = "j/g00000000/r000-a0001.json"
    store.write_bytes(rel, store.read_bytes(rel)[:20])
    with caplog.at_level(logging.WARNING):
        state = journal.load(set())
    assert list(state.groups[0][1]) == [0]  # attempt 1 reruns
    assert state.damaged == [store.uri(rel)]
    assert store.uri(rel) in caplog.text


def test_damaged_ledger_names_its_file(tmp_path: Path) -> None:
    Ledger([(0, 1, "trained")]).save(tmp_path)
    assert Ledger.load(tmp_path).entries == [(0, 1, "trained")]
    (tmp_path / "rollout_ledger.json").write_text('{"entries": [[0, 1')
    with pytest.raises(CorruptStoreFile, match="rollout_ledger.json"):
        Ledger.load(tmp_path)


# ----------------------------------------------------------------------------------------------------------------
# MLflow: runs of killed processes are marked KILLED


def test_runs_left_running_by_a_killed_process_are_marked_killed(mlflow_server: str) -> None:
    experiment = f"heal-mlflow-{uuid.uuid4().hex[:8]}"
    script = f"""
import os, signal, sys
sys.path.insert(0, {str(Path.cwd())!r})
from swerl.tracking import Tracker
t = Tracker({mlflow_server!r}, {experiment!r})
with t.run("pipeline") as parent:
    with t.run("sft", parent=parent):
        os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=180)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    tracker = Tracker(mlflow_server, experiment)
    client = MlflowClient(tracking_uri=mlflow_server)
    before = client.search_runs([tracker.experiment_id])
    assert sorted(r.info.status for r in before) == ["RUNNING", "RUNNING"]
    # a live run of another process of this host (this one) is left alone
    me = process_owner()
    live = client.create_run(tracker.experiment_id, tags={OWNER_PID_TAG: me["pid"], OWNER_HOST_TAG: me["host"]})
    with tracker.run("pipeline") as run:
        pass
    statuses = {r.info.run_id: r.info.status for r in client.search_runs([tracker.experiment_id])}
    assert all(statuses[r.info.run_id] == "KILLED" for r in before)
    assert statuses[live.info.run_id] == "RUNNING" and statuses[run.run_id] == "FINISHED"
    assert os.getpid() == int(me["pid"]) and time.time() > 0
