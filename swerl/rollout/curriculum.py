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
- **Strata** (`strata`: a label per task, e.g. its bug modifier or difficulty; `stratum_floor` > 0): fresh tasks
  still come in the seeded order, but the task at fresh position i is taken with probability w(stratum) and
  passed over otherwise (the draw is a hash of the seed and i, so a resume draws the same). w = max(floor,
  v(p_s) / max_t v(p_t)), where p_s is the stratum's success rate estimated from every finished attempt so far
  (a Beta prior of `stratum_prior` pseudo-attempts at 1/2) and v(p) the groups with signal per episode a fresh
  group of that stratum is expected to give: (1 - (1 - p)^k - p^n) / (n - (n - k)(1 - p)^k) with a probe of k,
  (1 - p^n - (1 - p)^n) / n without. Strata the policy never or always solves are visited less, never less than the
  floor.

What this does to the gradient (binary rewards, attempts sampled independently): given a group's reward vector
r, each attempt is a draw from the policy conditioned on its own reward, so the expected update of any group the
rules keep is sum_i A_i(r) E[grad log pi(y_i) | r_i] = c(r) * grad p(task) with c(r) >= 0 for the group-mean
advantage (divided by the std or not). Stopping on a probe's outcome, dropping unanimous groups (dynamic
sampling) and choosing tasks from earlier, independent outcomes therefore keep every task's expected update
pointed along the gradient of its own success rate; what they change is how much each task weighs: tasks the
policy sometimes solves weigh more, tasks it never or always solves less (dynamic sampling already removed
those). The objective is a success rate reweighted towards the policy's frontier, not the uniform mean over tasks.
Strata reweight the same way, by stratum: a task's chance to be drawn depends on its stratum's earlier outcomes,
never on its own attempts in the group being trained, so its update keeps its direction; tasks of strata far
from the frontier weigh at least `stratum_floor` times as much as the best stratum's.

State: counters, the fresh position, visits per task, the replay queue and each stratum's attempts and successes.
Every group's plan (a fresh pick's position included) is written to the rollout journal as it opens
(`GroupPlan.to_json`), so a resumed run rebuilds this state exactly by replaying the journal's openings and
finishes in time order (`restore`).
"""

from __future__ import annotations

import collections
import hashlib
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
    stratum_floor: float = 1.0
    """Least chance a fresh task of the least promising stratum is taken (1: strata off, every task in order)."""
    stratum_prior: float = 2.0
    """Pseudo-attempts at success rate 1/2 in every stratum's estimate (how many outcomes move it)."""
    seed: int = 0
    """Salt of the per-position draws of the strata rule."""

    def __post_init__(self) -> None:
        if not 0 <= self.probe_attempts < self.n_attempts:
            raise ValueError(
                f"probe_attempts ({self.probe_attempts}) must be >= 0 and below attempts_per_task ({self.n_attempts})"
            )
        if not 0.0 <= self.replay_share < 1.0:
            raise ValueError(f"replay_share ({self.replay_share}) must be in [0, 1)")
        if self.max_visits < 1:
            raise ValueError(f"max_visits ({self.max_visits}) must be >= 1")
        if not 0.0 < self.stratum_floor <= 1.0:
            raise ValueError(f"stratum_floor ({self.stratum_floor}) must be in (0, 1]")
        if self.stratum_prior <= 0:
            raise ValueError(f"stratum_prior ({self.stratum_prior}) must be > 0")

    @property
    def stratified(self) -> bool:
        return self.stratum_floor < 1.0

    @property
    def adaptive(self) -> bool:
        """Whether a group's task depends on earlier outcomes (so it cannot be known before the group opens)."""
        return self.replay_share > 0 or self.stratified

    def signal_per_episode(self, p: float) -> float:
        """Groups with signal per episode expected of a fresh group whose attempts each succeed with p."""
        n, k = self.n_attempts, self.probe_attempts
        if not k:
            return (1.0 - p**n - (1.0 - p) ** n) / n
        # a group goes on when one of its probe's k attempts passes, and has signal then unless all n pass
        return (1.0 - (1.0 - p) ** k - p**n) / (n - (n - k) * (1.0 - p) ** k)


@dataclass(frozen=True)
class GroupPlan:
    """What group `seq` runs: the task (its index in the seeded order), why, and its probe size (0: none)."""

    seq: int
    task_index: int
    source: Literal["fresh", "replay"]
    probe: int
    opened_at: float = 0.0
    """Epoch seconds (for `restore`: openings and finishes are replayed in time order)."""
    position: int = -1
    """A fresh pick's position in the fresh stream (-1: a replay, or a plan journaled before positions were)."""

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes) -> GroupPlan:
        body = json.loads(data)
        source = body["source"]
        if source not in ("fresh", "replay"):
            raise ValueError(f"unknown group source {source!r}")
        return cls(
            int(body["seq"]),
            int(body["task_index"]),
            source,
            int(body["probe"]),
            float(body["opened_at"]),
            int(body.get("position", -1)),
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
        self,
        n_tasks: int,
        settings: CurriculumSettings,
        eligible: Callable[[int], bool] | None = None,
        strata: Sequence[str] | None = None,
    ) -> None:
        """eligible(task index): whether a task may be planned (a GRPO phase's task filter; at least one must be):
        fresh picks pass over the others, replays wait in the queue for a phase that takes them. strata: each
        task index's stratum label (required when settings.stratum_floor < 1)."""
        if n_tasks < 1:
            raise ValueError("the curriculum needs at least one task")
        if settings.stratified and (strata is None or len(strata) != n_tasks):
            got = "none" if strata is None else f"{len(strata)}"
            raise ValueError(f"the strata rule needs one stratum label per task ({n_tasks}), got {got}")
        self.n_tasks = n_tasks
        self.settings = settings
        self.eligible = eligible
        self.strata = list(strata) if strata is not None and settings.stratified else None
        self.stratum_names = sorted(set(self.strata)) if self.strata is not None else []
        self.stratum_attempts: collections.Counter[str] = collections.Counter()
        self.stratum_successes: collections.Counter[str] = collections.Counter()
        self.passed_over = 0  # fresh positions the strata rule did not take
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
            weights = self._stratum_weights()
            while True:
                for _ in range(self.n_tasks):
                    if ok(self.fresh_next % self.n_tasks):
                        break
                    self.fresh_next += 1
                else:
                    raise ValueError("no task is eligible for this phase: the curriculum has nothing to plan")
                if weights is None or self._take(self.fresh_next, weights):
                    break
                self.passed_over += 1
                self.fresh_next += 1
            task = self.fresh_next % self.n_tasks
            plan = GroupPlan(seq, task, "fresh", s.probe_attempts, now, self.fresh_next)
            self.fresh_next += 1
            self._count(plan)
            return plan
        plan = GroupPlan(seq, task, source, probe, now)
        self._count(plan)
        return plan

    def stratum_success(self, stratum: str) -> float:
        """The stratum's estimated success rate: its finished attempts with `stratum_prior` pseudo-attempts at 1/2."""
        prior = self.settings.stratum_prior
        return (self.stratum_successes[stratum] + prior / 2) / (self.stratum_attempts[stratum] + prior)

    def _stratum_weights(self) -> dict[str, float] | None:
        """Each stratum's chance that its fresh task is taken (None: the strata rule is off)."""
        if self.strata is None:
            return None
        value = {
            stratum: self.settings.signal_per_episode(self.stratum_success(stratum)) for stratum in self.stratum_names
        }
        best = max(value.values())
        floor = self.settings.stratum_floor
        return {stratum: max(floor, v / best) if best > 0 else 1.0 for stratum, v in value.items()}

    def _take(self, position: int, weights: dict[str, float]) -> bool:
        """The seeded draw at a fresh position: whether its task is taken (same answer on every resume)."""
        assert self.strata is not None
        digest = hashlib.blake2b(f"{self.settings.seed}:{position}".encode(), digest_size=8).digest()
        uniform = int.from_bytes(digest, "big") / 2.0**64
        return uniform < weights[self.strata[position % self.n_tasks]]

    def _count(self, plan: GroupPlan) -> None:
        self.opened += 1
        self.replayed += plan.source == "replay"
        self.visits[plan.task_index] += 1

    def observe(self, plan: GroupPlan, rewards: list[float | None]) -> None:
        """A group finished (stopped early or whole): a task with signal and visits left joins the replay queue."""
        task = plan.task_index
        if self.strata is not None:
            valid = [reward for reward in rewards if reward is not None]
            stratum = self.strata[task]
            self.stratum_attempts[stratum] += len(valid)
            self.stratum_successes[stratum] += sum(1 for reward in valid if reward > 0)
        if (
            self.settings.replay_share > 0
            and has_signal(rewards)
            and self.visits[task] < self.settings.max_visits
            and task not in self._queued
        ):
            self.queue.append(task)
            self._queued.add(task)

    def restore(self, plans: Iterable[GroupPlan], finishes: Iterable[tuple[float, int, list[float | None]]]) -> None:
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
            if plan.source == "fresh" and plan.position >= 0:
                if self.strata is not None:  # the eligible positions before it were passed over by the draw
                    ok = self.eligible or (lambda _: True)
                    gap = range(self.fresh_next, plan.position)
                    self.passed_over += sum(1 for position in gap if ok(position % self.n_tasks))
                self.fresh_next = max(self.fresh_next, plan.position + 1)
            elif plan.source == "fresh":
                # a plan journaled without its position: the first fresh pick at or past fresh_next that lands on
                # it (positions repeat every n_tasks)
                self.fresh_next += (plan.task_index - self.fresh_next) % self.n_tasks + 1
            elif plan.task_index in self._queued:
                self.queue.remove(plan.task_index)
                self._queued.discard(plan.task_index)
            self._count(plan)

    def stats(self) -> dict[str, float]:
        stats = {
            "curriculum/replay_queue": float(len(self.queue)),
            "curriculum/fresh_tasks": float(self.fresh_next),
            "curriculum/replayed_groups": float(self.replayed),
        }
        if self.strata is not None:
            rates = [self.stratum_success(stratum) for stratum in self.stratum_names]
            stats["curriculum/passed_over"] = float(self.passed_over)
            stats["curriculum/stratum_success_min"] = min(rates)
            stats["curriculum/stratum_success_max"] = max(rates)
        return stats
