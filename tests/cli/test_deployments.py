"""Deployments served by a real Prefect worker (work pool of type process), as `swerl up` + `swerl serve` set them up.

Everything is real: the session's Prefect server, MLflow server and SeaweedFS S3, `swerl serve` registering the
deployments from the environment `swerl up` writes, a `prefect worker` process running the flow run in a process of
its own. The run is the pipeline with a partial override whose curate repository does not exist, so it fails in
curate by design after its session opened: it is the quickest run that writes to MLflow and S3.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from swerl import services
from swerl.cli import main, services_env
from swerl.config.services import ServicesConfig

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_a_ui_run_lands_in_the_mlflow_server_and_the_s3_bucket_with_a_merged_partial_config(
    prefect_api: str,
    mlflow_server: str,
    s3_env,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.deployments import run_deployment

    tag = uuid.uuid4().hex[:8]
    pool, name, prefix = f"pool-{tag}", f"dep-{tag}", f"store-{tag}"
    # The environment `swerl up` writes (services.env), here pointing at the session's servers.
    mlflow_port = int(mlflow_server.rsplit(":", 1)[1])
    s3_port = int(s3_env.endpoint_url.rsplit(":", 1)[1])
    sc = ServicesConfig(
        prefect_port=int(prefect_api.split(":")[2].split("/")[0]), mlflow_port=mlflow_port, s3_port=s3_port
    )
    creds = tmp_path / "s3.env"
    creds.write_text(
        f"export AWS_ACCESS_KEY_ID={s3_env.access_key}\nexport AWS_SECRET_ACCESS_KEY={s3_env.secret_key}\n"
    )
    exported = {}
    for line in services_env(sc, creds).splitlines():
        if line.startswith("export "):
            key, value = line.removeprefix("export ").split("=", 1)
            exported[key] = value
    assert exported["PREFECT_API_URL"] == prefect_api and exported["SWERL_TRACKING_URI"] == mlflow_server
    for key, value in exported.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SWERL_STORAGE_ROOT", f"s3://swerl/{prefix}")

    # `swerl serve` registers on the work pool (created: type process) and returns.
    experiment = f"deploy-{tag}"
    assert (
        main(
            [
                "serve",
                str(REPO / "configs/local.yaml"),
                "--pool",
                pool,
                "--set",
                f"run.name={name}",
                "--set",
                f"tracking.experiment={experiment}",
            ]
        )
        == 0
    )
    assert f"registered on work pool '{pool}'" in capsys.readouterr().out
    with get_client(sync_client=True) as client:
        assert client.read_work_pool(pool).type == "process"
        deployment = client.read_deployment_by_name(f"swerl-pipeline/{name}-pipeline")
        assert deployment.work_pool_name == pool
        params = deployment.parameters["config"]
        assert params["tracking"]["uri"] == mlflow_server and params["storage"]["root"] == f"s3://swerl/{prefix}"
        assert "services" not in params and "serve" not in params
        assert s3_env.secret_key not in str(deployment.model_dump())  # secrets never in a deployment

    # A worker as `swerl up` starts it: the S3 credentials in its environment only.
    worker = services.prefect_worker(
        tmp_path / "worker",
        prefect_api,
        pool,
        services.free_port(),
        startup_timeout_s=180,
        cwd=REPO,
        env={
            "AWS_ACCESS_KEY_ID": s3_env.access_key,
            "AWS_SECRET_ACCESS_KEY": s3_env.secret_key,
            "PYTHONPATH": str(REPO),
            "PREFECT_HOME": os.environ["PREFECT_HOME"],
        },
    )
    worker.stop_timeout_s = 10
    with worker:
        # A partial override, as `prefect deployment run --param config='{"curate": ...}'` sends it.
        missing = tmp_path / "no-such-repo"
        flow_run = run_deployment(
            f"swerl-pipeline/{name}-pipeline",
            parameters={"config": {"curate": {"repos": [str(missing)]}}},
            timeout=600,
        )
    assert flow_run.state is not None and flow_run.state.is_final(), flow_run.state
    assert flow_run.state.is_failed(), flow_run.state  # curate: the repository does not exist
    assert flow_run.name == name  # run.name from the deployment's config
    with get_client(sync_client=True) as client:
        logs = "\n".join(
            log.message
            for log in client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id])))
        )
    assert "machine limits at start (swerl doctor)" in logs, logs  # a swerl INFO record, from the worker's run
    assert str(missing) in logs
    assert s3_env.secret_key not in logs

    # The MLflow server has its parent run, with the deployment's config merged under the override.
    client = MlflowClient(tracking_uri=mlflow_server)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None
    (parent,) = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" not in r.data.tags]
    assert parent.data.tags["prefect.flow_run_id"] == str(flow_run.id)
    assert s3_env.secret_key not in str(parent.data.params)
    # The S3 bucket has the run's resolved config: the override, and the deployment's values elsewhere.
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=s3_env.endpoint_url, key=s3_env.access_key, secret=s3_env.secret_key)
    saved = fs.glob(f"swerl/{prefix}/pipelines/*/config.yaml")
    assert len(saved) == 1, fs.find(f"swerl/{prefix}")
    resolved = yaml.safe_load(fs.cat(saved[0]))
    assert resolved["curate"]["repos"] == [str(missing)]
    assert resolved["run"]["name"] == name and resolved["tracking"]["experiment"] == experiment
    assert resolved["storage"]["root"] == f"s3://swerl/{prefix}"
