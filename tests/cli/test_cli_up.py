"""`swerl up` for real: three servers and a Prefect worker on loopback, healthy, then all stopped by Ctrl-C (SIGINT)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from swerl import services

REPO = Path(__file__).resolve().parents[2]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _holders(path: Path) -> list[int]:
    """Processes with `path` open (a service's log is its stdout)."""
    pids = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) == str(path) for fd in fd_dir.iterdir()):
                pids.append(int(fd_dir.parent.name))
        except OSError:
            continue
    return pids


def up_command(data_dir: Path, startup_timeout_s: int) -> tuple[list[str], int, int, services.SeaweedPorts]:
    """`swerl up configs/local.yaml` on free loopback ports, its data under `data_dir`: (argv, Prefect port, MLflow
    port, SeaweedFS ports)."""
    weed = services.SeaweedPorts.free()
    prefect_port, mlflow_port = services.free_port(), services.free_port()
    overrides = [
        f"services.prefect_port={prefect_port}",
        f"services.mlflow_port={mlflow_port}",
        f"services.s3_port={weed.s3}",
        f"services.seaweed_master_port={weed.master}",
        f"services.seaweed_volume_port={weed.volume}",
        f"services.seaweed_filer_port={weed.filer}",
        f"services.startup_timeout_s={startup_timeout_s}",
    ]
    argv = [
        sys.executable,
        "-m",
        "swerl.cli",
        "up",
        str(REPO / "configs/local.yaml"),
        "--data-dir",
        str(data_dir),
    ]
    for item in overrides:
        argv += ["--set", item]
    return argv, prefect_port, mlflow_port, weed


@pytest.mark.slow
def test_up_starts_all_services_and_ctrl_c_stops_them(tmp_path: Path):
    argv, prefect_port, mlflow_port, weed = up_command(tmp_path, 240)
    log = (tmp_path / "up.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
    urls = [
        f"http://127.0.0.1:{prefect_port}/api/health",
        f"http://127.0.0.1:{mlflow_port}/health",
        f"http://127.0.0.1:{weed.s3}/healthz",
    ]
    try:
        deadline = time.monotonic() + 400
        # Ready means: every server answers and `swerl up` itself says so (it may still be in its own health wait
        # when a server first answers; a Ctrl-C during start-up is another case).
        while not (all(_answers(u) for u in urls) and "Local services are up" in (tmp_path / "up.log").read_text()):
            assert proc.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "services not healthy in time"
            time.sleep(1)
        # The credentials file exists, is private, and its secret is never printed.
        env_file = tmp_path / "s3.env"
        assert oct(env_file.stat().st_mode & 0o777) == "0o600"
        secret = [ln for ln in env_file.read_text().splitlines() if "SECRET" in ln][0].split("=", 1)[1]
        assert secret not in (tmp_path / "up.log").read_text()
        # services.env: what a run needs, the credentials by reference only; sourced by a shell, it sets them all.
        services_env = tmp_path / "services.env"
        assert secret not in services_env.read_text()
        shown = subprocess.run(
            ["bash", "-c", f"source {services_env} && env"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        env = dict(line.split("=", 1) for line in shown if "=" in line)
        assert env["PREFECT_API_URL"] == f"http://127.0.0.1:{prefect_port}/api"
        assert env["SWERL_TRACKING_URI"] == f"http://127.0.0.1:{mlflow_port}"
        assert env["SWERL_STORAGE_ROOT"] == "s3://swerl/store"
        assert env["SWERL_S3_ENDPOINT_URL"] == f"http://127.0.0.1:{weed.s3}"
        assert env["AWS_SECRET_ACCESS_KEY"] == secret
        # A worker serves the work pool `swerl` (type process), online on the Prefect server.
        workers: list[dict[str, str]] = []
        deadline = time.monotonic() + 120  # the worker registers with its first poll of the pool
        while [w["status"] for w in workers] != ["ONLINE"] and time.monotonic() < deadline:
            request = urllib.request.Request(
                f"http://127.0.0.1:{prefect_port}/api/work_pools/swerl/workers/filter",
                data=b"{}",
                method="POST",
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10) as resp:  # the pool exists: 404 otherwise
                workers = json.loads(resp.read())
            time.sleep(1)
        assert [w["status"] for w in workers] == ["ONLINE"], workers
        worker_pids = _holders(tmp_path / "prefect" / "prefect-worker.log")  # this test's worker, no other
        assert worker_pids
        # The three services started at once: each one's "starting" line comes before any "healthy" line.
        lines = (tmp_path / "up.log").read_text().splitlines()
        starts = [i for i, ln in enumerate(lines) if " starting " in ln and "starting prefect-worker" not in ln]
        healthy = [i for i, ln in enumerate(lines) if " healthy at " in ln]
        assert len(starts) == 3 and max(starts) < min(healthy), "\n".join(lines)

        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 0
        for port in (prefect_port, mlflow_port, weed.s3, weed.master, weed.filer):
            assert not _listening(port), f"port {port} still served after Ctrl-C"
        for pid in worker_pids:
            assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_ports_handed_out_are_never_repeated_within_a_process():
    """The OS offers a port again until its server binds it: picks in a row (SeaweedFS's six and their grpc ports,
    then Prefect's and MLflow's) must still all differ. Failed in CI when Prefect drew the filer's port."""
    weed = services.SeaweedPorts.free()
    http = [weed.s3, weed.master, weed.volume, weed.filer, weed.webdav, weed.admin]
    picked = http + [p + 10000 for p in http] + [services.free_port() for _ in range(400)]
    assert len(set(picked)) == len(picked)
    # a SeaweedFS server's own port and its grpc port (+10000) are both valid ports (swerl up's webdav and admin)
    extra = [services.free_seaweed_port() for _ in range(50)]
    assert all(p + 10000 <= 65535 for p in http + extra) and not set(extra) & set(picked)
