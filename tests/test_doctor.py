"""`swerl doctor` against this machine: it refuses configs that would hit a cap, with the numbers; local passes."""

from __future__ import annotations

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
        ["setpriv", "--bounding-set=-sys_admin", sys.executable, "-m", "swerl.cli", "doctor", "configs/local.yaml",
         "--set", "agent.sandbox.runtime=supervisor", "--set", "agent.sandbox.memory_mb=256"],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
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
        [sys.executable, "-m", "swerl.cli", "doctor", "configs/local.yaml",
         "--set", "agent.sandbox.runtime=supervisor", "--set", "agent.sandbox.memory_mb=256"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )  # fmt: skip
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
