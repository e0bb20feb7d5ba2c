"""The whole run's config: one section per stage and service, and what a stage reads of it."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from swerl.config.agent import AgentConfig
from swerl.config.base import ConfigError, StrictModel
from swerl.config.cluster import ClusterConfig
from swerl.config.data import CurateConfig, TracesConfig
from swerl.config.engine import EngineConfig
from swerl.config.evaluate import EvaluateConfig
from swerl.config.grpo import GRPOConfig
from swerl.config.phases import ResolvedPhase, resolve_phases
from swerl.config.run import RunConfig, StorageConfig, TrackingConfig
from swerl.config.services import ServeConfig, ServicesConfig
from swerl.config.train import SFTConfig

STAGES: tuple[str, ...] = ("curate", "traces", "sft", "grpo", "evaluate")
"""Pipeline stages in order; `--force STAGE` reruns that stage and every later one."""


class PipelineConfig(StrictModel):
    # The form a user fills to run it: budgets and model (sft, grpo), data (curate), evaluation first; the services'
    # and `swerl serve`'s settings are not a run's (they stay in the YAML, for `swerl up` and `swerl serve`).
    form_first = ("run", "sft", "grpo", "curate", "evaluate")
    form_hidden = ("serve", "services")

    run: RunConfig = Field(default_factory=RunConfig)
    """The run's name and seed."""
    storage: StorageConfig = Field(default_factory=StorageConfig)
    """Where artifacts and checkpoints go (file:// or s3://)."""
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    """MLflow: tracking URI, experiment, registered model."""
    curate: CurateConfig = Field(default_factory=CurateConfig)
    """Dataset curation: repositories, bug modifiers, validation, the held-out split."""
    agent: AgentConfig = Field(default_factory=AgentConfig)
    """The agent's episode caps (turns, tokens, timeouts) and its sandboxes."""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    """The inference engines (local, HTTP, SGLang), their context cap and connections."""
    traces: TracesConfig = Field(default_factory=TracesConfig)
    """Agent traces for SFT (the oracle, or a published dataset)."""
    sft: SFTConfig = Field(default_factory=SFTConfig)
    """Supervised fine-tuning: the model, steps, budget, optimizer."""
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    """GRPO: schedule, rollouts, algorithm, evaluation beside training, phases."""
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    """Held-out evaluation: models, tasks, attempts, grader."""
    serve: ServeConfig = Field(default_factory=ServeConfig)
    """`swerl serve`: the evaluation schedule and concurrent runs (not a run parameter)."""
    services: ServicesConfig = Field(default_factory=ServicesConfig)
    """`swerl up`: local service ports (not a run parameter)."""
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    """The machines `swerl plan` places the run on (read by no stage: changing it reruns nothing)."""

    @model_validator(mode="after")
    def _phases_resolve(self) -> PipelineConfig:
        phases = self.grpo_phases()  # raises naming the phase and key
        names = {p.stage for p in phases}
        unknown = [c for c in self.evaluate.checkpoints if c.startswith("grpo-") and c not in names]
        if unknown:
            have = sorted(names) if self.grpo.phases else "none (grpo.phases is not set: the model is `grpo`)"
            raise ValueError(
                f"evaluate.checkpoints names GRPO phase(s) {unknown} that grpo.phases does not define; phases: {have}"
            )
        return self

    def grpo_phases(self) -> list[ResolvedPhase]:
        """The GRPO phases in order, each with its effective grpo/agent/engine settings; without grpo.phases, one
        phase (stage `grpo`) with the base settings. ValueError naming the phase and key for bad input."""
        return resolve_phases(self.grpo, self.agent, self.engine)

    def phase_variants(self) -> list[tuple[str, PipelineConfig]]:
        """The whole config as each GRPO phase runs it (its grpo, agent and engine in place of the base's), for
        the checks made before a run (`swerl plan`, `swerl doctor`); one (stage grpo, this config) without phases."""
        if self.grpo.phases is None:
            return [("grpo", self)]
        return [
            (p.stage, self.model_copy(update={"grpo": p.grpo, "agent": p.agent, "engine": p.engine}))
            for p in self.grpo_phases()
        ]

    def stage_config(self, stage: str) -> BaseModel:
        """The config section a stage's checkpoint key is computed from."""
        section = getattr(self, stage, None)
        if not isinstance(section, BaseModel):
            raise ConfigError(f"stage {stage!r} has no config section")
        return section
