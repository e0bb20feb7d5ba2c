"""The SFT/GRPO model in MLflow: logged as the stage run's output model with a signature, registered as a version
of the pipeline's registered model, loadable as a pyfunc that answers a prompt (a real tiny Qwen3, sqlite MLflow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from swerl.model_logging import MAX_NEW_TOKENS_DEFAULT, log_and_register, registered_model_name
from swerl.tracking import Tracker
from tests.tiny_models import SMALL, TinyModels


@pytest.fixture(scope="module")
def checkpoint(tiny_models: TinyModels) -> Path:
    """A tiny Qwen3 (one layer, 2 heads) saved with its tokenizer."""
    tokenizer = tiny_models.tokenizer(["def f(x):\n    return x + 1\n"] * 20, 300)
    return tiny_models.saved(tokenizer, 128, shape=SMALL, num_heads=2, num_kv_heads=1)


def test_model_is_logged_with_signature_registered_and_loads(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow.pyfunc

    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "models")
    name = registered_model_name("flowtest")
    assert name == "flowtest-agent" and registered_model_name("x", "team-policy") == "team-policy"
    with tracker.run("sft") as run:
        first = log_and_register(
            run,
            tracker.experiment_id,
            checkpoint,
            stage="sft",
            checkpoint_uri="file:///store/stages/sft/k/a/model",
            registered=name,
        )
    with tracker.run("grpo-tight") as run2:
        second = log_and_register(
            run2,
            tracker.experiment_id,
            checkpoint,
            stage="grpo-tight",
            checkpoint_uri="file:///store/stages/grpo/k/a/model",
            registered=name,
        )
    assert first["swerl.model.registered"] == f"{name}/1" and second["swerl.model.registered"] == f"{name}/2"
    client = tracker.client
    assert client.get_run(run.run_id).data.tags["swerl.model.id"] == first["swerl.model.id"]
    outputs = client.get_run(run.run_id).outputs
    assert [o.model_id for o in outputs.model_outputs] == [first["swerl.model.id"]]
    version = client.get_model_version(name, "2")
    assert version.run_id == run2.run_id and version.tags["swerl.stage"] == "grpo-tight"

    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracker.uri)  # how a user loads it: models:/ID of their server
    model = mlflow.pyfunc.load_model(f"models:/{first['swerl.model.id']}")
    assert mlflow.pyfunc.load_model(f"models:/{name}/2").metadata.signature == model.metadata.signature
    sig = model.metadata.signature
    assert sig.inputs.input_names() == ["prompt"] and sig.outputs.input_names() == ["completion"]
    assert sig.params.params[0].name == "max_new_tokens" and sig.params.params[0].default == MAX_NEW_TOKENS_DEFAULT
    import pandas as pd

    answer = model.predict(pd.DataFrame({"prompt": ["def f(x):"]}), params={"max_new_tokens": 4})
    assert len(answer) == 1 and isinstance(answer[0], str)


def test_a_failure_to_log_never_fails_the_stage(tmp_path: Path) -> None:
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "models")
    with tracker.run("sft") as run:
        assert (
            log_and_register(
                run,
                tracker.experiment_id,
                tmp_path / "missing",
                stage="sft",
                checkpoint_uri="file:///nowhere",
                registered="x",
            )
            == {}
        )
