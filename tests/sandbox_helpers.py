"""Sandbox providers and pools as the config's defaults build them, with only what a test changes named.

`resources(memory_mb=512)` is the builder (swerl.stages.common.sandbox_resources) applied to the config's
defaults (SandboxLimits()), with memory_mb replaced; `pool_limits(...)` is the same for the pool. The backends'
helpers take resource limits and the backend's own arguments by name, mixed: `local_provider(max_processes=16,
git_baseline=True)`. Overrides replace fields after the builder ran, so a test may go below the config's bounds
(max_output_bytes=1000).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

from swerl.config.sandbox import SandboxLimits, SandboxPoolConfig
from swerl.sandbox.base import SandboxProvider, SandboxResources
from swerl.sandbox.docker import DockerSandboxProvider
from swerl.sandbox.e2b import E2BSandboxProvider
from swerl.sandbox.local import LocalSandboxProvider
from swerl.sandbox.pool import PoolLimits, SandboxPool
from swerl.stages.common import pool_limits as build_pool_limits
from swerl.stages.common import sandbox_resources

_RESOURCE_FIELDS = frozenset(f.name for f in dataclasses.fields(SandboxResources))
_POOL_FIELDS = frozenset(f.name for f in dataclasses.fields(PoolLimits))


def resources(**overrides: Any) -> SandboxResources:
    """The config's default sandbox limits through the builder, with `overrides` replacing fields."""
    return dataclasses.replace(sandbox_resources(SandboxLimits()), **overrides)


def pool_limits(**overrides: Any) -> PoolLimits:
    """The config's default pool limits through the builder, with `overrides` replacing fields."""
    if "retry_causes" in overrides:
        overrides["retry_causes"] = frozenset(overrides["retry_causes"])
    return dataclasses.replace(build_pool_limits(SandboxPoolConfig()), **overrides)


def _split(overrides: dict[str, Any]) -> tuple[SandboxResources, dict[str, Any]]:
    """(resources with the overrides naming a resource limit, the other overrides: the backend's arguments)."""
    limits = {k: v for k, v in overrides.items() if k in _RESOURCE_FIELDS}
    return resources(**limits), {k: v for k, v in overrides.items() if k not in _RESOURCE_FIELDS}


def local_provider(python: str | os.PathLike[str] | None = None, **overrides: Any) -> LocalSandboxProvider:
    """A LocalSandboxProvider with the config's defaults (SandboxLimits()) but for `overrides`: resource limits
    and LocalSandboxProvider's keyword arguments (root_dir, runtime, workspace_quota, git_baseline, bwrap, ...)."""
    config = SandboxLimits()
    res, backend = _split(overrides)
    backend = {
        "root_dir": config.workspace_dir,
        "workspace_quota": config.workspace_quota,
        "runtime": config.runtime,
        **backend,
    }
    return LocalSandboxProvider(python or config.python or sys.executable, res, **backend)


def docker_provider(**overrides: Any) -> DockerSandboxProvider:
    """A DockerSandboxProvider with the config's defaults (SandboxLimits().docker) but for `overrides`: resource
    limits and DockerSandboxProvider's keyword arguments (base_image, api_threads, docker_host, ...)."""
    config = SandboxLimits().docker
    res, backend = _split(overrides)
    backend = {
        "base_image": config.base_image,
        "cpus": config.cpus,
        "kill_grace_s": config.kill_grace_s,
        "max_lifetime_s": config.max_lifetime_s,
        "api_threads": config.api_threads,
        "api_timeout_s": config.api_timeout_s,
        **backend,
    }
    return DockerSandboxProvider(res, **backend)


def e2b_provider(**overrides: Any) -> E2BSandboxProvider:
    """An E2BSandboxProvider with the config's defaults (SandboxLimits().e2b) but for `overrides`: resource limits
    and E2BSandboxProvider's keyword arguments (template, exec_grace_s, sdk, api_key, git_baseline, ...)."""
    config = SandboxLimits().e2b
    res, backend = _split(overrides)
    backend = {
        "template": config.template,
        "lifetime_s": config.lifetime_s,
        "request_timeout_s": config.request_timeout_s,
        "exec_grace_s": config.exec_grace_s,
        **backend,
    }
    return E2BSandboxProvider(res, **backend)


def pool_around(provider: SandboxProvider, **overrides: Any) -> SandboxPool:
    """A SandboxPool around `provider` with the config's default pool limits but for `overrides`: pool limits and
    SandboxPool's keyword arguments (clock, owns_provider)."""
    limits = {k: v for k, v in overrides.items() if k in _POOL_FIELDS}
    rest = {k: v for k, v in overrides.items() if k not in _POOL_FIELDS}
    return SandboxPool(provider, pool_limits(**limits), **rest)
