"""A pipeline run: its store, its MLflow parent run, its resolved config and GRPO phases; which stages to force.

The Prefect flow (flows/pipeline.py) opens a PipelineSession and hands it to each stage task; this module holds
the logic so that it is testable without Prefect.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from swerl.config import ConfigError, PipelineConfig
from swerl.config.load import config_hash, dump_config
from swerl.config.phases import ResolvedPhase
from swerl.config.pipeline import STAGES
from swerl.model_logging import registered_model_name
from swerl.stages.runner import Manifest, ProgressFn, StageFn, StageOutcome, run_stage
from swerl.storage import Store, open_store
from swerl.tracking import CONFIG_HASH_TAG, KIND_TAG, StageRun, Tracker, get_tracker, git_tags, run_url

log = logging.getLogger("swerl.pipeline")


def pipeline_stages(cfg: PipelineConfig | None = None, grpo_stages: Sequence[str] | None = None) -> list[str]:
    """The pipeline's stages in order, each GRPO phase its own (grpo, or grpo-NAME per phase of grpo.phases).
    grpo_stages: the phases' stages where the caller has resolved them (else cfg's phases are resolved)."""
    if grpo_stages is None:
        grpo_stages = [p.stage for p in cfg.grpo_phases()] if cfg is not None else ["grpo"]
    return [s for stage in STAGES for s in (grpo_stages if stage == "grpo" else [stage])]


def stages_to_force(
    force: list[str], cfg: PipelineConfig | None = None, grpo_stages: Sequence[str] | None = None
) -> set[str]:
    """`--force STAGE` reruns that stage and every stage after it; `grpo` names the first GRPO phase."""
    order = pipeline_stages(cfg, grpo_stages)
    names = {s: s for s in order} | {"grpo": next(s for s in order if s.startswith("grpo"))}
    unknown = [s for s in force if s not in names]
    if unknown:
        alias = "" if "grpo" in order else " (and grpo: from the first GRPO phase)"
        raise ConfigError(f"--force: unknown stage(s) {unknown}; stages are {order}{alias}")
    if not force:
        return set()
    first = min(order.index(names[s]) for s in force)
    return set(order[first:])


def store_for(cfg: PipelineConfig) -> Store:
    s = cfg.storage
    return open_store(
        s.root,
        s3_endpoint_url=s.s3_endpoint_url,
        s3_region=s.s3_region,
        connect_timeout_s=s.connect_timeout_s,
        read_timeout_s=s.read_timeout_s,
        max_attempts=s.max_attempts,
        max_pool_connections=s.max_pool_connections,
    )


STAGE_DATASETS: dict[str, list[tuple[str, str, str]]] = {
    "sft": [("traces", "traces.jsonl", "training")],
    "grpo": [("curate", "train.parquet", "training")],
    "evaluate": [("curate", "eval.parquet", "evaluation")],
}
"""What each stage trains or evaluates on: (input stage, artifact, MLflow context), logged as dataset inputs."""


def stage_datasets(stage: str, inputs: list[Manifest]) -> list[tuple[str, str, str, str]]:
    """(name, uri, sha256, context) of the datasets `stage` reads from its input manifests (STAGE_DATASETS)."""
    by_stage = {m.stage: m for m in inputs}
    wanted = STAGE_DATASETS.get("grpo" if stage.startswith("grpo") else stage, [])
    out = []
    for source, artifact, context in wanted:
        manifest = by_stage.get(source)
        if manifest is not None and artifact in manifest.artifacts:
            record = manifest.artifacts[artifact]
            out.append((f"{source}/{artifact}", record.uri, record.sha256, context))
    return out


@dataclass
class PipelineSession:
    """State shared by the stages of one pipeline run."""

    cfg: PipelineConfig
    phases: list[ResolvedPhase]
    """cfg's GRPO phases, resolved once when the run opens (each phase's grpo, agent and engine settings)."""
    store: Store
    tracker: Tracker
    parent: StageRun
    run_id: str
    forced: set[str]
    outcomes: dict[str, StageOutcome] = field(default_factory=dict)

    def run_stage(
        self,
        stage: str,
        fn: StageFn,
        stage_cfg: BaseModel,
        inputs: list[Manifest] | None = None,
        content: str = "",
        progress: ProgressFn | None = None,
    ) -> StageOutcome:
        outcome = run_stage(
            stage,
            fn,
            stage_cfg,
            store=self.store,
            tracker=self.tracker,
            parent=self.parent,
            inputs=inputs,
            force=stage in self.forced,
            seed=self.cfg.run.seed,
            log=logging.getLogger(f"swerl.{stage}"),
            content=content,
            progress=progress,
            datasets=stage_datasets(stage, inputs or []),
            registered_model=registered_model_name(self.cfg.run.name, self.cfg.tracking.registered_model),
            outage_waits=self.cfg.storage.start_outage_waits(),
        )
        self.outcomes[stage] = outcome
        self.parent.set_tags(
            {
                f"swerl.stage.{stage}": "skipped" if outcome.skipped else "ran",
                f"swerl.stage.{stage}.manifest": outcome.manifest.uri,
            }
        )
        return outcome

    @property
    def mlflow_url(self) -> str | None:
        """The parent run's page in the MLflow UI (a tracking server only)."""
        return run_url(self.tracker.uri, self.tracker.experiment_id, self.parent.run_id)

    def summary(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "mlflow_run_id": self.parent.run_id,
            "store": self.store.root_uri,
            "stages": {
                name: {"skipped": o.skipped, "manifest": o.manifest.uri, "metrics": o.manifest.metrics}
                for name, o in self.outcomes.items()
            },
        }


@contextmanager
def open_session(
    cfg: PipelineConfig, *, force: list[str] | None = None, flow_run_id: str | None = None
) -> Iterator[PipelineSession]:
    """Open the store and the MLflow parent run; save the resolved config with the run.

    One parent run per pipeline config: a rerun of the same config (same `swerl.config_hash`, e.g. a resume after a
    failure or Ctrl-C) continues the newest ended parent run of that config instead of starting another, so its
    stages' runs (and their curves, continued by the stage runner) stay under one parent. Each continuation adds
    its Prefect flow-run id (the tag names the latest) and bumps `swerl.resumes`; a parent still RUNNING (a live
    concurrent run) is never shared: then a new parent starts.
    """
    phases = cfg.grpo_phases()  # the one resolution of the run's GRPO phases: its stages and tasks use these
    forced = stages_to_force(force or [], grpo_stages=[p.stage for p in phases])
    store = store_for(cfg)
    tracker = get_tracker(cfg.tracking.uri, cfg.tracking.experiment)
    # The random suffix keeps two runs started in the same second (a scheduler, --limit 2) apart.
    run_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + f"-{cfg.run.name}-{uuid.uuid4().hex[:6]}"
    identity = {KIND_TAG: "pipeline", CONFIG_HASH_TAG: config_hash(cfg)}
    resume = tracker.find_run(identity)
    tags: dict[str, str] = {**identity, "swerl.run_id": run_id, "swerl.store": store.root_uri, **git_tags()}
    if flow_run_id:
        tags["prefect.flow_run_id"] = flow_run_id
    t0 = time.monotonic()
    with tracker.run(
        f"{cfg.run.name}-pipeline",
        tags=tags,
        resume=resume,
        system_metrics=cfg.tracking.system_metrics_interval_s,
    ) as parent:
        if resume is not None:
            log.info("continuing MLflow parent run %s of this config (hash %s)", resume, identity[CONFIG_HASH_TAG])
        resolved = dump_config(cfg)
        store.write_bytes(f"pipelines/{run_id}/config.yaml", resolved.encode())
        parent.log_text(resolved, "config.yaml")
        parent.log_params(cfg.model_dump(mode="json", by_alias=True))
        parent.log_params({"forced_stages": sorted(forced)})
        parent.set_tags(
            {"swerl.forced_stages": json.dumps(sorted(forced))}
        )  # this invocation's (a param keeps the first)
        log_machine_limits(cfg, parent)
        session = PipelineSession(cfg, phases, store, tracker, parent, run_id, forced)
        yield session
        parent.log_metrics({"pipeline_duration_s": time.monotonic() - t0})
        store.write_json(f"pipelines/{run_id}/summary.json", session.summary())


def log_machine_limits(cfg: PipelineConfig, parent: StageRun) -> None:
    """Every run logs what the machine allows against what the config asks (`swerl doctor`) at start."""
    from swerl.doctor import diagnose

    try:
        report = diagnose(cfg)
    except Exception as exc:  # noqa: BLE001 - reading limits must never stop a run; say it could not
        log.warning("could not read the machine's limits: %s", exc)
        return
    log.info("machine limits at start (swerl doctor):\n%s", report.text())
    if not report.ok:
        log.warning("swerl doctor refuses this config on this machine; the run may hit a cap (see above)")
    parent.log_params(report.params(), record_changes=False)  # measured anew at every (re)start
    parent.set_tags({"swerl.doctor": "ok" if report.ok else "refused"})
