"""Tasks whose environment is a container image, end to end on real projects (issue 20, "Image environments").

Two real PyPI projects are built into images in SWE-bench's layout (repository at /testbed, a virtualenv with the
test requirements from wheels fetched at build time): toolz (flat layout, pytest only) and itsdangerous (src
layout, its tests need freezegun). The images are tagged in SWE-smith's naming scheme; bugs are synthesized and
validated inside them (Docker sandboxes on the image environment), written as SWE-smith rows and as SWE-bench rows
(per-instance images `swebench/sweb.eval.x86_64.*` with the bug committed, the row's patch the fix), loaded back
through the dataset loaders and graded by the one grader in fresh containers: the fix resolves, an empty patch
does not, and the agent's start state shows neither the fix nor a history that holds it. The
same tasks then run on the local backend (both runtimes) over the images' exported root file systems.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shlex
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from swerl.data.bugs import MODIFIERS
from swerl.data.diffs import reverse_patch
from swerl.data.environments import task_environment
from swerl.data.loaders import rows_to_tasks, swebench_image
from swerl.data.repoenv import fetch_sdist
from swerl.data.repos import RepoSpec
from swerl.data.schema import TaskInstance
from swerl.data.synth import synthesize_repo
from swerl.errors import InfraError
from swerl.grading.grader import grade_patch, start_task_sandbox
from swerl.sandbox.base import ImageEnvironment
from swerl.sandbox.docker import DockerSandboxProvider
from swerl.sandbox.images import build_instance_image, build_project_image, swesmith_image_name
from tests.sandbox_backends import docker_unavailable
from tests.sandbox_helpers import docker_provider, local_provider

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
    with tarfile.open(fetch_sdist(project.name, project.version, CACHE)) as tar:
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
                spec,
                provider,
                modifiers=list(MODIFIERS),
                max_candidates=8,
                max_tasks=2,
                seed=0,
                workers=2,
                test_timeout_s=120,
                clean_runs=1,
                bugged_timeout_factor=5.0,
                min_bugged_timeout_s=30.0,
            )
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
            "instance_id": task.instance_id,
            "repo": task.repo,
            "patch": task.patch,
            "FAIL_TO_PASS": json.dumps(task.FAIL_TO_PASS),
            "PASS_TO_PASS": json.dumps(task.PASS_TO_PASS),
            "image_name": task.image,
            "problem_statement": task.problem_statement,
        }
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
                    "instance_id": instance_id,
                    "repo": f"{project.owner}/{project.name}",
                    "base_commit": task.base_commit,
                    "patch": reverse_patch(task.patch),
                    "test_patch": "",
                    "version": project.version,
                    "FAIL_TO_PASS": json.dumps(task.FAIL_TO_PASS),
                    "PASS_TO_PASS": json.dumps(task.PASS_TO_PASS),
                    "problem_statement": task.problem_statement,
                    "difficulty": "<15 min fix",
                }
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
        instance_id="nobody__nothing-1",
        repo="nobody/nothing",
        base_commit="0",
        problem_statement="x",
        patch="x",
        patch_kind="fix",
        FAIL_TO_PASS=["t.py::t"],
        image="swebench/sweb.eval.x86_64.nobody:latest",
        source="test",
    )
    with pytest.raises(InfraError) as caught:
        asyncio.run(start_task_sandbox(provider, task))
    assert caught.value.cause == "image_missing" and "allow_pull" in str(caught.value)


@pytest.mark.parametrize("runtime", ["supervisor", "bubblewrap"])
def test_the_same_tasks_run_on_the_local_runtime_from_the_exported_image(
    tasks_by_project: dict[str, list[TaskInstance]], runtime: str
) -> None:
    """The local backend runs an image task over the image's root file system (exported once per image id):
    the image's interpreter and packages, the repository at /workspace with /testbed linked to it, the host's
    files out of sight; the grader gives the same verdicts as in the containers."""
    if runtime == "supervisor" and os.geteuid() != 0:
        pytest.skip("the supervisor runtime needs root")
    local = local_provider(git_baseline=True, runtime=runtime, memory_mb=1024)
    try:

        async def check(task: TaskInstance) -> None:
            sandbox = await start_task_sandbox(local, task)
            try:
                seen = await sandbox.exec(
                    "readlink /testbed; command -v python; git log --all --format=%s | cat; "
                    f"test -e {shlex.quote(str(Path(__file__).resolve()))} && echo HOST-VISIBLE; true",
                    timeout=60,
                )
                assert seen.output.split() == ["/workspace", "/opt/venv/bin/python", "task", "start"], seen.output
            finally:
                await sandbox.close()
            assert (await grade_patch(local, task, "", 120)).reward == 0.0
            graded = await grade_patch(local, task, reverse_patch(task.patch), 120)
            assert graded.reward == 1.0, graded.to_record()

        async def all_tasks() -> None:
            for tasks in tasks_by_project.values():
                await check(tasks[0])

        asyncio.run(all_tasks())
    finally:
        local.close()


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("backend", ["docker", "local"])
def test_the_pipeline_runs_on_image_tasks(
    tasks_by_project: dict[str, list[TaskInstance]], tmp_path: Path, backend: str
) -> None:
    """curate (toolz tasks loaded as SWE-smith rows) -> oracle traces -> SFT -> GRPO -> evaluation on SWE-bench
    rows (itsdangerous instance images), every sandbox of every stage started from the tasks' images: Docker
    containers, or local sandboxes over the exported images. Small budgets: this shows the stages run and grade
    real tasks in their images, not that a model learns."""
    import docker

    from swerl.config.agent import AgentConfig
    from swerl.config.data import CurateConfig, DatasetSource, TracesConfig
    from swerl.config.engine import EngineConfig
    from swerl.config.evaluate import EvaluateConfig
    from swerl.config.grpo import GRPOConfig
    from swerl.config.sandbox import SandboxLimits
    from swerl.config.train import SFTConfig, TinyModelConfig
    from swerl.data.taskio import tasks_from_parquet
    from swerl.stages.curate import run_curate
    from swerl.stages.evaluate import EvaluateStage, run_evaluate
    from swerl.stages.grpo import GRPOStage, run_grpo
    from swerl.stages.sft import SFTStage, run_sft
    from swerl.stages.traces import TracesStage, run_traces
    from swerl.storage import Store
    from swerl.tracking import Tracker
    from tests.stage_helpers import Env

    smith = tmp_path / "swesmith.jsonl"
    smith.write_text("".join(json.dumps(r) + "\n" for r in swesmith_rows({"toolz": tasks_by_project["toolz"]})))
    bench = tmp_path / "swebench.jsonl"
    client = docker.from_env()
    with bench.open("w") as out:
        for number, task in enumerate(tasks_by_project["itsdangerous"], start=1):
            instance_id = f"pallets__itsdangerous-{number}"
            build_instance_image(client, PROJECTS[1].image, task.patch, swebench_image(instance_id))
            out.write(
                json.dumps(
                    {
                        "instance_id": instance_id,
                        "repo": "pallets/itsdangerous",
                        "base_commit": task.base_commit,
                        "patch": reverse_patch(task.patch),
                        "test_patch": "",
                        "version": "2.2",
                        "FAIL_TO_PASS": json.dumps(task.FAIL_TO_PASS),
                        "PASS_TO_PASS": json.dumps(task.PASS_TO_PASS),
                        "problem_statement": task.problem_statement,
                        "difficulty": "<15 min fix",
                    }
                )
                + "\n"
            )
    client.close()
    limits = SandboxLimits(backend=backend, memory_mb=1024, start_timeout_s=180, timeout_s=120)
    agent = AgentConfig(
        max_turns=3,
        max_trajectory_tokens=1024,
        max_new_tokens_per_turn=16,
        command_timeout_s=60,
        test_timeout_s=120,
        episode_timeout_s=300,
        infra_retries=1,
        sandbox=limits,
    )
    engine = EngineConfig.model_validate({"max_batch_size": 4, "max_context_tokens": 1024, "local": {"threads": 1}})
    tiny = TinyModelConfig(
        vocab_size=500, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, ffn_size=64, max_positions=4096
    )
    env = Env(Store(f"file://{tmp_path}/store"), Tracker(f"sqlite:///{tmp_path}/mlflow.db", f"images-{backend}"))

    curate = env.run(
        "curate",
        run_curate,
        CurateConfig(
            repos=[],
            datasets=[DatasetSource(schema="swesmith", path=str(smith))],
            decontaminate=False,
            sandbox=limits,
        ),
    ).manifest
    train = tasks_from_parquet(env.artifact(curate, "train.parquet"))
    assert {t.image for t in train} == {PROJECTS[0].image} and all(t.patch_kind == "bug" for t in train)

    traces = env.run(
        "traces", run_traces, TracesStage(traces=TracesConfig(view_whole_file_lines=0), agent=agent), [curate]
    ).manifest
    report = env.json(traces, "traces_report.json")
    # the oracle fixed a real toolz bug through the agent's tools and the grader gave it 1
    assert report["traces"] >= 1, report
    sft_cfg = SFTConfig(
        tiny=tiny,
        seq_len=4096,
        rows_per_micro_batch=1,
        max_steps=2,
        lr=5e-3,
        warmup_steps=1,
        checkpoint_every=2,
        keep_checkpoints=1,
        threads=1,
        truncate_overlong=True,
    )
    sft = env.run("sft", run_sft, SFTStage.build(sft=sft_cfg, agent=agent, engine=engine), [curate, traces]).manifest
    grpo_cfg = GRPOConfig.model_validate(
        {
            "threads": 1,
            "schedule": {"steps": 1, "tasks_per_step": 1, "checkpoint_every": 1},
            "rollout": {"attempts_per_task": 2, "concurrency": 2, "dynamic_sampling": False},
        }
    )
    grpo = env.run("grpo", run_grpo, GRPOStage(grpo=grpo_cfg, agent=agent, engine=engine), [curate, sft]).manifest
    grpo_report = env.json(grpo, "grpo_report.json")
    assert grpo_report["steps"] == 1, grpo_report

    evaluate_cfg = EvaluateConfig(
        dataset=DatasetSource(schema="swebench", path=str(bench)),
        max_tasks=2,
        attempts=1,
        concurrency=2,
        bootstrap_samples=200,
        checkpoints=["sft"],
    )
    evaluated = env.run(
        "evaluate", run_evaluate, EvaluateStage(evaluate=evaluate_cfg, agent=agent, engine=engine), [curate, sft, grpo]
    ).manifest
    results = env.json(evaluated, "eval_results.json")["models"]
    assert len(results) == 1, results
