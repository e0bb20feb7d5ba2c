"""Stage tasks. Each runs a swerl stage through the session (skip/force by manifest) and publishes its report.

Checkpointing is swerl's manifest, not Prefect's result persistence, so caching is off here.
"""

from __future__ import annotations

import base64
import contextvars
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

from prefect import get_run_logger, task
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from prefect.utilities.urls import url_for

from swerl.pipeline import PipelineSession
from swerl.stages.runner import PLOTS_DIR, Manifest, StageOutcome
from swerl.tracking import run_url

PROGRESS_MIN_INTERVAL_S = 5.0
"""A stage's progress artifact is updated at most this often (and at 100%)."""
INLINE_IMAGE_MAX_BYTES = 2_000_000
"""A plot larger than this is not inlined in a Prefect artifact (it stays in MLflow and the store)."""
PREFECT_URL_TAG = "prefect.flow_run_url"


def _artifact_key(stage: str, name: str = "") -> str:
    """A Prefect artifact key (lowercase letters, digits and dashes): the stage, then the artifact's name unless
    it only repeats the stage (`sft`, not `sft-sft`; `grpo-explore`, not `grpo-explore-grpo`)."""
    stage_key, name_key = (re.sub(r"[^a-z0-9-]+", "-", p.lower()).strip("-") for p in (stage, name))
    if not name_key or name_key == stage_key or stage_key.startswith(name_key + "-"):
        return stage_key
    return f"{stage_key}-{name_key}"


def image_markdown(title: str, png: bytes) -> str:
    """A PNG as a markdown image with a data: URI. The Prefect 3 UI's markdown renderer (prefect-design's
    p-markdown-renderer) turns an image token into a plain <img src=...> with no URL filtering, and the server
    sets no Content-Security-Policy; the 3.9 "V2" UI (react-markdown + rehype-sanitize) lets exactly `data:image/`
    through for an <img src>. So the image shows with no server to fetch it from (MLflow on sqlite, a file://
    store, an offline UI). Checked in headless Chromium against `prefect server start`: the <img> loads, 640 px.
    """
    if len(png) > INLINE_IMAGE_MAX_BYTES:
        return f"*{title}: {len(png):,} bytes, too large to inline; see the MLflow run's `{PLOTS_DIR}/`.*"
    return f"![{title}](data:image/png;base64,{base64.b64encode(png).decode()})"


def _mlflow_links(session: PipelineSession, stage_run_id: str | None) -> str:
    """Markdown naming the MLflow parent run (and the stage's run): links when MLflow is a server."""
    exp, parent = session.tracker.experiment_id, session.parent.run_id
    lines = []
    for label, run_id in (("pipeline run", parent), ("stage run", stage_run_id)):
        if not run_id:
            continue
        url = run_url(session.tracker.uri, exp, run_id)
        lines.append(
            f"- MLflow {label}: [{run_id}]({url})"
            if url
            else f"- MLflow {label}: `{run_id}` in "
            f"`{session.tracker.uri}` (experiment {exp}; `mlflow ui --backend-store-uri` to browse)"
        )
    return "\n".join(lines)


def link_runs(session: PipelineSession, stage: str, stage_run_id: str | None) -> None:
    """Both ways: the Prefect flow run's URL as an MLflow tag on the parent (and stage) run, and the MLflow runs
    as a markdown artifact of the flow run (key `STAGE-mlflow`)."""
    # prefect.runtime's flow_run.ui_url names /flow-runs/flow-run/ID, a page the Prefect 3.9 UI does not have; the
    # UI's own route (what the "View at" log line prints) is url_for's /runs/flow-run/ID.
    url = url_for("flow-run", obj_id=flow_run.get_id()) if flow_run.get_id() else None
    tags = {PREFECT_URL_TAG: url} if url else {}
    if flow_run.get_id():
        tags["prefect.flow_run_id"] = str(flow_run.get_id())
    try:
        if tags:
            session.parent.set_tags(tags)
            if stage_run_id:
                session.tracker.client.set_tag(stage_run_id, PREFECT_URL_TAG, url or "")
    except Exception as exc:  # noqa: BLE001 - a link must never fail a stage
        get_run_logger().warning("could not tag the MLflow runs with the Prefect flow run: %s", exc)
    create_markdown_artifact(
        key=_artifact_key(stage, "mlflow"),
        markdown=f"**{stage}** in MLflow\n\n{_mlflow_links(session, stage_run_id)}\n",
        description=f"{stage}: MLflow runs",
    )


class StageProgress:
    """A Prefect progress artifact for one stage, fed by the stage's ctx.progress(...) from any thread.

    Updates go through one worker thread (the stage may report from inside an event loop, where Prefect's
    sync API would hand back an un-awaited coroutine), at most every PROGRESS_MIN_INTERVAL_S."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        created = create_progress_artifact(
            progress=0.0, key=_artifact_key(stage, "progress"), description=f"{stage}: starting", _sync=True
        )  # type: ignore[call-arg]
        assert isinstance(created, UUID)
        self.artifact_id: UUID = created
        self._context = contextvars.copy_context()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"progress-{stage}")
        self._last = 0.0
        self._lock = threading.Lock()

    def __call__(self, fraction: float, note: str) -> None:
        now = time.monotonic()
        with self._lock:
            if fraction < 1.0 and now - self._last < PROGRESS_MIN_INTERVAL_S:
                return
            self._last = now
        self._pool.submit(self._context.copy().run, self._update, fraction, note)

    def _update(self, fraction: float, note: str) -> None:
        try:
            update_progress_artifact(
                artifact_id=self.artifact_id,
                progress=round(100 * fraction, 1),
                description=f"{self.stage}: {note}" if note else self.stage,
                _sync=True,
            )  # type: ignore[call-arg]
        except Exception as exc:  # noqa: BLE001 - a progress display must never fail a stage
            get_run_logger().warning("%s: could not update the progress artifact: %s", self.stage, exc)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def run_and_publish(session: PipelineSession, stage: str, fn: Any, cfg: Any, **kwargs: Any) -> Manifest:
    """Run a stage through the session with a progress artifact, then publish its report, plots and links."""
    progress = StageProgress(stage)
    try:
        outcome = session.run_stage(stage, fn, cfg, progress=progress, **kwargs)
        progress(1.0, "skipped: already done" if outcome.skipped else "done")
    finally:
        progress.close()
    publish_outcome(stage, outcome)
    link_runs(session, stage, outcome.manifest.mlflow_run_id)
    return outcome.manifest


def publish_outcome(stage: str, outcome: StageOutcome) -> None:
    """Log what happened and publish the stage's tables, markdown and plots as Prefect artifacts."""
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
        create_markdown_artifact(key=_artifact_key(stage, name), markdown=text, description=f"{stage}: {name}")
    if result.images:
        body = "\n\n".join(f"### {title}\n\n{image_markdown(title, png)}" for title, png in result.images.items())
        create_markdown_artifact(
            key=_artifact_key(stage, "plots"),
            markdown=f"# {stage}: plots\n\n{body}\n",
            description=f"{stage}: plots",
        )


@task(name="curate-tasks", cache_policy=NO_CACHE, retries=0)
def curate_tasks(session: PipelineSession) -> Manifest:
    """Synthesize, validate, decontaminate and split SWE-smith-style tasks."""
    from swerl.stages.curate import content_key, run_curate

    cfg = session.cfg.curate
    return run_and_publish(session, "curate", run_curate, cfg, content=content_key(cfg))


@task(name="oracle-traces", cache_policy=NO_CACHE, retries=0)
def trace_tasks(session: PipelineSession, curate: Manifest) -> Manifest:
    """Agent traces for SFT: the oracle solving training tasks, or a published trace dataset."""
    from swerl.stages.traces import TracesStage, run_traces

    cfg = TracesStage(traces=session.cfg.traces, agent=session.cfg.agent)
    return run_and_publish(session, "traces", run_traces, cfg, inputs=[curate])


@task(name="sft", cache_policy=NO_CACHE, retries=0)
def sft_task(session: PipelineSession, curate: Manifest, traces: Manifest) -> Manifest:
    """The base model (loaded or built) and supervised fine-tuning on the traces."""
    from swerl.stages.sft import SFTStage, run_sft

    cfg = SFTStage.build(sft=session.cfg.sft, agent=session.cfg.agent, engine=session.cfg.engine)
    return run_and_publish(session, "sft", run_sft, cfg, inputs=[curate, traces])


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

    cfg = phase_stage(session.cfg, phase, session.phases)
    inputs = [curate, sft] + ([previous] if previous is not None else [])
    return run_and_publish(session, session.phases[phase].stage, run_grpo, cfg, inputs=inputs)


def grpo_phase_tasks(session: PipelineSession, curate: Manifest, sft: Manifest) -> list[Manifest]:
    """Every GRPO phase in order, each its own Prefect task (named by its stage: grpo, or grpo-NAME)."""
    manifests: list[Manifest] = []
    for phase in session.phases:
        previous = manifests[-1] if manifests else None
        run = grpo_task.with_options(name=phase.stage, task_run_name=phase.stage)
        manifests.append(run(session, curate, sft, phase.index, previous))
    return manifests


@task(name="evaluate", cache_policy=NO_CACHE, retries=0)
def evaluate_task(session: PipelineSession, curate: Manifest, sft: Manifest, grpo: list[Manifest]) -> Manifest:
    """Held-out pass@1 of the base, SFT and GRPO models (every phase's) on the same tasks."""
    from swerl.stages.evaluate import EvaluateStage, run_evaluate

    cfg = EvaluateStage(evaluate=session.cfg.evaluate, agent=session.cfg.agent, engine=session.cfg.engine)
    return run_and_publish(session, "evaluate", run_evaluate, cfg, inputs=[curate, sft, *grpo])


@task(name="evaluate-checkpoint", cache_policy=NO_CACHE, retries=0)
def evaluate_checkpoint_task(session: PipelineSession, curate: Manifest, checkpoint: Manifest) -> Manifest:
    """A scheduled evaluation of one checkpoint (an sft or grpo manifest) on its run's saved held-out subset."""
    from swerl.stages.evaluate import EvaluateStage, run_evaluate

    cfg = EvaluateStage(evaluate=session.cfg.evaluate, agent=session.cfg.agent, engine=session.cfg.engine)
    return run_and_publish(session, "evaluate", run_evaluate, cfg, inputs=[curate, checkpoint])
