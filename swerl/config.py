"""Run configuration: pydantic models, one per stage, loaded from YAML with dotted overrides.

Every limit the pipeline obeys is a field here, bounded and documented; nothing is left to a library default.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from swerl.data.loaders import TaskSchema
from swerl.data.micro import GENERATOR_VERSION
from swerl.errors import INFRA_CAUSES

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


def _numeric_annotation(annotation: Any) -> bool:
    """Whether a field's type is a number (int or float, maybe optional), not a boolean."""
    if annotation is bool:
        return False
    if annotation in (int, float):
        return True
    return any(_numeric_annotation(arg) for arg in get_args(annotation) if arg is not type(None))


class StrictModel(BaseModel):
    """Base for every config section: unknown keys and wrong types are errors.

    Numbers are strict where YAML would let a mistake through: a float must be finite (`.inf`, `.nan` are
    refused: a budget or a rate of infinity is written as the field's None, where it has one), and a boolean is
    not a number (`workers: true` is an error, not 1)."""

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        frozen=False,
        allow_inf_nan=False,
        use_attribute_docstrings=True,  # each field's docstring is its description (the Prefect form shows it)
        json_schema_extra=lambda schema, cls: _form_schema(schema, cls),
    )

    form_first: ClassVar[tuple[str, ...]] = ()
    """Fields the deployment form shows first, in this order (the rest follow in definition order)."""
    form_hidden: ClassVar[tuple[str, ...]] = ()
    """Fields left out of the deployment form and of a deployment's parameters (settings of the services and of
    `swerl serve`, which a run never reads)."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, bool) and info.field_name is not None:
            field = cls.model_fields.get(info.field_name)
            if field is not None and _numeric_annotation(field.annotation):
                raise ValueError(f"must be a number, not the boolean {v}")
        return v


def _form_schema(schema: dict[str, Any], cls: Any) -> None:
    """The JSON schema Prefect renders as the deployment form: `form_first` fields first, `form_hidden` ones out."""
    props = schema.get("properties")
    if not isinstance(props, dict):
        return
    first = [k for k in getattr(cls, "form_first", ()) if k in props]
    hidden = set(getattr(cls, "form_hidden", ()))
    ordered = {k: props[k] for k in first} | {k: v for k, v in props.items() if k not in first}
    schema["properties"] = {k: v for k, v in ordered.items() if k not in hidden}
    if "required" in schema:
        schema["required"] = [k for k in schema["required"] if k not in hidden]


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
    registered_model: str | None = Field(
        None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
    )
    """Registered model the SFT and GRPO models become versions of; None: RUN_NAME-agent."""
    system_metrics_interval_s: float = Field(10.0, gt=0, le=3600)
    """Seconds between samples of CPU, memory, disk and network into the pipeline's MLflow run (0 is refused)."""


class DockerSandboxConfig(StrictModel):
    """The docker backend (swerl.sandbox.docker): one container per sandbox, network "none", removed on close."""

    base_image: str = Field("swerl-base:bookworm", min_length=1, max_length=300)
    """Image environment images build on (`python -m swerl.sandbox.images base` builds it offline)."""
    cpus: float = Field(1.0, gt=0, le=1024)
    """CPU share of one container (NanoCpus)."""
    api_threads: int = Field(256, ge=4, le=100_000)
    """Threads for blocking Docker API calls (a running command holds one): caps concurrent commands."""
    api_timeout_s: float = Field(120.0, gt=0, le=3600)
    """Timeout of one Docker API request (not of a command, which has its own)."""
    max_lifetime_s: int = Field(21_600, ge=60, le=604_800)
    """A container removes itself after this long even if close() never ran (a crashed run leaks nothing)."""
    kill_grace_s: float = Field(10.0, gt=0, le=600)
    """After a timed-out command is killed, how long it may take to end before InfraError(exec_unresponsive)."""
    allow_pull: bool = False
    """Pull a task image the engine does not have (SWE-smith, SWE-bench); off: a missing image is image_missing."""
    pulls_per_hour: int = Field(100, ge=1, le=100_000)
    """Image pulls in any hour (the registry's cap: 100/h in the recipe); past it a pull waits, and says so."""


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
    workspace_dir: str | None = None
    """Where local sandboxes' workspaces are made (None: the system temp dir)."""
    workspace_mb: int = Field(1024, ge=16, le=1_048_576)
    """Size cap of a sandbox's writable /workspace: docker, a tmpfs counted in the container's memory limit;
    local, a tmpfs of this size mounted per sandbox (see workspace_quota)."""
    workspace_quota: Literal["auto", "tmpfs", "none"] = "auto"
    """Local backend: `tmpfs` mounts a size-capped tmpfs per sandbox (needs root or CAP_SYS_ADMIN; a start fails
    without it), `auto` does so where this process may mount and otherwise warns once and uses a plain directory,
    `none` uses a plain directory (a command can then fill the host disk file by file)."""
    runtime: Literal["auto", "supervisor", "bubblewrap"] = "auto"
    """Local backend: `supervisor` builds each sandbox in-process once (swerl/sandbox/nsinit.c, compiled once with
    the system C compiler: namespaces, mounts, the uid switch; a command is one fork and exec; needs root),
    `bubblewrap` runs each command in a fresh bubblewrap; `auto` is the supervisor where this process may mount and
    a C compiler built it, else bubblewrap. Same isolation and limits (the security suite runs against both); the
    supervisor starts and runs commands at a fraction of the CPU (docs/benchmarks.md)."""
    backend: Literal["local", "docker", "e2b"] = "local"
    """Where sandboxes run: bubblewrap on this host, containers of a Docker engine, or e2b's cloud."""
    docker: DockerSandboxConfig = Field(default_factory=DockerSandboxConfig)
    """Image and container settings of the docker backend (the limits above apply to it too)."""
    pool: SandboxPoolConfig = Field(default_factory=lambda: SandboxPoolConfig())
    """Concurrency, start retries, warm pool, environment pull rate and price of these sandboxes."""
    e2b: E2BConfig = Field(default_factory=lambda: E2BConfig())
    """Template and timeouts of the e2b backend (used only when sandboxes run on e2b)."""


class SandboxPoolConfig(StrictModel):
    """Named limits of the sandbox pool (swerl.sandbox.pool) wrapped around any backend."""

    max_concurrent: int = Field(64, ge=1, le=100_000)
    """Sandboxes alive at once (in use + warm); a start beyond it waits for a close."""
    start_timeout_s: float = Field(120.0, gt=0, le=3600)
    """Wall clock for one start try, on top of the backend's own check; past it: InfraError(start_timeout)."""
    start_retries: int = Field(2, ge=0, le=100)
    """Extra tries of a start that failed with a cause in retry_causes."""
    retry_causes: list[str] = Field(default_factory=lambda: ["start_timeout", "start_failed", "quota"])
    """InfraError causes of a failed start that are retried (others fail the start at once)."""
    retry_backoff_s: float = Field(0.5, ge=0, le=600)
    """Wait before a start retry, doubled each time."""
    warm_size: int = Field(0, ge=0, le=100_000)
    """Sandboxes kept started ahead of demand (0: every start is cold)."""
    pulls_per_minute: float = Field(60.0, gt=0, le=1_000_000)
    """Environment preparations (image pulls/builds, directory materializations) started per minute."""
    pull_burst: int = Field(4, ge=1, le=100_000)
    """Preparations that may start back to back before the per-minute rate applies (token bucket size)."""
    price_per_sandbox_hour: float = Field(0.0, ge=0, le=1000)
    """Cost of one sandbox-hour in USD for cloud backends (0: local); sandbox-seconds x price is logged."""

    @field_validator("retry_causes")
    @classmethod
    def _known_causes(cls, v: list[str]) -> list[str]:
        unknown = sorted(set(v) - INFRA_CAUSES)
        if unknown:
            raise ValueError(f"unknown infrastructure-error causes {unknown}; known: {sorted(INFRA_CAUSES)}")
        return v


class E2BConfig(StrictModel):
    """The e2b cloud backend (swerl.sandbox.e2b); the API key comes from E2B_API_KEY, never from config."""

    template: str = Field("swerl-base", min_length=1, max_length=200)
    """Template name or id (images/e2b/e2b.toml builds it)."""
    lifetime_s: int = Field(3600, ge=60, le=86_400)
    """The sandbox VM's own lifetime; e2b kills it past this even if close() never ran."""
    request_timeout_s: float = Field(30.0, gt=0, le=3600)
    """Per-request timeout of the e2b API and file transfers."""
    exec_grace_s: float = Field(15.0, gt=0, le=3600)
    """Past a command's timeout plus this, a command that has not come back is InfraError(exec_unresponsive)."""
    image_templates: dict[str, str] = Field(default_factory=dict)
    """Image tasks: the template built from each task image (`e2b template build` on a Dockerfile `FROM` it)."""


class DatasetSource(StrictModel):
    """Published task rows: a hub dataset or a local file, read through `datasets` (swerl.data.loaders)."""

    schema_name: TaskSchema = Field(alias="schema")
    """Which schema the rows follow: swesmith, swebench (SWE-bench and SWE-bench 5 rows, with their version and
    eval_script), swebench_pro (ScaleAI/SWE-bench_Pro), swerebench (nebius/SWE-rebench), or swerl (the curate
    stage's train/eval.parquet: every task as swerl stored it, its environment included)."""
    path: str = Field(min_length=1)
    """A Hugging Face hub id (real use) or a local parquet/jsonl/json file."""
    split: str = "train"
    """Dataset split to read."""
    limit: int | None = Field(None, ge=1)
    """Read at most this many rows (None: all)."""
    revision: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
    """The hub dataset's revision (a commit sha, tag or branch) passed to `datasets.load_dataset(...,
    revision=...)`; part of the stage's key, so another revision reruns the stage. None: the hub's default branch,
    whose rows can change under an unchanged key (pin it). Refused for a local file (its contents are the file's)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class MicroSource(StrictModel):
    """Procedural micro repositories (swerl.data.micro): tiny modules whose eval split uses unseen identifiers."""

    train_repos: int = Field(ge=0, le=100_000)
    """Micro repositories generated from the train vocabulary; their tasks go to train.parquet."""
    eval_repos: int = Field(ge=0, le=100_000)
    """Micro repositories generated from the disjoint eval vocabulary; their tasks go to eval.parquet."""
    seed: int = Field(0, ge=0, le=2**31 - 1)
    """Generator seed: the same seed and index give byte-identical repositories on any machine."""
    generator_version: int = GENERATOR_VERSION
    """The generator's version (part of the curate key, so a new generator reruns curation); must be current."""

    @field_validator("generator_version")
    @classmethod
    def _current_generator(cls, v: int) -> int:
        if v != GENERATOR_VERSION:
            raise ValueError(f"micro generator version {v} is not this swerl's ({GENERATOR_VERSION})")
        return v


class RepoSource(StrictModel):
    """A real repository to curate tasks from, tested in a virtualenv of its own (never swerl's interpreter).

    Its clean tests that fail or cannot be collected are left out of the tasks (counted by reason), and every task
    is confirmed by the sealed grader: the reference fix graded resolved, the untouched bug unresolved."""

    path: str = Field(min_length=1, max_length=4096)
    """A directory, an sdist (.tar.gz, extracted into swerl's cache) or a git repository already on disk (a bare
    repository's path, or a file:// URL: cloned locally)."""
    name: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """Name in reports and task ids (None: the directory's, the sdist's or the git repository's name)."""
    install: list[Annotated[str, Field(min_length=1, max_length=500)]] = Field(
        default_factory=list, max_length=200
    )
    """Extra test requirements (pip specifiers, e.g. hypothesis, pytest-asyncio), installed into the
    repository's environment when it is built, with pytest and the repository's own dependencies."""
    test_cmd: str = Field("", max_length=10_000)
    """The repository's own test command printing pytest's `-rA` summary (empty: pytest)."""
    python_path: str | None = Field(None, max_length=500)
    """Directory, relative to the repository, whose packages are imported (e.g. "src"); None: "src" when the
    repository has a src/ directory holding a package, else the repository's root."""
    build_timeout_s: float = Field(1800.0, gt=0, le=86400)
    """How long building the repository's environment (pip) may take."""

    @field_validator("python_path")
    @classmethod
    def _relative(cls, value: str | None) -> str | None:
        if value is not None and (value.startswith("/") or ".." in Path(value).parts):
            raise ValueError(f"must be a path inside the repository, got {value!r}")
        return value


def _repo_entry_kind(value: Any) -> str:
    return "name" if isinstance(value, str) else "source"


RepoEntry = Annotated[
    Annotated[str, Tag("name")] | Annotated[RepoSource, Tag("source")], Discriminator(_repo_entry_kind)
]
"""A `curate.repos` entry: 'builtin', 'builtin:NAME', a directory path, or a RepoSource mapping."""


class CurateConfig(StrictModel):
    repos: list[RepoEntry] = Field(default_factory=lambda: list[str | RepoSource](["builtin"]))
    """Repositories to synthesize tasks from: 'builtin' (all shipped), 'builtin:NAME', a directory path (all tested
    with swerl's interpreter), or a mapping (RepoSource: a directory, sdist or git repository with its own test
    environment, `install`, `test_cmd` and `python_path`)."""
    datasets: list[DatasetSource] = Field(default_factory=list)
    """Published task datasets (SWE-smith / SWE-bench schema) to include as they are."""
    harbor: list[str] = Field(default_factory=list)
    """Harbor task directories, each a task or a folder of task directories: image built offline, reference patch
    from solution/solve.sh, kept iff its verifier gives that patch 1 and the empty patch 0 (needs sandbox.backend
    docker, or local on the supervisor runtime); eval iff eval_repos names harbor/NAME, NAME or harbor-category:CAT."""
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
    gold_check: bool = True
    """Check every loaded SWE-bench-style row (the fix as `patch`) whose image is on the Docker engine in that image,
    with swerl's grader, before keeping it: its reference fix must resolve it (RESOLVED_FULL) and the empty patch
    must not. A failing row is dropped and counted by cause in curate_report.json's `gold_check` (gold_unresolved,
    gold_does_not_apply, empty_resolved); rows without their image are kept, counted as unchecked; an
    infrastructure error is counted apart by cause and keeps the row (swerl/stages/curate_gold.py). Costs two
    graded test runs per checked row, `validation_workers` at a time, in `sandbox` sandboxes."""


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
    max_command_bytes: int = Field(65_536, ge=256, le=126_976)
    """A bash command longer than this (UTF-8 bytes) is refused with an error observation, not run: one argv
    string cannot exceed Linux's 128 KiB (MAX_ARG_STRLEN), so a longer one would fail to start as if the sandbox
    had broken."""
    max_edit_bytes: int = Field(1_048_576, ge=1024, le=1 << 30)
    """str_replace's `old` and `new` together, and the file it edits, at most this many UTF-8 bytes; more is an
    error observation."""
    test_timeout_s: float = Field(60.0, gt=0, le=86400)
    """Wall clock of the grading test run after the episode."""
    episode_timeout_s: float = Field(600.0, gt=0, le=7 * 86400)
    """Wall clock of the agent's turns (sandbox start and grading excluded)."""
    infra_retries: int = Field(2, ge=0, le=100)
    """Times an episode that ended in an infrastructure error is rerun before it is reported as missing."""
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits)
    """Limits of every episode sandbox."""


class WeightSyncConfig(StrictModel):
    """How new weights reach the engines after a GRPO step."""

    method: Literal["disk", "distributed"] = "disk"
    """disk: the trainer writes an HF folder, engines load it (update_weights_from_disk); distributed: trainer rank 0
    and every engine join one process group and the weights are broadcast (SGLang's init_weights_update_group +
    update_weights_from_distributed; NCCL on GPUs, gloo on CPU; the local engine server speaks the same API)."""
    bucket_mb: int = Field(512, ge=1, le=1_048_576)
    """Tensors sent per update_weights_from_distributed request, in MiB (one request per bucket)."""
    master_addr: str = Field("127.0.0.1", min_length=1, max_length=255)
    """Address engines reach trainer rank 0 at for the weight group. On a cluster, the trainer node's address on
    the interface given in socket_ifname (the recipe's sync hung on duplicate container IPs)."""
    master_port: int = Field(0, ge=0, le=65535)
    """Port of the weight group's rendezvous; 0: a free port picked by the trainer."""
    process_group: Literal["auto", "gloo", "nccl"] = "auto"
    """Backend of the weight group; auto: nccl when the trainer runs on cuda, else gloo."""
    socket_ifname: str | None = Field(None, max_length=64)
    """Network interface of the weight group (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME on both sides)."""
    group_name: str = Field("swerl-weights", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._-]+$")
    """Name of the weight group on the engines."""
    timeout_s: float = Field(600.0, gt=0, le=86_400)
    """How long forming the group, or one bucket's broadcast, may take."""


class EngineConfig(StrictModel):
    """The inference engines episodes sample from: in process, local engine servers, or SGLang servers."""

    kind: Literal["local", "http_local", "sglang"] = "local"
    """local: LocalEngine in process; http_local: `num_engines` local engine servers (swerl.engine.server)
    behind the router, over HTTP; sglang: `num_engines` SGLang servers (GPU, the `gpu` extra) behind the router."""
    max_batch_size: int = Field(8, ge=1, le=100_000)
    """Requests decoded together per engine; more wait in the engine's queue (SGLang: --max-running-requests)."""
    max_context_tokens: int = Field(2048, ge=2, le=1_048_576)
    """Engine-side context cap: a request that would exceed it finishes with reason length."""
    threads: int = Field(1, ge=1, le=1024)
    """torch intra-op threads of the engine's forward passes (local engines)."""
    prefix_cache_size: int = Field(0, ge=0, le=1_000_000)
    """Local engines: finished requests whose KV cache is kept for the next turn of the same trajectory (rid), so
    a turn prefills only its new tokens (SGLang's radix cache does this on its own); 0: no prefix cache."""
    prefill_tokens_per_step: int = Field(1024, ge=1, le=10_000_000)
    """Local engines: most prompt tokens prefilled in one model step, unless one request alone has more: admitted
    requests share a step up to it (one pass over the weights for several prompts); past it the activations
    outgrow a CPU's caches (16 prompts of ~420 tokens took 1.3x as long in one step as in steps of 2-4)."""
    num_engines: int = Field(1, ge=1, le=4096)
    """Engine processes behind the router (http_local, sglang)."""
    urls: list[str] = Field(default_factory=list)
    """Already running engine servers (http://HOST:PORT) to route to instead of launching `num_engines`."""
    host: str = "127.0.0.1"
    """Bind address of launched engines (loopback unless you mean otherwise)."""
    base_port: int = Field(0, ge=0, le=65535)
    """Engine i listens on base_port + i; 0: free ports picked at launch."""
    max_connections: int | None = Field(None, ge=1, le=1_000_000)
    """HTTP connections per engine; None: the stage's episode concurrency + control_connections (one /generate
    in flight per episode), never a library default."""
    control_connections: int = Field(4, ge=1, le=1024)
    """Connections per engine kept beyond the episode concurrency for health probes and weight updates."""
    connect_timeout_s: float = Field(10.0, gt=0, le=3600)
    """Time to open a connection to an engine."""
    request_timeout_s: float = Field(1800.0, gt=0, le=86400)
    """Wall clock of one /generate call; past it the call is an InfraError(engine_timeout)."""
    control_timeout_s: float = Field(1800.0, gt=0, le=86400)
    """Wall clock of a weight update, pause, continue or cache flush."""
    retries: int = Field(2, ge=0, le=100)
    """Times a /generate that failed with an InfraError is retried on another engine, and a control call
    (weight update, pause, continue) on the same engine after retry_backoff_s."""
    retry_backoff_s: float = Field(0.5, ge=0, le=600)
    """First wait before a control call is retried; doubled after each retry."""
    health_interval_s: float = Field(5.0, ge=0, le=3600)
    """Seconds between the router's health probes of every engine (0: no probes, a dead engine stays out)."""
    health_timeout_s: float = Field(30.0, gt=0, le=3600)
    """Wall clock of one health probe (/health_generate)."""
    sticky_capacity: int = Field(100_000, ge=1, le=100_000_000)
    """Trajectory ids the router remembers for stickiness (prefix-cache reuse); least recently used forgotten."""
    sticky_max_excess: int = Field(64, ge=0, le=1_000_000)
    """A trajectory leaves its engine when that engine has this many more requests outstanding than the least."""
    weight_update_mode: Literal["pause", "drain"] = "pause"
    """pause: engines pause in place, load, continue (requests may span versions); drain: wait for in-flight
    requests to finish first (every response from one version)."""
    pause_mode: Literal["retract", "in_place"] = "retract"
    """SGLang /pause_generation mode of a pause-mode update: retract (running requests requeued, KV recomputed after
    the update; SGLang cannot flush its cache under in_place while requests run) or in_place."""
    startup_timeout_s: float = Field(900.0, gt=0, le=86400)
    """How long each launched engine may take to become healthy."""
    tp_size: int = Field(1, ge=1, le=1024)
    """SGLang tensor-parallel size: GPUs per engine (engine i gets GPUs i*tp_size ...)."""
    mem_fraction_static: float | None = Field(None, gt=0, lt=1)
    """SGLang --mem-fraction-static (weights + KV cache share of GPU memory); None: SGLang's own choice."""
    sglang_args: list[str] = Field(default_factory=list)
    """Extra `sglang.launch_server` arguments, appended as they are."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where local engines (local, http_local) run their model; cuda: engine i on GPU i (SGLang picks its own)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of local engines' weights and forward passes."""
    weight_sync: WeightSyncConfig = Field(default_factory=WeightSyncConfig)
    """How GRPO's new weights reach the engines."""

    def pool_size(self, concurrency: int) -> int:
        """HTTP connections per engine for a stage running `concurrency` episodes."""
        return self.max_connections or concurrency + self.control_connections


class MegatronConfig(StrictModel):
    """Parallelism of the `megatron` trainer backend (megatron-core through megatron-bridge; the `megatron` extra,
    Python >= 3.12, GPUs). The product of tensor, pipeline and context parallel sizes divides the ranks; the data
    parallel size is what remains; expert parallel splits the MoE experts across data-parallel ranks."""

    tensor_parallel: int = Field(1, ge=1, le=1024)
    """Tensor-parallel size (splits each layer's matrices)."""
    pipeline_parallel: int = Field(1, ge=1, le=1024)
    """Pipeline-parallel size (splits the layers into stages)."""
    context_parallel: int = Field(1, ge=1, le=1024)
    """Context-parallel size (splits long sequences)."""
    expert_parallel: int = Field(1, ge=1, le=1024)
    """Expert-parallel size (splits the MoE experts)."""
    expert_tensor_parallel: int = Field(1, ge=1, le=1024)
    """Tensor-parallel size inside each expert."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (needs tensor_parallel > 1)."""
    distributed_optimizer: bool = True
    """Optimizer state sharded across data-parallel ranks (Megatron's distributed optimizer)."""
    recompute: Literal["none", "selective", "full"] = "none"
    """Activation recomputation granularity."""

    @model_validator(mode="after")
    def _consistent(self) -> MegatronConfig:
        if self.sequence_parallel and self.tensor_parallel == 1:
            raise ValueError("sequence_parallel needs tensor_parallel > 1")
        return self

    @property
    def model_parallel(self) -> int:
        """Ranks one model replica spans (tensor x pipeline x context)."""
        return self.tensor_parallel * self.pipeline_parallel * self.context_parallel


class DistributedConfig(StrictModel):
    """Where and how a stage's trainer runs: one process (torch, today's default), N FSDP2 ranks (gloo on CPU,
    NCCL on GPUs), or Megatron. Part of the stage's inputs: changing it retrains (results differ in the last bits)."""

    backend: Literal["torch", "fsdp2", "megatron"] = "torch"
    """torch: one process, the model unsharded; fsdp2: `ranks` processes, parameters, gradients and optimizer state
    sharded with torch's fully_shard; megatron: megatron-core through megatron-bridge (the `megatron` extra)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """cpu: gloo ranks; cuda: one rank per GPU (local rank i on GPU i), NCCL."""
    ranks: int = Field(1, ge=1, le=100_000)
    """Trainer processes in all (world size); launched by the stage on this node."""
    process_group: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend of the trainer ranks; auto: nccl on cuda, gloo on cpu."""
    master_addr: str = Field("127.0.0.1", min_length=1, max_length=255)
    """Rendezvous address of the trainer ranks (MASTER_ADDR)."""
    master_port: int = Field(0, ge=0, le=65535)
    """Rendezvous port (MASTER_PORT); 0: a free port picked at launch."""
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of the forward and backward (FSDP2 MixedPrecisionPolicy param_dtype; sharded master weights and the
    optimizer state stay float32)."""
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype gradients are reduced in across ranks."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward instead of keeping them."""
    reshard_after_forward: bool = True
    """FSDP2: free the gathered parameters of a layer after its forward (ZeRO-3); False keeps them (ZeRO-2)."""
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2", "flex_attention"] = "sdpa"
    """transformers attention for packed rows (position ids restart per example, never a 2D mask). On GPUs
    flash_attention_2 reads the restarts as varlen sequences (no T x T mask); sdpa builds a block mask."""
    start_timeout_s: float = Field(600.0, gt=0, le=86_400)
    """How long the ranks may take to start and build the model."""
    collective_timeout_s: float = Field(1800.0, gt=0, le=86_400)
    """torch.distributed timeout of one collective (a rank that never answers fails the step after it)."""
    socket_ifname: str | None = Field(None, max_length=64)
    """Network interface the ranks talk over (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME); None: the library picks."""
    megatron: MegatronConfig = Field(default_factory=MegatronConfig)
    """Parallel sizes of the megatron backend."""

    @model_validator(mode="after")
    def _consistent(self) -> DistributedConfig:
        if self.backend == "torch" and self.ranks != 1:
            raise ValueError(
                f"backend torch runs one process; ranks {self.ranks} needs backend fsdp2 or megatron"
            )
        if self.process_group == "nccl" and self.device != "cuda":
            raise ValueError("process_group nccl needs device cuda")
        if self.backend == "megatron":
            if self.device != "cuda":
                raise ValueError("backend megatron runs on GPUs only (device cuda): megatron-core needs CUDA")
            if self.ranks % self.megatron.model_parallel:
                raise ValueError(
                    f"megatron: tensor x pipeline x context parallel ({self.megatron.model_parallel}) must divide "
                    f"ranks ({self.ranks})"
                )
            m = self.megatron
            experts = m.expert_tensor_parallel * m.expert_parallel * m.pipeline_parallel
            # megatron-core's expert grid: PP x ETP x EP x expert-data-parallel ranks
            if self.ranks % experts:
                raise ValueError(
                    f"megatron: expert_tensor_parallel x expert_parallel x pipeline_parallel ({experts}) must "
                    f"divide ranks ({self.ranks})"
                )
        return self

    @property
    def group_backend(self) -> Literal["gloo", "nccl"]:
        """The torch.distributed backend the ranks use."""
        if self.process_group != "auto":
            return self.process_group
        return "nccl" if self.device == "cuda" else "gloo"


class TinyModelConfig(StrictModel):
    """A Qwen3-architecture model built from scratch, with a byte-level BPE tokenizer trained on project data."""

    vocab_size: int = Field(4096, ge=300, le=1_000_000)
    """Target tokenizer vocabulary (the corpus may yield fewer)."""
    hidden_size: int = Field(256, ge=8, le=65_536)
    """Model width (the residual stream)."""
    num_layers: int = Field(4, ge=1, le=1000)
    """Decoder layers."""
    num_heads: int = Field(4, ge=1, le=1024)
    """Attention query heads (head size = hidden_size / num_heads)."""
    num_kv_heads: int = Field(2, ge=1, le=1024)
    """Key/value heads (grouped-query attention; divides num_heads)."""
    ffn_size: int = Field(768, ge=8, le=1_000_000)
    """MLP width (each expert's, for MoE)."""
    max_positions: int = Field(2048, ge=64, le=1_048_576)
    """Longest sequence the model accepts; every token cap must fit in it."""
    moe: bool = False
    """Qwen3-MoE instead of dense."""
    num_experts: int = Field(4, ge=1, le=1024)
    """Experts per MoE layer (moe: true)."""
    experts_per_token: int = Field(2, ge=1, le=1024)
    """Experts each token is routed to (moe: true)."""


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

    form_first = ("max_steps", "time_budget_s", "model_path", "tiny")

    model_path: str | None = None
    """A Hugging Face causal-LM checkpoint directory (model + tokenizer) to start from; None: build `tiny`."""
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    """The model built from scratch when model_path is None (the CPU default)."""
    seq_len: int = Field(1024, ge=16, le=1_048_576)
    """Packed row length: traces are packed next-fit into rows of at most this many tokens; a trace longer than
    this is an error unless truncate_overlong."""
    truncate_overlong: bool = False
    """Cut traces longer than seq_len instead of refusing them."""
    rows_per_micro_batch: int = Field(2, ge=1, le=100_000)
    """Packed rows per micro-batch (its token budget is rows_per_micro_batch x seq_len). A micro-batch is computed
    as one padding-free row of its traces' real tokens (swerl.train.packing): the rows' empty slots cost nothing."""
    grad_accum_steps: int = Field(1, ge=1, le=100_000)
    """Micro-batches per optimizer step: a step is rows_per_micro_batch x grad_accum_steps rows, and its loss the
    mean NLL over all of their assistant tokens."""
    max_steps: int = Field(300, ge=1, le=10_000_000)
    """Optimizer steps (the cosine schedule ends here)."""
    time_budget_s: float | None = Field(None, gt=0)
    """Wall-clock guard only (max_steps decides what is trained): a run past it ends early, with a warning, the
    report's `budget` and an MLflow tag; the time of earlier attempts counts (saved in each checkpoint)."""
    lr: float = Field(1e-3, gt=0, le=10)
    """Peak learning rate (AdamW), after warm-up."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    """The cosine decay ends at lr x min_lr_ratio on the last step."""
    warmup_steps: int = Field(20, ge=0, le=10_000_000)
    """Linear warm-up steps before the cosine decay."""
    weight_decay: float = Field(0.1, ge=0, le=10)
    """AdamW weight decay, on matrices only (norms and biases are not decayed)."""
    max_grad_norm: float | None = Field(1.0, gt=0)
    """Clip the gradient's total norm to this; None: measured, not clipped."""
    bf16: bool = False
    """bf16 autocast (slower than fp32 on CPUs without bf16 units: see docs/benchmarks.md)."""
    checkpoint_every: int = Field(100, ge=0, le=10_000_000)
    """Steps between checkpoints (model, optimizer, RNG, step, data position); 0: only at the end."""
    keep_checkpoints: int = Field(2, ge=1, le=1000)
    """Checkpoints kept, locally and in the store (the newest N; older ones are removed as new ones land)."""
    threads: int = Field(2, ge=1, le=1024)
    """torch intra-op threads for training."""
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    """Trainer processes, devices, sharding (the default: one CPU process)."""

    @model_validator(mode="after")
    def _trainer(self) -> SFTConfig:
        if self.distributed.backend == "megatron":
            raise ValueError(
                "distributed.backend megatron trains GRPO only (swerl/train/megatron_backend.py): SFT runs on torch "
                "or fsdp2 ranks (sft.distributed.backend fsdp2)"
            )
        return self


class GRPOScheduleConfig(StrictModel):
    """How much GRPO trains: steps of B groups, checkpoints, the time budget that only guards."""

    steps: int = Field(10, ge=0, le=10_000_000)
    """Optimizer steps (0 skips RL: the SFT checkpoint is passed on)."""
    tasks_per_step: int = Field(8, ge=1, le=1_000_000)
    """B: tasks (groups) per step."""
    time_budget_s: float | None = Field(None, gt=0)
    """Wall-clock budget for training. async: no step starts after it, a batch still being collected when it runs
    out is given back untrained (its groups stay journaled), and an update the previous one's duration says would
    end past it is not started; sync: stops after the step during which it ran out. A guard only (steps decide
    what is trained): ending early is a warning and a report field; earlier attempts' time counts (checkpointed)."""
    checkpoint_every: int = Field(5, ge=0, le=10_000_000)
    """Steps between checkpoints; 0: only at the end."""
    keep_checkpoints: int = Field(2, ge=1, le=1000)
    """Checkpoints kept, locally and in the store (the newest N; older ones are removed as new ones land)."""
    max_empty_steps: int = Field(3, ge=1, le=1_000_000)
    """Consecutive batches with nothing trainable (every group dropped: fewer than two valid attempts) before the
    stage fails; such a batch is never counted as a step."""
    task_seed_offset: int = Field(0, ge=0, le=2**31 - 1)
    """Shifts the seeded task order (the data position resumes exactly from a checkpoint)."""


class GRPORolloutConfig(StrictModel):
    """How GRPO samples: groups of n attempts, sampling parameters, and (async) what is in flight and how stale."""

    attempts_per_task: int = Field(4, ge=2, le=10_000)
    """n: attempts per task (the group)."""
    temperature: float = Field(1.0, gt=0, le=10)
    """Sampling temperature of the rollouts (the trainer's log-probs are taken at the same temperature)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling of the rollouts."""
    concurrency: int = Field(8, ge=1, le=1_000_000)
    """sync: episodes running at once."""
    max_in_flight: int = Field(32, ge=1, le=1_000_000)
    """async: trajectories kept running at all times (a finished one is replaced at once)."""
    max_staleness: int = Field(2, ge=0, le=1_000_000)
    """async: most versions a trajectory's oldest sampled token may lag the trainer before staleness_policy acts."""
    staleness_policy: Literal["drop", "requeue", "keep"] = "drop"
    """async: a stale attempt is left out (drop), its group is rerun (requeue), or trained with IS correction (keep)."""
    max_requeues: int = Field(1, ge=0, le=1000)
    """async, requeue: reruns of one group; a group still stale after them is dropped."""
    max_buffered_groups: int | None = Field(None, ge=1, le=1_000_000)
    """async: finished, untrained groups held before no new group is started (None: B x (max_staleness + 1))."""
    dynamic_sampling: bool = True
    """async: a group whose valid attempts all got the same reward (no gradient) does not fill one of the B slots."""
    max_extra_groups_per_step: int = Field(32, ge=0, le=1_000_000)
    """async: groups without gradient discarded per step at most; past it they fill slots (and teach nothing)."""
    prewarm_groups: int = Field(0, ge=0, le=1_000_000)
    """async: groups past the newest open one whose n sandboxes are started ahead (SandboxPool.warm_ahead), so an
    attempt's start is a hand-out, not a sandbox start; warming uses only sandbox slots no attempt waits for, so
    agent.sandbox.pool.max_concurrent should hold max_in_flight + prewarm_groups x attempts_per_task (doctor
    counts them); 0: every attempt starts its sandbox itself."""
    probe_attempts: int = Field(0, ge=0, le=10_000)
    """async: a fresh task's group opens with this many attempts; if they all fail (reward 0) the group stops there
    (discarded as probe_stopped), else its other attempts run and it is trained whole (swerl.rollout.curriculum:
    per task the expected update keeps its direction; tasks are reweighted towards the policy's frontier). 0: off;
    below attempts_per_task."""
    replay_share: float = Field(0.0, ge=0, lt=1)
    """async: share of the groups opened that rerun a task whose earlier group had signal (FIFO), instead of the next
    fresh task; 0: off (every group a fresh task in the seeded order)."""
    max_visits: int = Field(1, ge=1, le=1_000_000)
    """async, replay: most groups one task runs in all (its first included)."""
    stratify_by: Literal["modifier", "difficulty", "repo"] | None = None
    """async: the task attribute whose strata the curriculum estimates success rates for; a fresh task of a stratum
    far from the policy's frontier (never or always solved so far) is passed over with a seeded draw, keeping at
    least stratum_floor of its stratum's tasks (swerl.rollout.curriculum: tasks reweighted by stratum, each
    task's update keeps its direction). None: off (every fresh task in the seeded order)."""
    stratum_floor: float = Field(0.2, gt=0, le=1)
    """async, stratify_by: least chance that a fresh task of the least promising stratum is taken."""
    stratum_prior: float = Field(2.0, gt=0, le=1_000_000)
    """async, stratify_by: pseudo-attempts at success rate 1/2 in each stratum's estimate (how soon outcomes
    move it)."""


class GRPOAlgorithmConfig(StrictModel):
    """How one GRPO step updates the policy: optimizer, clipped token-level loss, TIS/MIS, KL, batching.

    Its fields are exactly those of swerl.train.grpo_trainer.UpdateSettings (a test keeps them equal)."""

    lr: float = Field(1e-4, gt=0, le=10)
    """AdamW learning rate (constant)."""
    weight_decay: float = Field(0.0, ge=0, le=10)
    """AdamW weight decay (matrices only)."""
    grad_clip: float | None = Field(1.0, gt=0)
    """Max total gradient norm (None: measured, not clipped)."""
    clip_eps_low: float = Field(0.2, ge=0, le=10)
    """PPO ratio clip below: 1 - clip_eps_low."""
    clip_eps_high: float = Field(0.28, ge=0, le=10)
    """PPO ratio clip above: 1 + clip_eps_high (DAPO's clip-higher when above clip_eps_low)."""
    tis_cap: float = Field(2.0, ge=1, le=1e6)
    """Truncation of the importance weight against the engine's behaviour log-probs."""
    tis_level: Literal["token", "sequence"] = "token"
    """Truncated importance sampling per token, or per trajectory (product of its token weights)."""
    mis_low: float = Field(0.0, ge=0, le=1)
    """Masked importance sampling: tokens (or trajectories) with weight below this get no loss (with mis_high)."""
    mis_high: float | None = Field(None, ge=1, le=1e6)
    """Masked importance sampling upper bound (None: MIS off)."""
    mis_level: Literal["token", "sequence"] = "token"
    """Masked importance sampling per token or per trajectory."""
    kl_coef: float = Field(0.0, ge=0, le=100)
    """k3 KL penalty to the SFT checkpoint (0: no reference model is kept)."""
    scale_adv_by_std: bool = False
    """Divide advantages by the group's reward std (GRPO) or not (Dr. GRPO)."""
    loss_aggregation: Literal["token_mean", "sequence_mean"] = "token_mean"
    """token_mean: every scored token of a minibatch weighs the same (DAPO; long trajectories weigh more);
    sequence_mean: every trajectory weighs the same (the original GRPO)."""
    micro_batch_tokens: int = Field(8192, ge=2, le=100_000_000)
    """Most tokens in one forward/backward, counted padded (rows x longest row). The torch backend computes only
    the real ones (the rows packed into one, the LM head at scored tokens); megatron the padded rows."""
    ppo_epochs: int = Field(1, ge=1, le=100)
    """Passes over each step's batch (optimizer updates per step = ppo_epochs x num_minibatches)."""
    num_minibatches: int = Field(1, ge=1, le=10_000)
    """Parts each pass splits the batch into, one optimizer update each."""

    @model_validator(mode="after")
    def _consistent(self) -> GRPOAlgorithmConfig:
        if self.mis_high is not None and self.mis_low >= self.mis_high:
            raise ValueError(f"mis_low ({self.mis_low}) must be below mis_high ({self.mis_high})")
        if self.mis_high is not None and self.tis_cap <= self.mis_low:
            raise ValueError(
                f"tis_cap ({self.tis_cap}) <= mis_low ({self.mis_low}): every kept weight is truncated"
            )
        return self


class GRPOEvalConfig(StrictModel):
    """async: evaluation of exported checkpoints beside training (swerl.stages.grpo_eval)."""

    every: int = Field(0, ge=0, le=10_000_000)
    """Every this many trainer steps, the weights just exported are evaluated on the held-out split beside training
    (its own engine and sandbox pool; neither trainer nor rollouts wait for it); 0: off."""
    tasks: int = Field(16, ge=1, le=10_000_000)
    """Held-out tasks per evaluation (the evaluate stage's stratified subset of this size)."""
    attempts: int = Field(1, ge=1, le=10_000)
    """Attempts per held-out task."""
    concurrency: int = Field(4, ge=1, le=1_000_000)
    """An evaluation's episodes at once: its engine's concurrency and the most sandboxes of its own pool (apart
    from grpo.rollout.max_in_flight and agent.sandbox.pool, which stay the rollouts')."""
    temperature: float = Field(0.7, ge=0, le=10)
    """Sampling temperature of the evaluation (0: greedy)."""
    grader: Literal["swebench", "episode"] = "episode"
    """The episode's in-workspace grade (the training reward), or swebench log grading of each patch in a fresh
    sandbox (as the evaluate stage; extra `swebench`)."""
    at_end: Literal["wait", "cancel"] = "wait"
    """An evaluation still running when training ends is awaited (and logged), or cancelled."""
    at_start: bool = False
    """Also evaluate the starting weights (step 0: the SFT model) beside the first steps, on the same tasks, so the
    learning curve starts where GRPO started (not on a resumed run: its step 0 was evaluated before)."""


_GRPO_SECTIONS: dict[str, type[StrictModel]] = {
    "schedule": GRPOScheduleConfig,
    "rollout": GRPORolloutConfig,
    "algorithm": GRPOAlgorithmConfig,
}
GRPO_MOVED_KEYS: dict[str, str] = {
    **{key: f"{section}.{key}" for section, model in _GRPO_SECTIONS.items() for key in model.model_fields},
    "rollout_concurrency": "rollout.concurrency",
    **{f"eval_{key}": f"eval.{key}" for key in GRPOEvalConfig.model_fields},
}
"""Flat grpo keys of earlier swerl versions and where each lives now (an old key is an error naming the new one)."""


class GRPOPhaseTasks(StrictModel):
    """Which training tasks a phase's groups run: a task passes when it matches every list given (an empty list
    matches all). The data stream stays the one seeded order over the training split; a phase skips the positions
    whose task it excludes (so phases hand over the data position, and a later phase without a filter continues
    the stream where the earlier one stopped)."""

    difficulties: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(default_factory=list)
    """Task difficulty labels (the curate stage's: e.g. easy, medium, hard)."""
    repos: list[Annotated[str, Field(min_length=1, max_length=300)]] = Field(default_factory=list)
    """Repository names (a task's `repo`)."""
    modifiers: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(default_factory=list)
    """Bug modifiers that made the task (synthesized tasks)."""

    def matches(self, difficulty: str | None, repo: str, modifier: str | None) -> bool:
        return ((not self.difficulties or difficulty in self.difficulties)
                and (not self.repos or repo in self.repos)
                and (not self.modifiers or modifier in self.modifiers))  # fmt: skip


PHASE_SECTIONS = ("grpo", "agent", "engine")
"""Config sections a GRPO phase may change (each against the base settings, not the previous phase's)."""
PHASE_FIXED_KEYS: dict[str, str] = {
    "grpo.phases": "phases do not nest",
    "grpo.mode": "every phase continues the same loop's state (sync and async checkpoints differ)",
    "grpo.distributed": "every phase loads the previous phase's checkpoint, written by the same trainer layout",
    "grpo.schedule.steps": "a phase's own steps are grpo.phases[i].steps",
    "grpo.schedule.task_seed_offset": "one seeded data stream runs through all phases (use grpo.phases[i].tasks "
    "to choose tasks)",
}
"""Keys a phase may not change, and why."""


class GRPOPhaseConfig(StrictModel):
    """One GRPO phase: its own stage (stage name grpo-NAME), trained from the previous phase's checkpoint (the SFT
    model for the first), with what it changes against the base grpo/agent/engine settings."""

    name: str = Field(min_length=1, max_length=40, pattern=r"^[a-z0-9][a-z0-9_]*$")
    """The phase's name: its stage is `grpo-NAME` (manifest, MLflow run, Prefect task, evaluate.checkpoints)."""
    steps: int = Field(ge=0, le=10_000_000)
    """GRPO steps this phase trains; the step axis continues from the previous phase's last step."""
    reset_optimizer: bool = False
    """Start with a fresh optimizer (the weights, step, data position and RNG still come from the previous
    phase); False: the previous phase's optimizer state (AdamW moments) carries on, at this phase's settings."""
    tasks: GRPOPhaseTasks | None = None
    """Which training tasks this phase's groups run (async mode); None: every task."""
    grpo: dict[str, Any] = Field(default_factory=dict)
    """Changes to the base grpo settings, as nested keys (e.g. {algorithm: {lr: 5.0e-5}})."""
    agent: dict[str, Any] = Field(default_factory=dict)
    """Changes to the base agent settings (e.g. {max_trajectory_tokens: 1536, max_turns: 8})."""
    engine: dict[str, Any] = Field(default_factory=dict)
    """Changes to the base engine settings (e.g. {max_context_tokens: 2048})."""


@dataclass(frozen=True)
class ResolvedPhase:
    """A GRPO phase with its effective settings (the base settings with its changes applied)."""

    index: int
    name: str
    stage: str
    """`grpo` for the single default phase (no grpo.phases), else `grpo-NAME`."""
    steps: int
    reset_optimizer: bool
    tasks: GRPOPhaseTasks | None
    grpo: GRPOConfig
    agent: AgentConfig
    engine: EngineConfig


def deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` in place, section by section (a list or a value replaces the base's whole); neither is
    modified. What a GRPO phase and a partial run parameter do to a config."""
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _flat_keys(data: dict[str, Any], prefix: str) -> list[str]:
    keys = []
    for key, value in data.items():
        path = f"{prefix}.{key}"
        keys.append(path)
        if isinstance(value, dict):
            keys += _flat_keys(value, path)
    return keys


class GRPOConfig(StrictModel):
    """GRPO on the SFT checkpoint: B groups of n attempts per step, token-level clipped loss, TIS/MIS; sync or
    fully asynchronous (swerl.rollout)."""

    form_first = ("schedule", "phases")

    mode: Literal["sync", "async"] = "sync"
    """sync: sample B x n, then train (the baseline); async: rollouts never stop, the trainer takes finished groups."""
    threads: int = Field(2, ge=1, le=1024)
    """torch intra-op threads for the update."""
    trainer_process: bool = False
    """Run the trainer in a spawned process of its own (swerl.train.trainer_process): its update does not hold the
    rollouts' interpreter (GIL) while the async loop keeps sampling. False: a thread of the stage's process."""
    schedule: GRPOScheduleConfig = Field(default_factory=GRPOScheduleConfig)
    """Steps, batch size, checkpoints, time budget."""
    rollout: GRPORolloutConfig = Field(default_factory=GRPORolloutConfig)
    """Group size, sampling, in-flight and staleness bounds."""
    algorithm: GRPOAlgorithmConfig = Field(default_factory=GRPOAlgorithmConfig)
    """Optimizer and loss of each update."""
    eval: GRPOEvalConfig = Field(default_factory=GRPOEvalConfig)
    """Evaluation beside training (async)."""
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    """Trainer processes, devices, sharding (the default: one CPU process; fsdp2 and megatron always run their ranks
    in processes of their own, whatever trainer_process says)."""
    phases: list[GRPOPhaseConfig] | None = None
    """GRPO in phases, each its own checkpointed stage (grpo-NAME) started from the previous one's checkpoint and
    changing what it names against these base settings (e.g. a tighter trajectory cap, a learning-rate drop, easier
    tasks first). None: one phase with these settings, the stage `grpo`."""

    @model_validator(mode="before")
    @classmethod
    def _no_moved_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            moved = {key: GRPO_MOVED_KEYS[key] for key in data if key in GRPO_MOVED_KEYS}
            if moved:
                where = ", ".join(f"grpo.{old} is now grpo.{new}" for old, new in moved.items())
                raise ValueError(f"renamed keys: {where}")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> GRPOConfig:
        if self.eval.every > 0 and self.mode != "async":
            raise ValueError(
                f"eval.every ({self.eval.every}) needs mode async: sync mode evaluates after training only "
                "(the evaluate stage)"
            )
        r = self.rollout
        adaptive = {"probe_attempts": r.probe_attempts, "replay_share": r.replay_share,
                    "stratify_by": r.stratify_by}  # fmt: skip
        if self.mode != "async" and any(adaptive.values()):
            raise ValueError(
                f"grpo.rollout {adaptive} need mode async (the sync loop rolls whole groups in order)"
            )
        if r.probe_attempts >= r.attempts_per_task:
            raise ValueError(f"grpo.rollout.probe_attempts ({r.probe_attempts}) must be below attempts_per_task "
                             f"({r.attempts_per_task}): the probe is the first part of a group")  # fmt: skip
        if r.replay_share > 0 and r.prewarm_groups > 0:
            raise ValueError("grpo.rollout.prewarm_groups needs each group's task before it opens: set it to 0 with "
                             f"replay_share ({r.replay_share}) > 0, whose tasks come from outcomes")  # fmt: skip
        if r.stratify_by is not None and r.prewarm_groups > 0:
            raise ValueError("grpo.rollout.prewarm_groups needs each group's task before it opens: set it to 0 with "
                             f"stratify_by ({r.stratify_by!r}), whose fresh picks depend on outcomes")  # fmt: skip
        if r.replay_share > 0 and r.max_visits < 2:
            raise ValueError(f"grpo.rollout.replay_share ({r.replay_share}) > 0 needs max_visits >= 2 (a task's "
                             f"replay is its second visit), got {r.max_visits}")  # fmt: skip
        if self.mode == "async" and self.buffered_groups < self.schedule.tasks_per_step:
            raise ValueError(
                f"schedule.tasks_per_step (B = {self.schedule.tasks_per_step}) exceeds rollout.max_buffered_groups "
                f"({self.buffered_groups}): the trainer would wait for more finished groups than rollouts may "
                "ever hold"
            )
        return self

    @property
    def buffered_groups(self) -> int:
        """Finished, untrained groups held at most (async)."""
        if self.rollout.max_buffered_groups is not None:
            return self.rollout.max_buffered_groups
        return self.schedule.tasks_per_step * (self.rollout.max_staleness + 1)


CHECKPOINT_NAMES: tuple[str, ...] = ("base", "sft", "grpo")
"""Models the evaluate stage can name: base and sft (from the sft stage), grpo (every GRPO phase among its inputs),
and grpo-NAME (one phase of grpo.phases)."""


class EvaluateConfig(StrictModel):
    """Held-out evaluation: a stratified subset, k attempts per task, pass@k with bootstrap CIs, paired tests."""

    form_first = ("max_tasks", "checkpoints")

    checkpoints: list[Annotated[str, Field(pattern=r"^(base|sft|grpo|grpo-[a-z0-9][a-z0-9_]*)$")]] = Field(
        default_factory=lambda: list(CHECKPOINT_NAMES), min_length=1
    )
    """Which models are evaluated, each on the same tasks (those whose stage is among the inputs): base, sft, grpo
    (every GRPO phase: the one `grpo` stage, or each grpo-NAME of grpo.phases) or grpo-NAME (that phase)."""
    max_tasks: int = Field(100, ge=1, le=10_000_000)
    """Subset size: held-out tasks drawn proportionally from repository x difficulty strata (an error if the
    held-out set is smaller)."""
    dataset: DatasetSource | None = None
    """Evaluate on these tasks instead of the curate stage's held-out split (e.g. SWE-bench/SWE-bench_Verified,
    split test, schema swebench: swebench 5's rows, each with its eval_script; or another curate stage's
    eval.parquet, schema swerl); each task keeps its environment. None: the held-out split."""
    split: Literal["held_out", "train"] = "held_out"
    """Without `dataset`: the curate stage's held-out split, or its training split (the tasks SFT and GRPO trained on,
    a fixed stratified probe set of max_tasks: how well training fitted them, not generalisation; the report says
    which split it is)."""
    by_difficulty: bool = True
    """Strata are repository x difficulty; False (or a dataset without labels): repository only."""
    grader: Literal["swebench", "episode"] = "swebench"
    """swebench: each attempt's patch re-run in a fresh sandbox, its test log graded by the swebench package
    (extra `swebench`); episode: the episode's own in-workspace grade."""
    comparison_samples: int = Field(10_000, ge=100, le=10_000_000)
    """Paired bootstrap resamples and Monte Carlo sign flips of a paired comparison of two checkpoints."""
    attempts: int = Field(2, ge=1, le=10_000)
    """k attempts per task."""
    temperature: float = Field(0.7, ge=0, le=10)
    """Sampling temperature (0: greedy)."""
    concurrency: int = Field(8, ge=1, le=1_000_000)
    """Episodes running at once."""
    bootstrap_samples: int = Field(2000, ge=100, le=10_000_000)
    """Bootstrap resamples (over tasks) of each pass@k confidence interval."""
    confidence: float = Field(0.95, gt=0, lt=1)
    """Confidence level of the intervals (and 1 - the significance level of comparisons)."""
    threads: int = Field(1, ge=1, le=1024)
    """torch intra-op threads of the engine."""
    max_missing_share: float = Field(0.2, ge=0, le=1)
    """A model with more than this share of its tasks missing (no valid attempt) fails the stage, naming them."""


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
    """Flow runs executed at once: by `swerl up`'s Prefect worker (its work pool's concurrency limit) and by a
    foreground `swerl serve` (the Prefect runner's limit)."""


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


class ClusterConfig(StrictModel):
    """The machines a run is planned on (`swerl plan`, swerl.plan): nodes of identical GPUs. No stage reads it:
    it places engines and trainer ranks on GPUs and checks that each one's memory fits before a run starts.

    Placement: engines take GPUs first, in (node, index) order (engine i: tp_size GPUs from i x tp_size), the
    trainer the GPUs after them; with engine_nodes, engines own whole nodes and the trainer starts on the node
    after them. A trainer on cuda runs one rank per GPU: its ranks must equal its GPUs."""

    nodes: int = Field(1, ge=1, le=4096)
    """Machines in the cluster, all alike."""
    gpus_per_node: int = Field(0, ge=0, le=64)
    """GPUs per machine; 0: CPU machines (the plan then reports host memory and processes and checks those)."""
    gpu_memory_gib: float = Field(80.0, gt=0, le=4096)
    """Memory of one GPU, in GiB (2^30 bytes)."""
    engine_nodes: int | None = Field(None, ge=0, le=4096)
    """Nodes given to the engines whole (the recipe: inference and training on separate nodes); the trainer
    starts on the next node. None: the engines take the first num_engines x tp_size GPUs and the trainer the
    ones right after them, on the same node where there is room."""
    trainer_gpus: int | None = Field(None, ge=1, le=1_000_000)
    """GPUs of the trainer, placed after the engines'; None: every GPU the engines do not take."""
    usable_memory_fraction: float = Field(0.9, gt=0, le=1)
    """Share of a trainer GPU's memory (and of a node's host memory) the plan lets the estimate fill; the rest is
    the CUDA context, NCCL buffers, the allocator's fragmentation and the estimate's error. SGLang engines are
    checked against engine.mem_fraction_static instead, as SGLang budgets them."""
    host_memory_gib: float | None = Field(None, gt=0, le=1_048_576)
    """Memory of one node's host, in GiB; None: this machine's (MemTotal)."""
    model_config_path: str | None = Field(None, alias="model_config", min_length=1, max_length=4096)
    """The model's architecture for the plan when sft.model_path has no config.json here (a cluster's model folder
    is absent on a laptop): a path to a Hugging Face config.json, or the name of one swerl ships
    (swerl/data/resources/architectures/NAME.json: `qwen3-30b-a3b`). Only architecture numbers are read."""


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
            raise ValueError(f"evaluate.checkpoints names GRPO phase(s) {unknown} that grpo.phases does not "
                             f"define; phases: {have}")  # fmt: skip
        return self

    def grpo_phases(self) -> list[ResolvedPhase]:
        """The GRPO phases in order, each with its effective grpo/agent/engine settings; without grpo.phases, one
        phase (stage `grpo`) with the base settings. ValueError naming the phase and key for bad input."""
        if self.grpo.phases is None:
            return [ResolvedPhase(0, "grpo", "grpo", self.grpo.schedule.steps, False, None, self.grpo, self.agent,
                                  self.engine)]  # fmt: skip
        if not self.grpo.phases:
            raise ValueError("grpo.phases is an empty list: give at least one phase, or leave grpo.phases out for "
                             "one phase with the base grpo settings")  # fmt: skip
        seen: set[str] = set()
        out = []
        for i, phase in enumerate(self.grpo.phases):
            where = f"grpo.phases[{i}] ({phase.name})"
            if phase.name in seen:
                raise ValueError(
                    f"{where}: name {phase.name!r} is used by an earlier phase; names must differ"
                )
            seen.add(phase.name)
            out.append(self._resolve_phase(i, phase, where))
        return out

    def phase_variants(self) -> list[tuple[str, PipelineConfig]]:
        """The whole config as each GRPO phase runs it (its grpo, agent and engine in place of the base's), for
        the checks made before a run (`swerl plan`, `swerl doctor`); one (stage grpo, this config) without phases."""
        if self.grpo.phases is None:
            return [("grpo", self)]
        return [(p.stage, self.model_copy(update={"grpo": p.grpo, "agent": p.agent, "engine": p.engine}))
                for p in self.grpo_phases()]  # fmt: skip

    def _resolve_phase(self, index: int, phase: GRPOPhaseConfig, where: str) -> ResolvedPhase:
        changes = {"grpo": phase.grpo, "agent": phase.agent, "engine": phase.engine}
        for section, body in changes.items():
            for key in _flat_keys(body, section):
                if key in PHASE_FIXED_KEYS:
                    raise ValueError(f"{where}: {key} cannot change in a phase: {PHASE_FIXED_KEYS[key]}")
        models: dict[str, BaseModel] = {}
        for section, body in changes.items():
            base = getattr(self, section).model_dump(mode="json", by_alias=True)
            if section == "grpo":
                base["phases"] = None
                base["schedule"]["steps"] = phase.steps
            cls = type(getattr(self, section))
            try:
                models[section] = cls.model_validate(deep_merge(base, body))
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join([section, *(str(p) for p in err['loc'])])}: {err['msg']}"
                    for err in exc.errors()
                )
                raise ValueError(f"{where}: {problems}") from None
        g, agent, engine = models["grpo"], models["agent"], models["engine"]
        assert (
            isinstance(g, GRPOConfig) and isinstance(agent, AgentConfig) and isinstance(engine, EngineConfig)
        )
        if agent.max_trajectory_tokens > engine.max_context_tokens:
            raise ValueError(
                f"{where}: agent.max_trajectory_tokens ({agent.max_trajectory_tokens}) exceeds the phase's "
                f"engine.max_context_tokens ({engine.max_context_tokens}): a phase cannot loosen a cap beyond the "
                "engine's context"
            )
        if phase.tasks is not None and g.mode != "async":
            raise ValueError(f"{where}: tasks needs grpo.mode async (the sync loop takes B tasks in order)")
        if g.distributed.backend == "megatron" and index > 0:
            if phase.reset_optimizer:
                raise ValueError(f"{where}: reset_optimizer is not built for the megatron backend")
            if (
                g.algorithm.lr != self.grpo.algorithm.lr
                or g.algorithm.weight_decay != self.grpo.algorithm.weight_decay
            ):
                raise ValueError(f"{where}: grpo.algorithm.lr / weight_decay cannot change between phases with the "
                                 "megatron backend (its optimizer state carries them)")  # fmt: skip
        return ResolvedPhase(index, phase.name, f"grpo-{phase.name}", phase.steps, phase.reset_optimizer,
                             phase.tasks, g, agent, engine)  # fmt: skip

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
        key = ".".join(str(p) for p in err["loc"])
        if not key:  # a check across sections: its message names its keys
            lines.append(f"  {err['msg'].removeprefix('Value error, ')}")
            continue
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
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {source} is not UTF-8 text: {exc}") from exc
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
