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

STAGES: tuple[str, ...] = ("curate", "sft", "grpo", "evaluate")
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
