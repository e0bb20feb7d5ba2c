"""Tasks curated from a real repository run in that repository's own virtualenv in every later stage, whatever
interpreter the provider was made with: their `image` is a venv:// reference (swerl.data.repoenv), task_env makes
it a VenvEnvironment, and the local backend runs it with a child provider per interpreter.

itsdangerous's tests import freezegun, which swerl's own environment does not have: with swerl's interpreter the
reference fix would not resolve (nor would the repository's src/ be on the path)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from pathlib import Path

import pytest

from swerl.config.data import CurateConfig, RepoSource
from swerl.data.diffs import reverse_patch
from swerl.data.environments import is_image_reference, resolve_environment, task_env
from swerl.data.repoenv import EnvReference, build_env, parse_env_reference
from swerl.data.schema import TaskInstance
from swerl.data.taskio import tasks_from_parquet, tasks_to_parquet
from swerl.errors import InfraError
from swerl.grading.grader import RESOLVED_FULL, grade_patch, start_task_sandbox
from swerl.sandbox.base import VenvEnvironment
from swerl.stages.common import run_async
from swerl.stages.curate import content_key, run_curate
from swerl.stages.runner import run_stage
from swerl.storage import Store
from swerl.tracking import Tracker
from tests.sandbox_backends import docker_unavailable
from tests.sandbox_helpers import docker_provider, e2b_provider, local_provider
from tests.stages.test_curate_pypi import sdist


def test_a_reference_round_trips_with_odd_requirements() -> None:
    ref = EnvReference(Path("/srv/my lib"), ("freezegun>=1.2,<2", "pkg[extra]; python_version>'3'"), "src", "k1")
    text = str(ref)
    assert text.startswith("venv:///srv/my%20lib?") and not is_image_reference(text)
    assert parse_env_reference(text) == ref
    with pytest.raises(ValueError, match="expected venv://"):
        parse_env_reference("venv:///srv/lib?install=x")  # no env key


def test_e2b_refuses_a_repository_with_its_own_environment(tmp_path: Path) -> None:
    env = VenvEnvironment(tmp_path, "/opt/env/bin/python", "k1", ("pytest==9.0.0",))
    with pytest.raises(InfraError) as info:
        asyncio.run(e2b_provider(api_key="unused").start(env))
    assert info.value.cause == "image_missing" and "local or docker backend" in str(info.value)


@pytest.fixture(scope="module")
def curated(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[TaskInstance], dict]:
    """itsdangerous curated through the stage (a few candidates): its tasks and its report entry."""
    tmp = tmp_path_factory.mktemp("venv-tasks")
    cfg = CurateConfig(
        repos=[RepoSource(path=str(sdist("itsdangerous", "2.2.0")), name="itsdangerous", install=["freezegun"])],
        modifiers=["flip_comparison", "negate_condition", "off_by_one"],
        max_candidates_per_repo=4,
        validation_workers=2,
        decontaminate=False,
    )
    store = Store(str(tmp / "store"))
    tracker = Tracker(f"sqlite:///{tmp}/mlflow.db", "venv-tasks")
    outcome = run_stage(
        "curate", run_curate, cfg, store=store, tracker=tracker, parent=None, seed=0, content=content_key(cfg)
    )
    prefix = f"stages/curate/{outcome.manifest.key}/{outcome.manifest.attempt}"
    report = json.loads(store.read_bytes(f"{prefix}/curate_report.json"))
    tasks = tasks_from_parquet(store.read_bytes(f"{prefix}/train.parquet")) + tasks_from_parquet(
        store.read_bytes(f"{prefix}/eval.parquet")
    )
    assert tasks, report["synthesis"]["by_repo"]["itsdangerous"]
    return tasks, report["synthesis"]["by_repo"]["itsdangerous"]


@pytest.mark.slow
@pytest.mark.network
def test_curated_tasks_run_in_their_own_environment_with_a_provider_running_swerls_python(curated) -> None:
    tasks, repo = curated
    task = tasks[0]
    assert task.image.startswith("venv://"), task.image
    env = task_env(task)
    assert isinstance(env, VenvEnvironment) and env.python == repo["environment"]["python"]
    assert env.path == resolve_environment(task.image) and any(r.startswith("freezegun==") for r in env.requirements)
    # What agent.sandbox.python defaults to: swerl's own interpreter (no freezegun, no itsdangerous on its path).
    provider = local_provider(sys.executable)

    async def check() -> None:
        sandbox = await start_task_sandbox(provider, task)
        try:
            probe = await sandbox.exec("python -c 'import sys, freezegun, itsdangerous; print(sys.prefix)'", 60)
        finally:
            await sandbox.close()
        assert probe.exit_code == 0 and probe.output.strip() == str(Path(env.python).parents[1]), probe.output
        fix = await grade_patch(provider, task, reverse_patch(task.patch), 120)
        bug = await grade_patch(provider, task, "", 120)
        assert fix.status == RESOLVED_FULL, fix
        assert bug.status != RESOLVED_FULL and bug.sealed, bug

    try:
        run_async(check())
    finally:
        provider.close()


@pytest.mark.slow
@pytest.mark.network
def test_a_missing_or_changed_environment_is_image_missing_never_swerls_python(curated) -> None:
    task = curated[0][0]
    ref = parse_env_reference(task.image)
    other = dataclasses.replace(ref, install=(*ref.install, "not-built-anywhere"), key="0" * 20)
    with pytest.raises(InfraError) as info:
        task_env(task.model_copy(update={"image": str(other)}))
    assert info.value.cause == "image_missing" and "python -m swerl.data.repoenv build" in str(info.value)
    with pytest.raises(InfraError) as info:
        task_env(task.model_copy(update={"base_commit": "f" * 64}))
    assert info.value.cause == "image_missing" and "changed since curation" in str(info.value)
    gone = dataclasses.replace(ref, path=Path("/nonexistent/itsdangerous"))
    with pytest.raises(InfraError, match="does not exist"):
        task_env(task.model_copy(update={"image": str(gone)}))


@pytest.mark.slow
@pytest.mark.network
def test_another_machine_rebuilds_the_environment_from_the_task(
    curated, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh cache (another machine with the same source path): image_missing naming the rebuild command, which
    builds it from what the task carries; then the task resolves to the rebuilt interpreter."""
    from swerl.data.repoenv import main

    task = curated[0][0]
    monkeypatch.setenv("SWERL_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(InfraError, match="swerl.data.repoenv build"):
        task_env(task)
    parquet = tmp_path / "train.parquet"
    parquet.write_bytes(tasks_to_parquet([task]))
    main(["build", str(parquet)])
    env = task_env(task)
    assert isinstance(env, VenvEnvironment) and env.python.startswith(str(tmp_path / "cache"))
    assert any(r.startswith("freezegun==") for r in env.requirements)


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.network
def test_the_docker_backend_runs_them_in_an_image_with_the_environments_requirements(curated) -> None:
    """docker: the repository's image is built once with the environment's pinned requirements (wheels fetched at
    preparation time, the build offline), so the reference fix resolves there too."""
    if reason := docker_unavailable():
        pytest.skip(reason)
    task = curated[0][0]
    provider = docker_provider(git_baseline=True, memory_mb=1024, start_timeout_s=120)

    async def check() -> None:
        prepared = await provider.environment_image(task_env(task))
        assert prepared.path.startswith("/opt/venv/bin"), prepared
        fix = await grade_patch(provider, task, reverse_patch(task.patch), 120)
        bug = await grade_patch(provider, task, "", 120)
        assert fix.status == RESOLVED_FULL, fix
        assert bug.status != RESOLVED_FULL and bug.sealed, bug

    try:
        run_async(check())
    finally:
        provider.close()


@pytest.mark.slow
@pytest.mark.network
def test_building_the_environment_leaves_the_source_as_the_task_ships_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip builds a setuptools project in its source tree, and build/lib/<package>/ would hold the unbugged code in
    the tree every task's workspace is copied from: the environment is built from a throwaway copy (issue 34)."""
    monkeypatch.setenv("SWERL_CACHE_DIR", str(tmp_path / "cache"))
    repo = tmp_path / "proj"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (repo / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "proj"\nversion = "0.1"\n\n[tool.setuptools]\npackages = ["pkg"]\n'
    )
    before = sorted(str(p.relative_to(repo)) for p in repo.rglob("*"))
    env = build_env(repo)
    assert Path(env.python).is_file() and "pytest" in " ".join(env.installed)
    assert sorted(str(p.relative_to(repo)) for p in repo.rglob("*")) == before  # no build/, no *.egg-info
