"""`swerl doctor` against this machine: it refuses configs that would hit a cap, with the numbers; local passes."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swerl.cli import main
from swerl.config import load_config
from swerl.doctor import _meminfo_mb, diagnose


def test_local_config_passes(capsys) -> None:
    # memory_mb is an address-space cap counted against memory free now: smaller here, so that the test does not
    # depend on what else runs on the machine (the CPU default's 1024 MB x 16 passes with ~18 GB free)
    assert main(["doctor", "configs/local.yaml", "--set", "agent.sandbox.memory_mb=256"]) == 0
    out = capsys.readouterr().out
    assert "doctor: ok" in out and "mem_available_mb" in out and "nofile_soft" in out


def test_refuses_more_sandbox_memory_than_the_machine_has(capsys) -> None:
    ram = _meminfo_mb()["MemTotal"]
    per_sandbox = ram // 8 + 1024  # 16 sandboxes of this are over twice the machine
    code = main(["doctor", "configs/local.yaml", "--set", f"agent.sandbox.memory_mb={per_sandbox}"])
    out = capsys.readouterr().out
    assert code == 1
    # With per-sandbox cgroups the whole sandbox (its tmpfs pages included) lives in memory_mb; with per-process
    # caps only, every process may take memory_mb: memory_mb x max_processes + the /tmp and workspace tmpfs.
    cgroups = "ok   sandbox_cgroups" in out
    per_sandbox_mb = per_sandbox if cgroups else per_sandbox * 64 + 64 + 64
    assert "FAIL memory" in out and f"= {16 * per_sandbox_mb} MB" in out and "refused: memory" in out


def test_refuses_a_pool_smaller_than_the_rollout_concurrency() -> None:
    cfg = load_config("configs/local.yaml", ["agent.sandbox.pool.max_concurrent=4"])
    report = diagnose(cfg)
    failed = {c.name: c.detail for c in report.checks if not c.ok}
    assert set(failed) == {
        "pool.grpo.rollout.max_in_flight",
        "pool.evaluate.concurrency",
    }  # local.yaml: async GRPO
    assert "12 episodes would wait for a sandbox" in failed["pool.grpo.rollout.max_in_flight"]
    assert report.params()["doctor.check.pool.grpo.rollout.max_in_flight"] == "FAIL"


def test_refuses_when_open_files_are_too_few() -> None:
    # A real lower RLIMIT_NOFILE for the doctor's process (prlimit), not a patched reading.
    done = subprocess.run(
        ["prlimit", "--nofile=300:300", sys.executable, "-m", "swerl.cli", "doctor", "configs/local.yaml"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL open_files: ~624 descriptors needed vs RLIMIT_NOFILE soft 300" in done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping a capability from the bounding set needs root")
def test_refuses_the_supervisor_runtime_without_the_right_to_mount() -> None:
    # A real process without CAP_SYS_ADMIN (dropped from its bounding set), not a patched probe.
    done = subprocess.run(
        [
            "setpriv",
            "--bounding-set=-sys_admin",
            sys.executable,
            "-m",
            "swerl.cli",
            "doctor",
            "configs/local.yaml",
            "--set",
            "agent.sandbox.runtime=supervisor",
            "--set",
            "agent.sandbox.memory_mb=256",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL local_runtime.supervisor: runtime supervisor needs root (CAP_SYS_ADMIN)" in done.stdout
    assert "Operation not permitted" in done.stdout and "refused: local_runtime.supervisor" in done.stdout
    # auto falls back to bubblewrap there, which the doctor then requires
    assert "ok   local_runtime.auto: runtime auto: bubblewrap per command" in done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="the supervisor runtime needs root")
def test_refuses_the_supervisor_runtime_it_cannot_build(tmp_path: Path) -> None:
    # A real missing compiler (CC names no program) and an empty build cache, in the doctor's own process.
    env = {**os.environ, "CC": "cc-not-installed", "SWERL_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "swerl.cli",
            "doctor",
            "configs/local.yaml",
            "--set",
            "agent.sandbox.runtime=supervisor",
            "--set",
            "agent.sandbox.memory_mb=256",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL local_runtime.supervisor: runtime supervisor cannot be built" in done.stdout
    assert "'cc-not-installed' was not found" in done.stdout
    assert "refused: local_runtime.supervisor" in done.stdout


def test_run_stops_on_a_doctor_refusal_naming_the_failed_checks(capsys, monkeypatch) -> None:
    """`swerl run` refuses before any stage (or Prefect) starts; --ignore-doctor overrides it."""
    import swerl.cli as cli

    started: list[bool] = []
    monkeypatch.setattr(cli, "_prefect_env", lambda: started.append(True))
    ram = _meminfo_mb()["MemTotal"]
    over = ["--set", f"agent.sandbox.memory_mb={ram // 8 + 1024}"]
    assert main(["run", "configs/local.yaml", *over]) == 1
    err = capsys.readouterr().err
    assert "swerl doctor refuses" in err and "memory:" in err and "--ignore-doctor" in err
    assert started == []

    class Stop(Exception):
        pass

    def stop_here() -> None:
        raise Stop

    monkeypatch.setattr(cli, "_prefect_env", stop_here)
    with pytest.raises(Stop):  # past the doctor: the run goes on to start Prefect
        main(["run", "configs/local.yaml", *over, "--ignore-doctor"])


@pytest.fixture
def task_images():
    """Two tiny images built here FROM swerl-base:bookworm (removed at the end), and a name no engine has."""
    from tests.sandbox_backends import docker_unavailable

    reason = docker_unavailable()
    if reason:
        pytest.skip(reason)
    import io
    import secrets

    import docker

    client = docker.from_env()
    tag = f"swerl-doctor-test-{secrets.token_hex(4)}"
    built = [f"{tag}:a", f"{tag}:b"]
    try:
        for name in built:
            dockerfile = f"FROM swerl-base:bookworm\nLABEL org.swerl.test={name}\nWORKDIR /testbed\n"
            client.images.build(
                fileobj=io.BytesIO(dockerfile.encode()), tag=name, pull=False, network_mode="none", rm=True
            )
        sizes = {name: int(client.images.get(name).attrs["Size"]) for name in built}
        yield client, sizes, f"{tag}-missing:latest"
    finally:
        for name in built:
            with contextlib.suppress(docker.errors.ImageNotFound):
                client.images.remove(name, noprune=False)
        client.close()


PATCH = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"


def _write_tasks(path: Path, images: list[str]) -> Path:
    from swerl.data.schema import TaskInstance
    from swerl.data.taskio import tasks_to_parquet

    tasks = [
        TaskInstance(
            instance_id=f"t{i}",
            repo="o/r",
            base_commit="",
            problem_statement="p",
            patch=PATCH,
            patch_kind="bug",
            FAIL_TO_PASS=["t::x"],
            image=image,
            source="test",
        )
        for i, image in enumerate(images)
    ]
    path.write_bytes(tasks_to_parquet(tasks))
    return path


DOCKER = ["--set", "agent.sandbox.backend=docker", "--set", "agent.sandbox.memory_mb=256"]


@pytest.mark.docker
def test_task_images_present_sized_and_refused_when_missing_without_pulls(task_images, tmp_path, capsys) -> None:
    import docker

    client, sizes, missing = task_images
    a, b = sorted(sizes)
    # curate's own task file: two tasks of one image, one of another (docker://), one missing, one directory task
    tasks = _write_tasks(tmp_path / "train.parquet", [a, a, f"docker://{b}", missing, "local://repos/intervals"])
    assert main(["doctor", "configs/local.yaml", *DOCKER, "--tasks", str(tasks)]) == 1
    out = capsys.readouterr().out
    assert "task images:\n  image_tasks: 4\n  of_tasks: 5\n  images: 3\n  backend: docker\n  present: 2" in out
    assert f"present_mb: {round((sizes[a] + sizes[b]) / 1e6, 1)}" in out and "missing: 1" in out
    assert f"missing_names: {missing}" in out and "missing_mb: unknown" in out
    assert (
        f"FAIL task_images: 1 of 3 images missing and agent.sandbox.docker.allow_pull is off: {missing}" in out
        and "refused: task_images" in out
    )

    # allowed to pull: reported with the pull budget's time, not refused, and nothing is pulled
    pull = ["--set", "agent.sandbox.docker.allow_pull=true", "--set", "agent.sandbox.docker.pulls_per_hour=1"]
    two_missing = _write_tasks(tmp_path / "more.parquet", [a, missing, missing + "2"])
    assert main(["doctor", "configs/local.yaml", *DOCKER, *pull, "--tasks", str(two_missing)]) == 0, (
        capsys.readouterr().out
    )
    out = capsys.readouterr().out
    assert "to_pull: 2" in out and "2 pulls at docker.pulls_per_hour 1: ~1 h of waiting for the budget" in out
    assert "ok   task_images: 2 of 3 images missing, to be pulled" in out and "doctor: ok" in out
    for name in (missing, missing + "2"):
        with pytest.raises(docker.errors.ImageNotFound):
            client.images.get(name)


@pytest.mark.docker
def test_task_images_all_present_pass_and_directory_tasks_add_nothing(task_images, tmp_path, capsys) -> None:
    _, sizes, _ = task_images
    rows = tmp_path / "swesmith.jsonl"  # a SWE-smith dataset file: image_name names the image
    rows.write_text(
        "\n".join(
            json.dumps(
                {
                    "instance_id": f"r{i}",
                    "repo": "swesmith/o__r.abcdef12",
                    "patch": PATCH,
                    "FAIL_TO_PASS": ["t::x"],
                    "image_name": name,
                }
            )
            for i, name in enumerate(sorted(sizes))
        )
        + "\n"
    )
    assert main(["doctor", "configs/local.yaml", *DOCKER, "--tasks", str(rows)]) == 0
    out = capsys.readouterr().out
    assert "ok   task_images: all 2 images on the engine" in out and "missing: 0" in out

    directory = _write_tasks(tmp_path / "dirs.parquet", ["local://repos/intervals", "micro://train/0/0"])
    assert (
        main(
            [
                "doctor",
                "configs/local.yaml",
                "--set",
                "agent.sandbox.memory_mb=256",
                "--tasks",
                str(directory),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "task images" not in out and "task_images" not in out
