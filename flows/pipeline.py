"""The training pipeline: curate -> traces -> sft -> grpo -> evaluate, each stage checkpointed by its manifest."""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.runtime import flow_run

from swerl.config import PipelineConfig
from swerl.pipeline import open_session
from tasks.stages import curate_tasks, evaluate_task, grpo_phase_tasks, sft_task, trace_tasks


@flow(name="swerl-pipeline", log_prints=True)
def pipeline(config: PipelineConfig | None = None, force: list[str] | None = None) -> dict[str, Any]:
    """Run every stage in order; finished stages (same config and inputs) are skipped.

    Args:
        config: the pipeline's config (every section; the defaults where left out).
        force: stages to rerun, each with every stage after it: curate, traces, sft, grpo (from the first GRPO
            phase), grpo-NAME (from that phase of grpo.phases), evaluate.
    """
    config = config or PipelineConfig()
    with open_session(config, force=list(force or []), flow_run_id=flow_run.get_id()) as session:
        curate = curate_tasks(session)
        traces = trace_tasks(session, curate)
        sft = sft_task(session, curate, traces)
        grpo = grpo_phase_tasks(session, curate, sft)
        evaluate_task(session, curate, sft, grpo)
        return session.summary()


@flow(name="swerl-curate", log_prints=True)
def curate_only(config: PipelineConfig | None = None, force: bool = False) -> dict[str, Any]:
    """Only the curate stage, in the same pipeline session (store, MLflow parent run, stage runner) as `pipeline`:
    `swerl curate CONFIG`. A finished curation with the same config and repository contents is skipped."""
    config = config or PipelineConfig()
    with open_session(config, force=["curate"] if force else [], flow_run_id=flow_run.get_id()) as session:
        curate_tasks(session)
        return session.summary()
