"""The Sandbox protocol: where an agent's commands and a task's tests run.

A command that runs past its timeout is a normal result (`timed_out=True`): the policy asked for it. A sandbox
that cannot start, dies, or stops answering raises `InfraError`, which is never scored against the policy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

WORKSPACE = "/workspace"
"""Where the task's repository lives inside every sandbox."""

IGNORED_AT_START = ".git/swerl-ignored-at-start"
IGNORED_AT_START_CMD = f"ls-files -z --others --ignored --exclude-standard --directory > {IGNORED_AT_START}"
"""Run after a sandbox's starting commit: the files and folders the repository's ignore rules kept out of it. The
agent's patch later takes new ignored files too (swerl.grading.grader.workspace_patch), never these."""


@dataclass(frozen=True)
class SandboxResources:
    """The limits a backend enforces on each of its sandboxes; every one is required (the config's SandboxLimits
    holds the defaults, and swerl.stages.common.sandbox_resources maps it onto this).

    Local and docker enforce them all. e2b enforces max_output_bytes and start_timeout_s; the rest is the size of
    its template's VM.
    """

    memory_mb: int
    """Memory: docker, the container (no swap); local under the supervisor with cgroups, the whole sandbox; local
    under bubblewrap (or without cgroups), each process's address space (RLIMIT_AS), so N processes may hold up to
    N x memory_mb (the provider's limits() says which: memory_per_sandbox 1 or 0)."""
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
class ImageEnvironment:
    """A container image that holds a task's repository (SWE-smith, SWE-bench and Harbor tasks).

    Every backend shows the repository at WORKSPACE, a private copy per sandbox, and puts a symlink to WORKSPACE
    where the image kept it (`repo_dir`), so the image's editable installs and scripts that `cd /testbed` see the
    sandbox's copy. The copy carries no git history (history can hold the fix: SWE-bench images keep every
    upstream commit, SWE-smith's bug is a commit on top of the clean one).
    """

    image: str
    """The image as the local Docker engine names it (name:tag, or an id)."""
    repo_dir: str | None = None
    """Where the image holds the repository; None: the image's WORKDIR (SWE-bench and SWE-smith: /testbed)."""
    path_prepend: tuple[str, ...] = ()
    """Directories put before the image's PATH in every command (e.g. a conda environment's bin)."""

    def __post_init__(self) -> None:
        if not self.image or any(c.isspace() for c in self.image) or "\0" in self.image:
            raise ValueError(f"ImageEnvironment: {self.image!r} is not an image reference")
        if self.repo_dir is not None and (not self.repo_dir.startswith("/") or self.repo_dir.rstrip("/") == ""):
            raise ValueError(
                f"ImageEnvironment({self.image}): repo_dir {self.repo_dir!r} must be an absolute path other than /"
            )


@dataclass(frozen=True)
class VenvEnvironment:
    """A repository directory on the host that runs with an interpreter of its own (a real repository curated
    from `curate.repos`, with its own virtualenv: swerl.data.repoenv), never the provider's.

    The local backend runs its sandboxes with `python` (its prefix bound read-only, its bin/ first on PATH); the
    docker backend builds an image with `requirements` installed (swerl.sandbox.images.build_project_image), the
    repository's `python_path` on the path; e2b refuses it (InfraError(image_missing))."""

    path: Path
    """The repository directory, copied into every sandbox's /workspace."""
    python: str
    """The environment's interpreter on the host (absolute)."""
    key: str = ""
    """The environment's identity (swerl.data.repoenv's key): names images built from it."""
    requirements: tuple[str, ...] = ()
    """What is installed in it, pinned (pytest, the test requirements, the repository's dependencies)."""
    python_path: str = ""
    """The repository's subdirectory its packages are imported from ('' the root, e.g. 'src')."""

    def __post_init__(self) -> None:
        if not os.path.isabs(self.python):
            raise ValueError(f"VenvEnvironment({self.path}): python {self.python!r} must be an absolute path")


Environment = Path | ImageEnvironment | VenvEnvironment
"""What a sandbox starts from: a repository directory on the host (run with the provider's interpreter, or with
its own: VenvEnvironment), or a container image holding one."""


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
    """Starts sandboxes from an environment (a repository directory, or an image holding one) with an optional
    setup patch applied. A backend that cannot run an ImageEnvironment raises InfraError(image_missing) saying
    why."""

    async def start(self, env_dir: Environment, setup_patch: str | None = None) -> Sandbox:
        """A fresh sandbox whose /workspace is a private copy of the environment's repository, setup_patch
        applied."""
        ...
