"""The rollout manager: keeps `max_in_flight` attempts running, schedules GRPO groups (n attempts of a task),
refills a slot the moment an attempt finishes, and buffers finished groups for the trainer.

Scheduling: attempts wait in a FIFO of pending (seq, generation, attempt) triples; when a slot frees, the next
pending attempt starts; when none is pending, the next group of the data stream opens (its n attempts become
pending), unless `max_buffered_groups` finished groups already wait for the trainer (a bound on how far rollouts
run ahead, so on staleness). Every finished attempt is written to the journal before it counts; a group joins
the buffer when its last attempt is written. The trainer calls `get()` for the oldest finished group.

Attempts continue across weight updates (partial rollouts): the manager never waits for the trainer.

With a curriculum (swerl.rollout.curriculum) each opening group's task and probe come from its plan, written to
the journal before the group's attempts; a probing group opens with its probe's attempts only and either stops
there (`stopped_early`) or opens the rest; every finished group's rewards are journaled and fed back to the plan
before the group is buffered. Without one, group seq runs task_at(seq) with all n attempts, as before.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from swerl.engine.base import Engine
from swerl.rollout.curriculum import Curriculum, GroupPlan, probe_settles
from swerl.rollout.groups import EpisodeFn
from swerl.rollout.journal import FinishedAttempt, FinishedGroup, JournalState, Ledger, RolloutJournal
from swerl.trajectory import Trajectory

TaskT = TypeVar("TaskT")
logger = logging.getLogger(__name__)


def group_id(seq: int, generation: int) -> str:
    return f"g{seq:08d}" + (f"r{generation}" if generation else "")


_GROUP_ID = re.compile(r"^g(\d+)(?:r(\d+))?$")


def parse_group_id(text: str) -> tuple[int, int]:
    """(seq, generation) of a group_id; ValueError naming it if it is not one."""
    match = _GROUP_ID.match(text)
    if match is None:
        raise ValueError(f"not a rollout group id: {text!r}")
    return int(match.group(1)), int(match.group(2) or 0)


@dataclass
class _OpenGroup:
    generation: int
    finished: dict[int, FinishedAttempt]
    target: int
    """Attempts that close it as it stands: the probe's while probing, else n."""


class RolloutManager(Generic[TaskT]):
    """Asynchronous GRPO rollouts (see the module docstring).

    Args:
        engine: the policy's engine, passed to every episode.
        episode: runs one attempt (with its infra retries) and returns its trajectory; raising is a bug.
        task_at: the task at an index of the data stream (a seeded order, wrapping around); without a curriculum
            group seq runs task_at(seq), with one the index its plan names.
        n_attempts: attempts per group.
        max_in_flight: attempts running at once.
        max_buffered_groups: finished groups held before no new group opens.
        journal: where finished attempts are persisted.
        prewarm: called (as a background task) with the task of each of the next `prewarm_groups` groups as soon
            as the group before it opens; it prepares what it can (an environment) and returns the call that
            starts the group's sandboxes (SandboxPool.warm_ahead), which the manager makes only if the group has
            not opened meanwhile (its attempts would then have started cold, and the warm sandboxes wait unused).
            A failure is logged, never raised (the attempts then start cold).
        prewarm_groups: how many groups past the newest open one are warmed ahead (0: none).
        curriculum: plans each group (task, probe) from the outcomes so far; an adaptive one (replay) cannot be
            combined with prewarm (a later group's task is not known before it opens).
        eligible: whether the task at a data-stream index may open a group (a GRPO phase's task filter); a data
            position whose task is not eligible is skipped (no group opens there). None: every task.
    """

    def __init__(
        self,
        engine: Engine,
        episode: EpisodeFn[TaskT],
        task_at: Callable[[int], TaskT],
        *,
        n_attempts: int,
        max_in_flight: int,
        max_buffered_groups: int,
        journal: RolloutJournal,
        prewarm: Callable[[TaskT], Awaitable[Callable[[], None]]] | None = None,
        prewarm_groups: int = 0,
        curriculum: Curriculum | None = None,
        eligible: Callable[[int], bool] | None = None,
    ) -> None:
        if curriculum is not None and curriculum.settings.adaptive and prewarm is not None and prewarm_groups:
            raise ValueError("prewarm_groups needs every group's task in advance: not with a replay curriculum")
        if prewarm_groups < 0:
            raise ValueError(f"prewarm_groups must be >= 0, got {prewarm_groups}")
        if n_attempts < 1 or max_in_flight < 1 or max_buffered_groups < 1:
            raise ValueError(
                f"n_attempts ({n_attempts}), max_in_flight ({max_in_flight}) and max_buffered_groups "
                f"({max_buffered_groups}) must be >= 1"
            )
        self.engine = engine
        self.episode = episode
        self.task_at = task_at
        self.n_attempts = n_attempts
        self.max_in_flight = max_in_flight
        self.max_buffered_groups = max_buffered_groups
        self.journal = journal
        self.next_seq = 0  # the data position: groups opened so far
        self.buffer: collections.deque[FinishedGroup] = collections.deque()
        self._pending: collections.deque[tuple[int, int, int]] = collections.deque()
        self._open: dict[int, _OpenGroup] = {}
        self._running: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._error: BaseException | None = None
        self._closed = False
        self.started = self.finished = 0  # attempts
        self.busy_since: float | None = None
        self.prewarm = prewarm
        self.prewarm_groups = prewarm_groups
        self._prewarmed_to = -1  # groups up to this seq have been warmed ahead (or opened)
        self._prewarming: set[asyncio.Task[None]] = set()
        self.curriculum = curriculum
        self.eligible = eligible
        self.skipped_positions = 0  # data positions skipped for a task the phase's filter excludes
        self._plans: dict[int, GroupPlan] = {}
        self._plan_writes: dict[int, asyncio.Task[None]] = {}

    def plan_of(self, seq: int) -> GroupPlan:
        """Group seq's plan (GroupPlan(seq, seq, fresh, no probe) without a curriculum)."""
        return self._plans.get(seq) or GroupPlan(seq, seq, "fresh", 0)

    def _first_target(self, seq: int) -> int:
        probe = self.plan_of(seq).probe
        return probe if probe else self.n_attempts

    # -- resume -------------------------------------------------------------------------------------------------

    def restore(
        self, state: JournalState, ledger: Ledger, plans: list[GroupPlan] | None = None, position: int = 0
    ) -> dict[str, int]:
        """Rebuild from the journal and the restored checkpoint's ledger (before `start`); returns counts (groups
        reloaded whole, partial, rerun; journal entries skipped as damaged). `plans`: the journal's group plans
        (the curriculum restored from the same journal beforehand). `position`: the data position handed over by
        an earlier GRPO phase (groups it opened past its journal's last finished attempt are not reopened)."""
        consumed = ledger.consumed
        counts = {
            "reloaded_groups": 0,
            "partial_groups": 0,
            "rerun_groups": 0,
            "skipped_groups": 0,
            "damaged_entries": len(state.damaged),
        }
        reloaded = []
        for plan in plans or []:
            self._plans[plan.seq] = plan
        for seq in range(state.max_seq + 1):
            if seq in consumed:
                continue
            if self.curriculum is not None and seq not in self._plans:
                # opened, nothing written: plan it anew
                self._plans[seq] = self.curriculum.plan(seq, time.time())
                self._write_plan(seq)
            generation, finished = state.groups.get(seq, (0, {}))
            if not finished and self.eligible is not None and not self.eligible(self.plan_of(seq).task_index):
                counts["skipped_groups"] += 1
                continue  # opened, nothing finished, and its task is not this phase's: not reopened
            probe = self.plan_of(seq).probe
            rewards = [finished[a].trajectory.reward for a in sorted(finished)]
            stopped = probe > 0 and sorted(finished) == list(range(probe)) and probe_settles(rewards)
            # A group an earlier GRPO phase finished with more attempts than this phase's n is whole; one with fewer
            # is completed to n (its finished attempts kept)
            if len(finished) >= self.n_attempts or stopped:
                reloaded.append(FinishedGroup(seq, generation, [finished[a] for a in sorted(finished)], stopped))
                counts["reloaded_groups"] += 1
                continue
            probing = probe > 0 and not all(a in finished for a in range(probe))
            target = probe if probing else self.n_attempts
            missing = (a for a in itertools.count() if a not in finished)
            self._open[seq] = _OpenGroup(generation, dict(finished), target)
            self._pending.extend((seq, generation, next(missing)) for _ in range(target - len(finished)))
            counts["partial_groups" if finished else "rerun_groups"] += 1
        self.buffer.extend(sorted(reloaded, key=lambda group: group.finished_at))
        self.next_seq = max(state.max_seq + 1, position)
        return counts

    # -- scheduling ---------------------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._running)

    def start(self) -> None:
        self._fill()

    def _fill(self) -> None:
        while not self._closed and len(self._running) < self.max_in_flight:
            if not self._pending:
                if len(self.buffer) >= self.max_buffered_groups:
                    break
                seq, self.next_seq = self.next_seq, self.next_seq + 1
                if self.curriculum is not None:
                    self._plans[seq] = self.curriculum.plan(seq, time.time())
                    self._write_plan(seq)
                elif self.eligible is not None and not self.eligible(seq):
                    self.skipped_positions += 1
                    continue  # this position's task is not this phase's
                target = self._first_target(seq)
                self._open[seq] = _OpenGroup(0, {}, target)
                self._pending.extend((seq, 0, attempt) for attempt in range(target))
                self._warm_ahead(seq)
            seq, generation, attempt = self._pending.popleft()
            task = asyncio.create_task(self._run(seq, generation, attempt), name=f"attempt-{seq}-{attempt}")
            self._running.add(task)
            task.add_done_callback(self._done)
            self.started += 1
        if self._running and self.busy_since is None:
            self.busy_since = time.monotonic()

    def _warm_ahead(self, opened: int) -> None:
        """Warm the next prewarm_groups groups after `opened` (each once; a group opened unwarmed starts cold)."""
        if self.prewarm is None or self._closed:
            return
        self._prewarmed_to = max(self._prewarmed_to, opened)
        while self._prewarmed_to < opened + self.prewarm_groups:
            self._prewarmed_to += 1
            task = asyncio.create_task(self._prewarm_one(self._prewarmed_to), name=f"prewarm-{self._prewarmed_to}")
            self._prewarming.add(task)
            task.add_done_callback(self._prewarming.discard)

    def _write_plan(self, seq: int) -> None:
        """Journal the plan (off the loop); the group's attempts wait for it before they are journaled."""
        plan = self._plans[seq]
        self._plan_writes[seq] = asyncio.create_task(
            asyncio.to_thread(self.journal.record_plan, plan), name=f"plan-{seq}"
        )

    def task_of(self, seq: int) -> TaskT:
        """The task group seq runs."""
        return self.task_at(self.plan_of(seq).task_index)

    async def _prewarm_one(self, seq: int) -> None:
        assert self.prewarm is not None
        if seq < self.next_seq:  # opened in the same fill: too late to warm
            return
        if self.curriculum is None and self.eligible is not None and not self.eligible(seq):
            return  # a position the phase's filter skips: no group will open there
        try:
            start = await self.prewarm(self.task_of(seq))
            if seq >= self.next_seq and not self._closed:
                start()
        except Exception as error:  # noqa: BLE001 - warming is an optimisation: the group starts cold
            logger.warning("rollout manager: warming group %d ahead failed: %r", seq, error)

    async def _run(self, seq: int, generation: int, attempt: int) -> None:
        started = time.time()
        trajectory: Trajectory = await self.episode(
            self.engine, self.task_of(seq), attempt=attempt, group_id=group_id(seq, generation)
        )
        finished = FinishedAttempt(seq, generation, trajectory, started, time.time())
        writing = self._plan_writes.get(seq)
        if writing is not None:
            await writing  # the plan is in the journal before any of its attempts
        await asyncio.to_thread(self.journal.record, finished)
        group = self._open.get(seq)
        if group is None or group.generation != generation:
            return  # requeued meanwhile: an older generation's attempt no longer counts
        group.finished[attempt] = finished
        self.finished += 1
        if len(group.finished) < group.target:
            return
        attempts = [group.finished[a] for a in sorted(group.finished)]
        rewards = [a.trajectory.reward for a in attempts]
        stopped = group.target < self.n_attempts and probe_settles(rewards)
        if group.target < self.n_attempts and not stopped:  # the probe disagrees: the rest of the group runs
            group.target = self.n_attempts
            self._pending.extendleft((seq, generation, a) for a in reversed(range(len(attempts), self.n_attempts)))
            return
        del self._open[seq]
        self._plan_writes.pop(seq, None)
        if self.curriculum is not None:
            finished_at = max(a.finished_at for a in attempts)
            await asyncio.to_thread(self.journal.record_outcome, seq, generation, rewards, finished_at)
            self.curriculum.observe(self.plan_of(seq), rewards)
        self.buffer.append(FinishedGroup(seq, generation, attempts, stopped))

    def _done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if not task.cancelled() and task.exception() is not None and self._error is None:
            self._error = task.exception()
        self._changed.set()
        self._fill()

    def requeue(self, group: FinishedGroup) -> None:
        """Rerun a taken group under its next generation (its attempts go to the front of the queue)."""
        generation = group.generation + 1
        target = self._first_target(group.seq)
        self._open[group.seq] = _OpenGroup(generation, {}, target)
        self._pending.extendleft((group.seq, generation, a) for a in reversed(range(target)))
        self._fill()

    async def get(self, deadline: float | None = None) -> FinishedGroup:
        """The oldest finished group, waiting for one if needed; re-raises an episode's exception.

        deadline (time.monotonic()): TimeoutError if no group has finished by then (nothing is taken).
        """
        while True:
            if self._error is not None:
                raise self._error
            if self.buffer:
                group = self.buffer.popleft()
                self._fill()  # a buffer slot freed: a new group may open
                return group
            self._changed.clear()
            if deadline is None:
                await self._changed.wait()
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no finished group before the deadline")
            with contextlib.suppress(TimeoutError):  # only the event's wait is cancelled: no group is lost
                await asyncio.wait_for(self._changed.wait(), remaining)

    def put_back(self, groups: list[FinishedGroup]) -> None:
        """Return taken groups, untrained, to the front of the buffer in their order (next `get` sees them first)."""
        self.buffer.extendleft(reversed(groups))
        self._changed.set()

    async def close(self, timeout_s: float = 60.0) -> None:
        """Cancel every running attempt (their finished siblings stay in the journal); an attempt whose
        cancellation does not finish within timeout_s is abandoned with a warning, never waited on forever."""
        self._closed = True
        for task in list(self._prewarming):
            task.cancel()
        for writing in list(self._plan_writes.values()):
            if not writing.done():
                await asyncio.wait([writing], timeout=timeout_s)
        running = list(self._running)
        for task in running:
            task.cancel()
        if running:
            _, stuck = await asyncio.wait(running, timeout=timeout_s)
            if stuck:
                logger.warning("rollout manager: %d cancelled attempts did not finish in %.0f s", len(stuck), timeout_s)
        self._running.clear()
