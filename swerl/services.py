"""Local services on loopback: SeaweedFS (S3), the MLflow tracking server and the Prefect server.

Each is a child process in its own session, health-checked over HTTP and stopped by process id (the whole process
group: MLflow and Prefect spawn workers). `swerl up` and the test fixtures both use these.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("swerl.services")


# Ports this process has handed out (and SeaweedFS's derived grpc ports): the OS may offer a port again until the
# server it was picked for binds it, so two picks in a row (SeaweedFS's filer, then Prefect) could collide.
_HANDED_OUT: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free right now on host (the OS picks it), never one this process handed out before."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def _bin(name: str) -> str:
    """An executable installed next to this interpreter (the venv), else on PATH."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


@dataclass
class Service:
    """A server process started from argv, healthy when `health_url` answers 200."""

    name: str
    argv: list[str]
    health_url: str
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    startup_timeout_s: float = 120.0
    stop_timeout_s: float = 30.0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> Service:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logfile = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed when it stops
        env = {**os.environ, **self.env}
        log.info("starting %s: %s (log %s)", self.name, " ".join(self.argv), self.log_path)
        self.proc = subprocess.Popen(
            self.argv,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=self.cwd,
            start_new_session=True,
        )
        logfile.close()
        self.wait_healthy()
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.health_url, timeout=2) as resp:  # noqa: S310 - loopback URL
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} while starting:\n{tail}")
            if self.healthy():
                log.info("%s healthy at %s (pid %s)", self.name, self.health_url, self.pid)
                return
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"{self.name} not healthy at {self.health_url} after {self.startup_timeout_s}s")

    def stop(self) -> None:
        """SIGTERM the process group, then SIGKILL what is left after the stop timeout."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # start_new_session: the group id is the child's pid
        try:
            os.killpg(pgid, signal.SIGTERM)
            self.proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in %ss, killing", self.name, self.stop_timeout_s)
        except ProcessLookupError:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)  # stragglers of the group (workers) go too
        self.proc.wait(timeout=10)

    def __enter__(self) -> Service:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class SeaweedPorts:
    s3: int
    master: int
    volume: int
    filer: int
    webdav: int
    admin: int

    @classmethod
    def free(cls, host: str = "127.0.0.1") -> SeaweedPorts:
        return cls(*(free_seaweed_port(host) for _ in range(6)))


def free_seaweed_port(host: str = "127.0.0.1") -> int:
    """A free port for a SeaweedFS server, whose grpc port is the port + 10000 by SeaweedFS's convention: below
    55000, with its grpc port free too (both handed out, never again in this process)."""
    while True:
        p = free_port(host)
        if p < 55000 and p + 10000 not in _HANDED_OUT and _port_free(host, p + 10000):
            _HANDED_OUT.add(p + 10000)
            return p


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def seaweedfs(
    data_dir: Path,
    ports: SeaweedPorts,
    *,
    host: str = "127.0.0.1",
    bucket: str = "swerl",
    access_key: str,
    secret_key: str,
    startup_timeout_s: float = 120.0,
) -> Service:
    """SeaweedFS `weed mini` with every port explicit, telemetry off, S3 credentials from arguments."""
    data_dir.mkdir(parents=True, exist_ok=True)
    g = 10000  # grpc port offset
    argv = [
        _bin("weed"),
        "mini",
        f"-dir={data_dir}",
        f"-ip={host}",
        f"-ip.bind={host}",
        f"-master.port={ports.master}",
        f"-master.port.grpc={ports.master + g}",
        f"-volume.port={ports.volume}",
        f"-volume.port.grpc={ports.volume + g}",
        f"-filer.port={ports.filer}",
        f"-filer.port.grpc={ports.filer + g}",
        f"-s3.port={ports.s3}",
        f"-s3.port.grpc={ports.s3 + g}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-webdav.port={ports.webdav}",
        f"-admin.port={ports.admin}",
        f"-admin.port.grpc={ports.admin + g}",
        "-admin.ui=false",
        "-master.telemetry=false",
        f"-bucket={bucket}",
    ]
    env = {"AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key}
    return Service(
        "seaweedfs",
        argv,
        f"http://{host}:{ports.s3}/healthz",
        data_dir / "weed.log",
        env=env,
        startup_timeout_s=startup_timeout_s,
        stop_timeout_s=30.0,
    )


def mlflow_server(
    data_dir: Path, port: int, *, host: str = "127.0.0.1", workers: int = 1, startup_timeout_s: float = 120.0
) -> Service:
    """An `mlflow server` with a sqlite backend and a local artifact root under data_dir."""
    data_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        _bin("mlflow"),
        "server",
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--backend-store-uri",
        f"sqlite:///{(data_dir / 'mlflow.db').resolve()}",
        "--artifacts-destination",
        str((data_dir / "artifacts").resolve()),
    ]
    return Service(
        "mlflow",
        argv,
        f"http://{host}:{port}/health",
        data_dir / "mlflow-server.log",
        env={"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"},
        startup_timeout_s=startup_timeout_s,
    )


def prefect_server(home: Path, port: int, *, host: str = "127.0.0.1", startup_timeout_s: float = 120.0) -> Service:
    """`prefect server start` with its own PREFECT_HOME (sqlite database inside it), analytics off."""
    home.mkdir(parents=True, exist_ok=True)
    argv = [_bin("prefect"), "server", "start", "--host", host, "--port", str(port)]
    env = {
        "PREFECT_HOME": str(home.resolve()),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "true",
        "PREFECT_API_URL": f"http://{host}:{port}/api",
    }
    return Service(
        "prefect",
        argv,
        f"http://{host}:{port}/api/health",
        home / "prefect-server.log",
        env=env,
        startup_timeout_s=startup_timeout_s,
    )


def prefect_worker(
    home: Path,
    api_url: str,
    pool: str,
    health_port: int,
    *,
    host: str = "127.0.0.1",
    limit: int = 1,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    startup_timeout_s: float = 120.0,
) -> Service:
    """`prefect worker start` on a work pool of type process: it runs the pool's flow runs (schedules, UI runs) as
    child processes that inherit its environment (`env`: the S3 credentials, never put in a deployment). Healthy when
    its health check (a web server on host:health_port) answers."""
    home.mkdir(parents=True, exist_ok=True)
    argv = [
        _bin("prefect"),
        "worker",
        "start",
        "--pool",
        pool,
        "--type",
        "process",
        "--limit",
        str(limit),
        "--with-healthcheck",
        "--name",
        f"swerl-{pool}",
    ]
    worker_env = {
        **(env or {}),
        "PREFECT_API_URL": api_url,
        "PREFECT_WORKER_WEBSERVER_HOST": host,
        "PREFECT_WORKER_WEBSERVER_PORT": str(health_port),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    return Service(
        "prefect-worker",
        argv,
        f"http://{host}:{health_port}/health",
        home / "prefect-worker.log",
        env=worker_env,
        cwd=cwd,
        startup_timeout_s=startup_timeout_s,
    )


def start_all(group: list[Service]) -> list[Service]:
    """Start services at once (each health wait in its own thread); if one fails, stop those that started and raise
    its error. Returns them in the order given."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(group)), thread_name_prefix="swerl-up") as ex:
        futures = {ex.submit(svc.start): svc for svc in group}
        errors = [f.exception() for f in concurrent.futures.as_completed(futures)]
    failed = [e for e in errors if e is not None]
    if failed:
        for svc in group:
            svc.stop()
        raise failed[0]
    return group
