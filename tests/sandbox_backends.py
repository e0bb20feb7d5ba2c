"""Sandbox backends as the conformance and security suites see them: a provider plus a way to find leftovers.

Adding a backend to the suites is one entry in BACKENDS: a factory taking (scratch dir, limits) and returning a
Backend. Docker backends are skipped, with the reason, only when no Docker engine answers.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from swerl.sandbox.base import SandboxProvider
from swerl.sandbox.docker import LABEL
from swerl.sandbox.images import BASE_IMAGE
from swerl.sandbox.local import LocalSandboxProvider
from tests.sandbox_helpers import docker_provider, e2b_provider, local_provider


@dataclass
class Backend:
    name: str
    provider: SandboxProvider
    leftovers: Callable[[], list[str]]
    """What this backend's sandboxes left behind (workspaces, containers); empty once every sandbox is closed."""
    teardown: Callable[[], None] = field(default=lambda: None)


@dataclass(frozen=True)
class Limits:
    """Small limits so bombs stay bounded on a 2-core host."""

    memory_mb: int = 512
    max_processes: int = 64
    tmp_size_mb: int = 16
    file_size_mb: int = 16
    workspace_mb: int = 64
    max_output_bytes: int = 1_000_000
    cpu_time_s: int = 60


def local_backend(scratch: Path, limits: Limits, **kwargs: Any) -> Backend:
    root = scratch / "local-sandboxes"
    provider = local_provider(
        sys.executable,
        memory_mb=max(limits.memory_mb, 1024),  # an address-space limit: the interpreter maps more than it uses
        max_processes=limits.max_processes,
        tmp_size_mb=limits.tmp_size_mb,
        file_size_mb=limits.file_size_mb,
        max_output_bytes=limits.max_output_bytes,
        cpu_time_s=limits.cpu_time_s,
        root_dir=root,
        workspace_mb=limits.workspace_mb,
        **kwargs,
    )
    name = "local-bwrap" if kwargs.get("runtime") == "bubblewrap" else "local"
    return Backend(
        name,
        provider,
        lambda: local_leftovers(provider, root),
        teardown=provider.close,
    )


def local_leftovers(provider: LocalSandboxProvider, root: Path) -> list[str]:
    """Entries under root but the supervisor's mount point, which must be empty (its inits' mounts are theirs)."""
    found = []
    for path in sorted(root.glob("*")) if root.exists() else []:
        if path == provider.mount_point and not any(path.iterdir()):
            continue
        found.append(path.name)
    return found


def local_bwrap_backend(scratch: Path, limits: Limits, **kwargs: Any) -> Backend:
    """The local backend on bubblewrap (what runs where swerl may not mount; "local" is the supervisor as root)."""
    return local_backend(scratch, limits, runtime="bubblewrap", **kwargs)


@functools.cache
def docker_unavailable() -> str | None:
    """Why docker tests cannot run here (no engine answering), or None."""
    import docker

    try:
        client = docker.from_env(timeout=10)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return f"no Docker engine reachable ({type(exc).__name__}: {exc}); .ci/run starts one"
    return None


@functools.cache
def _base_image_ready() -> str:
    """The base image, built offline the first time (a few minutes; .ci/run builds it before the tests)."""
    from swerl.sandbox.images import build_base, image_present

    if not image_present(BASE_IMAGE):
        build_base(BASE_IMAGE)
    return BASE_IMAGE


def docker_backend(scratch: Path, limits: Limits, **kwargs: Any) -> Backend:
    reason = docker_unavailable()
    if reason:
        pytest.skip(reason)
    provider = docker_provider(
        base_image=_base_image_ready(),
        cpus=1.0,
        memory_mb=limits.memory_mb,
        max_processes=limits.max_processes,
        tmp_size_mb=limits.tmp_size_mb,
        file_size_mb=limits.file_size_mb,
        workspace_mb=limits.workspace_mb,
        max_output_bytes=limits.max_output_bytes,
        cpu_time_s=limits.cpu_time_s,
        api_threads=32,
        **kwargs,
    )
    return Backend("docker", provider, lambda: containers(provider.id), teardown=provider.close)


def containers(provider_id: str) -> list[str]:
    """Names of the containers (running or not) a docker provider started that still exist."""
    import docker

    client = docker.from_env(timeout=30)
    try:
        found = client.containers.list(all=True, filters={"label": f"{LABEL}={provider_id}"})
        return sorted(c.name for c in found)
    finally:
        client.close()


def e2b_fake_backend(scratch: Path, limits: Limits, **kwargs: Any) -> Backend:
    """The e2b backend against a FAKE of the e2b SDK (tests/doubles.py): the cloud is not reachable here."""
    pytest.importorskip("e2b")
    from tests.doubles import FakeAsyncSandbox

    root = scratch / "e2b-vms"
    root.mkdir(parents=True, exist_ok=True)
    FakeAsyncSandbox.reset(root)
    provider = e2b_provider(
        sdk=FakeAsyncSandbox,
        api_key="fake-key",
        exec_grace_s=5.0,
        max_output_bytes=limits.max_output_bytes,
        start_timeout_s=120.0,  # what these tests ran with before (E2BSandboxProvider's old default)
        **kwargs,
    )
    return Backend("e2b-fake", provider, lambda: sorted(p.name for p in root.glob("*")))


BACKENDS: dict[str, tuple[Callable[..., Backend], list[pytest.MarkDecorator]]] = {
    "local": (local_backend, []),
    "local-bwrap": (local_bwrap_backend, []),
    "docker": (docker_backend, [pytest.mark.docker]),
    "e2b-fake": (e2b_fake_backend, []),
}
"""Every backend the suites run against: name -> (factory, marks)."""


def backend_params(names: list[str] | None = None) -> list[Any]:
    return [
        pytest.param(name, marks=marks, id=name) for name, (_, marks) in BACKENDS.items() if not names or name in names
    ]


def make_backend(name: str, scratch: Path, limits: Limits = Limits(), **kwargs: Any) -> Backend:
    factory, _ = BACKENDS[name]
    return factory(scratch, limits, **kwargs)


def host_processes_matching(text: str) -> list[int]:
    """Host pids whose command line contains `text` (containers' processes are visible from the host)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline and entry.name != str(os.getpid()):
                found.append(int(entry.name))
    return found
