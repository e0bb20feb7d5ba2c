"""Environments by repository: tasks of one environment share one preparation, done ahead of need at a set rate.

An environment is what a sandbox starts from: a repository directory for the local backend, an image for docker,
a template for e2b. `EnvironmentBackend` is the interface a backend implements (`key` names the environment a
task needs, `prepare` builds, pulls or materializes it and returns the handle `SandboxProvider.start` takes).
`EnvironmentPlanner` groups work by environment, prepares each once, in order of first need, no faster than a
token bucket allows (registries limit pulls per hour), and hands episodes the prepared handle.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from swerl.data.environments import task_env
from swerl.data.schema import TaskInstance
from swerl.errors import InfraError
from swerl.sandbox.base import Environment
from swerl.sandbox.ratelimit import TokenBucket


@runtime_checkable
class EnvironmentBackend(Protocol):
    """Prepares the environments a backend's sandboxes start from."""

    def key(self, task: TaskInstance) -> str:
        """The environment a task needs (tasks with equal keys share one preparation)."""
        ...

    async def prepare(self, task: TaskInstance) -> Environment:
        """Build, pull or materialize the task's environment; InfraError(image_missing) if it cannot exist."""
        ...


class LocalEnvironments:
    """The local backend's environments: repository directories (micro repositories are generated on disk)."""

    def key(self, task: TaskInstance) -> str:
        return task.image

    async def prepare(self, task: TaskInstance) -> Environment:
        return await asyncio.to_thread(task_env, task)


class ProviderEnvironments(LocalEnvironments):
    """Environments of a backend that builds something from them: the docker backend's `environment_image(env)`
    builds (or reuses) a repository's image, or checks (and within its pull budget pulls) a task's image and
    builds the sandbox layer on it; a backend without it needs none."""

    def __init__(self, provider: object) -> None:
        self.provider = getattr(provider, "provider", provider)  # a SandboxPool's backend

    async def prepare(self, task: TaskInstance) -> Environment:
        env_dir = await super().prepare(task)
        build = getattr(self.provider, "environment_image", None)
        if build is not None:
            await build(env_dir)
        return env_dir


def group_by_environment(tasks: Iterable[TaskInstance], backend: EnvironmentBackend) -> dict[str, list[TaskInstance]]:
    """Tasks grouped by the environment they need, environments in order of first need."""
    groups: dict[str, list[TaskInstance]] = {}
    for task in tasks:
        groups.setdefault(backend.key(task), []).append(task)
    return groups


class EnvironmentPlanner:
    """Prepares each environment once, ahead of need, at most `pulls_per_minute` (token bucket) and `parallel`
    at a time; `environment(task)` returns the prepared handle, preparing it now if nobody asked before."""

    def __init__(self, backend: EnvironmentBackend, *, pulls_per_minute: float, burst: int, parallel: int = 2) -> None:
        self.backend = backend
        self.bucket = TokenBucket(pulls_per_minute / 60.0, burst)
        self._parallel = asyncio.Semaphore(parallel)
        self._prepared: dict[str, asyncio.Task[Environment]] = {}
        self.counters: Counter[str] = Counter()
        self.seconds: dict[str, float] = {}
        """Preparation wall clock per environment (rate-limit waits excluded)."""

    def prepare_ahead(self, tasks: Iterable[TaskInstance]) -> list[str]:
        """Schedule every environment these tasks need, in order of first need; returns the new ones."""
        new = []
        for key, group in group_by_environment(tasks, self.backend).items():
            if key not in self._prepared:
                self._prepared[key] = asyncio.ensure_future(self._prepare(key, group[0]))
                new.append(key)
        return new

    async def environment(self, task: TaskInstance) -> Environment:
        """The task's prepared environment (InfraError(image_missing) if its preparation failed)."""
        self.prepare_ahead([task])
        return await asyncio.shield(self._prepared[self.backend.key(task)])

    async def prepare_all(self, tasks: Iterable[TaskInstance]) -> dict[str, Environment | InfraError]:
        """Prepare every environment before a run; failures are returned by key, not raised."""
        self.prepare_ahead(tasks)
        results: dict[str, Environment | InfraError] = {}
        for key, task in list(self._prepared.items()):
            try:
                results[key] = await asyncio.shield(task)
            except InfraError as exc:
                results[key] = exc
        return results

    async def _prepare(self, key: str, task: TaskInstance) -> Environment:
        async with self._parallel:
            waited = await self.bucket.acquire()
            self.counters["rate_limited_s"] += int(waited)
            started = time.monotonic()
            try:
                handle = await self.backend.prepare(task)
            except InfraError:
                self.counters["failed"] += 1
                raise
            self.seconds[key] = time.monotonic() - started
            self.counters["prepared"] += 1
            return handle

    async def __aenter__(self) -> EnvironmentPlanner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Cancel preparations nobody waits for any more."""
        for task in self._prepared.values():
            task.cancel()
        await asyncio.gather(*self._prepared.values(), return_exceptions=True)
