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
  flush_cache is sent only where SGLang accepts it for the mode (flush_cache_allowed).
- Weight sync over a process group (SGLang's API): weight_group_ranks probes the engines and counts their ranks,
  init_weights_update_group has engine i join as ranks 1 + (ranks of engines before it) ...; a sync is
  begin_weight_update (pause or drain, then every member's session), one update_weights_from_distributed per
  bucket to every member, end_weight_update (sessions closed, engines continue). A member that fails (no answer)
  breaks the group (a broadcast needs every rank): it is taken out and the next sync needs a new group; a member
  that refuses a bucket is taken out of rotation (SGLang loads bucket by bucket, so its weights are unknown) and
  comes back once it takes a whole sync.

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


def flush_cache_allowed(weight_update_mode: str, pause_mode: str) -> bool:
    """Whether SGLang (0.5.23) accepts flush_cache with a weight update made under this discipline.

    SGLang flushes after loading only when its scheduler is idle (sglang/srt/managers/scheduler.py:
    Scheduler.flush_cache, is_fully_idle(ignore_waiting=<engine paused>)); a flush it cannot do fails the update,
    HTTP 400 after the weights loaded (scheduler_components/weight_updater.py: flush_cache_after_weight_update).
    pause_generation (scheduler.py: pause_generation; io_struct.py: PauseGenerationReqInput) leaves running
    requests in the running batch under in_place (not idle while one runs), moves them to the waiting queue under
    retract (ignored while paused: idle) and ends them under abort. An update without a pause (drain) takes the
    model-update writer lock, which waits for running requests, after swerl has waited for its own: idle.
    """
    return not (weight_update_mode == "pause" and pause_mode == "in_place")


@dataclass(eq=False)
class _WeightGroup:
    """The weight group the router's engines joined (init_weights_update_group)."""

    name: str
    members: list[EngineSlot]
    world_size: int
    broken: str | None = None
    """Why a broadcast can no longer complete (a member failed); None while usable."""


@dataclass(eq=False)
class _SyncSession:
    """One weight sync under way (begin_weight_update .. end_weight_update)."""

    paused: list[EngineSlot] = field(default_factory=list)
    drained: bool = False
    refused: set[EngineSlot] = field(default_factory=set)
    version: int | None = None
    """The version the sync's versioned bucket carried (every member that refused nothing serves it)."""


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
        self.slots = [EngineSlot(client, i, weight_version=weight_version) for i, client in enumerate(clients)]
        self.retries = retries
        self.health_interval_s = health_interval_s
        self.sticky_capacity = sticky_capacity
        self.sticky_max_excess = sticky_max_excess
        self.weight_update_mode = weight_update_mode
        self.pause_mode = pause_mode
        self.weight_version = weight_version
        self.flush_cache_on_update = flush_cache_allowed(weight_update_mode, pause_mode)
        self._weights_path: str | None = None
        self._weights_distributed = False  # the current version came over a weight group (no path to reload)
        self._group: _WeightGroup | None = None
        self._candidates: list[EngineSlot] | None = None  # the engines weight_group_ranks counted
        self._session: _SyncSession | None = None
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
            self._health_task = asyncio.get_running_loop().create_task(self._health_loop(), name="router-health")

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
                log.warning(
                    "no engine in rotation for weight version %d: each gets it when it answers again", weight_version
                )
                self.weight_version = weight_version
                self._weights_path = model_path
                self._weights_distributed = False
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
            self._weights_distributed = False

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
            await slot.client.update_weights_from_disk(
                model_path, weight_version, flush_cache=self.flush_cache_on_update
            )
        except InfraError as error:
            self._take_out(slot, error)  # the health loop brings it back at the current version
            return
        slot.weight_version = weight_version

    # ------------------------------------------------------------------------------------------------------------
    # Weight sync over a process group

    async def weight_group_ranks(self) -> int:
        """Probe every engine; the ranks of those that answer (they are the next init_weights_update_group's
        members, engines out of rotation included: a whole sync brings them back)."""
        alive = await asyncio.gather(*(slot.client.health() for slot in self.slots))
        self._candidates = [slot for slot, ok in zip(self.slots, alive, strict=True) if ok]
        if not self._candidates:
            raise InfraError("engine_unreachable", f"no engine among {len(self.slots)} answers: no weight group")
        return sum(slot.client.tp_size for slot in self._candidates)

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
    ) -> None:
        """Every member joins the group, engine i (in order) at rank rank_offset + the ranks of those before it;
        returns once all (and the trainer, rank 0) joined. world_size must be rank_offset + weight_group_ranks()."""
        if self._candidates is None:
            await self.weight_group_ranks()
        assert self._candidates is not None
        members = list(self._candidates)
        ranks = sum(slot.client.tp_size for slot in members)
        if world_size != rank_offset + ranks:
            raise ValueError(
                f"world_size {world_size} != rank_offset {rank_offset} + {ranks} ranks of {len(members)} engines "
                "(from weight_group_ranks(); call it again if engines came or went)"
            )
        async with self._update_lock:
            if self._group is not None:  # SGLang refuses a second init under one name until the first is destroyed
                old = self._group
                self._group = None
                await asyncio.gather(
                    *(slot.client.destroy_weights_update_group(old.name) for slot in old.members),
                    return_exceptions=True,
                )
            offsets = [rank_offset]
            for slot in members[:-1]:
                offsets.append(offsets[-1] + slot.client.tp_size)
            results = await asyncio.gather(
                *(
                    slot.client.init_weights_update_group(
                        master_address, master_port, offset, world_size, group_name, backend
                    )
                    for slot, offset in zip(members, offsets, strict=True)
                ),
                return_exceptions=True,
            )
            errors = self._settle(members, results)
            self._candidates = None
            if errors:
                raise errors[0]
            self._group = _WeightGroup(group_name, members, world_size)
        log.info("weight group %r: %d engines joined, world size %d", group_name, len(members), world_size)

    def _settle(self, slots: list[EngineSlot], results: list[Any]) -> list[BaseException]:
        """Take out the engines whose call failed with an InfraError; the errors, refusals first."""
        errors: list[BaseException] = []
        for slot, result in zip(slots, results, strict=True):
            if isinstance(result, InfraError):
                self._take_out(slot, result)
            if isinstance(result, BaseException):
                errors.append(result)
        return sorted(errors, key=lambda error: not isinstance(error, WeightUpdateError))

    def _usable_group(self) -> _WeightGroup:
        group = self._group
        if group is None:
            raise WeightUpdateError("no weight group: call weight_group_ranks and init_weights_update_group first")
        if group.broken is not None:
            raise WeightUpdateError(
                f"weight group {group.name!r} is broken ({group.broken}): form it again "
                "(weight_group_ranks, init_weights_update_group)"
            )
        return group

    def _break(self, group: _WeightGroup, slot: EngineSlot, error: Exception) -> None:
        self._take_out(slot, error)
        if group.broken is None:
            group.broken = f"engine {slot.client.base_url} failed: {error}"
            log.warning("weight group %r broken: %s", group.name, group.broken)

    async def begin_weight_update(self) -> None:
        """Start a sync: stop generation as weight_update_mode says (pause or drain), open every member's session.

        Engines in rotation that are not members are taken out (the sync would leave them on old weights). Holds
        the router's update lock until end_weight_update."""
        group = self._usable_group()
        await self._update_lock.acquire()
        session = _SyncSession()
        try:
            for slot in self.slots:
                if slot.healthy and slot not in group.members:
                    self._take_out(slot, WeightUpdateError(f"not a member of weight group {group.name!r}"))
            alive = await asyncio.gather(*(slot.client.health() for slot in group.members))
            for slot, ok in zip(group.members, alive, strict=True):
                if not ok:
                    self._break(group, slot, InfraError("engine_unreachable", "health probe failed"))
            self._usable_group()
            live = [slot for slot in group.members if slot.healthy]
            if self.weight_update_mode == "drain":
                session.drained = True
                self._admitting.clear()
                await asyncio.gather(*(slot.idle.wait() for slot in live))
            else:
                results = await asyncio.gather(
                    *(slot.client.pause_generation(self.pause_mode) for slot in live), return_exceptions=True
                )
                session.paused = [slot for slot, result in zip(live, results, strict=True) if result is None]
                for slot, result in zip(live, results, strict=True):
                    if isinstance(result, BaseException):
                        self._break(group, slot, result if isinstance(result, Exception) else Exception(result))
                self._usable_group()
            results = await asyncio.gather(
                *(slot.client.begin_weight_update() for slot in group.members), return_exceptions=True
            )
            for slot, result in zip(group.members, results, strict=True):
                if isinstance(result, InfraError):
                    self._break(group, slot, result)
            errors = self._settle(group.members, [None if isinstance(r, InfraError) else r for r in results])
            if errors or group.broken is not None:
                opened = [slot for slot, result in zip(group.members, results, strict=True) if result is None]
                await asyncio.gather(*(slot.client.end_weight_update() for slot in opened), return_exceptions=True)
                if errors:
                    raise errors[0]
                self._usable_group()
        except BaseException:
            await self._resume(session)
            self._update_lock.release()
            raise
        self._session = session

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str,
        weight_version: int | None = None,
        flush_cache: bool = True,
    ) -> None:
        """One bucket to every member (inside begin_weight_update .. end_weight_update). flush_cache is sent only
        where the pause mode allows it (flush_cache_allowed). A member that fails breaks the group: the others'
        requests are abandoned and the InfraError raised; a refusal takes the member out of rotation and is raised
        once every member answered. With weight_version, every member that refused nothing in this sync serves it,
        and the router does when none refused."""
        session = self._session
        group = self._usable_group()
        if session is None:
            raise WeightUpdateError(
                "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()"
            )
        if group_name != group.name:
            raise WeightUpdateError(f"the router's weight group is {group.name!r}, not {group_name!r}")
        flush = flush_cache and self.flush_cache_on_update
        tasks = {
            asyncio.ensure_future(
                slot.client.update_weights_from_distributed(names, dtypes, shapes, group_name, weight_version, flush)
            ): slot
            for slot in group.members
        }
        refusals: list[WeightUpdateError] = []
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                slot, error = tasks[task], task.exception()
                if isinstance(error, WeightUpdateError):
                    session.refused.add(slot)
                    refusals.append(error)
                    self._take_out(slot, error)  # SGLang has loaded the buckets before: its weights are unknown
                elif error is not None:
                    self._break(group, slot, error if isinstance(error, Exception) else Exception(error))
                    for other in pending:
                        other.cancel()  # those engines wait for a broadcast that cannot complete
                    raise error
        if weight_version is not None:
            session.version = weight_version
            for slot in group.members:
                if slot not in session.refused:
                    slot.weight_version = weight_version
            if not session.refused:
                self.weight_version = weight_version
                self._weights_path = None
                self._weights_distributed = True
        if refusals:
            raise refusals[0]

    async def end_weight_update(self) -> None:
        """Close every member's session, bring back members that took the whole sync, resume generation."""
        session = self._session
        if session is None:
            raise WeightUpdateError("no weight-update session is open; call begin_weight_update() first")
        self._session = None
        group = self._group
        try:
            if group is not None:
                results = await asyncio.gather(
                    *(slot.client.end_weight_update() for slot in group.members), return_exceptions=True
                )
                for slot, result in zip(group.members, results, strict=True):
                    if isinstance(result, InfraError):
                        self._break(group, slot, result)
                    elif isinstance(result, BaseException):
                        slot.last_error = str(result)
                    elif session.version is not None and slot not in session.refused and not slot.healthy:
                        slot.healthy = True  # it took the whole sync: it serves what the others serve
                        slot.client.weight_version = session.version
                        log.info("engine %s back in rotation at version %d", slot.client.base_url, session.version)
        finally:
            await self._resume(session)
            self._update_lock.release()

    async def _resume(self, session: _SyncSession) -> None:
        if session.drained:
            self._admitting.set()
        results = await asyncio.gather(
            *(slot.client.continue_generation() for slot in session.paused), return_exceptions=True
        )
        for slot, result in zip(session.paused, results, strict=True):
            if isinstance(result, InfraError):
                self._take_out(slot, result)

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
            if reported != str(self.weight_version) and self._weights_distributed:
                slot.last_error = (
                    f"serves weight version {reported}, the router {self.weight_version} (sent over the weight "
                    "group): back after it takes a whole weight sync"
                )
                return
            if self._weights_path is not None and reported != str(self.weight_version):
                async with self._update_lock:
                    # out of rotation, so idle: SGLang can flush whatever the pause mode
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
                    "in_weight_group": self._group is not None and slot in self._group.members,
                }
                for slot in self.slots
            ],
            "weight_group": None
            if self._group is None
            else {
                "name": self._group.name,
                "world_size": self._group.world_size,
                "broken": self._group.broken,
            },
        }
