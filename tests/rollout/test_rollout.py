"""Asynchronous rollouts: the staleness policy on constructed version histories, long-tail metrics, the buffer's
dynamic sampling, the journal's resume, config refusals, and the manager + loop end to end with injected
infrastructure failures.

Everything is real except two edges: the engine (swerl.engine.emulated: no model behind it, its latencies and
tool calls follow the recipe's profile) and, in the failure test, wrappers at the Engine and SandboxProvider
protocol boundaries that raise an engine 503 or timeout and kill a real sandbox mid-command (tests/doubles.py).
The agent loop, bubblewrap sandboxes, grading, the store, the trainer (a tiny model) and the manager run for real.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from transformers import PreTrainedTokenizerBase

from benchmarks.grpo_async import agent_episode, clean_micro_tasks, emulation_tokenizer
from swerl.agent.episode import EpisodeLimits
from swerl.config import ConfigError, load_config
from swerl.data.environments import task_environment
from swerl.data.schema import TaskInstance
from swerl.engine.base import Engine
from swerl.engine.emulated import EmulatedEngine, EpisodeProfile
from swerl.rollout.async_loop import AsyncSettings, Batch, BudgetSpent, collect_batch, train_async
from swerl.rollout.journal import FinishedAttempt, JournalState, Ledger, RolloutJournal
from swerl.rollout.longtail import longtail_stats, tail_share
from swerl.rollout.manager import RolloutManager
from swerl.rollout.staleness import StalenessPolicy, staleness, staleness_stats, triage_group
from swerl.storage import Store
from swerl.train.grpo_step import score_groups
from swerl.trajectory import EpisodeStatus, Trajectory
from tests.doubles import CountingTrainer, FailingEngine, KillingProvider, VersionEngine
from tests.sandbox_helpers import local_provider, pool_around
from tests.tiny_models import SMALL, tiny_qwen3
from tests.trainer_helpers import grpo_trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread", "micro_cache")

PROFILE = EpisodeProfile(max_turns=4, turn_latency_s=0.01, turn_cap_share=0.5)
LIMITS = EpisodeLimits(
    max_turns=4,
    max_trajectory_tokens=2048,
    max_new_tokens_per_turn=64,
    command_timeout_s=20,
    test_timeout_s=30,
    max_observation_chars=4000,
    episode_timeout_s=1800.0,
    max_malformed_calls=1_000_000,
)


def async_settings(**knobs: Any) -> AsyncSettings:
    """The async loop's settings with the values these tests were written for, changed by knobs."""
    base: dict[str, Any] = dict(
        staleness_policy=StalenessPolicy.DROP,
        max_requeues=1,
        dynamic_sampling=True,
        max_extra_groups_per_step=32,
        checkpoint_every=0,
        time_budget_s=None,
        max_empty_steps=3,
    )
    return AsyncSettings(**(base | knobs))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerBase:
    return emulation_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def tasks(micro_cache: Path) -> list[TaskInstance]:
    return clean_micro_tasks(4)


def trajectory(versions: list[int], reward: float | None = 0.0, attempt: int = 0, group: str = "g") -> Trajectory:
    """A trajectory whose sampled tokens (one per entry of versions >= 0) carry those weight versions."""
    mask = [0, *(1 if v >= 0 else 0 for v in versions)]
    status = (
        EpisodeStatus.INFRA_ERROR if reward is None else EpisodeStatus.RESOLVED if reward else EpisodeStatus.UNRESOLVED
    )
    return Trajectory(
        task_id="t",
        attempt=attempt,
        group_id=group,
        status=status,
        reward=reward,
        prompt_tokens=1,
        token_ids=[5] * len(mask),
        loss_mask=mask,
        behaviour_logprobs=[-0.5 * m for m in mask],
        token_weight_versions=[-1, *versions],
        infra_cause="engine_http" if reward is None else None,
    )


# ----------------------------------------------------------------------------------------------------------------
# Staleness on constructed version histories


def test_staleness_is_measured_from_the_oldest_sampled_token() -> None:
    spanning = trajectory([3, 3, -1, 4, 5])  # a partial rollout: sampled under versions 3, 4 and 5
    assert staleness(spanning, 6) == 3 and staleness(spanning, 3) == 0
    assert staleness(trajectory([-1, -1]), 9) == 0  # sampled nothing (an infra error before the first turn)


@pytest.mark.parametrize("policy", list(StalenessPolicy))
def test_staleness_policy_on_constructed_histories(policy: StalenessPolicy) -> None:
    # Trainer at version 6, max_staleness 2: oldest tokens 3 (stale) and 4, 5, 6 (fresh).
    group = [
        trajectory([3, 5, 6], 1.0, 0),
        trajectory([4, 6], 0.0, 1),
        trajectory([5], 1.0, 2),
        trajectory([6], 0.0, 3),
    ]
    result = triage_group(group, 6, 2, policy)
    assert result.stale == 1
    if policy is StalenessPolicy.KEEP:
        assert (result.action, result.kept, result.left_out) == ("train", group, 0)
    elif policy is StalenessPolicy.DROP:
        assert (result.action, result.kept, result.left_out) == ("train", group[1:], 1)
    else:
        assert result.action == "requeue" and result.kept == []
        assert triage_group(group, 6, 2, policy, requeues_done=1, max_requeues=1).action == "drop"
    # Exactly at the bound is not stale; one more version is.
    assert triage_group(group, 5, 2, policy).stale == 0
    # Drop leaving fewer than two valid attempts drops the group.
    two_stale = [
        trajectory([2], 1.0, 0),
        trajectory([3], 0.0, 1),
        trajectory([6], None, 2),
        trajectory([6], 1.0, 3),
    ]
    if policy is StalenessPolicy.DROP:
        assert triage_group(two_stale, 6, 2, policy).action == "drop"


def test_staleness_distribution() -> None:
    batch = [trajectory([6, 6]), trajectory([4, 5]), trajectory([4]), trajectory([-1])]
    stats = staleness_stats(batch, 6)
    assert stats["staleness/mean"] == pytest.approx((0 + 2 + 2 + 0) / 4)
    assert stats["staleness/token_mean"] == pytest.approx((0 + 0 + 2 + 1 + 2) / 5)
    assert (stats["staleness/count_0"], stats["staleness/count_1"], stats["staleness/count_2"]) == (2, 0, 2)
    assert stats["staleness/fresh_share"] == 0.5 and stats["staleness/max"] == 2


# ----------------------------------------------------------------------------------------------------------------
# Long-tail metrics


def test_tail_share_matches_a_brute_force_count() -> None:
    starts, finishes = [0.0] * 10, [1, 2, 3, 4, 5, 6, 7, 8, 9, 30]
    # 90% (9 of 10) finished at t=9; the span is 30 s; 21 s came after.
    assert tail_share(starts, [float(f) for f in finishes]) == pytest.approx(21 / 30)
    grid = [i / 100 for i in range(3001)]  # brute force: share of time points after the 9th finish
    assert tail_share(starts, [float(f) for f in finishes]) == pytest.approx(
        sum(t > 9 for t in grid) / len(grid), abs=0.01
    )


def test_longtail_stats_of_constructed_groups() -> None:
    def attempt(seq: int, index: int, start: float, end: float, status: EpisodeStatus, turns: int) -> FinishedAttempt:
        base = trajectory([0], 0.0, index, f"g{seq}").model_copy(update={"status": status, "num_turns": turns})
        return FinishedAttempt(seq, 0, base, start, end)

    from swerl.rollout.journal import FinishedGroup

    groups = [
        FinishedGroup(
            0, 0, [attempt(0, 0, 0, 10, EpisodeStatus.TURN_CAP, 30), attempt(0, 1, 0, 4, EpisodeStatus.RESOLVED, 8)]
        ),
        FinishedGroup(
            1, 0, [attempt(1, 0, 1, 3, EpisodeStatus.LENGTH_CAP, 5), attempt(1, 1, 1, 6, EpisodeStatus.TURN_CAP, 30)]
        ),
    ]
    stats = longtail_stats(groups)
    assert stats["longtail/turn_cap_rate"] == 0.5 and stats["longtail/length_cap_rate"] == 0.25
    assert stats["longtail/group_spread_max"] == pytest.approx(10 / 4)
    assert stats["longtail/group_spread_mean"] == pytest.approx((10 / 4 + 5 / 2) / 2)
    assert (stats["longtail/slowest_s"], stats["longtail/slowest_turns"]) == (10, 30)
    assert stats["longtail/tail_share_after_p90"] == pytest.approx((10 - 10) / 10)  # 4 attempts: p90 is the last


# ----------------------------------------------------------------------------------------------------------------
# Config refusals before anything starts


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["grpo.rollout.max_staleness=-1"], "grpo.rollout.max_staleness"),
        (
            ["grpo.mode=async", "grpo.schedule.tasks_per_step=8", "grpo.rollout.max_buffered_groups=4"],
            "exceeds rollout.max_buffered_groups",
        ),
        (
            [
                "grpo.mode=async",
                "grpo.schedule.tasks_per_step=8",
                "grpo.rollout.max_staleness=0",
                "grpo.rollout.max_buffered_groups=7",
            ],
            "rollouts may ever hold",
        ),
        (
            ["grpo.algorithm.mis_high=2.0", "grpo.algorithm.mis_low=1.0", "grpo.algorithm.tis_cap=1.0"],
            "every kept weight is truncated",
        ),
        (["grpo.rollout.staleness_policy=ignore"], "grpo.rollout.staleness_policy"),
        (["grpo.algorithm.mis_high=0.5"], "grpo.algorithm.mis_high"),
    ],
)
def test_config_refuses_bad_async_settings(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_local_config_and_async_mode_load() -> None:
    cfg = load_config(Path("configs/local.yaml"), ["grpo.mode=async"])
    assert cfg.grpo.mode == "async" and cfg.grpo.buffered_groups >= cfg.grpo.schedule.tasks_per_step


# ----------------------------------------------------------------------------------------------------------------
# The buffer: dynamic sampling and the journal's resume


async def never_finishes(engine: Engine, task: Any, *, attempt: int, group_id: str) -> Trajectory:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


def finished_group(seq: int, rewards: list[float | None], finished_at: float = 0.0) -> dict[int, FinishedAttempt]:
    return {
        index: FinishedAttempt(
            seq, 0, trajectory([0], reward, index, f"g{seq:08d}"), finished_at - 1, finished_at + index
        )
        for index, reward in enumerate(rewards)
    }


@pytest.mark.parametrize("dynamic_sampling", [True, False])
def test_dynamic_sampling_refills_instead_of_training_groups_without_gradient(dynamic_sampling: bool) -> None:
    rewards: list[list[float | None]] = [[0, 0], [1, 1], [0, None], [0, 0], [1, 0], [0, 0], [0, 1]]
    state = JournalState(
        {seq: (0, finished_group(seq, r, float(seq))) for seq, r in enumerate(rewards)}, len(rewards) - 1
    )

    async def run() -> tuple[Batch, Ledger]:
        manager = RolloutManager(
            None,
            never_finishes,
            lambda seq: seq,
            n_attempts=2,
            max_in_flight=2,  # type: ignore[arg-type]
            max_buffered_groups=100,
            journal=RolloutJournal(None, "x"),
        )
        manager.restore(state, Ledger())
        ledger = Ledger()
        settings = async_settings(
            steps=1, tasks_per_step=2, max_staleness=0, dynamic_sampling=dynamic_sampling, max_extra_groups_per_step=4
        )
        batch = await collect_batch(manager, 0, settings, ledger)
        await manager.close()
        return batch, ledger

    batch, ledger = asyncio.run(run())
    if dynamic_sampling:
        # 0: no signal, 1: no signal, 2: one valid attempt, 3: no signal -> discarded (4 = the cap); 4 trains;
        # 5 has no signal but the cap is reached, so it fills the second slot.
        assert [[t.reward for t in g] for g in batch.groups] == [[1, 0], [0, 0]]
        assert dict(batch.discarded) == {"no_signal": 3, "few_valid": 1}
        assert ledger.entries == [
            (0, 1, "no_signal"),
            (1, 1, "no_signal"),
            (2, 1, "few_valid"),
            (3, 1, "no_signal"),
            (4, 1, "trained"),
            (5, 1, "trained"),
        ]
    else:
        assert [[t.reward for t in g] for g in batch.groups] == [[0, 0], [1, 1]]
        assert ledger.entries == [(0, 1, "trained"), (1, 1, "trained")]


def restore_and_start(
    journal: RolloutJournal, ledger: Ledger, position: int = 0, **manager_args: Any
) -> tuple[dict[str, int], list[int], int, list[str]]:
    """A manager restored from `journal` and `ledger`, then started for a moment (its episodes never finish): the
    restore's counts, the groups back in the buffer, the data position, the attempts started ("gSEQ/ATTEMPT")."""
    started: list[str] = []

    async def recording(engine: Engine, task: Any, *, attempt: int, group_id: str) -> Trajectory:
        started.append(f"{group_id}/{attempt}")
        return await never_finishes(engine, task, attempt=attempt, group_id=group_id)

    async def run() -> tuple[dict[str, int], list[int], int]:
        manager = RolloutManager(
            None,
            recording,
            lambda seq: seq,
            max_buffered_groups=100,
            journal=journal,  # type: ignore[arg-type]
            **manager_args,
        )
        counts = manager.restore(journal.load(ledger.consumed), ledger, position=position)
        buffered, next_seq = [group.seq for group in manager.buffer], manager.next_seq
        manager.start()
        await asyncio.sleep(0.05)
        await manager.close()
        return counts, buffered, next_seq

    return (*asyncio.run(run()), started)


def test_journal_resume_reloads_finished_groups_and_reruns_only_what_is_missing(tmp_path: Path) -> None:
    store = Store(f"file://{tmp_path}/store")
    journal = RolloutJournal(store, "stages/grpo/KEY/rollouts")
    for seq, attempts in [(0, [0, 1]), (1, [1]), (3, [0, 1]), (4, [0, 1])]:  # seq 2: nothing finished
        group = finished_group(seq, [1.0, 0.0], 10.0 - seq)  # later seqs finished earlier
        for attempt in attempts:
            journal.record(group[attempt])
    ledger = Ledger([(4, 1, "trained")])  # the restored checkpoint had trained group 4
    counts, buffered, next_seq, started = restore_and_start(journal, ledger, n_attempts=2, max_in_flight=4)
    assert counts == {
        "reloaded_groups": 2,
        "partial_groups": 1,
        "rerun_groups": 1,
        "skipped_groups": 0,
        "damaged_entries": 0,
    }
    assert buffered == [3, 0]  # finished, untrained: back in the buffer in finishing order
    # Only the missing attempt of group 1, all of group 2, then the data stream continues at 5 (not 0, not 4).
    assert started == ["g00000001/0", "g00000002/0", "g00000002/1", "g00000005/0"]
    assert next_seq == 5


def test_a_batch_still_being_collected_when_the_budget_runs_out_is_given_back() -> None:
    # Group 0 has no signal (discarded), group 1 is trainable, and no other group ever finishes: B = 2 is never met.
    state = JournalState({seq: (0, finished_group(seq, r, float(seq))) for seq, r in enumerate([[0, 0], [1, 0]])}, 1)

    async def run() -> tuple[Ledger, list[int], float]:
        manager = RolloutManager(
            None,
            never_finishes,
            lambda seq: seq,
            n_attempts=2,
            max_in_flight=2,  # type: ignore[arg-type]
            max_buffered_groups=100,
            journal=RolloutJournal(None, "x"),
        )
        manager.restore(state, Ledger())
        manager.start()
        ledger = Ledger()
        settings = async_settings(steps=1, tasks_per_step=2, max_staleness=0, max_extra_groups_per_step=4)
        started = asyncio.get_running_loop().time()
        with pytest.raises(BudgetSpent, match="1 trainable groups of 2"):
            await collect_batch(manager, 0, settings, ledger, deadline=time.monotonic() + 0.3)
        waited = asyncio.get_running_loop().time() - started
        await manager.close()
        return ledger, [group.seq for group in manager.buffer], waited

    ledger, buffered, waited = asyncio.run(run())
    assert 0.3 <= waited < 2.0
    assert ledger.entries == [(0, 1, "no_signal")]  # the discard stands; group 1's 'trained' mark was taken back
    assert buffered == [1]  # ... and group 1 is back at the front of the buffer, untrained


@pytest.mark.parametrize("finished_groups", [1, 3])
def test_the_async_loop_keeps_to_its_time_budget(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path, finished_groups: int
) -> None:
    # Real trainer (tiny model) whose update is slowed to ~0.8 s; B = 1; budget 1.2 s. Step 1 trains. Then either
    # no group ever finishes (1 group): the wait is cut at the budget; or a batch is ready at once (3 groups) but
    # an update like the last one would end past the budget: it is not started. Either way the untrained group
    # goes back and the loop ends within the budget (plus the export of step 1), not one update later.
    state = JournalState(
        {seq: (0, finished_group(seq, [1, 0], float(seq))) for seq in range(finished_groups)},
        finished_groups - 1,
    )
    model = tiny_qwen3(tokenizer, 2048, shape=SMALL)
    trainer = grpo_trainer(model, lr=1e-3, seed=0)
    step = trainer.train_step

    def slow_step(groups: Any) -> dict[str, float]:
        time.sleep(0.8)
        return step(groups)

    trainer.train_step = slow_step  # type: ignore[method-assign]
    ledger = Ledger()

    async def run() -> tuple[float, list[int]]:
        manager = RolloutManager(
            EmulatedEngine(tokenizer, PROFILE, seed=0),
            never_finishes,
            lambda seq: seq,
            n_attempts=2,
            max_in_flight=2,
            max_buffered_groups=100,
            journal=RolloutJournal(None, "x"),
        )
        manager.restore(state, Ledger())
        settings = async_settings(steps=10, tasks_per_step=1, max_staleness=10, time_budget_s=1.2)
        started = time.monotonic()
        async for _ in train_async(trainer, manager.engine, manager, settings, ledger, export_dir=tmp_path / "exports"):
            pass
        return time.monotonic() - started, [group.seq for group in manager.buffer]

    elapsed, buffered = asyncio.run(run())
    assert trainer.step == 1
    assert ledger.entries == [(0, 1, "trained")]
    assert buffered == list(range(1, finished_groups))  # given back in order (the 3-group case), none lost
    assert elapsed < 1.5  # without the budget logic: 1 group waits forever; 3 groups train 2 updates, >= 1.7 s


def test_requeue_reruns_the_whole_group_first_under_a_new_generation() -> None:
    started: list[str] = []

    async def recording(engine: Engine, task: Any, *, attempt: int, group_id: str) -> Trajectory:
        started.append(f"{group_id}/{attempt}")
        return await never_finishes(engine, task, attempt=attempt, group_id=group_id)

    async def run() -> None:
        manager = RolloutManager(
            None,
            recording,
            lambda seq: seq,
            n_attempts=2,
            max_in_flight=2,  # type: ignore[arg-type]
            max_buffered_groups=1,
            journal=RolloutJournal(None, "x"),
        )
        manager.restore(JournalState({0: (0, finished_group(0, [1, 0]))}, 0), Ledger())
        group = await manager.get()  # the buffer empties: a new group (seq 1) opens
        await asyncio.sleep(0.01)
        manager.max_in_flight = 4
        manager.requeue(group)
        await asyncio.sleep(0.01)
        await manager.close()

    asyncio.run(run())
    assert started == ["g00000001/0", "g00000001/1", "g00000000r1/0", "g00000000r1/1"]


# ----------------------------------------------------------------------------------------------------------------
# The manager and the loop with the real agent, sandboxes and trainer


def test_manager_keeps_trajectories_in_flight_and_real_grading_scores_them(
    tokenizer: PreTrainedTokenizerBase, tasks: list[TaskInstance], tmp_path: Path
) -> None:
    store = Store(f"file://{tmp_path}/store")
    journal = RolloutJournal(store, "rollouts")
    counts: dict[str, int] = {}
    episode = agent_episode(local_provider(git_baseline=True), tokenizer, LIMITS, 1, counts)
    engine = EmulatedEngine(tokenizer, PROFILE, seed=3)
    samples: list[int] = []

    async def run() -> list[Any]:
        manager = RolloutManager(
            engine,
            episode,
            lambda seq: tasks[seq % len(tasks)],
            n_attempts=2,
            max_in_flight=5,
            max_buffered_groups=3,
            journal=journal,
        )
        manager.start()
        groups: list[Any] = []
        while len(groups) < 6:
            samples.append(manager.in_flight)
            groups.append(await manager.get())
            samples.append(manager.in_flight)
        await manager.close()
        return groups

    groups = asyncio.run(run())
    assert max(samples) == 5 and all(count <= 5 for count in samples)
    assert len({group.seq for group in groups}) == 6
    for group in groups:
        assert [a.trajectory.attempt for a in group.attempts] == [0, 1]
        for attempt in group.attempts:
            t = attempt.trajectory
            plan = engine.plan(f"{t.group_id}/{t.attempt}")
            # Real grading of the real workspace: the plan that broke mod.py fails, the one that submits passes.
            assert t.reward == (1.0 if plan.submits else 0.0), (t.status, plan)
            assert t.status is (EpisodeStatus.RESOLVED if plan.submits else EpisodeStatus.TURN_CAP)
            assert t.num_turns == plan.turns
            stored = FinishedAttempt.from_json(
                store.read_bytes(f"rollouts/g{group.seq:08d}/r000-a{t.attempt:04d}.json")
            )
            assert stored.trajectory == t  # persisted as it finished
    assert counts == {}


def test_a_group_opened_before_its_warm_up_is_not_warmed() -> None:
    """With room for two groups, groups 0 and 1 open together: warming group 1 would come too late (its attempts
    start cold, the warm sandboxes would wait unused), so only group 2 (the one after the newest open) is warmed,
    and a group that opens while its warm-up is being prepared is not started either."""
    prepared: list[int] = []
    started: list[int] = []
    release = asyncio.Event()

    async def prewarm(seq: int) -> Callable[[], None]:
        prepared.append(seq)
        if seq == 3:
            await release.wait()  # group 3 opens while this preparation is under way
        return lambda: started.append(seq)

    async def run() -> None:
        manager = RolloutManager(
            None,
            never_finishes,
            lambda seq: seq,
            n_attempts=2,
            max_in_flight=4,  # type: ignore[arg-type]
            max_buffered_groups=8,
            journal=RolloutJournal(None, "x"),
            prewarm=prewarm,
            prewarm_groups=1,
        )
        manager.start()
        await asyncio.sleep(0.05)
        assert (prepared, started) == ([2], [2])
        manager.max_in_flight = 6  # room for group 2, whose opening warms group 3
        manager._fill()
        await asyncio.sleep(0.05)
        manager.max_in_flight = 8  # group 3 opens before its preparation returns
        manager._fill()
        release.set()
        await asyncio.sleep(0.05)
        assert (prepared, started) == ([2, 3, 4], [2, 4])
        await manager.close()

    asyncio.run(run())


def test_groups_are_warmed_ahead_and_their_attempts_start_warm(
    tokenizer: PreTrainedTokenizerBase, tasks: list[TaskInstance], tmp_path: Path
) -> None:
    """grpo.rollout.prewarm_groups: when a group opens, the next one's sandboxes start (SandboxPool.warm_ahead), so its
    attempts get ready sandboxes; each group is warmed once, in data order, and nothing is left after close."""
    sandboxes = tmp_path / "sandboxes"
    pool = pool_around(
        local_provider(git_baseline=True, root_dir=sandboxes),
        max_concurrent=8,
        owns_provider=True,  # as the stages' pools do: closing the pool releases the provider (its zygote)
    )
    attempt = agent_episode(pool, tokenizer, LIMITS, 1, {})
    graded: list[str] = []

    async def episode(*args: Any, **kwargs: Any) -> Trajectory:
        trajectory = await attempt(*args, **kwargs)
        if trajectory.grade_status:
            graded.append(trajectory.grade_status)
        return trajectory

    engine = EmulatedEngine(tokenizer, EpisodeProfile(max_turns=4, turn_latency_s=0.2, turn_cap_share=0.5), seed=3)
    warmed: list[TaskInstance] = []

    async def prewarm(task: TaskInstance) -> Callable[[], None]:
        warmed.append(task)
        env_dir, setup_patch = await asyncio.to_thread(task_environment, task)
        return lambda: pool.warm_ahead(env_dir, setup_patch, 2)

    async def run() -> int:
        async with pool:
            manager = RolloutManager(
                engine,
                episode,
                lambda seq: tasks[seq % len(tasks)],
                n_attempts=2,
                max_in_flight=2,
                max_buffered_groups=4,
                journal=RolloutJournal(None, "x"),
                prewarm=prewarm,
                prewarm_groups=1,
            )
            manager.start()
            for _ in range(3):
                await manager.get()
            await manager.close()
            return manager.started

    started = asyncio.run(run())
    # Each group after the first was warmed once, in data order, one group ahead of the newest open one.
    assert warmed == [tasks[seq % len(tasks)] for seq in range(1, len(warmed) + 1)] and len(warmed) >= 3
    # Group 0 started cold; every later attempt took a sandbox warmed for it. Grading starts a fresh sandbox of
    # its own per attempt (cold: swerl/grading/grader.py), at most max_in_flight of them unfinished at close.
    counters = dict(pool.counters)
    assert 2 + len(graded) <= counters["start.cold"] <= 2 + len(graded) + 2, (counters, len(graded))
    assert counters["start.warm"] >= 4, counters
    assert counters["start.cold"] + counters["start.warm"] <= started + len(graded) + 2  # (the last may be cancelled)
    assert list(sandboxes.iterdir()) == []


def test_infra_failures_never_reach_the_loss_or_a_baseline_and_are_counted_by_cause(
    tokenizer: PreTrainedTokenizerBase, tasks: list[TaskInstance], tmp_path: Path
) -> None:
    counts: dict[str, int] = {}
    provider = KillingProvider(local_provider(git_baseline=True))
    episode = agent_episode(provider, tokenizer, LIMITS, 1, counts)
    engine = FailingEngine(EmulatedEngine(tokenizer, PROFILE, seed=5))
    model = tiny_qwen3(tokenizer, 2048, shape=SMALL)
    trainer = grpo_trainer(model, lr=1e-3, seed=0)
    trained: list[list[list[Trajectory]]] = []
    step = trainer.train_step

    def recording_step(groups: Any) -> dict[str, float]:
        trained.append([list(g) for g in groups])
        return step(groups)

    trainer.train_step = recording_step  # type: ignore[method-assign]
    history: list[dict[str, float]] = []

    async def run() -> None:
        manager = RolloutManager(
            engine,
            episode,
            lambda seq: tasks[seq % len(tasks)],
            n_attempts=3,
            max_in_flight=1,
            max_buffered_groups=4,
            journal=RolloutJournal(None, "x"),
        )
        # Groups are taken in finishing order; with one attempt in flight at a time they finish in seq order, so
        # each batch holds an even and an odd group. (With three in flight, an odd group's instant failures let
        # the next group overtake it, and a batch of two odd groups, untrainable, was no step: a flaky test.)
        settings = async_settings(steps=2, tasks_per_step=2, max_staleness=100, dynamic_sampling=False)
        async for step in train_async(
            trainer, engine, manager, settings, Ledger(), export_dir=tmp_path / "exports", infra_counts=counts
        ):
            history.append(step.stats)

    asyncio.run(run())
    groups = [group for step_groups in trained for group in step_groups]
    seqs = [int(group[0].group_id[1:]) for group in groups]
    assert len(groups) == 4 and {seq % 2 for seq in seqs} == {0, 1}  # both failure patterns were trained
    final_infra = {(t.group_id, t.attempt): t.infra_cause for g in groups for t in g if t.reward is None}
    expected_infra = {(f"g{seq:08d}", a): FailingEngine.cause(seq, a) for seq in seqs for a in range(3)}
    # Every permanent failure is an infra_error attempt with its cause (never a 0), and nothing else is.
    assert final_infra == {key: cause for key, cause in expected_infra.items() if cause is not None}
    for step_groups, stats in zip(trained, history, strict=True):
        scored = score_groups(step_groups, scale_by_std=False)
        assert all(t.reward is not None for t in scored.trajectories)  # never in the loss...
        valid_groups = [[t for t in g if t.reward is not None] for g in step_groups]
        kept = [g for g in valid_groups if len(g) >= 2]
        assert stats["loss_tokens"] == sum(t.sampled_tokens for g in kept for t in g)  # ...not one token of them
        expected = [t.reward - sum(u.reward for u in g) / len(g) for g in kept for t in g]  # type: ignore[operator, misc]
        assert scored.advantages == pytest.approx(expected)  # ...nor in a baseline
        assert stats["groups_dropped"] == len(valid_groups) - len(kept)
        assert stats.get("infra_error/engine_http", 0) + stats.get("infra_error/engine_timeout", 0) == sum(
            1 for g in step_groups for t in g if t.reward is None
        )
    odd = sum(seq % 2 for seq in seqs)
    assert history[-1]["totals/groups_dropped_few_valid"] == odd
    # Counted by cause, every step: permanent failures once per try (2 tries each); kills retried successfully.
    assert counts["infra_error.engine_http"] >= 2 * len(seqs) // 2 and counts["infra_error.engine_timeout"] >= 2
    assert counts["infra_error.sandbox_died"] >= 1
    assert counts["infra_error.gave_up"] >= len(final_infra)
    assert all(cause != "sandbox_died" for cause in final_infra.values())
    for stats in history:
        assert stats["failures/infra_error.gave_up"] >= 1


def test_histograms_are_written_as_an_image_and_raw_values(tmp_path: Path) -> None:
    import json

    from swerl.rollout.longtail import write_histograms

    image, raw = write_histograms([1.5, 2.0, 30.0], [3, 8, 30], tmp_path)
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.stat().st_size > 1000
    assert json.loads(raw.read_text()) == {"duration_s": [1.5, 2.0, 30.0], "turns": [3, 8, 30]}


# ----------------------------------------------------------------------------------------------------------------
# Batches with nothing trainable are not steps


def test_async_batches_whose_groups_were_all_dropped_are_not_steps_and_end_the_stage(tmp_path: Path) -> None:
    """Groups with fewer than two valid attempts fill the slots once dynamic sampling's extras are spent: such a
    batch is never trained and never counts as a step (the ledger says few_valid); max_empty_steps of them in a
    row fail the stage, saying why. The short groups here are the policy's (one graded attempt each, no
    infrastructure error): batches emptied by infrastructure errors are waited out instead (test_outage.py)."""
    from swerl.rollout.step import NothingTrainable

    rewards: list[list[float | None]] = [[1, 0], [0], [0], [0], [0], [1, 0]]
    state = JournalState(
        {seq: (0, finished_group(seq, r, float(seq))) for seq, r in enumerate(rewards)}, len(rewards) - 1
    )
    trainer, ledger = CountingTrainer(), Ledger()

    async def run(steps: int, max_empty_steps: int) -> None:
        manager = RolloutManager(
            None,
            never_finishes,
            lambda seq: seq,  # type: ignore[arg-type]
            n_attempts=1,  # every restored group is whole
            max_in_flight=1,
            max_buffered_groups=100,
            journal=RolloutJournal(None, "x"),
        )
        manager.restore(state, Ledger())
        settings = async_settings(
            steps=steps,
            tasks_per_step=1,
            max_staleness=10,
            max_extra_groups_per_step=0,
            max_empty_steps=max_empty_steps,
        )
        engine: Any = VersionEngine()
        async for _ in train_async(trainer, engine, manager, settings, ledger, export_dir=tmp_path / "exports"):
            pass

    asyncio.run(run(steps=2, max_empty_steps=5))
    # seq 0 trains step 1; 1, 2, 3, 4 have under two valid attempts each: not steps; seq 5 trains step 2
    assert trainer.step == 2 and [len(batch) for batch in trainer.trained] == [1, 1]
    assert [reason for _, _, reason in ledger.entries] == ["trained", *["few_valid"] * 4, "trained"]
    assert {step for _, step, _ in ledger.entries} == {1, 2}

    trainer, ledger = CountingTrainer(), Ledger()
    with pytest.raises(NothingTrainable, match=r"3 batches in a row had nothing to train on .*max_empty_steps = 3"):
        asyncio.run(run(steps=5, max_empty_steps=3))
    assert trainer.step == 1


def test_sync_batches_whose_groups_were_all_dropped_are_not_steps_and_end_the_stage(tmp_path: Path) -> None:
    """Groups short of two valid attempts on the policy's side (the groups of tasks in `short` come back with one
    graded attempt, no infrastructure error: every attempt graded is valid, so only a short group is empty on the
    policy's side) leave a batch with nothing trainable: it is skipped (the data position moves on, not a step),
    and max_empty_steps of them in a row fail the stage. Batches emptied by infrastructure errors are waited out
    and sampled again instead (test_outage.py)."""
    from swerl.rollout.step import NothingTrainable
    from swerl.rollout.sync_loop import SyncProgress, SyncSettings, train_sync

    short = {1, 2}

    async def episode(engine: Any, task: int, *, attempt: int, group_id: str) -> Trajectory:
        reward = float(attempt % 2)
        return trajectory([0], reward, attempt, group_id).model_copy(update={"task_id": str(task)})

    def drop_short(groups: list[list[Trajectory]]) -> list[list[Trajectory]]:
        return [[t for t in group if not (int(t.task_id) in short and t.attempt == 1)] for group in groups]

    async def run(steps: int, max_empty: int, progress: SyncProgress) -> CountingTrainer:
        trainer = CountingTrainer()
        settings = SyncSettings(
            steps=steps,
            tasks_per_step=1,
            attempts_per_task=2,
            concurrency=2,
            checkpoint_every=0,
            deadline=None,
            max_empty_steps=max_empty,
        )
        engine: Any = VersionEngine()
        async for _ in train_sync(
            trainer, engine, list(range(6)), episode, settings, export_dir=tmp_path, progress=progress
        ):
            pass
        return trainer

    import swerl.rollout.sync_loop as sync_loop

    rollout_groups = sync_loop.rollout_groups

    async def shortened(*args: Any, **kwargs: Any) -> list[list[Trajectory]]:
        return drop_short(await rollout_groups(*args, **kwargs))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sync_loop, "rollout_groups", shortened)
        progress = SyncProgress()
        trainer = asyncio.run(run(steps=3, max_empty=5, progress=progress))
        assert trainer.step == 3 and progress.skipped_batches == 2  # tasks 0, 3, 4 trained; 1 and 2 skipped
        assert [[int(t.task_id) for t in batch[0]] for batch in trainer.trained] == [[0, 0], [3, 3], [4, 4]]
        assert "every one with fewer than two valid attempts" in progress.skipped_reasons[0]

        short = {1, 2, 3}
        with pytest.raises(NothingTrainable, match="3 batches in a row"):
            asyncio.run(run(steps=3, max_empty=3, progress=SyncProgress()))


def test_group_ids_parse_back_to_seq_and_generation() -> None:
    from swerl.rollout.manager import group_id, parse_group_id

    for seq, generation in [(0, 0), (12, 3), (99_999_999, 0), (7, 11)]:
        assert parse_group_id(group_id(seq, generation)) == (seq, generation)
    for bad in ["", "x00000001", "g", "g1r", "g00000001-a0001"]:
        with pytest.raises(ValueError, match="not a rollout group id"):
            parse_group_id(bad)


def test_a_later_phase_reads_the_earlier_journal_with_its_own_and_carries_what_was_left(
    tmp_path: Path,
) -> None:
    """GRPO phases (swerl.stages.grpo): phase 2 reads phase 1's journal (read-only) with its own. Phase 1 (n = 2)
    left group 1 finished and unconsumed, group 2 half finished, group 3 opened with nothing finished; phase 2 has
    n = 3, a task filter that excludes the tasks at indices 3 and 5, and starts at phase 1's data position 4."""
    store = Store(f"file://{tmp_path}/store")
    phase1 = RolloutJournal(store, "stages/grpo-a/K1/rollouts")
    for seq, attempts in [(0, [0, 1]), (1, [0, 1]), (2, [1])]:
        group = finished_group(seq, [1.0, 0.0], 10.0 + seq)
        for attempt in attempts:
            phase1.record(group[attempt])
    ledger = Ledger([(0, 2, "trained")])  # phase 1's final checkpoint consumed group 0
    phase2 = RolloutJournal(store, "stages/grpo-b/K2/rollouts", [phase1.prefix])
    counts, buffered, position, started = restore_and_start(
        phase2, ledger, position=4, n_attempts=3, max_in_flight=8, eligible=lambda i: i % 6 not in (3, 5)
    )
    # groups 1 and 2 are completed to phase 2's n = 3 (their finished attempts kept), nothing is reloaded whole
    assert buffered == [] and position == 4
    assert counts == {
        "reloaded_groups": 0,
        "partial_groups": 2,
        "rerun_groups": 0,
        "skipped_groups": 0,
        "damaged_entries": 0,
    }
    # their missing attempts, then the stream at 4 (group 3, opened in phase 1 past its journal's last finished
    # attempt, is not reopened), 5 skipped by the filter, 6
    assert started == [
        "g00000001/2",
        "g00000002/0",
        "g00000002/2",
        "g00000004/0",
        "g00000004/1",
        "g00000004/2",
        "g00000006/0",
        "g00000006/1",
    ]
    # phase 2 wrote only under its own prefix; phase 1's journal is as it was
    assert len(store.list(phase1.prefix)) == 3
