"""Session fixtures: real SeaweedFS, MLflow and Prefect servers on loopback, each started lazily at most once.

The environment below is set at import, before any test module imports prefect (whose settings are read then):
tests never touch ~/.prefect, never reach a user's PREFECT_API_URL, and the ephemeral API gets time to migrate.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

SESSION_DIR = Path(tempfile.mkdtemp(prefix="swerl-tests-"))

os.environ["PREFECT_HOME"] = str(SESSION_DIR / "prefect-home")
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "300"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
os.environ["DO_NOT_TRACK"] = "true"
for _var in ("PREFECT_API_URL", "PREFECT_API_KEY", "PREFECT_PROFILE", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
    os.environ.pop(_var, None)

from swerl import services  # noqa: E402 - after the environment above

if TYPE_CHECKING:
    from tests.stage_helpers import Env
    from tests.tiny_models import TinyModels


@pytest.fixture(scope="session", autouse=True)
def _session_dir() -> Iterator[Path]:
    """Scratch space of the whole session; removed after every server has stopped."""
    yield SESSION_DIR
    shutil.rmtree(SESSION_DIR, ignore_errors=True)


@dataclass(frozen=True)
class SeaweedS3:
    endpoint_url: str
    bucket: str
    access_key: str
    secret_key: str

    def __repr__(self) -> str:  # never print the secret in a failing test's report
        return f"SeaweedS3(endpoint_url={self.endpoint_url!r}, bucket={self.bucket!r})"


@pytest.fixture(scope="session")
def seaweed(_session_dir: Path) -> Iterator[SeaweedS3]:
    """A real S3 server (`weed mini`) with credentials generated for this session."""
    access, secret = "swerl-test-" + secrets.token_hex(4), secrets.token_urlsafe(24)
    ports = services.SeaweedPorts.free()
    svc = services.seaweedfs(
        _session_dir / "seaweedfs",
        ports,
        bucket="swerl",
        access_key=access,
        secret_key=secret,
        startup_timeout_s=120,
    )
    svc.stop_timeout_s = 5  # data is thrown away; no need for a clean 20 s shutdown
    svc.start()
    try:
        yield SeaweedS3(f"http://127.0.0.1:{ports.s3}", "swerl", access, secret)
    finally:
        svc.stop()


@pytest.fixture
def s3_env(seaweed: SeaweedS3, monkeypatch: pytest.MonkeyPatch) -> SeaweedS3:
    """The session's S3 server with its credentials in this test's environment (where boto reads them)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return seaweed


@pytest.fixture(scope="session")
def mlflow_server(_session_dir: Path) -> Iterator[str]:
    """A real `mlflow server` (sqlite backend); yields its tracking URI."""
    port = services.free_port()
    svc = services.mlflow_server(_session_dir / "mlflow", port, startup_timeout_s=180)
    svc.stop_timeout_s = 3  # data is thrown away
    svc.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        svc.stop()


@pytest.fixture(scope="session")
def prefect_server(_session_dir: Path) -> Iterator[str]:
    """A real `prefect server start` shared by the session; yields its API URL."""
    port = services.free_port()
    svc = services.prefect_server(_session_dir / "prefect-server", port, startup_timeout_s=180)
    svc.stop_timeout_s = 3  # data is thrown away
    svc.start()
    try:
        yield f"http://127.0.0.1:{port}/api"
    finally:
        svc.stop()


@pytest.fixture
def prefect_api(prefect_server: str) -> Iterator[str]:
    """Point Prefect at the session's server for one test; flush its log and event queues afterwards."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect_server}):
        try:
            yield prefect_server
        finally:
            _drain_prefect_workers()


def _drain_prefect_workers() -> None:
    # Logs and events are sent by background workers; send them now, while the server still runs.
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=10)


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny-model ops gain nothing from threads; on 2 busy shared cores, 2 threads ran ~10x slower than 1."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Env:
    """Where a test module runs stages (tests/stage_helpers.py): a file:// store and a sqlite MLflow of its own."""
    from swerl.storage import Store
    from swerl.tracking import Tracker
    from tests.stage_helpers import Env

    root = tmp_path_factory.mktemp("stages")
    return Env(Store(f"file://{root}/store"), Tracker(f"sqlite:///{root}/mlflow.db", "stages-test"))


@pytest.fixture(scope="session")
def tiny_models(_session_dir: Path) -> TinyModels:
    """Tiny Qwen3 models and their tokenizers (tests/tiny_models.py), each made once per session and shared."""
    from tests.tiny_models import TinyModels

    return TinyModels(_session_dir / "tiny-models")


@pytest.fixture(scope="module")
def micro_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Micro repositories materialize under the test session's folder, never the user's ~/.cache."""
    cache = tmp_path_factory.getbasetemp() / "swerl-cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SWERL_CACHE_DIR", str(cache))
        yield cache
