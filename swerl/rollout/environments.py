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
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol, runtime_checkable

from swerl.data.environments import environment_dir
from swerl.data.schema import TaskInstance
from swerl.errors import InfraError


@runtime_checkable
class EnvironmentBackend(Protocol):
    """Prepares the environments a backend's sandboxes start from."""

    def key(self, task: TaskInstance) -> str:
        """The environment a task needs (tasks with equal keys share one preparation)."""
        ...

    async def prepare(self, task: TaskInstance) -> Path:
        """Build, pull or materialize the task's environment; InfraError(image_missing) if it cannot exist."""
        ...


class LocalEnvironments:
    """The local backend's environments: repository directories (micro repositories are generated on disk)."""

    def key(self, task: TaskInstance) -> str:
        return task.image

    async def prepare(self, task: TaskInstance) -> Path:
        return await asyncio.to_thread(environment_dir, task)


class ProviderEnvironments(LocalEnvironments):
    """Environments of a backend that builds something from the repository directory: the docker backend's
    `environment_image(env_dir)` builds (or reuses) the repository's image; a backend without it needs none."""

    def __init__(self, provider: object) -> None:
        self.provider = getattr(provider, "provider", provider)  # a SandboxPool's backend

    async def prepare(self, task: TaskInstance) -> Path:
        env_dir = await super().prepare(task)
        build = getattr(self.provider, "environment_image", None)
        if build is not None:
            await build(env_dir)
        return env_dir


class TokenBucket:
    """At most `burst` acquisitions back to back, then `rate_per_s` per second on average."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(f"TokenBucket needs rate_per_s > 0 and burst >= 1, got {rate_per_s}, {burst}")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.clock = clock
        self._tokens = float(burst)
        self._updated = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate_per_s)
        self._updated = now

    async def acquire(self) -> float:
        """Take one token, waiting for it; returns the seconds waited."""
        waited = 0.0
        async with self._lock:  # first come, first served
            self._refill()
            while self._tokens < 1.0:
                pause = (1.0 - self._tokens) / self.rate_per_s
                await asyncio.sleep(pause)
                waited += pause
                self._refill()
            self._tokens -= 1.0
        return waited


def group_by_environment(
    tasks: Iterable[TaskInstance], backend: EnvironmentBackend
) -> dict[str, list[TaskInstance]]:
    """Tasks grouped by the environment they need, environments in order of first need."""
    groups: dict[str, list[TaskInstance]] = {}
    for task in tasks:
        groups.setdefault(backend.key(task), []).append(task)
    return groups


class EnvironmentPlanner:
    """Prepares each environment once, ahead of need, at most `pulls_per_minute` (token bucket) and `parallel`
    at a time; `environment(task)` returns the prepared handle, preparing it now if nobody asked before."""

    def __init__(
        self, backend: EnvironmentBackend, *, pulls_per_minute: float, burst: int, parallel: int = 2
    ) -> None:
        self.backend = backend
        self.bucket = TokenBucket(pulls_per_minute / 60.0, burst)
        self._parallel = asyncio.Semaphore(parallel)
        self._prepared: dict[str, asyncio.Task[Path]] = {}
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

    async def environment(self, task: TaskInstance) -> Path:
        """The task's prepared environment (InfraError(image_missing) if its preparation failed)."""
        self.prepare_ahead([task])
        return await asyncio.shield(self._prepared[self.backend.key(task)])

    async def prepare_all(self, tasks: Iterable[TaskInstance]) -> dict[str, Path | InfraError]:
        """Prepare every environment before a run; failures are returned by key, not raised."""
        self.prepare_ahead(tasks)
        results: dict[str, Path | InfraError] = {}
        for key, task in list(self._prepared.items()):
            try:
                results[key] = await asyncio.shield(task)
            except InfraError as exc:
                results[key] = exc
        return results

    async def _prepare(self, key: str, task: TaskInstance) -> Path:
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
