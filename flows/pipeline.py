"""The training pipeline: curate -> sft -> grpo -> evaluate, each stage checkpointed by its manifest."""

from __future__ import annotations

from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from swerl.config import STAGES, PipelineConfig
from swerl.pipeline import open_session
from tasks.stages import curate_tasks

StageName = Literal["curate", "sft", "grpo", "evaluate"]
BUILT_STAGES = ("curate",)


@flow(name="swerl-pipeline", log_prints=True)
def pipeline(config: PipelineConfig | None = None, force: list[StageName] | None = None) -> dict[str, Any]:
    """Run every built stage in order; finished stages (same config and inputs) are skipped."""
    config = config or PipelineConfig()
    logger = get_run_logger()
    with open_session(config, force=list(force or []), flow_run_id=flow_run.get_id()) as session:
        curate_tasks(session)
        not_built = [s for s in STAGES if s not in BUILT_STAGES]
        logger.warning(
            "pipeline stops after %s: stages not built yet: %s", BUILT_STAGES[-1], ", ".join(not_built)
        )
        summary = session.summary()
        summary["not_built"] = not_built
        return summary
