"""MLflow tracking against a real `mlflow server` and the default sqlite store."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from swerl.errors import InfraError
from swerl.tracking import (
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    GIT_COMMIT_TAG,
    GIT_DIRTY_TAG,
    MLFLOW_PARAM_VALUE_MAX,
    RESUMES_TAG,
    Tracker,
    flatten,
    git_tags,
    log_dataset_inputs,
    run_url,
    safe_params,
)


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


def test_experiment_is_a_training_experiment_for_mlflow_3(tmp_path: Path) -> None:
    """MLflow 3 opens an experiment without mlflow.experimentKind in its GenAI view; swerl's is 'Machine learning',
    also when the experiment existed before (created by an older swerl)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    old = client.create_experiment("older")
    assert EXPERIMENT_KIND_TAG not in client.get_experiment(old).tags
    for name in ("fresh", "older"):
        tracker = Tracker(uri, name)
        assert client.get_experiment(tracker.experiment_id).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    assert EXPERIMENT_KIND == "custom_model_development"


def test_an_ended_run_is_continued_with_its_curve(tmp_path: Path) -> None:
    """A resumed attempt finds its failed run and continues it: one run, one curve, params kept, a changed value
    recorded as a tag (MLflow never changes a param), the resume counted; a RUNNING run is never continued."""
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "resume")
    identity = {"swerl.kind": "stage", "swerl.key": "k1"}
    with pytest.raises(RuntimeError), tracker.run("sft", tags=identity) as first:
        first.log_params({"lr": 0.1, "steps": 4})
        first.log_metrics({"loss": 3.0}, step=1)
        assert tracker.find_run(identity) is None  # RUNNING: a live process owns it
        raise RuntimeError("killed at step 1")
    assert tracker.find_run({"swerl.kind": "stage", "swerl.key": "other"}) is None
    assert tracker.find_run(identity, statuses=("FINISHED",)) is None
    found = tracker.find_run(identity, statuses=("FAILED", "KILLED"))
    assert found == first.run_id
    with tracker.run("sft", tags=identity, resume=found) as second:
        second.log_params({"lr": 0.1, "steps": 8, "new": 1})
        second.log_metrics({"loss": 2.0}, step=2)
    client = tracker.client
    run = client.get_run(first.run_id)
    assert second.run_id == first.run_id and run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.1", "steps": "4", "new": "1"}
    assert run.data.tags["swerl.param_changed.steps"] == "8"
    assert run.data.tags[RESUMES_TAG] == "1"
    history = sorted(client.get_metric_history(first.run_id, "loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in history] == [(1, 3.0), (2, 2.0)]
    assert all(m.timestamp > 1_600_000_000_000 for m in history)  # real times, not 1970


def test_system_metrics_are_sampled_into_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "system")
    with tracker.run("pipe", system_metrics=0.5) as run:  # tracking.system_metrics_interval_s
        time.sleep(2.5)
    metrics = tracker.client.get_run(run.run_id).data.metrics
    assert any(k.startswith("system/cpu_utilization") for k in metrics), metrics
    assert any(k.startswith("system/system_memory_usage") for k in metrics), metrics


def test_git_tags_name_the_checkout(tmp_path: Path) -> None:
    tags = git_tags()
    assert len(tags[GIT_COMMIT_TAG]) == 40 and tags[GIT_DIRTY_TAG] in ("true", "false")
    assert git_tags(tmp_path) == {}  # not a checkout: no tag rather than a wrong one


def test_dataset_inputs_are_logged_with_their_context(tmp_path: Path) -> None:
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "datasets")
    with tracker.run("grpo") as run:
        log_dataset_inputs(
            run,
            [
                ("curate/train.parquet", f"file://{tmp_path}/train.parquet", "ab" * 32, "training"),
                ("eval", "s3://bucket/eval.parquet", "cd" * 32, "evaluation"),
            ],
        )
    inputs = tracker.client.get_run(run.run_id).inputs.dataset_inputs
    got = {i.dataset.name: ({t.key: t.value for t in i.tags}["mlflow.data.context"], i.dataset.digest) for i in inputs}
    assert got == {"curate/train.parquet": ("training", "ab" * 18), "eval": ("evaluation", "cd" * 18)}
    assert "s3://bucket/eval.parquet" in [i.dataset.source for i in inputs if i.dataset.name == "eval"][0]


def test_run_url_only_for_a_server() -> None:
    assert (
        run_url("http://127.0.0.1:5000/", "3", "abc")
        == "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning"
    )
    assert run_url("sqlite:///runs/mlflow.db", "3", "abc") is None


def test_a_run_left_running_by_a_killed_process_is_continued(tmp_path: Path) -> None:
    """SIGKILL leaves the parent RUNNING; the next run of the config marks it KILLED and continues it."""
    import socket
    import subprocess
    import sys

    from swerl.tracking import OWNER_HOST_TAG, OWNER_PID_TAG

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "killed")
    identity = {"swerl.kind": "pipeline", "swerl.config_hash": "h1"}
    left = tracker.client.create_run(
        tracker.experiment_id,
        tags={**identity, OWNER_PID_TAG: str(gone.pid), OWNER_HOST_TAG: socket.gethostname()},
    )
    assert tracker.find_run(identity) == left.info.run_id
    assert tracker.client.get_run(left.info.run_id).info.status == "KILLED"
