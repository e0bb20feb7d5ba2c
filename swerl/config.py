"""Run configuration: pydantic models, one per stage, loaded from YAML with dotted overrides.

Every limit the pipeline obeys is a field here, bounded and documented; nothing is left to a library default.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

STAGES: tuple[str, ...] = ("curate", "traces", "sft", "grpo", "evaluate")
"""Pipeline stages in order; `--force STAGE` reruns that stage and every later one."""

ModifierName = Literal[
    "flip_comparison",
    "swap_binop",
    "negate_condition",
    "drop_condition",
    "off_by_one",
    "remove_statement",
    "swap_call_args",
]
ALL_MODIFIERS: list[ModifierName] = list(ModifierName.__args__)  # type: ignore[attr-defined]


class ConfigError(ValueError):
    """A config that cannot be used; the message names the offending key."""


class StrictModel(BaseModel):
    """Base for every config section: unknown keys and wrong types are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)


class RunConfig(StrictModel):
    name: str = Field("local", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._-]+$")
    """Run name: the MLflow experiment's run name prefix and the Prefect flow-run name."""
    seed: int = Field(0, ge=0, le=2**31 - 1)
    """Global seed; stages derive their own seeds from it."""


class StorageConfig(StrictModel):
    root: str = Field("file://runs/store", min_length=1)
    """Artifact store root URL: file://PATH (relative to the working directory) or s3://BUCKET/PREFIX."""
    s3_endpoint_url: str | None = None
    """S3 endpoint (e.g. http://127.0.0.1:8333); credentials always come from the environment, never config."""
    s3_region: str | None = None
    """S3 region name, if the endpoint needs one."""
    connect_timeout_s: float = Field(10.0, gt=0, le=600)
    """Per-request connect timeout for object storage."""
    read_timeout_s: float = Field(60.0, gt=0, le=3600)
    """Per-request read timeout for object storage."""
    max_attempts: int = Field(5, ge=1, le=50)
    """Retries (total attempts) for a failing object-storage request before it is an InfraError(storage)."""
    max_pool_connections: int = Field(16, ge=1, le=4096)
    """HTTP connection pool size of the S3 client (named here so no library default decides it)."""

    @field_validator("root")
    @classmethod
    def _known_scheme(cls, v: str) -> str:
        if not (v.startswith("file://") or v.startswith("s3://") or "://" not in v):
            raise ValueError(f"unsupported storage URL {v!r}: use file://PATH or s3://BUCKET/PREFIX")
        return v


class TrackingConfig(StrictModel):
    uri: str = Field("sqlite:///runs/mlflow.db", min_length=1)
    """MLflow tracking URI: a sqlite file by default, or http://HOST:PORT of an `mlflow server`."""
    experiment: str = Field("swerl", min_length=1, max_length=200)
    """MLflow experiment that holds the pipeline's parent runs."""


class SandboxLimits(StrictModel):
    timeout_s: float = Field(60.0, gt=0, le=86400)
    """Wall-clock limit for one command (a test-suite run) in a sandbox."""
    memory_mb: int = Field(1024, ge=64, le=1_048_576)
    """Address-space limit per sandboxed process."""
    max_processes: int = Field(256, ge=8, le=1_000_000)
    """Process/thread limit inside one sandbox (fork-bomb guard)."""
    cpu_time_s: int = Field(120, ge=1, le=86400)
    """CPU-seconds limit per sandboxed process."""
    tmp_size_mb: int = Field(256, ge=1, le=1_048_576)
    """Size of the sandbox's private /tmp."""
    file_size_mb: int = Field(256, ge=1, le=1_048_576)
    """Largest file a sandboxed process may write."""
    max_open_files: int = Field(1024, ge=16, le=1_048_576)
    """Open-file limit (RLIMIT_NOFILE) per sandboxed process."""
    max_output_bytes: int = Field(1_000_000, ge=1024, le=1 << 30)
    """Output kept from one command (head and tail); the rest is cut, never buffered without bound."""
    start_timeout_s: float = Field(60.0, gt=0, le=3600)
    """How long starting a sandbox (copying the workspace, applying the patch) may take."""
    python: str | None = None
    """Interpreter run inside sandboxes (None: the one running swerl); its install prefix is bound read-only."""


class DatasetSource(StrictModel):
    schema_name: Literal["swesmith", "swebench"] = Field(alias="schema")
    """Which published schema the rows follow."""
    path: str = Field(min_length=1)
    """A Hugging Face hub id (real use) or a local parquet/jsonl/json file."""
    split: str = "train"
    """Dataset split to read."""
    limit: int | None = Field(None, ge=1)
    """Read at most this many rows (None: all)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class MicroSource(StrictModel):
    """Procedural micro repositories (swerl.data.micro): tiny modules whose eval split uses unseen identifiers."""

    train_repos: int = Field(ge=0, le=100_000)
    """Micro repositories generated from the train vocabulary; their tasks go to train.parquet."""
    eval_repos: int = Field(ge=0, le=100_000)
    """Micro repositories generated from the disjoint eval vocabulary; their tasks go to eval.parquet."""
    seed: int = Field(0, ge=0, le=2**31 - 1)
    """Generator seed: the same seed and index give byte-identical repositories on any machine."""
    generator_version: int = Field(default_factory=lambda: _micro_version())
    """The generator's version (part of the curate key, so a new generator reruns curation); must be current."""

    @field_validator("generator_version")
    @classmethod
    def _current_generator(cls, v: int) -> int:
        if v != _micro_version():
            raise ValueError(f"micro generator version {v} is not this swerl's ({_micro_version()})")
        return v


def _micro_version() -> int:
    from swerl.data.micro import GENERATOR_VERSION

    return GENERATOR_VERSION


class CurateConfig(StrictModel):
    repos: list[str] = Field(default_factory=lambda: ["builtin"])
    """Repositories to synthesize tasks from: 'builtin' (all shipped), 'builtin:NAME', or a directory path."""
    datasets: list[DatasetSource] = Field(default_factory=list)
    """Published task datasets (SWE-smith / SWE-bench schema) to include as they are."""
    modifiers: list[ModifierName] = Field(default_factory=lambda: list(ALL_MODIFIERS), min_length=1)
    """Procedural bug modifiers to apply."""
    max_candidates_per_repo: int = Field(80, ge=1, le=1_000_000)
    """Bug candidates validated per repository (sampled by seed across modifiers)."""
    max_tasks_per_repo: int = Field(1_000_000, ge=1, le=1_000_000)
    """Valid tasks kept per repository."""
    eval_repos: list[str] = Field(default_factory=list)
    """Repositories held out for evaluation: their tasks go to eval.parquet, all others to train.parquet."""
    decontaminate: bool = True
    """Drop tasks from SWE-bench Verified repositories or whose problem statement matches an evaluation task."""
    decontamination_sets: list[DatasetSource] = Field(default_factory=list)
    """Evaluation datasets whose problem statements must not appear among training tasks."""
    validation_workers: int = Field(2, ge=1, le=4096)
    """Sandboxes running test suites at once during validation."""
    clean_runs: int = Field(2, ge=1, le=10)
    """Times the clean suite runs; a test must pass in every run (flaky tests never become F2P/P2P)."""
    bugged_timeout_factor: float = Field(5.0, ge=1.0, le=1000.0)
    """A bugged suite may run this many times the slowest clean run (a bug that loops costs seconds) ..."""
    min_bugged_timeout_s: float = Field(10.0, gt=0, le=86400)
    """... but never less than this, and never more than sandbox.timeout_s."""
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits)
    """Limits of each validation sandbox."""
    strict_rows: bool = False
    """Raise on the first malformed dataset row instead of rejecting and counting it."""
    micro: MicroSource | None = None
    """Micro repositories to synthesize tasks from as well (None: none); eval ones are held out whatever eval_repos says."""


class AgentConfig(StrictModel):
    """Every cap of an agent episode (oracle traces, GRPO rollouts and evaluation share them)."""

    max_turns: int = Field(12, ge=1, le=10_000)
    """Assistant turns before the episode ends with status turn_cap."""
    max_trajectory_tokens: int = Field(2048, ge=64, le=1_048_576)
    """Prompt + all turns + observations; past it the episode ends with status length_cap."""
    max_new_tokens_per_turn: int = Field(128, ge=1, le=1_048_576)
    """Most tokens sampled in one assistant turn."""
    max_malformed_calls: int = Field(3, ge=1, le=10_000)
    """Consecutive malformed tool calls before the episode ends (status malformed); each one is counted."""
    command_timeout_s: float = Field(30.0, gt=0, le=86400)
    """Wall clock of one command the agent runs; a timeout is an observation, not an infra error."""
    max_observation_chars: int = Field(2000, ge=100, le=10_000_000)
    """A tool output longer than this is cut in the middle (head and tail kept)."""
    test_timeout_s: float = Field(60.0, gt=0, le=86400)
    """Wall clock of the grading test run after the episode."""
    episode_timeout_s: float = Field(600.0, gt=0, le=7 * 86400)
    """Wall clock of the agent's turns (sandbox start and grading excluded)."""
    infra_retries: int = Field(2, ge=0, le=100)
    """Times an episode that ended in an infrastructure error is rerun before it is reported as missing."""
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits)
    """Limits of every episode sandbox."""


class EngineConfig(StrictModel):
    """The inference engine episodes sample from (CPU: swerl's local engine, in process)."""

    kind: Literal["local"] = "local"
    """local: swerl.engine.local.LocalEngine (transformers, KV cache, continuous batching)."""
    max_batch_size: int = Field(8, ge=1, le=100_000)
    """Requests decoded together; more wait in the engine's queue."""
    max_context_tokens: int = Field(2048, ge=2, le=1_048_576)
    """Engine-side context cap: a request that would exceed it finishes with reason length."""
    threads: int = Field(1, ge=1, le=1024)
    """torch intra-op threads of the engine's forward passes."""


class TinyModelConfig(StrictModel):
    """A Qwen3-architecture model built from scratch, with a byte-level BPE tokenizer trained on project data."""

    vocab_size: int = Field(4096, ge=300, le=1_000_000)
    """Target tokenizer vocabulary (the corpus may yield fewer)."""
    hidden_size: int = Field(256, ge=8, le=65_536)
    num_layers: int = Field(4, ge=1, le=1000)
    num_heads: int = Field(4, ge=1, le=1024)
    num_kv_heads: int = Field(2, ge=1, le=1024)
    ffn_size: int = Field(768, ge=8, le=1_000_000)
    """MLP width (each expert's, for MoE)."""
    max_positions: int = Field(2048, ge=64, le=1_048_576)
    """Longest sequence the model accepts; every token cap must fit in it."""
    moe: bool = False
    """Qwen3-MoE instead of dense."""
    num_experts: int = Field(4, ge=1, le=1024)
    experts_per_token: int = Field(2, ge=1, le=1024)


class TracesConfig(StrictModel):
    """Agent traces for SFT: an oracle solving the training tasks, or a SWE-smith-trajectories dataset."""

    source: Literal["oracle", "dataset"] = "oracle"
    """oracle: solve the curated training tasks through the agent's tools; dataset: load `dataset`."""
    dataset: str | None = None
    """SWE-smith-trajectories rows (hub id or local jsonl/parquet/json) when source is dataset."""
    dataset_split: str = "train"
    """Split of `dataset` to read."""
    max_traces: int = Field(100_000, ge=1, le=100_000_000)
    """Most traces kept (oracle: tasks attempted, in seeded order)."""
    workers: int = Field(2, ge=1, le=4096)
    """Oracle episodes at once (each holds one sandbox)."""
    recovery_prob: float = Field(0.0, ge=0.0, le=1.0)
    """Share of oracle traces that first make a plausible wrong edit, see the tests fail, undo it and fix."""
    view_whole_file_lines: int = Field(40, ge=0, le=100_000)
    """The oracle views a file with this many lines or fewer whole (`cat -n FILE`), longer ones around the bug."""
    context_lines: int = Field(3, ge=0, le=1000)
    """Lines shown around the bug when the oracle views part of a file."""
    view_function_lines: int = Field(0, ge=0, le=100_000)
    """> 0: the oracle views the function the failing test names (`grep -n -A N-1 'def NAME(' FILE`), N lines."""
    test_command: str | None = None
    """What the oracle runs to see the failures; None: the task's own test command (pytest when it has none)."""


class SFTConfig(StrictModel):
    """Supervised fine-tuning on the traces (torch backend): packing, assistant-only loss, AdamW + cosine."""

    model_path: str | None = None
    """A Hugging Face causal-LM checkpoint directory (model + tokenizer) to start from; None: build `tiny`."""
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    """The model built from scratch when model_path is None (the CPU default)."""
    seq_len: int = Field(1024, ge=16, le=1_048_576)
    """Packed row length; a trace longer than this is an error unless truncate_overlong."""
    truncate_overlong: bool = False
    """Cut traces longer than seq_len instead of refusing them."""
    rows_per_micro_batch: int = Field(2, ge=1, le=100_000)
    grad_accum_steps: int = Field(1, ge=1, le=100_000)
    max_steps: int = Field(300, ge=1, le=10_000_000)
    """Optimizer steps (the cosine schedule ends here)."""
    time_budget_s: float | None = Field(None, gt=0)
    """Wall-clock budget: when set, max_steps is lowered to what a measured step time allows."""
    lr: float = Field(1e-3, gt=0, le=10)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    warmup_steps: int = Field(20, ge=0, le=10_000_000)
    weight_decay: float = Field(0.1, ge=0, le=10)
    max_grad_norm: float | None = Field(1.0, gt=0)
    bf16: bool = False
    """bf16 autocast (slower than fp32 on CPUs without bf16 units: see docs/benchmarks.md)."""
    checkpoint_every: int = Field(100, ge=0, le=10_000_000)
    """Steps between checkpoints (model, optimizer, RNG, step, data position); 0: only at the end."""
    keep_checkpoints: int = Field(2, ge=1, le=1000)
    threads: int = Field(2, ge=1, le=1024)
    """torch intra-op threads for training."""


class GRPOConfig(StrictModel):
    """Synchronous GRPO on the SFT checkpoint: B tasks x n attempts per step, token-level clipped loss, TIS."""

    steps: int = Field(10, ge=0, le=10_000_000)
    """Optimizer steps (0 skips RL: the SFT checkpoint is passed on)."""
    time_budget_s: float | None = Field(None, gt=0)
    """Stop after the step during which this much wall clock has passed."""
    tasks_per_step: int = Field(8, ge=1, le=1_000_000)
    """B: tasks (groups) per step."""
    attempts_per_task: int = Field(4, ge=2, le=10_000)
    """n: attempts per task (the group)."""
    rollout_concurrency: int = Field(8, ge=1, le=1_000_000)
    """Episodes running at once."""
    temperature: float = Field(1.0, gt=0, le=10)
    top_p: float = Field(1.0, gt=0, le=1)
    lr: float = Field(1e-4, gt=0, le=10)
    weight_decay: float = Field(0.0, ge=0, le=10)
    grad_clip: float | None = Field(1.0, gt=0)
    clip_eps_low: float = Field(0.2, ge=0, le=10)
    clip_eps_high: float = Field(0.28, ge=0, le=10)
    tis_cap: float = Field(2.0, ge=1, le=1e6)
    """Truncation of the importance weight against the engine's behaviour log-probs."""
    kl_coef: float = Field(0.0, ge=0, le=100)
    """k3 KL penalty to the SFT checkpoint (0: no reference model is kept)."""
    scale_adv_by_std: bool = False
    """Divide advantages by the group's reward std (GRPO) or not (Dr. GRPO)."""
    micro_batch_tokens: int = Field(8192, ge=2, le=100_000_000)
    ppo_epochs: int = Field(1, ge=1, le=100)
    num_minibatches: int = Field(1, ge=1, le=10_000)
    checkpoint_every: int = Field(5, ge=0, le=10_000_000)
    """Steps between checkpoints; 0: only at the end."""
    threads: int = Field(2, ge=1, le=1024)
    """torch intra-op threads for the update."""
    task_seed_offset: int = Field(0, ge=0, le=2**31 - 1)
    """Shifts the seeded task order (the data position resumes exactly from a checkpoint)."""


CheckpointName = Literal["base", "sft", "grpo"]
CHECKPOINT_NAMES: tuple[CheckpointName, ...] = ("base", "sft", "grpo")


class EvaluateConfig(StrictModel):
    """Held-out evaluation: k attempts per task, pass@1 with a bootstrap CI, per-repository table."""

    checkpoints: list[CheckpointName] = Field(default_factory=lambda: list(CHECKPOINT_NAMES))
    """Which models are evaluated, each on the same tasks."""
    max_tasks: int = Field(100, ge=1, le=10_000_000)
    """Held-out tasks evaluated (a seeded sample when there are more)."""
    attempts: int = Field(2, ge=1, le=10_000)
    """k attempts per task."""
    temperature: float = Field(0.7, ge=0, le=10)
    """Sampling temperature (0: greedy)."""
    concurrency: int = Field(8, ge=1, le=1_000_000)
    """Episodes running at once."""
    bootstrap_samples: int = Field(2000, ge=100, le=10_000_000)
    confidence: float = Field(0.95, gt=0, lt=1)
    threads: int = Field(1, ge=1, le=1024)
    """torch intra-op threads of the engine."""


CRON_FIELD = re.compile(r"^(\*|\d+(-\d+)?)(/\d+)?(,(\*|\d+(-\d+)?)(/\d+)?)*$|^[A-Za-z]{3}(-[A-Za-z]{3})?$")


class ServeConfig(StrictModel):
    eval_cron: str = Field("0 3 * * *", min_length=9)
    """Cron schedule (5 fields) of the evaluation deployment registered by `swerl serve`."""
    timezone: str = "UTC"
    """IANA time zone of the cron schedule."""

    @field_validator("eval_cron")
    @classmethod
    def _five_cron_fields(cls, v: str) -> str:
        fields = v.split()
        if len(fields) != 5 or not all(CRON_FIELD.match(f) for f in fields):
            raise ValueError(f"{v!r} is not a 5-field cron expression (minute hour day month weekday)")
        return v

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {v!r}") from exc
        return v

    max_concurrent_runs: int = Field(1, ge=1, le=1000)
    """Flow runs the serving process executes at once (Prefect runner limit)."""


class ServicesConfig(StrictModel):
    """Ports of the local services that `swerl up` starts, all on `host`."""

    host: str = "127.0.0.1"
    """Bind address of every local service (loopback unless you mean otherwise)."""
    prefect_port: int = Field(4200, ge=1024, le=65535)
    """Prefect server (API and UI)."""
    mlflow_port: int = Field(5000, ge=1024, le=65535)
    """MLflow tracking server and UI."""
    s3_port: int = Field(8333, ge=1024, le=65535)
    """SeaweedFS S3 endpoint."""
    seaweed_master_port: int = Field(9333, ge=1024, le=65535)
    """SeaweedFS master."""
    seaweed_volume_port: int = Field(8080, ge=1024, le=65535)
    """SeaweedFS volume server."""
    seaweed_filer_port: int = Field(8888, ge=1024, le=65535)
    """SeaweedFS filer."""
    startup_timeout_s: float = Field(120.0, gt=0, le=3600)
    """How long each service may take to become healthy."""


class PipelineConfig(StrictModel):
    run: RunConfig = Field(default_factory=RunConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    curate: CurateConfig = Field(default_factory=CurateConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    traces: TracesConfig = Field(default_factory=TracesConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    serve: ServeConfig = Field(default_factory=ServeConfig)
    services: ServicesConfig = Field(default_factory=ServicesConfig)

    def stage_config(self, stage: str) -> BaseModel:
        """The config section a stage's checkpoint key is computed from."""
        section = getattr(self, stage, None)
        if not isinstance(section, BaseModel):
            raise ConfigError(f"stage {stage!r} has no config section")
        return section


def config_hash(model: BaseModel) -> str:
    """Stable sha256 of a config section (canonical JSON, sorted keys)."""
    payload = json.dumps(model.model_dump(mode="json", by_alias=True), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def parse_override(item: str) -> tuple[list[str], Any]:
    """Split 'a.b.c=VALUE' into its key path and a YAML-typed value."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.path=value")
    key, raw = item.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {key}: value {raw!r} is not valid YAML: {exc}") from exc
    return path, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted overrides to raw config data; unknown keys are caught by validation afterwards."""
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for i, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(path[: i + 1])} is not a section")
            node = child
        node[path[-1]] = value
    return data


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line per problem, each naming the dotted key."""
    lines = [f"invalid config ({source}):"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<root>"
        got = err.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"  {key}: {err['msg']}{shown}")
    return "\n".join(lines)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> PipelineConfig:
    """Load a YAML config file (or the defaults), apply overrides and validate."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {source} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {source} is not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {source} must hold a mapping at the top level")
        data = loaded
    data = apply_overrides(data, overrides or [])
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


def dump_config(cfg: PipelineConfig) -> str:
    """The resolved config as YAML (saved with every run)."""
    return yaml.safe_dump(cfg.model_dump(mode="json", by_alias=True), sort_keys=False)
