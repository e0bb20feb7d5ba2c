"""Rollouts spent where they teach (swerl.rollout.curriculum): the probe and replay rules, what they do to the
expected GRPO update (exact enumeration), the manager running probing groups, resume from the journal (probe
mid-way, settled, expanded; the curriculum's state replayed exactly), the signal metrics and config refusals.

Episodes here are functions of the task with fixed or scripted rewards (the manager and journal are real, the
store is a real file store): what is tested is scheduling and bookkeeping, not the agent.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swerl.config import ConfigError, load_config
from swerl.engine.base import Engine
from swerl.rollout.async_loop import collect_batch, signal_stats
from swerl.rollout.curriculum import Curriculum, CurriculumSettings, GroupPlan, has_signal, probe_settles
from swerl.rollout.journal import FinishedAttempt, FinishedGroup, Ledger, RolloutJournal
from swerl.rollout.manager import RolloutManager
from swerl.storage import Store
from swerl.trajectory import Trajectory
from tests.rollout.test_rollout import async_settings, trajectory

# ----------------------------------------------------------------------------------------------------------------
# The rules


def test_signal_and_probe_rules_treat_infra_errors_as_no_outcome() -> None:
    assert has_signal([0.0, 1.0]) and has_signal([None, 1.0, 0.0])
    assert not has_signal([1.0, 1.0]) and not has_signal([None, 1.0]) and not has_signal([])
    assert probe_settles([0.0]) and probe_settles([0.0, 0.0])
    assert not probe_settles([1.0]) and not probe_settles([1.0, 1.0])  # only failures stop a group
    assert not probe_settles([0.0, 1.0]) and not probe_settles([None]) and not probe_settles([0.0, None])
    assert not probe_settles([])


def test_fresh_tasks_come_in_order_with_the_probe_and_replays_take_their_share() -> None:
    curriculum = Curriculum(10, CurriculumSettings(n_attempts=4, probe_attempts=1, replay_share=0.5, max_visits=3))
    plans = [curriculum.plan(seq) for seq in range(3)]
    assert [(p.task_index, p.source, p.probe) for p in plans] == [
        (0, "fresh", 1),
        (1, "fresh", 1),
        (2, "fresh", 1),
    ]
    curriculum.observe(plans[0], [0.0])  # settled by its probe: no signal, not queued
    curriculum.observe(plans[1], [1.0, 0.0, 0.0, 1.0])  # signal: queued
    curriculum.observe(plans[2], [1.0, 0.0, None, 0.0])
    assert list(curriculum.queue) == [1, 2]
    nxt = [curriculum.plan(seq) for seq in range(3, 7)]
    # 3 opened, 0 replayed: replays while replayed < 0.5 x (opened + 1); a replay has no probe
    assert [(p.task_index, p.source, p.probe) for p in nxt] == [
        (1, "replay", 0),
        (2, "replay", 0),
        (3, "fresh", 1),
        (4, "fresh", 1),
    ]
    curriculum.observe(nxt[0], [1.0, 0.0, 1.0, 1.0])  # second visit of task 1, still signal: queued again (3 max)
    replay = curriculum.plan(7)
    assert (replay.task_index, replay.source) == (1, "replay")
    curriculum.observe(replay, [1.0, 0.0, 1.0, 0.0])  # third visit: max_visits reached, not queued
    assert 1 not in curriculum.queue and curriculum.visits[1] == 3


def test_no_replay_without_signal_and_order_wraps() -> None:
    curriculum = Curriculum(3, CurriculumSettings(n_attempts=2, replay_share=0.9, max_visits=2))
    indices = []
    for seq in range(7):
        plan = curriculum.plan(seq)
        indices.append(plan.task_index)
        curriculum.observe(plan, [0.0, 0.0])
    assert indices == [0, 1, 2, 0, 1, 2, 0] and curriculum.replayed == 0


@pytest.mark.parametrize(
    "knobs",
    [
        dict(n_attempts=4, probe_attempts=4),
        dict(n_attempts=4, probe_attempts=-1),
        dict(n_attempts=4, replay_share=1.0),
        dict(n_attempts=4, max_visits=0),
        dict(n_attempts=4, stratum_floor=0.0),
        dict(n_attempts=4, stratum_floor=1.5),
        dict(n_attempts=4, stratum_floor=0.5, stratum_prior=0.0),
    ],
)
def test_settings_refuse_impossible_values(knobs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        CurriculumSettings(**knobs)


# ----------------------------------------------------------------------------------------------------------------
# The strata rule


@pytest.mark.parametrize("probe", [0, 1, 2])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_signal_per_episode_is_what_a_fresh_group_gives_by_enumeration(probe: int, p: float) -> None:
    s = CurriculumSettings(n_attempts=4, probe_attempts=probe)
    signal = episodes = 0.0
    for outcome in itertools.product([0.0, 1.0], repeat=4):
        weight = p ** sum(outcome) * (1 - p) ** (4 - sum(outcome))
        stopped = probe > 0 and probe_settles(list(outcome[:probe]))
        episodes += weight * (probe if stopped else 4)
        signal += weight * (not stopped and has_signal(outcome))
    assert s.signal_per_episode(p) == pytest.approx(signal / episodes)


def test_strata_pass_over_fresh_tasks_of_strata_far_from_the_frontier_but_never_below_the_floor() -> None:
    strata = ["hard", "mid"] * 500
    s = CurriculumSettings(n_attempts=4, probe_attempts=1, stratum_floor=0.2, stratum_prior=2.0, seed=7)
    curriculum = Curriculum(len(strata), s, strata=strata)
    taken: collections.Counter[str] = collections.Counter()
    for seq in range(300):
        plan = curriculum.plan(seq)
        stratum = strata[plan.task_index]
        taken[stratum] += 1
        assert plan.position == plan.task_index  # no lap yet: the position is the task's index
        # hard never passes; mid passes half the time
        curriculum.observe(plan, [0.0] if stratum == "hard" else [1.0, 0.0, 0.0, 1.0])
    assert curriculum.stratum_success("hard") < 0.05 and curriculum.stratum_success("mid") == pytest.approx(
        0.5, abs=0.01
    )
    # once the estimates settle, hard's fresh tasks are taken at the floor's rate (seeded draws: exact counts)
    share = taken["hard"] / (taken["hard"] + taken["mid"])
    assert 0.1 < share < 0.3, taken
    assert curriculum.passed_over > 0 and curriculum.stats()["curriculum/passed_over"] == curriculum.passed_over
    # without strata the same outcomes take every task in order
    plain = Curriculum(len(strata), CurriculumSettings(n_attempts=4, probe_attempts=1))
    assert [plain.plan(seq).task_index for seq in range(5)] == [0, 1, 2, 3, 4]


def test_strata_start_with_every_task_and_need_a_label_per_task() -> None:
    s = CurriculumSettings(n_attempts=4, probe_attempts=1, stratum_floor=0.2)
    with pytest.raises(ValueError, match="one stratum label per task"):
        Curriculum(3, s)
    with pytest.raises(ValueError, match="one stratum label per task"):
        Curriculum(3, s, strata=["a", "b"])
    curriculum = Curriculum(4, s, strata=["a", "b", "a", "b"])
    # no outcome yet: every stratum estimated alike, so every fresh task is taken in order
    assert [curriculum.plan(seq).task_index for seq in range(4)] == [0, 1, 2, 3]
    assert GroupPlan.from_json(curriculum.plan(4).to_json()).position == 4
    # a plan journaled before positions were (no "position" key) still reads
    assert (
        GroupPlan.from_json(b'{"seq": 1, "task_index": 1, "source": "fresh", "probe": 1, "opened_at": 0}').position
        == -1
    )


# ----------------------------------------------------------------------------------------------------------------
# What the rules do to the expected update: exact enumeration over every outcome of a small softmax policy


def expected_update(logits: torch.Tensor, passing: set[int], n: int, probe: int, scale_by_std: bool) -> torch.Tensor:
    """E[sum_i A_i grad log pi(y_i)] over every sequence of n answers, for the groups the rules train: a probe of
    `probe` answers that all score the same stops the group (no update), then groups without signal are dropped
    (dynamic sampling). A_i = r_i - mean(r) (divided by the std when scale_by_std)."""
    probs = torch.softmax(logits, 0)
    total = torch.zeros_like(logits)
    for answers in itertools.product(range(len(logits)), repeat=n):
        rewards = [float(a in passing) for a in answers]
        if probe and probe_settles(rewards[:probe]):
            continue
        if not has_signal(rewards):
            continue
        weight = torch.prod(probs[list(answers)])
        r = torch.tensor(rewards)
        advantages = r - r.mean()
        if scale_by_std:
            advantages = advantages / r.std()
        for answer, advantage in zip(answers, advantages, strict=True):
            grad_log = -probs.clone()
            grad_log[answer] += 1.0
            total += weight * advantage * grad_log
    return total


@pytest.mark.parametrize("probe", [0, 1, 2])
@pytest.mark.parametrize("scale_by_std", [False, True])
def test_probing_and_dropping_keep_each_tasks_update_along_the_gradient_of_its_success_rate(
    probe: int, scale_by_std: bool
) -> None:
    """The module docstring's claim, checked exactly: for any policy over answers (some pass), the expected update
    of the kept groups is a non-negative multiple of grad p(pass)."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(4):
        logits = torch.randn(4, generator=generator, dtype=torch.float64)
        passing = {0, 2}
        probs = torch.softmax(logits, 0)
        p = probs[list(passing)].sum()
        grad_p = torch.tensor([(float(i in passing) - p) * probs[i] for i in range(4)], dtype=torch.float64)
        update = expected_update(logits, passing, n=4, probe=probe, scale_by_std=scale_by_std)
        cosine = torch.nn.functional.cosine_similarity(update, grad_p, dim=0)
        assert cosine > 1 - 1e-9, (probe, scale_by_std, cosine)


def test_the_probe_reweights_tasks_towards_those_the_policy_sometimes_solves() -> None:
    """What the probe changes: the weight on a task falls more for rarely solved tasks (a one-attempt probe stops
    most of their groups) than for tasks solved half the time."""

    def weight(logit: float, probe: int) -> float:
        logits = torch.tensor([logit, 0.0], dtype=torch.float64)
        update = expected_update(logits, {0}, n=4, probe=probe, scale_by_std=False)
        probs = torch.softmax(logits, 0)
        grad_p = torch.tensor([probs[0] * probs[1], -probs[0] * probs[1]], dtype=torch.float64)
        return float(update @ grad_p / (grad_p @ grad_p))

    rare, even = -2.5, 0.0  # p = 0.08 and 0.5
    kept_rare, kept_even = weight(rare, 1) / weight(rare, 0), weight(even, 1) / weight(even, 0)
    assert kept_rare == pytest.approx(0.288, abs=1e-3) and kept_even == pytest.approx(0.5)  # exact enumeration


# ----------------------------------------------------------------------------------------------------------------
# Resume: the state rebuilt from the journal's plans and outcomes equals the live one


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n_tasks=st.integers(1, 6),
    share=st.sampled_from([0.0, 0.3, 0.5, 0.8]),
    probe=st.integers(0, 2),
    visits=st.integers(2, 4),
    floor=st.sampled_from([1.0, 0.5, 0.05]),
)
def test_restore_from_the_journal_rebuilds_the_live_state(
    seed: int, n_tasks: int, share: float, probe: int, visits: int, floor: float
) -> None:
    rng = random.Random(seed)
    s = CurriculumSettings(
        n_attempts=3,
        probe_attempts=probe,
        replay_share=share,
        max_visits=visits,
        stratum_floor=floor,
        stratum_prior=1.0,
        seed=seed,
    )
    strata = [f"s{index % 2}" for index in range(n_tasks)]
    live = Curriculum(n_tasks, s, strata=strata)
    plans: list[GroupPlan] = []
    finishes: list[tuple[float, int, list[float | None]]] = []
    open_plans: list[GroupPlan] = []
    clock = 0.0
    for seq in range(30):
        clock += 1.0
        plan = live.plan(seq, clock)
        plans.append(plan)
        open_plans.append(plan)
        while open_plans and rng.random() < 0.6:  # groups finish in any order
            done = open_plans.pop(rng.randrange(len(open_plans)))
            clock += 0.5
            # stratum s0 mostly fails, s1 mostly passes: the strata rule passes over tasks (laps included)
            good = 0.9 if strata[done.task_index] == "s1" else 0.05
            rewards: list[float | None] = [rng.choice([1.0 if rng.random() < good else 0.0, None]) for _ in range(3)]
            live.observe(done, rewards)
            finishes.append((clock, done.seq, rewards))
    restored = Curriculum(n_tasks, s, strata=strata)
    shuffled = plans[:]
    rng.shuffle(shuffled)  # the store lists them in any order
    restored.restore(shuffled, list(reversed(finishes)))
    assert (restored.fresh_next, restored.opened, restored.replayed) == (
        live.fresh_next,
        live.opened,
        live.replayed,
    )
    assert list(restored.queue) == list(live.queue) and restored.visits == live.visits
    assert restored.passed_over == live.passed_over
    assert (restored.stratum_attempts, restored.stratum_successes) == (
        live.stratum_attempts,
        live.stratum_successes,
    )
    assert [restored.plan(seq).task_index for seq in range(30, 40)] == [
        live.plan(seq).task_index for seq in range(30, 40)
    ]


# ----------------------------------------------------------------------------------------------------------------
# The manager: probing groups, the journal, resume


def scripted(rewards_by_task: dict[int, list[float]], started: list[str]) -> Any:
    """An episode whose reward is rewards_by_task[task][attempt] (task = the task index the group runs)."""

    async def episode(engine: Engine, task: int, *, attempt: int, group_id: str) -> Trajectory:
        started.append(f"{group_id}/{attempt}")
        await asyncio.sleep(0)
        return trajectory([0], rewards_by_task[task][attempt], attempt, group_id)

    return episode


def run_groups(manager: RolloutManager[Any], count: int) -> list[FinishedGroup]:
    async def run() -> list[FinishedGroup]:
        groups = [await manager.get() for _ in range(count)]
        await manager.close()
        return groups

    async def main() -> list[FinishedGroup]:
        manager.start()
        return await run()

    return asyncio.run(main())


def test_a_probe_that_settles_stops_its_group_and_one_that_disagrees_opens_the_rest(tmp_path: Path) -> None:
    rewards = {0: [0.0] * 4, 1: [0.0, 1.0, 0.0, 1.0], 2: [0.0, 0.0, 1.0, 0.0], 3: [1.0, 1.0, 0.0, 0.0]}
    started: list[str] = []
    journal = RolloutJournal(Store(f"file://{tmp_path}/store"), "rollouts")
    curriculum = Curriculum(4, CurriculumSettings(n_attempts=4, probe_attempts=2))
    manager = RolloutManager(
        None,
        scripted(rewards, started),
        lambda index: index % 4,
        n_attempts=4,  # type: ignore[arg-type]
        max_in_flight=1,
        max_buffered_groups=100,
        journal=journal,
        curriculum=curriculum,
    )
    groups = run_groups(manager, 4)
    by_seq = {g.seq: g for g in groups}
    assert [len(by_seq[s].attempts) for s in range(4)] == [2, 4, 2, 4]
    assert [by_seq[s].stopped_early for s in range(4)] == [True, False, True, False]
    assert [t.reward for t in by_seq[3].trajectories] == [
        1.0,
        1.0,
        0.0,
        0.0,
    ]  # the probe is part of the group
    assert started[:12] == [
        "g00000000/0",
        "g00000000/1",
        "g00000001/0",
        "g00000001/1",
        "g00000001/2",
        "g00000001/3",
        "g00000002/0",
        "g00000002/1",
        "g00000003/0",
        "g00000003/1",
        "g00000003/2",
        "g00000003/3",
    ]
    plans, finishes = journal.load_curriculum()
    assert sorted((p.seq, p.task_index, p.probe) for p in plans)[:4] == [
        (0, 0, 2),
        (1, 1, 2),
        (2, 2, 2),
        (3, 3, 2),
    ]
    assert sorted((seq, r) for _, seq, r in finishes)[:4] == [
        (0, [0.0, 0.0]),
        (1, [0.0, 1.0, 0.0, 1.0]),
        (2, [0.0, 0.0]),
        (3, [1.0, 1.0, 0.0, 0.0]),
    ]

    async def batch() -> tuple[list[list[float | None]], dict[str, int], Ledger]:
        again = RolloutManager(
            None,
            scripted(rewards, []),
            lambda i: i % 4,
            n_attempts=4,
            max_in_flight=1,  # type: ignore[arg-type]
            max_buffered_groups=100,
            journal=RolloutJournal(None, "x"),
        )
        again.buffer.extend(groups)
        ledger = Ledger()
        taken = await collect_batch(
            again, 0, async_settings(steps=1, tasks_per_step=2, max_staleness=0, max_extra_groups_per_step=0), ledger
        )
        await again.close()
        return [[t.reward for t in g] for g in taken.groups], dict(taken.discarded), ledger

    trained, discarded, ledger = asyncio.run(batch())
    # probe-stopped groups are discarded even with no extra-group allowance; both trained groups have signal
    assert discarded == {"probe_stopped": 2} and len(trained) == 2
    assert sorted(reason for _, _, reason in ledger.entries) == [
        "probe_stopped",
        "probe_stopped",
        "trained",
        "trained",
    ]


def test_resume_reruns_a_probe_midway_keeps_a_settled_one_and_finishes_an_expanded_one(
    tmp_path: Path,
) -> None:
    store = Store(f"file://{tmp_path}/store")
    journal = RolloutJournal(store, "stages/grpo/KEY/rollouts")
    s = CurriculumSettings(n_attempts=4, probe_attempts=2)
    for seq in range(4):
        journal.record_plan(GroupPlan(seq, seq, "fresh", 2, float(seq)))

    def record(seq: int, attempt: int, reward: float) -> None:
        t = trajectory([0], reward, attempt, f"g{seq:08d}")
        journal.record(FinishedAttempt(seq, 0, t, 10.0, 11.0 + attempt))

    record(0, 0, 0.0)  # probe midway
    record(1, 0, 0.0)  # probe settled (all fail), never closed before the crash
    record(1, 1, 0.0)
    record(2, 0, 1.0)  # probe disagreed: expanded, attempt 3 finished, 2 did not
    record(2, 1, 0.0)
    record(2, 3, 1.0)
    # group 3: planned, nothing finished
    started: list[str] = []
    curriculum = Curriculum(10, s)
    plans, finishes = journal.load_curriculum()
    curriculum.restore(plans, finishes)

    async def run() -> tuple[dict[str, int], list[tuple[int, bool]]]:
        manager = RolloutManager(
            None,
            never(started),
            lambda i: i,
            n_attempts=4,
            max_in_flight=8,  # type: ignore[arg-type]
            max_buffered_groups=100,
            journal=journal,
            curriculum=curriculum,
        )
        counts = manager.restore(journal.load(set()), Ledger(), plans)
        buffered = [(g.seq, g.stopped_early) for g in manager.buffer]
        manager.start()
        await asyncio.sleep(0.05)
        await manager.close()
        return counts, buffered

    counts, buffered = asyncio.run(run())
    assert buffered == [(1, True)]
    assert counts == {
        "reloaded_groups": 1,
        "partial_groups": 2,
        "rerun_groups": 1,
        "skipped_groups": 0,
        "damaged_entries": 0,
    }
    # only what is missing: group 0's second probe attempt, group 2's attempt 2, group 3's probe; then seq 4 (task 4,
    # the curriculum's fresh position after the journaled picks 0-3)
    assert started == [
        "g00000000/1",
        "g00000002/2",
        "g00000003/0",
        "g00000003/1",
        "g00000004/0",
        "g00000004/1",
        "g00000005/0",
        "g00000005/1",
    ]


def never(started: list[str]) -> Any:
    async def episode(engine: Engine, task: Any, *, attempt: int, group_id: str) -> Trajectory:
        started.append(f"{group_id}/{attempt}")
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    return episode


def test_replayed_tasks_come_from_groups_with_signal_and_the_metrics_count_rolled_episodes(
    tmp_path: Path,
) -> None:
    # task t passes on attempts listed: tasks 0 and 3 never pass, 1 and 2 sometimes
    rewards = collections.defaultdict(lambda: [0.0] * 4, {1: [1.0, 0.0, 1.0, 0.0], 2: [0.0, 1.0, 0.0, 0.0]})
    started: list[str] = []
    journal = RolloutJournal(Store(f"file://{tmp_path}/store"), "rollouts")
    curriculum = Curriculum(50, CurriculumSettings(n_attempts=4, probe_attempts=1, replay_share=0.5, max_visits=3))
    manager = RolloutManager(
        None,
        scripted(rewards, started),
        lambda i: i,
        n_attempts=4,
        max_in_flight=1,  # type: ignore[arg-type]
        max_buffered_groups=100,
        journal=journal,
        curriculum=curriculum,
    )
    groups = run_groups(manager, 12)
    tasks = [manager.plan_of(g.seq).task_index for g in groups]
    sources = [manager.plan_of(g.seq).source for g in groups]
    assert tasks.count(1) == 3 and "replay" in sources  # task 1 always has signal: visited max_visits times
    assert 0 not in [t for t, s in zip(tasks, sources, strict=True) if s == "replay"]
    # task 2's probe (attempt 0) fails: it stops at one episode, so it is never found to have signal
    assert tasks.count(2) == 1
    totals: collections.Counter[str] = collections.Counter()
    stats = signal_stats(groups, totals)
    signal = sum(has_signal([t.reward for t in g.trajectories]) for g in groups)
    episodes = sum(len(g.attempts) for g in groups)
    assert stats["signal/groups_per_100_episodes"] == pytest.approx(100 * signal / episodes)
    assert totals["probe_stopped"] == sum(g.stopped_early for g in groups) > 0
    assert episodes < 4 * len(groups)


# ----------------------------------------------------------------------------------------------------------------
# Config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["grpo.mode=sync", "grpo.rollout.probe_attempts=1"], "need mode async"),
        (
            ["grpo.mode=async", "grpo.rollout.attempts_per_task=4", "grpo.rollout.probe_attempts=4"],
            "probe_attempts \\(4\\) must be below attempts_per_task",
        ),
        (
            [
                "grpo.mode=async",
                "grpo.rollout.replay_share=0.5",
                "grpo.rollout.max_visits=3",
                "grpo.rollout.prewarm_groups=2",
            ],
            "prewarm_groups needs each group's task",
        ),
        (["grpo.mode=async", "grpo.rollout.replay_share=0.5"], "needs max_visits >= 2"),
        (
            ["grpo.mode=async", "grpo.rollout.stratify_by=modifier", "grpo.rollout.prewarm_groups=2"],
            "prewarm_groups needs each group's task",
        ),
        (["grpo.mode=sync", "grpo.rollout.stratify_by=modifier"], "need mode async"),
        (["grpo.mode=async", "grpo.rollout.stratify_by=colour"], "grpo.rollout.stratify_by"),
        (["grpo.mode=async", "grpo.rollout.stratify_by=modifier", "grpo.rollout.stratum_floor=0"], "stratum_floor"),
        (
            ["grpo.mode=async", "grpo.rollout.replay_share=1.0", "grpo.rollout.max_visits=3"],
            "grpo.rollout.replay_share",
        ),
    ],
)
def test_config_refuses_impossible_curricula(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)
