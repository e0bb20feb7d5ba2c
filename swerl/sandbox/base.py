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
