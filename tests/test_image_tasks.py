"""Tasks whose environment is a container image, end to end on real projects (issue 20, "Image environments").

Two real PyPI projects are built into images in SWE-bench's layout (repository at /testbed, a virtualenv with the
test requirements from wheels fetched at build time): toolz (flat layout, pytest only) and itsdangerous (src
layout, its tests need freezegun). The images are tagged in SWE-smith's naming scheme; bugs are synthesized and
validated inside them (Docker sandboxes on the image environment), written as SWE-smith rows and as SWE-bench rows
(per-instance images `swebench/sweb.eval.x86_64.*` with the bug committed, the row's patch the fix), loaded back
through the dataset loaders and graded by the one grader in fresh containers: the fix resolves, nothing or the
bug's own test edits do not, and the agent's start state shows neither the fix nor a history that holds it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from swerl.agent.grading import grade_patch, start_task_sandbox
from swerl.data.bugs import MODIFIERS
from swerl.data.diffs import reverse_patch
from swerl.data.environments import task_environment
from swerl.data.loaders import rows_to_tasks, swebench_image
from swerl.data.repos import RepoSpec
from swerl.data.schema import TaskInstance
from swerl.data.synth import synthesize_repo
from swerl.errors import InfraError
from swerl.sandbox.base import ImageEnvironment
from swerl.sandbox.docker import DockerSandboxProvider
from swerl.sandbox.images import build_instance_image, build_project_image, swesmith_image_name
from tests.sandbox_backends import docker_unavailable
from tests.sandbox_helpers import docker_provider

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.network]

CACHE = Path.home() / ".cache" / "swerl-test-sdists"


@dataclass(frozen=True)
class Project:
    owner: str
    name: str
    version: str
    requirements: tuple[str, ...]
    python_path: str = ""

    @property
    def commit(self) -> str:
        """A stand-in for the upstream commit SWE-smith names images and repositories by (the sdist has none)."""
        return hashlib.sha1(f"{self.name}-{self.version}".encode()).hexdigest()[:8]

    @property
    def image(self) -> str:
        return swesmith_image_name(self.owner, self.name, self.commit)

    @property
    def swesmith_repo(self) -> str:
        return f"swesmith/{self.owner}__{self.name}.{self.commit}"


PROJECTS = (
    Project("pytoolz", "toolz", "1.0.0", ("pytest",)),
    Project("pallets", "itsdangerous", "2.2.0", ("pytest", "freezegun"), python_path="src"),
)


def sdist_source(project: Project, into: Path) -> Path:
    """The project's sdist (downloaded once into the cache), unpacked under `into`."""
    archive = CACHE / f"{project.name}-{project.version}.tar.gz"
    if not archive.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             f"{project.name}=={project.version}", "-d", str(CACHE)],
            check=True, capture_output=True, timeout=600,
        )  # fmt: skip
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / f"{project.name}-{project.version}"


@pytest.fixture(scope="module")
def provider() -> Iterator[DockerSandboxProvider]:
    if reason := docker_unavailable():
        pytest.skip(reason)
    made = docker_provider(git_baseline=True, memory_mb=1024, start_timeout_s=120)
    yield made
    made.close()


@pytest.fixture(scope="module")
def tasks_by_project(
    provider: DockerSandboxProvider, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[TaskInstance]]:
    """Each project's image built, and bugs synthesized and validated in containers of that image."""
    import docker

    client = docker.from_env()
    found: dict[str, list[TaskInstance]] = {}
    for project in PROJECTS:
        src = sdist_source(project, tmp_path_factory.mktemp(project.name))
        tag = build_project_image(client, src, project.image, list(project.requirements), project.python_path)
        spec = RepoSpec(name=project.name, path=src, repo=project.swesmith_repo, image=tag)
        tasks, report = asyncio.run(
            synthesize_repo(
                spec, provider, modifiers=list(MODIFIERS), max_candidates=8, max_tasks=2, seed=0, workers=2,
                test_timeout_s=120, clean_runs=1, bugged_timeout_factor=5.0, min_bugged_timeout_s=30.0,
            )  # fmt: skip
        )
        assert report.clean_passing >= 100, report.to_dict()  # the suite ran in the image, freezegun and all
        assert tasks, report.to_dict()
        found[project.name] = tasks
    client.close()
    return found


def swesmith_rows(tasks_by_project: dict[str, list[TaskInstance]]) -> list[dict[str, object]]:
    """The tasks as SWE-smith publishes them: the bug as `patch`, the image as `image_name`, test lists as JSON."""
    return [
        {
            "instance_id": task.instance_id, "repo": task.repo, "patch": task.patch,
            "FAIL_TO_PASS": json.dumps(task.FAIL_TO_PASS), "PASS_TO_PASS": json.dumps(task.PASS_TO_PASS),
            "image_name": task.image, "problem_statement": task.problem_statement,
        }  # fmt: skip
        for tasks in tasks_by_project.values()
        for task in tasks
    ]


def test_swesmith_rows_run_in_their_images(
    provider: DockerSandboxProvider, tasks_by_project: dict[str, list[TaskInstance]], tmp_path: Path
) -> None:
    path = tmp_path / "swesmith.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in swesmith_rows(tasks_by_project)))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    loaded, _ = rows_to_tasks(rows, "swesmith", str(path), strict=True)
    assert {t.repo_key for t in loaded} == {"pytoolz/toolz", "pallets/itsdangerous"}

    async def check(task: TaskInstance) -> None:
        env, setup = task_environment(task)
        assert isinstance(env, ImageEnvironment) and env.image == task.image and setup == task.patch
        sandbox = await start_task_sandbox(provider, task)
        try:
            history = await sandbox.exec("git log --all --format=%s | cat", timeout=30)
            assert history.output.splitlines() == ["task start"]  # no commit that could hold the fix
            where = await sandbox.exec("readlink /testbed; pwd; git status --porcelain | wc -l", timeout=30)
            assert where.output.split() == ["/workspace", "/workspace", "0"]
        finally:
            await sandbox.close()
        fixed = reverse_patch(task.patch)
        assert (await grade_patch(provider, task, "", 120)).reward == 0.0
        graded = await grade_patch(provider, task, fixed, 120)
        assert graded.reward == 1.0, graded.to_record()
        assert graded.sealed

    async def all_tasks() -> None:
        for task in loaded:
            await check(task)

    asyncio.run(all_tasks())


def test_swebench_rows_grade_in_their_instance_images(
    provider: DockerSandboxProvider, tasks_by_project: dict[str, list[TaskInstance]]
) -> None:
    import docker

    client = docker.from_env()
    rows = []
    for name, tasks in tasks_by_project.items():
        project = next(p for p in PROJECTS if p.name == name)
        for number, task in enumerate(tasks, start=1):
            instance_id = f"{project.owner}__{project.name}-{number}"
            build_instance_image(client, project.image, task.patch, swebench_image(instance_id))
            rows.append(
                {
                    "instance_id": instance_id, "repo": f"{project.owner}/{project.name}",
                    "base_commit": task.base_commit,
                    "patch": reverse_patch(task.patch), "test_patch": "", "version": project.version,
                    "FAIL_TO_PASS": json.dumps(task.FAIL_TO_PASS), "PASS_TO_PASS": json.dumps(task.PASS_TO_PASS),
                    "problem_statement": task.problem_statement, "difficulty": "<15 min fix",
                }  # fmt: skip
            )
    client.close()
    loaded, _ = rows_to_tasks(rows, "swebench", "swebench-rows", strict=True)

    async def check(task: TaskInstance) -> None:
        env, setup = task_environment(task)
        assert isinstance(env, ImageEnvironment) and env.image == swebench_image(task.instance_id)
        assert setup is None  # a SWE-bench repository starts broken; its patch is the fix, never shown
        assert (await grade_patch(provider, task, "", 120)).reward == 0.0
        assert (await grade_patch(provider, task, task.patch, 120)).reward == 1.0

    async def all_tasks() -> None:
        for task in loaded:
            await check(task)

    asyncio.run(all_tasks())


def test_a_missing_image_is_an_infra_error_never_a_pull(provider: DockerSandboxProvider) -> None:
    task = TaskInstance(
        instance_id="nobody__nothing-1", repo="nobody/nothing", base_commit="0", problem_statement="x",
        patch="x", patch_kind="fix", FAIL_TO_PASS=["t.py::t"], image="swebench/sweb.eval.x86_64.nobody:latest",
        source="test",
    )  # fmt: skip
    with pytest.raises(InfraError) as caught:
        asyncio.run(start_task_sandbox(provider, task))
    assert caught.value.cause == "image_missing" and "allow_pull" in str(caught.value)
