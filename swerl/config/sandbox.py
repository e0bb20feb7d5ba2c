"""Sandboxes: the limits of each one, its backend (local, docker, e2b) and the pool around it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from swerl.config.base import StrictModel
from swerl.errors import INFRA_CAUSES


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
    """Memory limit: per sandbox under the supervisor with cgroups (as root) and docker; per process (RLIMIT_AS)
    under bubblewrap, where N processes may hold up to N x memory_mb (`swerl doctor`'s sandbox_cgroups line)."""
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
