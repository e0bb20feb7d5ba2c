"""The Sandbox protocol: where an agent's commands and a task's tests run.

A command that runs past its timeout is a normal result (`timed_out=True`): the policy asked for it. A sandbox
that cannot start, dies, or stops answering raises `InfraError`, which is never scored against the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

WORKSPACE = "/workspace"
"""Where the task's repository lives inside every sandbox."""


@dataclass(frozen=True)
class SandboxResources:
    """The limits a backend enforces on each of its sandboxes; every one is required (the config's SandboxLimits
    holds the defaults, and swerl.stages.common.sandbox_resources maps it onto this).

    Local and docker enforce them all. e2b enforces max_output_bytes and start_timeout_s; the rest is the size of
    its template's VM.
    """

    memory_mb: int
    """Memory per sandbox: local, each process's address space (RLIMIT_AS); docker, the container (no swap)."""
    max_processes: int
    """Processes and threads alive in one sandbox at once (the fork-bomb guard)."""
    cpu_time_s: int
    """CPU-seconds one sandboxed process may use (RLIMIT_CPU)."""
    file_size_mb: int
    """Largest file one sandboxed process may write (RLIMIT_FSIZE)."""
    tmp_size_mb: int
    """Size of the sandbox's private tmpfs /tmp."""
    workspace_mb: int
    """Size of the writable /workspace (a tmpfs; local only where it may mount, see workspace_quota)."""
    max_open_files: int
    """Open files per sandboxed process (RLIMIT_NOFILE)."""
    max_output_bytes: int
    """Output kept from one command (its head and tail); the rest is cut, never buffered."""
    start_timeout_s: float
    """Wall clock for one start: the workspace copied, the setup patch applied, the first checks run."""


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one command: exit code, merged stdout+stderr, whether the wall clock ran out."""

    exit_code: int
    output: str
    timed_out: bool
    duration_s: float


@runtime_checkable
class Sandbox(Protocol):
    """An isolated workspace with the task's repository at /workspace."""

    async def exec(self, cmd: str, timeout: float, cwd: str | None = None) -> ExecResult:
        """Run a shell command; cwd defaults to /workspace."""
        ...

    async def read_file(self, path: str) -> str:
        """Read a text file (absolute, or relative to /workspace)."""
        ...

    async def write_file(self, path: str, content: str) -> None:
        """Write a text file under /workspace, creating parent directories."""
        ...

    async def close(self) -> None:
        """Kill everything still running and delete the workspace; idempotent."""
        ...


@runtime_checkable
class SandboxProvider(Protocol):
    """Starts sandboxes from an environment (a repository directory) with an optional setup patch applied."""

    async def start(self, env_dir: Path, setup_patch: str | None = None) -> Sandbox:
        """A fresh sandbox whose /workspace is a private copy of env_dir with setup_patch applied."""
        ...
