"""Deployments: what `swerl serve` registers with the Prefect API (the pipeline on demand, the evaluation on the cron
schedule `serve.eval_cron`), each with the resolved config as its default parameters (less the sections a run never
reads: `serve`, `services`).

By default they go to a work pool of type `process` (`swerl up` runs its worker), so schedules fire and UI runs start
without a foreground process; `swerl serve --foreground` serves them from this process instead (Prefect's runner).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from prefect import serve
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.exceptions import ObjectNotFound
from prefect.schedules import Cron
from prefect.settings import get_current_settings
from prefect.workers.process import ProcessWorker

from flows.evaluate import evaluate
from flows.pipeline import pipeline
from swerl.config import ConfigError, PipelineConfig

log = logging.getLogger("swerl.flows.deploy")

PROJECT = Path(__file__).resolve().parent.parent  # flows/ and tasks/ live here; flow runs start here
ENTRYPOINTS = {"pipeline": "flows/pipeline.py:pipeline", "evaluate": "flows/evaluate.py:evaluate"}


def deployment_parameters(cfg: PipelineConfig) -> dict[str, Any]:
    """A deployment's default parameters: the resolved config without the sections the form hides."""
    hidden = set(PipelineConfig.form_hidden)
    return {"config": cfg.model_dump(mode="json", by_alias=True, exclude=hidden)}


def build_deployments(cfg: PipelineConfig, work_pool: str | None = None) -> list[Any]:
    """The deployments `swerl serve` registers: the pipeline (run on demand) and the scheduled evaluation; with
    work_pool, for that pool's workers (flow runs start in this checkout, with its flows/ and tasks/ importable).

    (RunnerDeployment objects; typed Any because Prefect types to_deployment as possibly a coroutine.)"""
    params = deployment_parameters(cfg)
    pool: dict[str, Any] = {}
    if work_pool is not None:
        pool = {"work_pool_name": work_pool, "job_variables": {"working_dir": str(PROJECT)}}
    out: list[Any] = [
        pipeline.to_deployment(name=f"{cfg.run.name}-pipeline", parameters=params, tags=["swerl"], **pool),
        evaluate.to_deployment(
            name=f"{cfg.run.name}-evaluate",
            parameters=params,
            tags=["swerl", "evaluation"],
            schedule=Cron(cfg.serve.eval_cron, timezone=cfg.serve.timezone),
            **pool,
        ),
    ]
    if work_pool is not None:
        for deployment, entrypoint in zip(out, ENTRYPOINTS.values(), strict=True):
            deployment.entrypoint = entrypoint  # relative to the project, wherever `swerl serve` was started
            deployment._path = str(PROJECT)
    return out


def require_api() -> str:
    """The Prefect API deployments go to; a ConfigError when none is set (an ephemeral API forgets them at exit
    and runs no schedule)."""
    url = get_current_settings().api.url
    if not url:
        raise ConfigError(
            "PREFECT_API_URL is not set: deployments would be registered with a throw-away Prefect API that runs no "
            "schedule and no UI. Start the services (`swerl up`) and `source runs/services/services.env` (or export "
            "PREFECT_API_URL=http://127.0.0.1:4200/api), then run `swerl serve` again"
        )
    return str(url)


def ensure_work_pool(name: str) -> None:
    """Create the work pool (type process) unless it exists."""
    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(name)
        except ObjectNotFound:
            template = ProcessWorker.get_default_base_job_template()
            client.create_work_pool(WorkPoolCreate(name=name, type="process", base_job_template=template))
            log.info("created work pool %s (type process)", name)


def register_deployments(cfg: PipelineConfig, work_pool: str) -> list[str]:
    """Register the deployments on the work pool (created if missing); returns their names."""
    require_api()
    ensure_work_pool(work_pool)
    names = []
    for deployment in build_deployments(cfg, work_pool=work_pool):
        deployment.apply(work_pool_name=work_pool)
        names.append(f"{deployment.flow_name}/{deployment.name}")
    return names


def serve_deployments(cfg: PipelineConfig) -> None:
    """Register the deployments and run their flow runs here until interrupted (serve.max_concurrent_runs)."""
    require_api()
    serve(*build_deployments(cfg), limit=cfg.serve.max_concurrent_runs)
