"""Checkpointed stages: run once, skip when done, rerun on change or force, never publish a failed stage."""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from pydantic import BaseModel

from swerl.config import ConfigError, PipelineConfig
from swerl.config.load import config_hash, dump_config
from swerl.config.pipeline import STAGES
from swerl.pipeline import open_session, stages_to_force
from swerl.stages.runner import (
    Manifest,
    StageContext,
    StageResult,
    load_manifest,
    manifest_path,
    read_force_epoch,
    run_stage,
    stage_key,
)
from swerl.storage import Store, open_store
from swerl.tracking import Tracker


class ToyConfig(BaseModel):
    n: int = 3
    label: str = "a"


@dataclass
class ToyStage:
    """A literal stage: writes tasks.json (its content depends on the config) and reports a metric."""

    fail: bool = False
    calls: int = 0
    seen_workdirs: list[Path] = field(default_factory=list)
    during: list[Manifest | None] = field(default_factory=list)  # the published manifest while running
    durable: list[str] = field(default_factory=list)  # where each attempt's checkpoints would go

    def __call__(self, cfg: ToyConfig, ctx: StageContext) -> StageResult:
        self.calls += 1
        assert ctx.workdir.is_dir()
        self.seen_workdirs.append(ctx.workdir)
        self.during.append(load_manifest(ctx.store, ctx.stage, ctx.prefix.split("/")[2]))
        self.durable.append(ctx.durable("checkpoints"))
        ctx.write_artifact("tasks.json", _content(cfg))
        scratch = ctx.workdir / "big.txt"
        scratch.write_text("x" * 1000)
        ctx.put_artifact("scratch.txt", scratch)
        for step in range(3):
            ctx.log_metrics({"progress": step / 2}, step=step)
        time.sleep(0.05)
        if self.fail:
            raise RuntimeError("stage exploded")
        return StageResult(metrics={"n_tasks": float(cfg.n)}, markdown={"report": "# done"}, summary="ok")


def _content(cfg: ToyConfig) -> bytes:
    return json.dumps({"n": cfg.n, "label": cfg.label}).encode()


@pytest.fixture(scope="module")
def tracker(mlflow_server: str) -> Tracker:
    return Tracker(mlflow_server, f"stage-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return open_store(f"file://{tmp_path}/store")


def _run(stage: ToyStage, cfg: ToyConfig, store: Store, tracker: Tracker, **kw):  # type: ignore[no-untyped-def]
    return run_stage("toy", stage, cfg, store=store, tracker=tracker, parent=None, **kw)


def test_first_run_writes_a_complete_manifest(store: Store, tracker: Tracker) -> None:
    fn, cfg = ToyStage(), ToyConfig(n=4)
    before = datetime.now().astimezone()
    out = _run(fn, cfg, store, tracker)
    assert not out.skipped and fn.calls == 1
    m = out.manifest
    assert m.key == stage_key("toy", cfg, [])
    assert m.config_hash == config_hash(cfg)
    assert m.uri == store.uri(manifest_path("toy", m.key))
    assert load_manifest(store, "toy", m.key) == m  # what was published is what was returned
    # every artifact's hash is the hash of the bytes stored under its URI, in this attempt's folder
    tasks = m.artifact("tasks.json")
    stored = store.read_bytes(store.rel_of(tasks.uri))
    assert stored == _content(cfg)
    assert tasks.sha256 == hashlib.sha256(_content(cfg)).hexdigest() and tasks.size == len(stored)
    assert tasks.uri == store.uri(f"stages/toy/{m.key}/{m.attempt}/tasks.json")
    assert m.artifact("scratch.txt").sha256 == hashlib.sha256(b"x" * 1000).hexdigest()
    with pytest.raises(KeyError, match="no artifact"):
        m.artifact("missing")
    assert m.metrics == {"n_tasks": 4.0}
    # timings
    started, finished = datetime.fromisoformat(m.started_at), datetime.fromisoformat(m.finished_at)
    assert before.replace(microsecond=0) <= started <= finished
    assert 0.05 <= m.duration_s < 60
    # the scratch folder is gone
    assert not fn.seen_workdirs[0].exists()
    # the MLflow run of the stage
    run = MlflowClient(tracking_uri=tracker.uri).get_run(m.mlflow_run_id or "")
    assert run.info.status == "FINISHED"
    assert run.data.tags["swerl.stage"] == "toy" and run.data.tags["swerl.key"] == m.key
    assert run.data.params == {"n": "4", "label": "a"}
    assert run.data.metrics["n_tasks"] == 4.0 and run.data.metrics["stage_duration_s"] > 0
    history = MlflowClient(tracking_uri=tracker.uri).get_metric_history(run.info.run_id, "progress")
    assert sorted(h.step for h in history) == [0, 1, 2]
    artifacts = {a.path for a in MlflowClient(tracking_uri=tracker.uri).list_artifacts(run.info.run_id)}
    assert artifacts == {"manifest.json", "report.md"}


def test_same_config_is_skipped_without_calling_the_stage(
    store: Store, tracker: Tracker, caplog: pytest.LogCaptureFixture
) -> None:
    fn, cfg = ToyStage(), ToyConfig()
    first = _run(fn, cfg, store, tracker)
    caplog.set_level("INFO", logger="swerl.toy")
    second = _run(fn, ToyConfig(), store, tracker)  # an equal config, another object
    assert second.skipped and fn.calls == 1
    assert second.result is None
    assert second.manifest == first.manifest
    assert any("skipped" in r.getMessage() for r in caplog.records if r.name == "swerl.toy")


def test_changed_config_runs_under_a_new_key(store: Store, tracker: Tracker) -> None:
    fn = ToyStage()
    a = _run(fn, ToyConfig(n=1), store, tracker)
    b = _run(fn, ToyConfig(n=2), store, tracker)
    assert fn.calls == 2 and not b.skipped
    assert a.manifest.key != b.manifest.key
    assert load_manifest(store, "toy", a.manifest.key) == a.manifest  # the old checkpoint stays valid
    assert store.read_bytes(store.rel_of(b.manifest.artifact("tasks.json").uri)) == _content(ToyConfig(n=2))
    # and going back to the first config is a skip
    assert _run(fn, ToyConfig(n=1), store, tracker).skipped and fn.calls == 2


def test_seed_is_part_of_the_key(store: Store, tracker: Tracker) -> None:
    """A stage derives its seeds from the run seed, so another seed is another result."""
    fn, cfg = ToyStage(), ToyConfig()
    a = _run(fn, cfg, store, tracker, seed=0)
    b = _run(fn, cfg, store, tracker, seed=1)
    assert fn.calls == 2 and not b.skipped and a.manifest.key != b.manifest.key
    assert _run(fn, cfg, store, tracker, seed=1).skipped


def test_force_reruns_and_keeps_the_old_attempt_until_the_new_manifest(store: Store, tracker: Tracker) -> None:
    fn, cfg = ToyStage(), ToyConfig()
    old = _run(fn, cfg, store, tracker).manifest
    new_out = _run(fn, cfg, store, tracker, force=True)
    new = new_out.manifest
    assert not new_out.skipped and fn.calls == 2
    # while the forced run worked, the old manifest was still the published one
    assert fn.during == [None, old]
    assert new.key == old.key and new.attempt != old.attempt
    assert load_manifest(store, "toy", new.key) == new
    # the old attempt's artifacts are untouched, in their own folder
    old_tasks = old.artifact("tasks.json")
    assert store.read_bytes(store.rel_of(old_tasks.uri)) == _content(cfg)
    assert old_tasks.uri != new.artifact("tasks.json").uri
    assert new.mlflow_run_id != old.mlflow_run_id
    # the same content: the output's identity (what downstream keys use) is unchanged
    assert new.fingerprint == old.fingerprint


def test_failed_stage_publishes_nothing_and_the_rerun_runs(store: Store, tracker: Tracker) -> None:
    cfg = ToyConfig(label="fails")
    broken = ToyStage(fail=True)
    with pytest.raises(RuntimeError, match="exploded"):
        _run(broken, cfg, store, tracker)
    key = stage_key("toy", cfg, [])
    assert load_manifest(store, "toy", key) is None
    assert not store.exists(manifest_path("toy", key))
    assert not broken.seen_workdirs[0].exists()
    client = MlflowClient(tracking_uri=tracker.uri)
    failed = client.search_runs([tracker.experiment_id], f"tags.`swerl.key` = '{key}'")
    assert [r.info.status for r in failed] == ["FAILED"]

    fixed = ToyStage()
    out = _run(fixed, cfg, store, tracker)
    assert not out.skipped and fixed.calls == 1
    assert load_manifest(store, "toy", key) == out.manifest


def test_failed_forced_rerun_keeps_the_published_checkpoint(store: Store, tracker: Tracker) -> None:
    cfg = ToyConfig(label="keep")
    good = _run(ToyStage(), cfg, store, tracker).manifest
    with pytest.raises(RuntimeError):
        _run(ToyStage(fail=True), cfg, store, tracker, force=True)
    assert load_manifest(store, "toy", good.key) == good
    assert store.read_bytes(store.rel_of(good.artifact("tasks.json").uri)) == _content(cfg)


def test_a_forced_run_opens_a_force_epoch_that_a_plain_rerun_finishes(store: Store, tracker: Tracker) -> None:
    """A forced run keeps its durable state (checkpoints) apart from earlier attempts' (it must not resume from
    them); when it fails, the published manifest stays, but the stage is not done: the next plain run resumes the
    forced attempt (its durable folder, its MLflow run) instead of skipping, and then the stage is done."""
    fn, cfg = ToyStage(), ToyConfig(label="epoch")
    good = _run(fn, cfg, store, tracker).manifest
    key = good.key
    assert good.force_epoch == "" and fn.durable == [f"stages/toy/{key}/checkpoints"]
    failing = ToyStage(fail=True)
    with pytest.raises(RuntimeError, match="exploded"):
        _run(failing, cfg, store, tracker, force=True)
    epoch = read_force_epoch(store, "toy", key)
    assert epoch is not None and epoch.previous == "" and failing.during == [good]
    assert failing.durable == [f"stages/toy/{key}/forced/{epoch.epoch}/checkpoints"]
    assert load_manifest(store, "toy", key) == good  # still published, still readable
    client = MlflowClient(tracking_uri=tracker.uri)
    forced_runs = client.search_runs([tracker.experiment_id], f"tags.`swerl.force_epoch` = '{epoch.epoch}'")
    assert [(r.info.status, r.data.tags["swerl.forced"]) for r in forced_runs] == [("FAILED", "true")]

    resumed = _run(fn, cfg, store, tracker)  # no force: the forced attempt is resumed, not skipped
    assert not resumed.skipped and fn.calls == 2
    assert fn.durable[-1] == failing.durable[0] and resumed.manifest.force_epoch == epoch.epoch
    assert resumed.manifest.mlflow_run_id == forced_runs[0].info.run_id  # its MLflow run continued
    assert load_manifest(store, "toy", key) == resumed.manifest
    assert _run(fn, cfg, store, tracker).skipped and fn.calls == 2

    again = _run(fn, cfg, store, tracker, force=True).manifest  # a new epoch, a new run
    assert again.force_epoch not in ("", epoch.epoch) and fn.durable[-1].endswith(
        f"/forced/{again.force_epoch}/checkpoints"
    )
    assert again.mlflow_run_id != resumed.manifest.mlflow_run_id
    assert (read_force_epoch(store, "toy", key) or epoch).previous == epoch.epoch


def test_inputs_fingerprints_change_the_key(store: Store, tracker: Tracker) -> None:
    up_a = _run(ToyStage(), ToyConfig(n=1), store, tracker).manifest
    up_b = _run(ToyStage(), ToyConfig(n=2), store, tracker).manifest
    down = ToyStage()

    def downstream(inputs: list[Manifest]):  # type: ignore[no-untyped-def]
        return run_stage("down", down, ToyConfig(), store=store, tracker=tracker, parent=None, inputs=inputs)

    on_a = downstream([up_a])
    assert on_a.manifest.inputs == [up_a.as_input()]
    assert on_a.manifest.inputs[0].fingerprint == up_a.fingerprint
    on_b = downstream([up_b])
    assert down.calls == 2 and on_a.manifest.key != on_b.manifest.key
    assert downstream([up_a]).skipped and down.calls == 2
    # an upstream forced rerun with the same content does not invalidate downstream work
    up_a_again = _run(ToyStage(), ToyConfig(n=1), store, tracker, force=True).manifest
    assert up_a_again.attempt != up_a.attempt
    assert downstream([up_a_again]).skipped and down.calls == 2
    # the downstream stage sees its inputs by stage name
    assert on_a.manifest.inputs[0].stage == "toy"


def test_nested_under_a_parent_run(store: Store, tracker: Tracker) -> None:
    with tracker.run("pipe") as parent:
        out = run_stage("toy", ToyStage(), ToyConfig(n=9), store=store, tracker=tracker, parent=parent)
    run = MlflowClient(tracking_uri=tracker.uri).get_run(out.manifest.mlflow_run_id or "")
    assert run.data.tags["mlflow.parentRunId"] == parent.run_id


# ---- pipeline-level logic (swerl/pipeline.py) -----------------------------------------------------------


@pytest.mark.parametrize(
    ("force", "expected"),
    [
        ([], set()),
        (["curate"], {"curate", "traces", "sft", "grpo", "evaluate"}),
        (["traces"], {"traces", "sft", "grpo", "evaluate"}),
        (["sft"], {"sft", "grpo", "evaluate"}),
        (["grpo"], {"grpo", "evaluate"}),
        (["evaluate"], {"evaluate"}),
        (["evaluate", "sft"], {"sft", "grpo", "evaluate"}),
    ],
)
def test_stages_to_force(force: list[str], expected: set[str]) -> None:
    assert stages_to_force(force) == expected


def test_stages_to_force_rejects_unknown_stage() -> None:
    with pytest.raises(ConfigError, match="unknown stage") as err:
        stages_to_force(["curate", "nope"])
    assert "nope" in str(err.value) and all(s in str(err.value) for s in STAGES)


def _pipeline_cfg(tmp_path: Path, tracking_uri: str) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "run": {"name": "t", "seed": 5},
            "storage": {"root": f"file://{tmp_path}/store"},
            "tracking": {"uri": tracking_uri, "experiment": f"session-{uuid.uuid4().hex[:8]}"},
        }
    )


def test_session_saves_config_summary_and_tags(tmp_path: Path, mlflow_server: str) -> None:
    cfg = _pipeline_cfg(tmp_path, mlflow_server)
    fn = ToyStage()
    with open_session(cfg, flow_run_id="flow-run-1") as session:
        out = session.run_stage("curate", fn, ToyConfig())
    store, client = session.store, MlflowClient(tracking_uri=mlflow_server)
    assert out.manifest.key == stage_key("curate", ToyConfig(), [], seed=5)
    saved = store.read_bytes(f"pipelines/{session.run_id}/config.yaml").decode()
    assert saved == dump_config(cfg)
    assert PipelineConfig.model_validate(yaml.safe_load(saved)) == cfg
    summary = store.read_json(f"pipelines/{session.run_id}/summary.json")
    assert summary["stages"]["curate"] == {
        "skipped": False,
        "manifest": out.manifest.uri,
        "metrics": {"n_tasks": 3.0},
    }
    parent = client.get_run(session.parent.run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["prefect.flow_run_id"] == "flow-run-1"
    assert parent.data.tags["swerl.stage.curate"] == "ran"
    assert parent.data.params["run.seed"] == "5" and parent.data.params["forced_stages"] == "[]"
    # every run logs the machine's limits against the config at start (swerl doctor)
    assert parent.data.tags["swerl.doctor"] in ("ok", "refused")
    assert int(parent.data.params["doctor.machine.nofile_soft"]) > 0
    assert "doctor.check.memory" in parent.data.params
    assert "pipeline_duration_s" in parent.data.metrics
    stage_run = client.get_run(out.manifest.mlflow_run_id or "")
    assert stage_run.data.tags["mlflow.parentRunId"] == parent.info.run_id

    with open_session(cfg) as again:
        assert again.run_id != session.run_id  # two runs never share a folder
        assert again.run_stage("curate", fn, ToyConfig()).skipped and fn.calls == 1
    assert client.get_run(again.parent.run_id).data.tags["swerl.stage.curate"] == "skipped"

    with open_session(cfg, force=["curate"]) as forced:
        assert forced.forced == set(STAGES)
        assert not forced.run_stage("curate", fn, ToyConfig()).skipped and fn.calls == 2


def test_session_with_failing_stage_fails_its_parent_run(tmp_path: Path, mlflow_server: str) -> None:
    cfg = _pipeline_cfg(tmp_path, mlflow_server)
    with pytest.raises(RuntimeError), open_session(cfg) as session:
        session.run_stage("curate", ToyStage(fail=True), ToyConfig())
    assert MlflowClient(tracking_uri=mlflow_server).get_run(session.parent.run_id).info.status == "FAILED"
    assert session.store.exists(f"pipelines/{session.run_id}/config.yaml")
    assert not session.store.exists(f"pipelines/{session.run_id}/summary.json")
    assert session.store.list("stages/curate") != []  # the attempt folder
    assert load_manifest(session.store, "curate", stage_key("curate", ToyConfig(), [], seed=5)) is None


def test_session_rejects_unknown_force_before_opening_anything(tmp_path: Path) -> None:
    cfg = _pipeline_cfg(tmp_path, "sqlite:///never/used.db")
    with pytest.raises(ConfigError), open_session(cfg, force=["bogus"]):
        pass
    assert not (tmp_path / "store").exists()


def test_a_rerun_of_the_same_config_continues_one_parent_and_the_failed_stage_run(
    tmp_path: Path, mlflow_server: str
) -> None:
    """One MLflow parent run per pipeline config: the resumed pipeline continues the failed parent, and the
    resumed stage continues its failed run, so its curve is one line under one parent; tags name the config hash
    and the git commit; progress reaches the hook; a changed config starts its own parent."""
    cfg = _pipeline_cfg(tmp_path, mlflow_server)
    with pytest.raises(RuntimeError), open_session(cfg, flow_run_id="flow-1") as first:
        first.run_stage("curate", ToyStage(fail=True), ToyConfig())
    seen: list[tuple[float, str]] = []

    def stage(cfg: ToyConfig, ctx: StageContext) -> StageResult:
        ctx.log_metrics({"progress": 1.0}, step=5)
        ctx.progress(1, 2, "half")
        return StageResult(images={"curve": b"\x89PNG fake bytes"})  # logged as bytes; no image decoding here

    with open_session(cfg, flow_run_id="flow-2") as second:
        out = second.run_stage("curate", stage, ToyConfig(), progress=lambda f, note: seen.append((f, note)))
    client = MlflowClient(tracking_uri=mlflow_server)
    assert second.parent.run_id == first.parent.run_id
    parent = client.get_run(second.parent.run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["swerl.resumes"] == "1"
    assert parent.data.tags["prefect.flow_run_id"] == "flow-2"
    assert parent.data.tags["swerl.config_hash"] == config_hash(cfg)
    assert not [t for t in parent.data.tags if t.startswith("swerl.param_changed.doctor.")]  # measured anew
    assert len(parent.data.tags["mlflow.source.git.commit"]) == 40
    runs = client.search_runs([second.tracker.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert [r.info.run_id for r in runs] == [out.manifest.mlflow_run_id]
    (run,) = runs
    assert run.info.status == "FINISHED" and run.data.tags["swerl.resumes"] == "1"
    assert run.data.tags["swerl.config_hash"] == config_hash(ToyConfig())
    steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "progress"))
    assert steps == [0, 1, 2, 5]  # the failed attempt's points and the resumed one's, one curve
    assert [a.path for a in client.list_artifacts(run.info.run_id, "plots")] == ["plots/curve.png"]
    assert seen == [(0.5, "half")]

    other = cfg.model_copy(update={"run": cfg.run.model_copy(update={"seed": 6})})
    with open_session(other) as third:
        assert third.parent.run_id != first.parent.run_id
