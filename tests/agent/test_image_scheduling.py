"""Image-aware scheduling: stages that walk a task list start tasks of one environment together, in order of
first need, and hand results back in the tasks' own order."""

from __future__ import annotations

import asyncio

from swerl.agent.episode import EpisodeLimits
from swerl.agent.oracle import generate_oracle_traces
from swerl.data.environments import environment_order
from swerl.data.schema import TaskInstance
from tests.doubles import RefusingProvider

PATCH = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"


def _task(index: int, image: str) -> TaskInstance:
    return TaskInstance(
        instance_id=f"t{index}",
        repo="o/r",
        base_commit="",
        problem_statement="p",
        patch=PATCH,
        patch_kind="fix",
        FAIL_TO_PASS=["t::x"],
        image=image,
        source="test",
    )


IMAGES = ["docker://a", "docker://b", "docker://c", "local://repos/x"]
TASKS = [_task(i, IMAGES[i % 3] if i != 4 else IMAGES[3]) for i in range(9)]


def test_environment_order_groups_by_first_need_and_keeps_order_within() -> None:
    order = environment_order(TASKS)
    assert sorted(order) == list(range(len(TASKS)))  # the same tasks, each once
    assert [TASKS[i].instance_id for i in order] == ["t0", "t3", "t6", "t1", "t7", "t2", "t5", "t8", "t4"]
    assert environment_order([]) == []


def test_oracle_starts_tasks_by_environment_and_reports_in_task_order() -> None:
    image_tasks = [t for t in TASKS if t.image.startswith("docker://")]
    provider = RefusingProvider()
    limits = EpisodeLimits(
        max_turns=2,
        max_trajectory_tokens=512,
        max_new_tokens_per_turn=16,
        max_malformed_calls=1,
        command_timeout_s=5,
        max_observation_chars=200,
        test_timeout_s=5,
        episode_timeout_s=5,
    )
    traces, report = asyncio.run(
        generate_oracle_traces(
            image_tasks,
            provider,
            limits,
            recovery_prob=0.0,
            workers=1,
            context_lines=3,
            view_whole_file_lines=0,
            view_function_lines=0,
            test_command=None,
        )
    )
    assert provider.started == ["a"] * 3 + ["b"] * 2 + ["c"] * 3
    assert traces == [] and report.attempted == 8 and report.skipped == {"infra_error:start_failed": 8}
