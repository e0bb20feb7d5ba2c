"""Store artifacts checked against their manifests (issue 36): a damaged input names its file, the stage that wrote it
and the command that recomputes it; a finished stage whose artifacts are truncated or gone reruns instead of being
"skipped, already done"."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import BaseModel

from swerl.stages.common import get_dir, read_input
from swerl.stages.runner import Manifest, StageContext, StageResult, run_stage
from swerl.storage import DamagedArtifact, Store, open_store
from swerl.tracking import Tracker

PARQUET = b"PAR1" + bytes(range(256)) * 8 + b"PAR1"
WEIGHTS = b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " + bytes(4096)


class Cfg(BaseModel):
    n: int = 1


@dataclass
class Writer:
    """A literal stage writing fixed artifacts (curate's train.parquet, SFT's model/ folder)."""

    calls: int = 0

    def __call__(self, cfg: Cfg, ctx: StageContext) -> StageResult:
        self.calls += 1
        if ctx.stage == "curate":
            ctx.write_artifact("train.parquet", PARQUET)
        else:
            ctx.write_artifact("model/model.safetensors", WEIGHTS)
            ctx.write_artifact("model/config.json", b"{}")
        return StageResult()


@pytest.fixture(scope="module")
def tracker(tmp_path_factory: pytest.TempPathFactory) -> Tracker:
    db = tmp_path_factory.mktemp("integrity-mlflow") / "mlflow.db"
    return Tracker(f"sqlite:///{db}", f"integrity-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return open_store(f"file://{tmp_path}/store")


def _finish(stage: str, store: Store, tracker: Tracker, writer: Writer) -> Manifest:
    return run_stage(stage, writer, Cfg(), store=store, tracker=tracker, parent=None).manifest


def _local(store: Store, uri: str) -> Path:
    return Path(store.root) / store.rel_of(uri)


def test_a_truncated_train_parquet_names_the_file_the_stage_and_the_remedy(store: Store, tracker: Tracker) -> None:
    curate = _finish("curate", store, tracker, Writer())
    path = _local(store, curate.artifact("train.parquet").uri)
    path.write_bytes(PARQUET[:100])
    with pytest.raises(DamagedArtifact) as info:
        read_input(store, curate, "train.parquet")
    message = str(info.value)
    assert str(path) in message and "100 bytes where its manifest records" in message
    assert "written by stage curate" in message and "`swerl run CONFIG --force curate`" in message


def test_a_same_size_damaged_model_names_the_file_the_stage_and_the_remedy(
    store: Store, tracker: Tracker, tmp_path: Path
) -> None:
    sft = _finish("sft", store, tracker, Writer())
    path = _local(store, sft.artifact("model/model.safetensors").uri)
    path.write_bytes(b"\xff" + WEIGHTS[1:])  # same size: only the sha256 tells
    with pytest.raises(DamagedArtifact) as info:
        get_dir(store, sft, "model", tmp_path / "local-model")
    message = str(info.value)
    assert "model.safetensors" in message and "sha256" in message
    assert "written by stage sft" in message and "`swerl run CONFIG --force sft`" in message


def test_intact_artifacts_read_back_and_the_stage_is_skipped(store: Store, tracker: Tracker, tmp_path: Path) -> None:
    writer = Writer()
    sft = _finish("sft", store, tracker, writer)
    local = get_dir(store, sft, "model", tmp_path / "m")
    assert (local / "model.safetensors").read_bytes() == WEIGHTS
    again = run_stage("sft", writer, Cfg(), store=store, tracker=tracker, parent=None)
    assert again.skipped and writer.calls == 1


@pytest.mark.parametrize(("stage", "name"), [("curate", "train.parquet"), ("sft", "model/model.safetensors")])
def test_a_finished_stage_with_a_truncated_or_missing_artifact_reruns(
    stage: str, name: str, store: Store, tracker: Tracker, caplog: pytest.LogCaptureFixture
) -> None:
    writer = Writer()
    first = _finish(stage, store, tracker, writer)
    path = _local(store, first.artifact(name).uri)
    for damage in ("truncate", "remove"):
        if damage == "truncate":
            path.write_bytes(path.read_bytes()[:10])
        else:
            path.unlink()
        with caplog.at_level("WARNING"):
            again = run_stage(stage, writer, Cfg(), store=store, tracker=tracker, parent=None)
        assert not again.skipped, damage
        assert f"stage {stage}: published but its artifacts are damaged" in caplog.text
        assert str(path) in caplog.text
        data = read_input(store, again.manifest, name)  # the rerun's artifact, intact
        assert data == (PARQUET if stage == "curate" else WEIGHTS)
        assert again.manifest.key == first.key and again.manifest.fingerprint == first.fingerprint
        path = _local(store, again.manifest.artifact(name).uri)
        caplog.clear()
    assert writer.calls == 3
    assert run_stage(stage, writer, Cfg(), store=store, tracker=tracker, parent=None).skipped
