"""A real non-pytest project graded with its own harness (issue 34, item 4): Django's runtests.py.

Django's PyPI sdist (downloaded once into ~/.cache/swerl-test-sdists) is built into SWE-bench-style instance
images (swerl/data/django_tasks.py: /testbed a git repository, the bug committed, images named as swebench 5's
run_evaluation looks them up); two hand-written tasks become swebench 5 rows (eval_script with the runtests.py
command, test_patch, FAIL_TO_PASS/PASS_TO_PASS found by running the eval script without and with the fix), are
loaded through swerl.data.loaders and graded by the one grader, which runs the row's own command under the sealed
runner's `unittest` mode: in Docker containers and on the local backend over the exported images. The reference
fix resolves, an empty patch and a plausible wrong fix do not.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from swerl.data.django_tasks import PROJECT_IMAGE, TASKS, TEST_CMD, build_django_rows
from swerl.data.loaders import rows_to_tasks
from swerl.data.schema import TaskInstance
from swerl.grading.grader import RESOLVED_FULL, grade_patch, runner_mode
from swerl.grading.harness import harness_for
from swerl.grading.verdict import grade_attempt
from swerl.sandbox.base import SandboxProvider
from swerl.sandbox.docker import DockerSandboxProvider
from tests.sandbox_backends import docker_unavailable
from tests.sandbox_helpers import docker_provider, local_provider

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.network]
TIMEOUT_S = 300.0  # a guard only: each run takes seconds


@pytest.fixture(scope="module")
def provider() -> Iterator[DockerSandboxProvider]:
    if reason := docker_unavailable():
        pytest.skip(reason)
    made = docker_provider(git_baseline=True, memory_mb=2048, start_timeout_s=180)
    yield made
    made.close()


@pytest.fixture(scope="module")
def rows(provider: DockerSandboxProvider, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return build_django_rows(tmp_path_factory.mktemp("django"))


@pytest.fixture(scope="module")
def tasks(rows: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> list[TaskInstance]:
    path = tmp_path_factory.mktemp("rows") / "django.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    loaded, _ = rows_to_tasks(
        [json.loads(line) for line in path.read_text().splitlines()], "swebench", str(path), strict=True
    )
    return loaded


def test_rows_carry_their_harness_and_swebench_names(rows: list[dict[str, Any]], tasks: list[TaskInstance]) -> None:
    from swebench.harness.utils import make_test_spec
    from swebench.image_builder.image_spec import ImageSpec

    assert [t.instance_id for t in tasks] == [t.instance_id for t in TASKS]
    for row, task in zip(rows, tasks, strict=True):
        spec = make_test_spec(row)  # what swebench's run_evaluation builds from the row
        assert spec.image == task.image == ImageSpec(task.instance_id, "FROM x", namespace="swebench").name
        assert task.version == "5.0" and task.eval_script == row["eval_script"]
        module = next(t.module for t in TASKS if t.instance_id == task.instance_id)
        assert harness_for(task).test_cmd == f"{TEST_CMD} {module}"
        assert harness_for(task).parser == "parse_log_django"
        assert runner_mode(task) == "unittest"
        # Django's runner names: Python 3.11's `test_a (module.Class.test_a)`, a docstring's first line
        assert any(" (utils_tests." in t for t in task.FAIL_TO_PASS)
        assert any(not t.endswith(")") for t in task.FAIL_TO_PASS)
        assert len(task.PASS_TO_PASS) >= 10
    assert PROJECT_IMAGE.startswith("swesmith.x86_64.django_1776_django.")


def check_grades(provider: SandboxProvider, tasks: list[TaskInstance], rows: list[dict[str, Any]]) -> None:
    wrong = {row["instance_id"]: row["wrong_patch"] for row in rows}

    async def check(task: TaskInstance) -> None:
        fixed = await grade_patch(provider, task, task.patch, TIMEOUT_S)
        assert fixed.status == RESOLVED_FULL and fixed.reward == 1.0 and fixed.sealed, fixed.to_record()
        assert not fixed.tampered and fixed.forged_lines == 0
        assert set(task.FAIL_TO_PASS + task.PASS_TO_PASS) <= set(fixed.outcomes)
        evaluated = await grade_attempt(provider, task, task.patch, TIMEOUT_S)
        assert evaluated.grade.resolved
        for patch, what in (("", "empty"), (wrong[task.instance_id], "wrong")):
            graded = await grade_patch(provider, task, patch, TIMEOUT_S)
            # the wrong fix of django__django-90002 fixes iteration but not lookups: RESOLVED_PARTIAL
            assert graded.reward == 0.0 and graded.status in ("RESOLVED_NO", "RESOLVED_PARTIAL"), (
                what,
                graded.to_record(),
            )
            assert not graded.tampered, (what, graded.tampered)
            failed = [t for t in task.FAIL_TO_PASS if graded.outcomes[t].status.value != "PASSED"]
            assert failed, (what, graded.to_record())  # every F2P ran and the fix's absence shows

    async def all_tasks() -> None:
        for task in tasks:
            await check(task)

    asyncio.run(all_tasks())


def test_graded_in_docker(
    provider: DockerSandboxProvider, tasks: list[TaskInstance], rows: list[dict[str, Any]]
) -> None:
    check_grades(provider, tasks, rows)


@pytest.mark.parametrize("runtime", ["supervisor", "bubblewrap"])
def test_graded_on_the_local_backend_from_the_exported_image(
    tasks: list[TaskInstance], rows: list[dict[str, Any]], runtime: str
) -> None:
    if runtime == "supervisor" and os.geteuid() != 0:
        pytest.skip("the supervisor runtime needs root")
    local = local_provider(git_baseline=True, runtime=runtime, memory_mb=2048)
    try:
        check_grades(local, tasks, rows)
    finally:
        local.close()
