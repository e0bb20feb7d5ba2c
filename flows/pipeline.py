"""The training pipeline: curate -> traces -> sft -> grpo -> evaluate, each stage checkpointed by its manifest.

Also what every swerl flow does first, however it was started (`swerl run`, the UI, a schedule, a worker): merge a
partial config onto its deployment's (`run_config`), and send swerl's own log records to the flow run's logs and
the terminal (`swerl_logs`). No flow captures print(): libraries print what is not the run's business.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any
from uuid import UUID

from prefect import flow
from prefect.context import MissingContextError, SettingsContext, get_run_context, get_settings_context
from prefect.logging.handlers import APILogHandler
from prefect.runtime import deployment, flow_run

from swerl.config import PipelineConfig
from swerl.config.base import deep_merge
from swerl.pipeline import open_session
from tasks.stages import curate_tasks, evaluate_task, grpo_phase_tasks, sft_task, trace_tasks

SWERL_LOGGER = "swerl"
LOG_FORMAT = "%(name)s: %(message)s"


class _RunLogHandler(APILogHandler):
    """Prefect's API log handler for swerl's records, which also files a record made outside Prefect's run context
    (a stage's own threads) under this flow run, with the Prefect settings the flow runs under, instead of dropping
    it with a warning."""

    def __init__(self, flow_run_id: UUID) -> None:
        super().__init__()
        self.flow_run_id = flow_run_id
        self.settings = get_settings_context()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "flow_run_id", None) is None:
            try:
                get_run_context()
            except MissingContextError:
                record.flow_run_id = self.flow_run_id
                with SettingsContext(profile=self.settings.profile, settings=self.settings.settings):
                    super().emit(record)
                return
        super().emit(record)


@contextlib.contextmanager
def swerl_logs(flow_run_id: str | None) -> Iterator[None]:
    """While a flow runs: every `swerl` record at INFO and above (DEBUG if the process asked for it) goes to the
    flow run's logs, from any thread; the terminal gets them through the root logger's handler (the CLI's, or
    Prefect's console handler in a flow-run process started by a worker or `serve`)."""
    logger = logging.getLogger(SWERL_LOGGER)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)  # a flow-run process never ran the CLI's set-up
    if flow_run_id is None:
        yield
        return
    # One API handler of ours; one that PREFECT_LOGGING_EXTRA_LOGGERS added would drop thread records, with warnings.
    theirs = [h for h in logger.handlers if isinstance(h, APILogHandler)]
    for handler in theirs:
        logger.removeHandler(handler)
    ours = _RunLogHandler(UUID(flow_run_id))
    ours.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.addHandler(ours)
    try:
        yield
    finally:
        logger.removeHandler(ours)
        for handler in theirs:
            logger.addHandler(handler)


def deployment_config() -> dict[str, Any] | None:
    """The config of the deployment this flow run belongs to (its own parameters, not the run's), or None."""
    deployment_id = deployment.get_id()
    if deployment_id is None:
        return None
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        base = client.read_deployment(UUID(deployment_id)).parameters.get("config")
    return base if isinstance(base, dict) else None


def run_config(config: PipelineConfig | dict[str, Any] | None) -> PipelineConfig:
    """The config a flow run runs: the keys given (a partial config from the UI or `prefect deployment run --param
    config=...`) merged onto its deployment's config; outside a deployment, the config as given (defaults where
    left out). Keys left out of a partial override keep the deployment's values, not the class defaults."""
    if config is None:
        given: dict[str, Any] = {}
    elif isinstance(config, PipelineConfig):
        given = config.model_dump(mode="json", by_alias=True, exclude_unset=True)
    else:
        given = dict(config)
    base = deployment_config()
    if base is not None:
        return PipelineConfig.model_validate(deep_merge(base, given))
    if isinstance(config, PipelineConfig):
        return config
    return PipelineConfig.model_validate(given)


def run_name() -> str:
    """The flow run's name: the config's run.name (the deployment's when the run's parameters leave it out)."""
    config = (flow_run.parameters or {}).get("config")
    given: dict[str, Any] = {}
    if isinstance(config, PipelineConfig):
        given = config.model_dump(mode="json", exclude_unset=True)
    elif isinstance(config, dict):
        given = config
    name = (given.get("run") or {}).get("name")
    if name is None:
        base = deployment_config()
        if base is not None:
            name = (base.get("run") or {}).get("name")
        elif isinstance(config, PipelineConfig):
            name = config.run.name
    return str(name or PipelineConfig().run.name)


@flow(name="swerl-pipeline", flow_run_name=run_name)
def pipeline(config: PipelineConfig | None = None, force: list[str] | None = None) -> dict[str, Any]:
    """Run every stage in order; finished stages (same config and inputs) are skipped.

    Args:
        config: the pipeline's config (every section; from a deployment, the keys given are merged onto the
            deployment's config).
        force: stages to rerun, each with every stage after it: curate, traces, sft, grpo (from the first GRPO
            phase), grpo-NAME (from that phase of grpo.phases), evaluate.
    """
    run_id = flow_run.get_id()
    with swerl_logs(run_id):
        cfg = run_config(config)
        with open_session(cfg, force=list(force or []), flow_run_id=run_id) as session:
            curate = curate_tasks(session)
            traces = trace_tasks(session, curate)
            sft = sft_task(session, curate, traces)
            grpo = grpo_phase_tasks(session, curate, sft)
            evaluate_task(session, curate, sft, grpo)
            return session.summary()


@flow(name="swerl-curate", flow_run_name=run_name)
def curate_only(config: PipelineConfig | None = None, force: bool = False) -> dict[str, Any]:
    """Only the curate stage, in the same pipeline session (store, MLflow parent run, stage runner) as `pipeline`:
    `swerl curate CONFIG`. A finished curation with the same config and repository contents is skipped."""
    run_id = flow_run.get_id()
    with swerl_logs(run_id):
        cfg = run_config(config)
        with open_session(cfg, force=["curate"] if force else [], flow_run_id=run_id) as session:
            curate_tasks(session)
            return session.summary()
