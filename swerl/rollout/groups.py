"""GRPO groups: n attempts of each task, sampled concurrently by any episode function.

`EpisodeFn` is the one shape an episode has for every sampler (the synchronous loop's `rollout_groups`, the
asynchronous `RolloutManager`, benchmarks): one attempt at a task with the policy behind an engine, returning its
trajectory, infrastructure errors included (an episode function turns them into infra_error trajectories; raising
is a bug).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Protocol, TypeVar

from swerl.engine.base import Engine
from swerl.trajectory import Trajectory

TaskT = TypeVar("TaskT", contravariant=True)


class EpisodeFn(Protocol[TaskT]):
    """One episode of `task` with the policy behind `engine`; returns its trajectory (infra errors included)."""

    def __call__(self, engine: Engine, task: TaskT, *, attempt: int, group_id: str) -> Awaitable[Trajectory]: ...


async def rollout_groups(
    engine: Engine,
    tasks: Sequence[TaskT],
    n_attempts: int,
    run_episode_fn: EpisodeFn[TaskT],
    concurrency: int,
    group_prefix: str = "",
) -> list[list[Trajectory]]:
    """Run n_attempts episodes of every task, at most `concurrency` at once; returns groups in task order.

    Group i is `f"{group_prefix}{i}"`, its attempts are in attempt order. An episode that raises (a bug: episode
    functions turn infrastructure failures into infra_error trajectories) cancels the rest and propagates.
    """
    if n_attempts < 1 or concurrency < 1:
        raise ValueError(f"n_attempts ({n_attempts}) and concurrency ({concurrency}) must be >= 1")
    limit = asyncio.Semaphore(concurrency)

    async def one(task: TaskT, attempt: int, group_id: str) -> Trajectory:
        async with limit:
            return await run_episode_fn(engine, task, attempt=attempt, group_id=group_id)

    async with asyncio.TaskGroup() as group:
        running = [
            [group.create_task(one(task, attempt, f"{group_prefix}{index}")) for attempt in range(n_attempts)]
            for index, task in enumerate(tasks)
        ]
    return [[attempt.result() for attempt in attempts] for attempts in running]
