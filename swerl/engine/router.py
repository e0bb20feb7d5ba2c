"""An in-process router over N engine servers, itself an Engine.

- Routing: a request whose rid was seen before goes to the engine that served it (the trajectory's earlier turns
  are in that engine's prefix cache); any other request goes to the available engine with the fewest requests
  outstanding. Stickiness yields when its engine is out or `sticky_max_excess` requests busier than the least.
- Failures: an InfraError from an engine takes it out of rotation and the request is retried on another engine
  (`retries` times); an InvalidRequestError is the caller's and is raised as it is. A health loop probes every
  engine each `health_interval_s`; one that answers again is brought to the current weight version (it may
  have restarted with old weights) and put back.
- Weight updates: mode "pause" pauses every engine (SGLang: `pause_mode` retract, the default, or in_place;
  the local engine keeps running requests' KV cache either way), loads the new weights and continues, so a
  request may span versions (the local engine reports each token's version);
  mode "drain" stops sending new requests, waits for those in flight to finish, updates and resumes, so every
  response comes from one version. Either way every response carries the weight version it was generated with.

The router runs in the caller's process: no proxy hop serialises the calls (see docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from swerl.engine.base import GenerateRequest, GenerateResponse, WeightUpdateError
from swerl.engine.client import EngineClient
from swerl.errors import InfraError

log = logging.getLogger("swerl.engine.router")

WeightUpdateMode = Literal["pause", "drain"]


@dataclass(eq=False)
class EngineSlot:
    """One engine as the router sees it."""

    client: EngineClient
    index: int
    healthy: bool = True
    outstanding: int = 0
    weight_version: int = 0
    requests: int = 0
    failures: int = 0
    removals: int = 0
    last_error: str = ""
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()


class Router:
    """Least-outstanding-requests routing with rid stickiness, health checks and versioned weight updates.

    swerl.engine.factory.open_engine maps EngineConfig (which holds the defaults) onto these arguments.

    Args:
        clients: one EngineClient per engine server (their own retries should be 0: the router retries).
        retries: times a request that failed with an InfraError is retried on another engine.
        health_interval_s: seconds between health probes of every engine (0: no health loop).
        sticky_capacity: most rids remembered for stickiness (least recently used forgotten first).
        sticky_max_excess: a sticky engine is skipped when it has this many more requests outstanding than the
            least busy one.
        weight_update_mode: "pause" or "drain" (see the module docstring).
        pause_mode: SGLang's /pause_generation mode for "pause": retract (running requests go back to the queue
            and their KV cache is recomputed after the update; SGLang refuses to flush its cache under a weight
            update while requests hold KV in place) or in_place.
        weight_version: the version every engine serves at start.
    """

    def __init__(
        self,
        clients: list[EngineClient],
        *,
        retries: int,
        health_interval_s: float,
        sticky_capacity: int,
        sticky_max_excess: int,
        weight_update_mode: WeightUpdateMode,
        pause_mode: Literal["retract", "in_place"],
        weight_version: int = 0,
    ) -> None:
        if not clients:
            raise ValueError("a router needs at least one engine")
        self.slots = [
            EngineSlot(client, i, weight_version=weight_version) for i, client in enumerate(clients)
        ]
        self.retries = retries
        self.health_interval_s = health_interval_s
        self.sticky_capacity = sticky_capacity
        self.sticky_max_excess = sticky_max_excess
        self.weight_update_mode = weight_update_mode
        self.pause_mode = pause_mode
        self.weight_version = weight_version
        self._weights_path: str | None = None
        self._sticky: collections.OrderedDict[str, EngineSlot] = collections.OrderedDict()
        self._admitting = asyncio.Event()  # cleared while a drain-mode update runs
        self._admitting.set()
        self._update_lock = asyncio.Lock()
        self._health_task: asyncio.Task[None] | None = None
        self.outstanding = 0
        self.max_outstanding = 0  # the achieved concurrency, for benchmarks and metrics
        self.retried = 0

    async def __aenter__(self) -> Router:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start(self) -> None:
        """Start the health loop (call inside the running event loop)."""
        if self.health_interval_s > 0 and self._health_task is None:
            self._health_task = asyncio.get_running_loop().create_task(
                self._health_loop(), name="router-health"
            )

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
            self._health_task = None
        await asyncio.gather(*(slot.client.close() for slot in self.slots))

    def pick(self, rid: str | None) -> EngineSlot:
        """The engine for a request: its rid's engine if available and not too busy, else the least busy."""
        available = [slot for slot in self.slots if slot.healthy]
        if not available:
            raise InfraError("engine_unreachable", f"no healthy engine among {len(self.slots)}")
        least = min(available, key=lambda slot: slot.outstanding)
        if rid is not None:
            sticky = self._sticky.get(rid)
            excess = sticky.outstanding - least.outstanding if sticky is not None else 0
            if sticky is not None and sticky.healthy and excess <= self.sticky_max_excess:
                self._sticky.move_to_end(rid)
                return sticky
            self._sticky[rid] = least
            self._sticky.move_to_end(rid)
            while len(self._sticky) > self.sticky_capacity:
                self._sticky.popitem(last=False)
        return least

    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        """Route one /generate; an engine failure is retried elsewhere, a bad request raised as it is."""
        error: InfraError | None = None
        for attempt in range(self.retries + 1):
            await self._admitting.wait()
            slot = self.pick(request.rid)
            self._begin(slot)
            try:
                return await slot.client.generate(request)
            except InfraError as failure:
                error = failure
                self._take_out(slot, failure)
                if request.rid is not None:
                    self._sticky.pop(request.rid, None)
                if attempt < self.retries:
                    self.retried += 1
            finally:
                self._end(slot)
        assert error is not None
        raise error

    def _begin(self, slot: EngineSlot) -> None:
        slot.outstanding += 1
        slot.requests += 1
        slot.idle.clear()
        self.outstanding += 1
        self.max_outstanding = max(self.max_outstanding, self.outstanding)

    def _end(self, slot: EngineSlot) -> None:
        slot.outstanding -= 1
        self.outstanding -= 1
        if slot.outstanding == 0:
            slot.idle.set()

    def _take_out(self, slot: EngineSlot, error: Exception) -> None:
        slot.failures += 1
        slot.last_error = str(error)
        if slot.healthy:
            slot.healthy = False
            slot.removals += 1
            log.warning("engine %s taken out of rotation: %s", slot.client.base_url, error)

    async def update_weights_from_disk(self, model_path: str, weight_version: int) -> None:
        """Load new weights on every healthy engine; raises WeightUpdateError if an engine refuses them (the
        engines that refused keep their previous version; the router's version moves only when all succeed)."""
        if not any(slot.healthy for slot in self.slots):
            await self.check_health()  # one dropped connection must not decide a weight update: probe first
        async with self._update_lock:
            healthy = [slot for slot in self.slots if slot.healthy]
            if not healthy and self.health_interval_s > 0:
                # The health loop brings every engine back at the router's version: make this update that version.
                log.warning("no engine in rotation for weight version %d: each gets it when it answers again",
                            weight_version)  # fmt: skip
                self.weight_version = weight_version
                self._weights_path = model_path
                return
            if not healthy:
                raise InfraError("engine_unreachable", "no healthy engine to update")
            if self.weight_update_mode == "drain":
                self._admitting.clear()
                try:
                    await asyncio.gather(*(slot.idle.wait() for slot in healthy))
                    await self._update_all(healthy, model_path, weight_version)
                finally:
                    self._admitting.set()
            else:
                await self._update_all(healthy, model_path, weight_version, pause=True)
            self.weight_version = weight_version
            self._weights_path = model_path

    async def _update_all(
        self, slots: list[EngineSlot], model_path: str, weight_version: int, pause: bool = False
    ) -> None:
        update = self._paused_update if pause else self._update_one
        results = await asyncio.gather(
            *(update(slot, model_path, weight_version) for slot in slots), return_exceptions=True
        )
        errors = [result for result in results if isinstance(result, BaseException)]
        if errors:
            refused = [error for error in errors if isinstance(error, WeightUpdateError)]
            raise refused[0] if refused else errors[0]

    async def _paused_update(self, slot: EngineSlot, model_path: str, weight_version: int) -> None:
        try:
            await slot.client.pause_generation(self.pause_mode)
        except InfraError as error:
            self._take_out(slot, error)
            return
        try:
            await self._update_one(slot, model_path, weight_version)
        finally:
            try:
                await slot.client.continue_generation()
            except InfraError as error:
                self._take_out(slot, error)

    async def _update_one(self, slot: EngineSlot, model_path: str, weight_version: int) -> None:
        try:
            await slot.client.update_weights_from_disk(model_path, weight_version)
        except InfraError as error:
            self._take_out(slot, error)  # the health loop brings it back at the current version
            return
        slot.weight_version = weight_version

    async def flush_cache(self) -> bool:
        results = await asyncio.gather(*(slot.client.flush_cache() for slot in self.slots if slot.healthy))
        return all(results)

    async def health(self) -> bool:
        """True while at least one engine is in rotation."""
        return any(slot.healthy for slot in self.slots)

    async def check_health(self) -> None:
        """Probe every engine once: take out the ones that fail, bring back (at the current version) the ones
        that answer."""
        await asyncio.gather(*(self._check(slot) for slot in self.slots))

    async def _check(self, slot: EngineSlot) -> None:
        if not await slot.client.health():
            if slot.healthy:
                self._take_out(slot, InfraError("engine_unreachable", "health probe failed"))
            return
        if slot.healthy:
            return
        try:
            info = await slot.client.model_info()
            reported = str(info.get("weight_version", ""))
            if self._weights_path is not None and reported != str(self.weight_version):
                async with self._update_lock:
                    await slot.client.update_weights_from_disk(self._weights_path, self.weight_version)
            slot.client.weight_version = self.weight_version
            slot.weight_version = self.weight_version
        except (InfraError, WeightUpdateError) as error:
            slot.last_error = str(error)
            return
        slot.healthy = True
        log.info("engine %s back in rotation at version %d", slot.client.base_url, self.weight_version)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            try:
                await self.check_health()
            except Exception:  # the loop must outlive any one probe's surprise
                log.exception("router health check failed")

    def stats(self) -> dict[str, Any]:
        return {
            "weight_version": self.weight_version,
            "outstanding": self.outstanding,
            "max_outstanding": self.max_outstanding,
            "retried": self.retried,
            "sticky_rids": len(self._sticky),
            "engines": [
                {
                    "url": slot.client.base_url,
                    "healthy": slot.healthy,
                    "outstanding": slot.outstanding,
                    "requests": slot.requests,
                    "failures": slot.failures,
                    "removals": slot.removals,
                    "weight_version": slot.weight_version,
                    "last_error": slot.last_error,
                }
                for slot in self.slots
            ],
        }
