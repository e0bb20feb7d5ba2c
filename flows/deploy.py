"""Deployments: what `swerl serve` registers with the Prefect API and serves (the pipeline on demand, the
evaluation on the cron schedule `serve.eval_cron`), each with the resolved config as its default parameters."""

from __future__ import annotations

from typing import Any

from prefect import serve
from prefect.schedules import Cron

from flows.evaluate import evaluate
from flows.pipeline import pipeline
from swerl.config import PipelineConfig


def build_deployments(cfg: PipelineConfig) -> list[Any]:
    """The deployments `swerl serve` registers: the pipeline (run on demand) and the scheduled evaluation.

    (RunnerDeployment objects; typed Any because Prefect types to_deployment as possibly a coroutine.)"""
    params = {"config": cfg.model_dump(mode="json", by_alias=True)}
    return [
        pipeline.to_deployment(name=f"{cfg.run.name}-pipeline", parameters=params, tags=["swerl"]),
        evaluate.to_deployment(
            name=f"{cfg.run.name}-evaluate",
            parameters=params,
            tags=["swerl", "evaluation"],
            schedule=Cron(cfg.serve.eval_cron, timezone=cfg.serve.timezone),
        ),
    ]


def serve_deployments(cfg: PipelineConfig) -> None:
    """Register the deployments and run their flow runs here until interrupted (serve.max_concurrent_runs)."""
    serve(*build_deployments(cfg), limit=cfg.serve.max_concurrent_runs)
