"""What only the docker backend has: images, engine failures, a container that dies, the config wiring."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from swerl.config.sandbox import SandboxLimits
from swerl.errors import InfraError
from swerl.sandbox.docker import DockerSandbox, DockerSandboxProvider
from swerl.sandbox.images import debian_mirror, env_image_name
from swerl.stages.common import sandbox_provider
from tests.sandbox_backends import Backend, Limits, containers, docker_unavailable, make_backend
from tests.sandbox_helpers import docker_provider


@pytest.fixture
def env_dir(tmp_path: Path) -> Path:
    root = tmp_path / "env"
    root.mkdir()
    (root / "mod.py").write_text("x = 1\n")
    return root


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[Backend]:
    made = make_backend("docker", tmp_path, Limits())
    yield made
    made.teardown()


def test_debian_mirror_from_apt_sources(tmp_path: Path):
    sources = tmp_path / "sources.list.d"
    sources.mkdir()
    (sources / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert debian_mirror(sources) == "http://mirror.example/debian"
    (sources / "debian.sources").unlink()
    (sources / "old.list").write_text("# comment\ndeb [arch=amd64] http://old.example/debian bookworm main\n")
    assert debian_mirror(sources) == "http://old.example/debian"
    with pytest.raises(RuntimeError, match="no Debian mirror"):
        debian_mirror(sources, suite="trixie")


def test_environment_image_name_follows_content(env_dir: Path):
    first = env_image_name(env_dir)
    (env_dir / "__pycache__").mkdir()
    (env_dir / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"junk")
    assert env_image_name(env_dir) == first  # caches do not change the environment
    (env_dir / "mod.py").write_text("x = 2\n")
    assert env_image_name(env_dir) != first
    assert env_image_name(env_dir, base="other:tag") != env_image_name(env_dir)


def test_config_builds_the_docker_provider():
    limits = SandboxLimits(backend="docker", memory_mb=777, max_processes=99, docker={"cpus": 0.5})
    provider = sandbox_provider(limits, git_baseline=True)
    assert isinstance(provider, DockerSandboxProvider) and provider.git_baseline
    assert provider.limits()["memory_mb"] == 777 and provider.limits()["cpus"] == 0.5
    assert provider.resources.max_processes == 99
    provider.close()
    local = sandbox_provider(SandboxLimits(workspace_dir="/dev/shm/swerl-workspaces"))
    assert type(local).__name__ == "LocalSandboxProvider" and str(local.root_dir) == "/dev/shm/swerl-workspaces"


@pytest.mark.docker
def test_container_limits_and_isolation_settings(backend: Backend, env_dir: Path):
    import docker

    async def body() -> None:
        sandbox = await backend.provider.start(env_dir)
        assert isinstance(sandbox, DockerSandbox)
        try:
            client = docker.from_env()
            attrs = client.api.inspect_container(sandbox.container_id)
            client.close()
            host = attrs["HostConfig"]
            assert host["NetworkMode"] == "none" and attrs["Config"]["NetworkDisabled"]
            assert host["Memory"] == Limits().memory_mb << 20 and host["PidsLimit"] == Limits().max_processes
            assert host["ReadonlyRootfs"] and host["CapDrop"] == ["ALL"] and host["NanoCpus"] == 10**9
            assert attrs["Config"]["User"] == "10001:10001"
            assert set(attrs["NetworkSettings"]["Networks"]) <= {"none"}  # attached to no network at all
        finally:
            await sandbox.close()

    asyncio.run(body())


@pytest.mark.docker
def test_missing_base_image_is_image_missing_and_never_pulled(tmp_path: Path, env_dir: Path):
    if reason := docker_unavailable():  # an engine must answer for the image to be found missing
        pytest.skip(reason)
    provider = docker_provider(base_image="swerl-no-such-image:never", api_threads=4)
    with pytest.raises(InfraError) as info:
        asyncio.run(provider.start(env_dir))
    assert info.value.cause == "image_missing" and "swerl-no-such-image:never" in str(info.value)
    assert containers(provider.id) == []
    provider.close()


@pytest.mark.docker
def test_unreachable_engine_is_start_failed(env_dir: Path, tmp_path: Path):
    provider = docker_provider(docker_host=f"unix://{tmp_path}/no-docker.sock", api_threads=4)
    with pytest.raises(InfraError) as info:
        asyncio.run(provider.start(env_dir))
    assert info.value.cause == "start_failed" and "not reachable" in str(info.value)
    provider.close()


@pytest.mark.docker
def test_a_container_killed_from_outside_is_sandbox_died(backend: Backend, env_dir: Path):
    async def body() -> None:
        sandbox = await backend.provider.start(env_dir)
        assert isinstance(sandbox, DockerSandbox)
        try:
            assert (await sandbox.exec("echo up", 10)).output == "up\n"
            subprocess.run(["docker", "kill", sandbox.container_id], check=True, capture_output=True)
            with pytest.raises(InfraError) as info:
                await sandbox.exec("echo still", 10)
            assert info.value.cause == "sandbox_died"
        finally:
            await sandbox.close()

    asyncio.run(body())
    assert backend.leftovers() == []


@pytest.mark.docker
def test_start_timeout_leaves_no_container(env_dir: Path, tmp_path: Path):
    backend = make_backend("docker", tmp_path, Limits())
    provider = backend.provider
    assert isinstance(provider, DockerSandboxProvider)
    asyncio.run(provider.environment_image(env_dir))  # built outside the timed start
    provider.resources = dataclasses.replace(provider.resources, start_timeout_s=0.05)

    with pytest.raises(InfraError) as info:
        asyncio.run(provider.start(env_dir))
    assert info.value.cause == "start_timeout"
    provider._executor.shutdown(wait=True)  # a create still in flight finishes, sees it was abandoned, removes
    assert backend.leftovers() == []


@pytest.mark.docker
def test_curation_finds_the_same_tasks_in_docker_as_under_bubblewrap(tmp_path: Path):
    from swerl.data.micro import micro_repo_spec
    from swerl.data.synth import synthesize_repo

    spec = micro_repo_spec("train", 0, 0)
    found, reports = {}, {}
    for name in ("local", "docker"):
        backend = make_backend(name, tmp_path / name, Limits())
        tasks, report = asyncio.run(
            synthesize_repo(
                spec,
                backend.provider,
                modifiers=["flip_comparison", "swap_binop"],
                max_candidates=3,
                max_tasks=10,
                seed=0,
                workers=2,
                test_timeout_s=120,
                min_bugged_timeout_s=60,  # generous: a loaded machine must not turn a slow run into a rejection
                bugged_timeout_factor=5.0,
                clean_runs=1,
            )
        )
        found[name] = sorted((t.instance_id, tuple(t.FAIL_TO_PASS), tuple(t.PASS_TO_PASS)) for t in tasks)
        reports[name] = report
        assert backend.leftovers() == []
        backend.teardown()
    assert found["docker"] == found["local"] and len(found["docker"]) >= 1, reports
