"""MLflow tracking against a real `mlflow server` and the default sqlite store."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from swerl.errors import InfraError
from swerl.tracking import MLFLOW_PARAM_VALUE_MAX, Tracker, flatten, safe_params


def _experiment() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def test_flatten_nested_mappings_and_lists() -> None:
    flat = flatten({"a": {"b": {"c": 1}, "d": [3, 1]}, "e": None, "f": ("x",)})
    assert flat == {"a.b.c": 1, "a.d": "[3, 1]", "e": None, "f": '["x"]'}


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "db.passwd",
        "e2b.api_key",
        "apiKey",
        "aws_secret_access_key",
        "s3.access_key_id",
        "hf_token",
        "HF_TOKEN",
        "github.token",
        "token",
        "auth_token",
        "credentials.path",
        "client_secret",
    ],
)
def test_secret_looking_keys_are_dropped(key: str) -> None:
    assert safe_params({key: "hunter2", "kept": 1}) == {"kept": "1"}


@pytest.mark.parametrize(
    "key",
    [
        "max_tokens",
        "grpo.trajectory_token_cap",
        "engine.context_tokens",
        "model.tokenizer",
        "tokenizer_path",
        "rollout.tokens_per_step",
        "curate.max_candidates_per_repo",
    ],
)
def test_limit_and_model_keys_are_kept(key: str) -> None:
    """Caps must be logged (no hidden caps): a key that only mentions tokens is not a secret."""
    assert safe_params({key: 4096}) == {key: "4096"}


def test_long_values_are_truncated_to_mlflow_limit() -> None:
    out = safe_params({"big": "x" * (MLFLOW_PARAM_VALUE_MAX + 50)})
    assert len(out["big"]) == MLFLOW_PARAM_VALUE_MAX


def _check_parent_and_nested(uri: str, experiment: str) -> tuple[str, str]:
    tracker = Tracker(uri, experiment)
    with tracker.run("p-pipeline", tags={"prefect.flow_run_id": "flow-123"}) as parent:
        parent.log_params({"run": {"name": "p", "seed": 3}, "forced": ["sft", "grpo"]})
        with tracker.run("curate", tags={"swerl.stage": "curate"}, parent=parent) as child:
            child.log_params(
                {
                    "sandbox": {"memory_mb": 1024, "api_key": "sk-should-not-appear"},
                    "modifiers": ["b", "a"],
                    "many": {f"p{i}": i for i in range(230)},  # more than one 100-param batch
                }
            )
            for step, loss in enumerate([3.0, 2.0, 1.5]):
                child.log_metrics({"loss": loss, "reward": step / 2}, step=step)
            child.log_dict({"rows": 2}, "report.json")
            child.log_text("# hi", "report.md")

    client = MlflowClient(tracking_uri=tracker.uri)
    p, c = client.get_run(parent.run_id), client.get_run(child.run_id)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None and p.info.experiment_id == c.info.experiment_id == exp.experiment_id
    assert p.info.status == c.info.status == "FINISHED"
    assert p.data.tags["prefect.flow_run_id"] == "flow-123"
    assert p.data.tags["mlflow.runName"] == "p-pipeline"
    assert "mlflow.parentRunId" not in p.data.tags
    assert c.data.tags["mlflow.parentRunId"] == parent.run_id
    assert c.data.tags["swerl.stage"] == "curate"
    assert c.info.run_name == "curate"
    assert p.data.params == {"run.name": "p", "run.seed": "3", "forced": '["sft", "grpo"]'}
    assert c.data.params["sandbox.memory_mb"] == "1024"
    assert c.data.params["modifiers"] == '["b", "a"]'
    assert c.data.params["many.p229"] == "229"
    assert len([k for k in c.data.params if k.startswith("many.")]) == 230
    assert not any("api_key" in k for k in c.data.params)
    assert "sk-should-not-appear" not in json.dumps(c.data.params)
    history = client.get_metric_history(child.run_id, "loss")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [
        (0, 3.0),
        (1, 2.0),
        (2, 1.5),
    ]
    assert c.data.metrics["reward"] == 1.0  # the latest value
    assert {a.path for a in client.list_artifacts(child.run_id)} == {"report.json", "report.md"}
    local = client.download_artifacts(child.run_id, "report.json")
    assert json.loads(Path(local).read_text()) == {"rows": 2}
    nested = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.run_id}'")
    assert [r.info.run_id for r in nested] == [child.run_id]
    return parent.run_id, child.run_id


def test_parent_and_nested_runs_on_mlflow_server(mlflow_server: str) -> None:
    _check_parent_and_nested(mlflow_server, _experiment())


def test_parent_and_nested_runs_on_default_sqlite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _check_parent_and_nested("sqlite:///runs/mlflow.db", "swerl")
    assert (tmp_path / "runs" / "mlflow.db").is_file()
    # artifacts go next to the database, not into the working directory
    assert list((tmp_path / "runs" / "mlflow-artifacts").rglob("report.json"))
    assert not (tmp_path / "mlruns").exists()
    assert not (tmp_path / "mlartifacts").exists()


def test_existing_experiment_is_reused(mlflow_server: str) -> None:
    name = _experiment()
    first, second = Tracker(mlflow_server, name), Tracker(mlflow_server, name)
    assert first.experiment_id == second.experiment_id


def test_run_is_failed_when_body_raises(mlflow_server: str) -> None:
    tracker = Tracker(mlflow_server, _experiment())
    with pytest.raises(RuntimeError, match="boom"), tracker.run("pipe") as parent:  # noqa: SIM117
        with tracker.run("stage", parent=parent) as child:  # the child needs the parent's handle
            child.log_metrics({"partial": 1.0})
            raise RuntimeError("boom")
    client = MlflowClient(tracking_uri=mlflow_server)
    assert client.get_run(child.run_id).info.status == "FAILED"
    assert client.get_run(parent.run_id).info.status == "FAILED"
    assert client.get_run(child.run_id).data.metrics == {"partial": 1.0}


def test_run_is_killed_on_keyboard_interrupt(mlflow_server: str) -> None:
    tracker = Tracker(mlflow_server, _experiment())
    with pytest.raises(KeyboardInterrupt), tracker.run("pipe") as parent:
        raise KeyboardInterrupt
    assert MlflowClient(tracking_uri=mlflow_server).get_run(parent.run_id).info.status == "KILLED"


def test_unreachable_server_is_an_infra_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from swerl.services import free_port

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    with pytest.raises(InfraError) as err:
        Tracker(f"http://127.0.0.1:{free_port()}", "swerl")
    assert err.value.cause == "storage"
