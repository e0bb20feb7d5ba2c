"""Which task each GRPO group runs, and how many of its attempts go first: rollouts spent where they teach.

A group teaches only if its attempts disagree (binary rewards: some pass, some fail); on the CPU default about
half the groups rolled had every attempt fail. Two rules, both deterministic functions of the outcomes seen so far:

- **Probe** (`probe_attempts` = k > 0): a task seen for the first time (a *fresh* task) opens with k attempts;
  if all k fail (reward 0), the group stops there (`stopped_early`, discarded as `probe_stopped`: k episodes spent
  instead of n); otherwise its other n - k attempts follow and the group is trained whole, probe included. Only
  failures stop a group: at the policy strengths GRPO starts from, all-fail groups are the waste (about half the
  groups rolled on the CPU default), all-pass ones rare, and a one-attempt probe can then decide something.
- **Replay** (`replay_share` > 0): a task whose group had signal goes to a FIFO queue; a share `replay_share` of
  the groups opened comes from that queue (all n attempts at once: the task is known to have signal), the rest
  are fresh tasks in the seeded order. A task runs at most `max_visits` groups in all.

What this does to the gradient (binary rewards, attempts sampled independently): given a group's reward vector
r, each attempt is a draw from the policy conditioned on its own reward, so the expected update of any group the
rules keep is sum_i A_i(r) E[grad log pi(y_i) | r_i] = c(r) * grad p(task) with c(r) >= 0 for the group-mean
advantage (divided by the std or not). Stopping on a probe's outcome, dropping unanimous groups (dynamic
sampling) and choosing tasks from earlier, independent outcomes therefore keep every task's expected update
pointed along the gradient of its own success rate; what they change is how much each task weighs: tasks the
policy sometimes solves weigh more, tasks it never or always solves less (dynamic sampling already removed
those). The objective is a success rate reweighted towards the policy's frontier, not the uniform mean over tasks.

State: counters, the fresh position, visits per task and the replay queue. Every group's plan is written to the
rollout journal as it opens (`GroupPlan.to_json`), so a resumed run rebuilds this state exactly by replaying the
journal's openings and finishes in time order (`restore`).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Literal


@dataclass(frozen=True)
class CurriculumSettings:
    """GRPORolloutConfig's probe and replay knobs (see the module docstring)."""

    n_attempts: int
    probe_attempts: int = 0
    replay_share: float = 0.0
    max_visits: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.probe_attempts < self.n_attempts:
            raise ValueError(
                f"probe_attempts ({self.probe_attempts}) must be >= 0 and below attempts_per_task ({self.n_attempts})"
            )
        if not 0.0 <= self.replay_share < 1.0:
            raise ValueError(f"replay_share ({self.replay_share}) must be in [0, 1)")
        if self.max_visits < 1:
            raise ValueError(f"max_visits ({self.max_visits}) must be >= 1")

    @property
    def adaptive(self) -> bool:
        """Whether a group's task depends on earlier outcomes (so it cannot be known before the group opens)."""
        return self.replay_share > 0


@dataclass(frozen=True)
class GroupPlan:
    """What group `seq` runs: the task (its index in the seeded order), why, and its probe size (0: none)."""

    seq: int
    task_index: int
    source: Literal["fresh", "replay"]
    probe: int
    opened_at: float = 0.0
    """Epoch seconds (for `restore`: openings and finishes are replayed in time order)."""

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes) -> GroupPlan:
        body = json.loads(data)
        source = body["source"]
        if source not in ("fresh", "replay"):
            raise ValueError(f"unknown group source {source!r}")
        return cls(
            int(body["seq"]), int(body["task_index"]), source, int(body["probe"]), float(body["opened_at"])
        )


def has_signal(rewards: Iterable[float | None]) -> bool:
    """At least two valid attempts and not all the same reward (an infra error's None is no outcome)."""
    valid = [reward for reward in rewards if reward is not None]
    return len(valid) >= 2 and max(valid) != min(valid)


def probe_settles(rewards: Sequence[float | None]) -> bool:
    """Whether a probe's outcomes stop its group: every attempt failed (reward 0). An infra error decides nothing:
    the group continues (an outage must not retire a task)."""
    return bool(rewards) and all(reward == 0.0 for reward in rewards)


class Curriculum:
    """Plans groups over `n_tasks` tasks in a seeded order (index i is order[i]); see the module docstring."""

    def __init__(
        self, n_tasks: int, settings: CurriculumSettings, eligible: Callable[[int], bool] | None = None
    ) -> None:
        """eligible(task index): whether a task may be planned (a GRPO phase's task filter; at least one must be):
        fresh picks pass over the others, replays wait in the queue for a phase that takes them."""
        if n_tasks < 1:
            raise ValueError("the curriculum needs at least one task")
        self.n_tasks = n_tasks
        self.settings = settings
        self.eligible = eligible
        self.fresh_next = 0  # fresh picks so far: the next is order[fresh_next % n_tasks]
        self.opened = 0
        self.replayed = 0
        self.visits: collections.Counter[int] = collections.Counter()
        self.queue: collections.deque[int] = collections.deque()
        self._queued: set[int] = set()

    def plan(self, seq: int, now: float = 0.0) -> GroupPlan:
        """The next group's plan (state advances: call once per opened group)."""
        s = self.settings
        ok = self.eligible or (lambda _: True)
        replay = next((t for t in self.queue if ok(t)), None)
        if replay is not None and self.replayed < s.replay_share * (self.opened + 1):
            task = replay
            self.queue.remove(task)
            self._queued.discard(task)
            source: Literal["fresh", "replay"] = "replay"
            probe = 0
        else:
            for _ in range(self.n_tasks):
                if ok(self.fresh_next % self.n_tasks):
                    break
                self.fresh_next += 1
            else:
                raise ValueError("no task is eligible for this phase: the curriculum has nothing to plan")
            task = self.fresh_next % self.n_tasks
            self.fresh_next += 1
            source, probe = "fresh", s.probe_attempts
        plan = GroupPlan(seq, task, source, probe, now)
        self._count(plan)
        return plan

    def _count(self, plan: GroupPlan) -> None:
        self.opened += 1
        self.replayed += plan.source == "replay"
        self.visits[plan.task_index] += 1

    def observe(self, plan: GroupPlan, rewards: list[float | None]) -> None:
        """A group finished (stopped early or whole): a task with signal and visits left joins the replay queue."""
        task = plan.task_index
        if (self.settings.replay_share > 0 and has_signal(rewards) and self.visits[task] < self.settings.max_visits
                and task not in self._queued):  # fmt: skip
            self.queue.append(task)
            self._queued.add(task)

    def restore(
        self, plans: Iterable[GroupPlan], finishes: Iterable[tuple[float, int, list[float | None]]]
    ) -> None:
        """Rebuild the state from the journal: every opened group's plan, and every finished group as
        (finished_at, seq, rewards); the two are replayed in time order (an opening before a finish at the same
        instant), which is the order they happened in."""
        by_seq = {plan.seq: plan for plan in plans}
        events: list[tuple[float, int, int, list[float | None]]] = [
            (plan.opened_at, 0, plan.seq, []) for plan in by_seq.values()
        ]
        events += [(at, 1, seq, rewards) for at, seq, rewards in finishes if seq in by_seq]
        for _, kind, seq, rewards in sorted(events, key=lambda event: (event[0], event[1], event[2])):
            plan = by_seq[seq]
            if kind == 1:
                self.observe(plan, rewards)
                continue
            if plan.source == "fresh":
                # the first fresh pick at or past fresh_next that lands on it (positions repeat every n_tasks)
                self.fresh_next += (plan.task_index - self.fresh_next) % self.n_tasks + 1
            elif plan.task_index in self._queued:
                self.queue.remove(plan.task_index)
                self._queued.discard(plan.task_index)
            self._count(plan)

    def stats(self) -> dict[str, float]:
        return {
            "curriculum/replay_queue": float(len(self.queue)),
            "curriculum/fresh_tasks": float(self.fresh_next),
            "curriculum/replayed_groups": float(self.replayed),
        }
