"""Stage tasks. Each runs a swerl stage through the session (skip/force by manifest) and publishes its report.

Checkpointing is swerl's manifest, not Prefect's result persistence, so caching is off here.
"""

from __future__ import annotations

import re

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from swerl.pipeline import PipelineSession
from swerl.stages.runner import Manifest, StageOutcome


def _artifact_key(*parts: str) -> str:
    # Prefect artifact keys: lowercase letters, digits and dashes only.
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")


def publish_outcome(stage: str, outcome: StageOutcome) -> None:
    """Log what happened and publish the stage's tables and markdown as Prefect artifacts."""
    logger = get_run_logger()
    m = outcome.manifest
    if outcome.skipped:
        logger.info("%s skipped: already done (manifest %s)", stage, m.uri)
        create_markdown_artifact(
            key=_artifact_key(stage, "status"),
            markdown=f"**{stage}** skipped: manifest `{m.uri}` exists (key `{m.key}`).",
            description=f"{stage}: skipped",
        )
        return
    result = outcome.result
    if result is None:
        return
    for name, rows in result.tables.items():
        if rows:
            create_table_artifact(key=_artifact_key(stage, name), table=rows, description=f"{stage}: {name}")
    for name, text in result.markdown.items():
        create_markdown_artifact(
            key=_artifact_key(stage, name), markdown=text, description=f"{stage}: {name}"
        )


@task(name="curate-tasks", cache_policy=NO_CACHE, retries=0)
def curate_tasks(session: PipelineSession) -> Manifest:
    """Synthesize, validate, decontaminate and split SWE-smith-style tasks."""
    from swerl.stages.curate import content_key, run_curate

    cfg = session.cfg.curate
    outcome = session.run_stage("curate", run_curate, cfg, content=content_key(cfg))
    publish_outcome("curate", outcome)
    return outcome.manifest


@task(name="oracle-traces", cache_policy=NO_CACHE, retries=0)
def trace_tasks(session: PipelineSession, curate: Manifest) -> Manifest:
    """Agent traces for SFT: the oracle solving training tasks, or a published trace dataset."""
    from swerl.stages.traces import TracesStage, run_traces

    cfg = TracesStage(traces=session.cfg.traces, agent=session.cfg.agent)
    outcome = session.run_stage("traces", run_traces, cfg, inputs=[curate])
    publish_outcome("traces", outcome)
    return outcome.manifest


@task(name="sft", cache_policy=NO_CACHE, retries=0)
def sft_task(session: PipelineSession, curate: Manifest, traces: Manifest) -> Manifest:
    """The base model (loaded or built) and supervised fine-tuning on the traces."""
    from swerl.stages.sft import SFTStage, run_sft

    cfg = SFTStage.build(sft=session.cfg.sft, agent=session.cfg.agent, engine=session.cfg.engine)
    outcome = session.run_stage("sft", run_sft, cfg, inputs=[curate, traces])
    publish_outcome("sft", outcome)
    return outcome.manifest


@task(name="grpo", cache_policy=NO_CACHE, retries=0)
def grpo_task(
    session: PipelineSession,
    curate: Manifest,
    sft: Manifest,
    phase: int = 0,
    previous: Manifest | None = None,
) -> Manifest:
    """One GRPO phase on the training tasks: from the SFT checkpoint (the first) or the previous phase's."""
    from swerl.stages.grpo import phase_stage, run_grpo

    resolved = session.cfg.grpo_phases()[phase]
    cfg = phase_stage(session.cfg, phase)
    inputs = [curate, sft] + ([previous] if previous is not None else [])
    outcome = session.run_stage(resolved.stage, run_grpo, cfg, inputs=inputs)
    publish_outcome(resolved.stage, outcome)
    return outcome.manifest


def grpo_phase_tasks(session: PipelineSession, curate: Manifest, sft: Manifest) -> list[Manifest]:
    """Every GRPO phase in order, each its own Prefect task (named by its stage: grpo, or grpo-NAME)."""
    manifests: list[Manifest] = []
    for phase in session.cfg.grpo_phases():
        previous = manifests[-1] if manifests else None
        run = grpo_task.with_options(name=phase.stage, task_run_name=phase.stage)
        manifests.append(run(session, curate, sft, phase.index, previous))
    return manifests


@task(name="evaluate", cache_policy=NO_CACHE, retries=0)
def evaluate_task(
    session: PipelineSession, curate: Manifest, sft: Manifest, grpo: list[Manifest]
) -> Manifest:
    """Held-out pass@1 of the base, SFT and GRPO models (every phase's) on the same tasks."""
    from swerl.stages.evaluate import EvaluateStage, run_evaluate

    cfg = EvaluateStage(evaluate=session.cfg.evaluate, agent=session.cfg.agent, engine=session.cfg.engine)
    outcome = session.run_stage("evaluate", run_evaluate, cfg, inputs=[curate, sft, *grpo])
    publish_outcome("evaluate", outcome)
    return outcome.manifest


@task(name="evaluate-checkpoint", cache_policy=NO_CACHE, retries=0)
def evaluate_checkpoint_task(session: PipelineSession, curate: Manifest, checkpoint: Manifest) -> Manifest:
    """A scheduled evaluation of one checkpoint (an sft or grpo manifest) on its run's saved held-out subset."""
    from swerl.stages.evaluate import EvaluateStage, run_evaluate

    cfg = EvaluateStage(evaluate=session.cfg.evaluate, agent=session.cfg.agent, engine=session.cfg.engine)
    outcome = session.run_stage("evaluate", run_evaluate, cfg, inputs=[curate, checkpoint])
    publish_outcome("evaluate", outcome)
    return outcome.manifest
