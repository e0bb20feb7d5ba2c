"""A pool with named limits around any SandboxProvider: concurrency, start timeout and retries, per-cause
counters, sandbox-seconds for cost, and a warm pool that hands out sandboxes started ahead of demand.

The pool is itself a SandboxProvider, so episodes, the oracle and evaluation use it unchanged. A warm sandbox is
keyed by its exact starting state (environment + setup patch): a task's n GRPO attempts share one key, so the
scheduler can warm the next tasks while the current ones run, and a hand-out is a dictionary pop.

Starts are never cancelled half-way: a start that times out, or whose caller is cancelled, keeps running in the
background and the sandbox it yields is closed on arrival. Backends copy workspaces on threads that a
cancellation cannot stop, so this is what keeps a killed episode from leaking a workspace.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swerl.errors import InfraError
from swerl.sandbox.base import Environment, ExecResult, Sandbox, SandboxProvider

log = logging.getLogger("swerl.sandbox.pool")

WarmKey = tuple[Environment, str | None]
"""(environment, setup patch): the exact starting state a warm sandbox is interchangeable for."""


def warm_key(env_dir: Environment | str, setup_patch: str | None = None) -> WarmKey:
    return (Path(env_dir) if isinstance(env_dir, str) else env_dir, setup_patch or None)


class PooledSandbox:
    """A backend sandbox handed out by the pool: counts its infrastructure errors, frees its slot on close."""

    def __init__(self, inner: Sandbox, pool: SandboxPool, requested_at: float, warm: bool) -> None:
        self.inner = inner
        self.pool = pool
        self.requested_at = requested_at
        """When the backend start was requested (billing starts there; for a warm one, its warm-up)."""
        self.warm = warm
        self.closed_at: float | None = None

    async def exec(self, cmd: str, timeout: float, cwd: str | None = None) -> ExecResult:
        try:
            return await self.inner.exec(cmd, timeout, cwd)
        except InfraError as exc:
            self.pool.counters[f"infra.{exc.cause}"] += 1
            raise

    async def read_file(self, path: str) -> str:
        return await self.inner.read_file(path)

    async def write_file(self, path: str, content: str) -> None:
        await self.inner.write_file(path, content)

    def seconds(self) -> float:
        """Sandbox-seconds so far (start request to close)."""
        return (self.closed_at or self.pool.clock()) - self.requested_at

    async def close(self) -> None:
        if self.closed_at is not None:
            return
        self.closed_at = self.pool.clock()
        try:
            await asyncio.shield(self.pool._close_inner(self.inner))
        finally:
            self.pool._retire(self)


@dataclass
class _Warm:
    """Ready sandboxes for one key, and how many the pool keeps there."""

    target: int
    ready: list[tuple[Sandbox, float]] = field(default_factory=list)
    starting: int = 0
    refill: bool = True
    """False for warm_ahead: `target` counts the starts still expected and falls with each one (warm or cold)."""


def release_provider(provider: SandboxProvider) -> None:
    """Release what a provider itself holds (the local supervisor's zygote, docker's API threads), if anything.

    Sandboxes still open are not touched; a local provider stays usable (its next start launches a new zygote).
    """
    close = getattr(provider, "close", None)
    if callable(close) and not inspect.iscoroutinefunction(close):
        close()


@dataclass(frozen=True)
class PoolLimits:
    """The pool's named limits; every one is required (the config's SandboxPoolConfig holds the defaults, and
    swerl.stages.common.pool_limits maps it onto this)."""

    max_concurrent: int
    """Sandboxes alive at once (in use + warm + starting); a start beyond it waits for a close."""
    start_timeout_s: float
    """Wall clock for one start try, on top of the backend's own; past it: InfraError(start_timeout)."""
    start_retries: int
    """Extra tries of a start that failed with a cause in retry_causes."""
    retry_causes: frozenset[str]
    """InfraError causes of a failed start that are retried (others fail the start at once)."""
    retry_backoff_s: float
    """Wait before the first start retry, doubled for each next one."""
    warm_size: int
    """Sandboxes keep_warm keeps ready for one starting state when it names no size."""
    price_per_sandbox_hour: float
    """USD per sandbox-hour, for the cost metrics (0: free)."""


class SandboxPool:
    """SandboxProvider with limits: at most `max_concurrent` sandboxes alive (in use + warm + starting)."""

    def __init__(
        self,
        provider: SandboxProvider,
        limits: PoolLimits,
        *,
        clock: Any = time.monotonic,
        owns_provider: bool = False,
    ) -> None:
        self.provider = provider
        self.owns_provider = owns_provider
        """Release the provider's own resources (release_provider) when the pool closes: it was made for the pool."""
        self.pool_limits = limits
        self.clock = clock
        self.counters: Counter[str] = Counter()
        """start.cold, start.warm, start_error.CAUSE, start_retry.CAUSE, infra.CAUSE, warm.evicted, ..."""
        self._slots = 0
        self._waiting = 0
        self._slot_freed = asyncio.Condition()
        self._warm: dict[WarmKey, _Warm] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._closed_seconds = 0.0
        self._reported_seconds = 0.0
        self._live: set[PooledSandbox] = set()
        self._closing = False

    # ------------------------------------------------------------------------------------------------------------
    # SandboxProvider

    async def start(self, env_dir: Environment, setup_patch: str | None = None) -> PooledSandbox:
        """A warm sandbox for this starting state if one is ready (refilled in the background), else a cold one."""
        key = warm_key(env_dir, setup_patch)
        warm = self._warm.get(key)
        if warm is not None:
            ready = warm.ready.pop() if warm.ready else None
            if not warm.refill:
                warm.target -= 1  # one expected start happens now, warm or cold
            if ready is not None:
                self._refill(key)
            self._forget_if_spent(key, warm)
            if ready is not None:
                self.counters["start.warm"] += 1
                return self._hand_out(*ready, warm=True)
        self.counters["start.cold"] += 1
        await self._acquire_slot()
        requested_at = self.clock()
        try:
            inner = await self._start_with_retries(env_dir, setup_patch)
        except BaseException:
            self._release_slot()
            raise
        return self._hand_out(inner, requested_at, warm=False)

    def limits(self) -> dict[str, int | float]:
        """The backend's enforced limits (if it reports them) and the pool's own."""
        backend = getattr(self.provider, "limits", None)
        own: dict[str, int | float] = {
            "pool.max_concurrent": self.pool_limits.max_concurrent,
            "pool.start_timeout_s": self.pool_limits.start_timeout_s,
            "pool.start_retries": self.pool_limits.start_retries,
            "pool.warm_size": self.pool_limits.warm_size,
            "pool.price_per_sandbox_hour": self.pool_limits.price_per_sandbox_hour,
        }
        return {**(backend() if callable(backend) else {}), **own}

    # ------------------------------------------------------------------------------------------------------------
    # Warm pool

    def keep_warm(self, env_dir: Environment | str, setup_patch: str | None = None, size: int | None = None) -> None:
        """Keep `size` (default warm_size) sandboxes of this starting state ready; refilled after each hand-out."""
        target = self.pool_limits.warm_size if size is None else size
        key = warm_key(env_dir, setup_patch)
        warm = self._warm.setdefault(key, _Warm(target=target))
        warm.target, warm.refill = target, True
        self._refill(key)

    def warm_ahead(self, env_dir: Environment | str, setup_patch: str | None, count: int) -> None:
        """Start `count` sandboxes of this starting state now for the next `count` starts of it (a GRPO group
        about to open), with free slots only; nothing is refilled. A start that finds none ready yet starts cold
        and one warm sandbox fewer is kept; leftovers are closed by stop_warming or aclose."""
        if count < 1:
            return
        key = warm_key(env_dir, setup_patch)
        warm = self._warm.get(key)
        if warm is None:
            warm = self._warm[key] = _Warm(target=0, refill=False)
        if warm.refill:  # already kept warm by keep_warm: that covers it
            return
        warm.target += count
        self.counters["warm.ahead"] += count
        self._refill(key)

    def _forget_if_spent(self, key: WarmKey, warm: _Warm) -> None:
        """Drop a warm_ahead key once every expected start has happened (closing what is still ready)."""
        if not warm.refill and warm.target <= 0 and self._warm.get(key) is warm:
            self.stop_warming(*key)

    def stop_warming(self, env_dir: Environment | str, setup_patch: str | None = None) -> None:
        """Stop keeping this starting state warm and close its ready sandboxes."""
        warm = self._warm.pop(warm_key(env_dir, setup_patch), None)
        if warm is not None:
            for inner, requested_at in warm.ready:
                self._close_in_background(inner, requested_at)

    def warm_ready(self, env_dir: Environment | str | None = None, setup_patch: str | None = None) -> int:
        """Ready warm sandboxes (of one starting state, or all)."""
        if env_dir is None:
            return sum(len(w.ready) for w in self._warm.values())
        warm = self._warm.get(warm_key(env_dir, setup_patch))
        return len(warm.ready) if warm else 0

    async def wait_warm(self, timeout: float | None = None) -> None:
        """Wait until every kept starting state has its target ready (or no slot is left to start more)."""
        async with asyncio.timeout(timeout):
            while any(
                len(w.ready) < w.target and (w.starting or self._slots < self.pool_limits.max_concurrent)
                for w in self._warm.values()
            ):
                await asyncio.sleep(0.01)

    def _refill(self, key: WarmKey) -> None:
        warm = self._warm.get(key)
        if warm is None or self._closing:
            return
        # Warming only takes slots that no cold start is waiting for.
        while (
            len(warm.ready) + warm.starting < warm.target
            and self._slots + self._waiting < self.pool_limits.max_concurrent
        ):
            self._slots += 1  # a warm start never waits for a slot: it only uses a free one
            warm.starting += 1
            self._spawn(self._warm_one(key, warm))

    async def _warm_one(self, key: WarmKey, warm: _Warm) -> None:
        requested_at = self.clock()
        try:
            inner = await self._start_with_retries(key[0], key[1])
        except Exception as exc:  # noqa: BLE001 - a failed warm-up is counted; the next demand starts cold
            warm.starting -= 1
            self._release_slot()
            log.warning("warm start of %s failed: %s", key[0], exc)
            return
        warm.starting -= 1
        if self._closing or self._warm.get(key) is not warm or len(warm.ready) >= warm.target:
            self._close_in_background(inner, requested_at)  # no longer wanted (a warm_ahead start went cold)
            self.counters["warm.unused"] += 1
            return
        warm.ready.append((inner, requested_at))

    def _evict_one_warm(self) -> bool:
        """Close one ready warm sandbox to free its slot for a cold start; False if there is none."""
        for warm in self._warm.values():
            if warm.ready:
                inner, requested_at = warm.ready.pop(0)
                self.counters["warm.evicted"] += 1
                self._close_in_background(inner, requested_at)
                return True
        return False

    # ------------------------------------------------------------------------------------------------------------
    # Slots, starts, closes

    async def _acquire_slot(self) -> None:
        async with self._slot_freed:
            self._waiting += 1
            try:
                while self._slots >= self.pool_limits.max_concurrent:
                    # A ready warm sandbox gives its slot to real demand (released when its close finishes).
                    self._evict_one_warm()
                    self.counters["slot.waits"] += 1
                    await self._slot_freed.wait()
                self._slots += 1
            finally:
                self._waiting -= 1

    def _release_slot(self) -> None:
        self._slots -= 1
        self._spawn(self._notify_slot())
        for key in list(self._warm):
            self._refill(key)

    async def _notify_slot(self) -> None:
        async with self._slot_freed:
            self._slot_freed.notify_all()  # a waiter cancelled after a notify() would swallow it

    async def _start_with_retries(self, env_dir: Environment, setup_patch: str | None) -> Sandbox:
        delay = self.pool_limits.retry_backoff_s
        for attempt in range(self.pool_limits.start_retries + 1):
            try:
                return await self._start_once(env_dir, setup_patch)
            except InfraError as exc:
                self.counters[f"start_error.{exc.cause}"] += 1
                if exc.cause not in self.pool_limits.retry_causes or attempt == self.pool_limits.start_retries:
                    raise
                self.counters[f"start_retry.{exc.cause}"] += 1
                await asyncio.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    async def _start_once(self, env_dir: Environment, setup_patch: str | None) -> Sandbox:
        """One backend start under the start timeout. The start itself is never cancelled (see module doc)."""
        task = asyncio.ensure_future(self.provider.start(env_dir, setup_patch))
        try:
            done, _ = await asyncio.wait({task}, timeout=self.pool_limits.start_timeout_s)
        except asyncio.CancelledError:
            self._close_on_arrival(task)
            raise
        if not done:
            self._close_on_arrival(task)
            raise InfraError(
                "start_timeout", f"sandbox start took over {self.pool_limits.start_timeout_s}s ({env_dir})"
            )
        return task.result()

    def _close_on_arrival(self, task: asyncio.Future[Sandbox]) -> None:
        async def reap() -> None:
            with contextlib.suppress(BaseException):
                sandbox = await task
                self.counters["start.abandoned"] += 1
                await self._close_inner(sandbox)

        self._spawn(reap())

    def _hand_out(self, inner: Sandbox, requested_at: float, warm: bool) -> PooledSandbox:
        sandbox = PooledSandbox(inner, self, requested_at, warm)
        self._live.add(sandbox)
        return sandbox

    async def _close_inner(self, inner: Sandbox) -> None:
        try:
            await inner.close()
        except Exception as exc:  # noqa: BLE001 - a close failure is counted, never raised into an episode
            self.counters["close_failed"] += 1
            log.warning("sandbox close failed: %s", exc)

    def _retire(self, sandbox: PooledSandbox) -> None:
        self._live.discard(sandbox)
        self._closed_seconds += sandbox.seconds()
        self._release_slot()

    def _close_in_background(self, inner: Sandbox, requested_at: float) -> None:
        async def close() -> None:
            try:
                await self._close_inner(inner)
            finally:
                self._closed_seconds += self.clock() - requested_at
                self._release_slot()

        self._spawn(close())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------------------------------------------------
    # Accounting and shutdown

    def sandbox_seconds(self) -> float:
        """Sandbox-seconds billed so far: closed sandboxes, live ones, and warm ones waiting."""
        now = self.clock()
        live = sum(s.seconds() for s in self._live)
        warm = sum(now - t for w in self._warm.values() for _, t in w.ready)
        return self._closed_seconds + live + warm

    def cost_usd(self, seconds: float) -> float:
        return seconds / 3600.0 * self.pool_limits.price_per_sandbox_hour

    def step_metrics(self) -> dict[str, float]:
        """Sandbox-seconds and cost since the previous call (a training step), and the pool's counters."""
        total = self.sandbox_seconds()
        step = total - self._reported_seconds
        self._reported_seconds = total
        metrics = {
            "sandbox_seconds_step": step,
            "sandbox_cost_usd_step": self.cost_usd(step),
            "sandbox_seconds_total": total,
            "sandbox_cost_usd_total": self.cost_usd(total),
        }
        return metrics | {f"pool/{name}": float(count) for name, count in sorted(self.counters.items())}

    @property
    def in_use(self) -> int:
        """Sandboxes handed out and not closed yet."""
        return len(self._live)

    async def drain(self) -> None:
        """Wait for background starts and closes (a test or shutdown calls this)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def aclose(self) -> None:
        """Close warm sandboxes, reap abandoned starts; sandboxes in use are their holders' to close."""
        self._closing = True
        for key in list(self._warm):
            self.stop_warming(*key)
        await self.drain()
        if self.owns_provider:
            release_provider(self.provider)

    async def __aenter__(self) -> SandboxPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
