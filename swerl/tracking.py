"""MLflow tracking: one parent run per pipeline run, one nested run per stage.

Uses MlflowClient with explicit run ids (no fluent global state), so stages running in worker threads or under
Prefect's task engine log to the right run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from swerl.errors import InfraError

# Keys that look like secrets never go to MLflow, whatever their value. "token" counts only as a whole last word
# (hf_token, github.token): caps such as max_tokens or trajectory_token_cap and a tokenizer must still be logged.
SECRET_KEY_PATTERN = re.compile(
    r"(secret|password|passwd|api[_-]?key|access[_-]?key|credential|(^|[._-])token$)", re.I
)
MLFLOW_PARAM_VALUE_MAX = 6000

OWNER_PID_TAG = "swerl.owner.pid"
OWNER_HOST_TAG = "swerl.owner.host"
OWNER_START_TAG = "swerl.owner.start"

_log = logging.getLogger("swerl.tracking")


def _process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), so a reused pid is not taken for its owner."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""


def process_owner() -> dict[str, str]:
    """Who this process is: pid, host and start time (what a run or a workdir records as its owner)."""
    pid = os.getpid()
    return {"pid": str(pid), "host": socket.gethostname(), "start": _process_start(pid)}


def owner_is_dead(owner: Mapping[str, str]) -> bool:
    """True when the recorded owner is a process of this host that no longer runs (unknown hosts: False)."""
    if owner.get("host") != socket.gethostname():
        return False
    try:
        pid = int(owner.get("pid", ""))
    except ValueError:
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    start = owner.get("start", "")
    return bool(start) and _process_start(pid) not in ("", start)


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings into dotted keys (lists become JSON strings)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, dotted + "."))
        elif isinstance(value, list | tuple):
            out[dotted] = json.dumps(value, sort_keys=True, default=str)
        else:
            out[dotted] = value
    return out


def safe_params(params: Mapping[str, Any]) -> dict[str, str]:
    """Params fit for MLflow: flattened, secret-looking keys dropped, values truncated to MLflow's limit."""
    flat = flatten(params)
    return {k: str(v)[:MLFLOW_PARAM_VALUE_MAX] for k, v in flat.items() if not SECRET_KEY_PATTERN.search(k)}


def _prepare_uri(uri: str) -> str:
    # A relative sqlite path is resolved against the working directory; create its folder.
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        path = Path(uri[len("sqlite:///") :]).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{path}"
    return uri


class StageRun:
    """A handle on one MLflow run for logging params, metrics, dicts and files."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client = client
        self.run_id = run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in safe_params(params).items()]
        for i in range(0, len(items), 100):  # MLflow accepts at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step or 0) for k, v in metrics.items()]
        for i in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[i : i + 1000])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        self.client.log_dict(self.run_id, obj, artifact_file)

    def log_text(self, text: str, artifact_file: str) -> None:
        self.client.log_text(self.run_id, text, artifact_file)

    def log_file(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)


class Tracker:
    """Creates the parent run of a pipeline run and nested runs for its stages."""

    def __init__(self, uri: str, experiment: str) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = _prepare_uri(uri)
        # Artifacts of a sqlite-backed store go next to the database, not into the working directory.
        self._artifact_root: str | None = None
        if self.uri.startswith("sqlite:///"):
            db = Path(self.uri[len("sqlite:///") :])
            self._artifact_root = (db.parent / "mlflow-artifacts").resolve().as_uri()
        try:
            self.client = MlflowClient(tracking_uri=self.uri)
            found = self.client.get_experiment_by_name(experiment)
            self.experiment_id = (
                found.experiment_id
                if found is not None
                else self.client.create_experiment(experiment, artifact_location=self._artifact_root)
            )
        except Exception as exc:  # noqa: BLE001 - an unreachable tracking server is infrastructure
            raise InfraError("storage", f"MLflow at {self.uri} unavailable: {exc}") from exc

    def mark_dead_runs(self) -> list[str]:
        """Mark KILLED this experiment's runs left RUNNING by a process of this host that is gone; their ids.

        Each run records its owner (pid, host, process start time) in tags; a run whose owner no longer runs was
        killed (SIGKILL, power loss) before it could end itself. Runs of other hosts, or without owner tags, are
        left alone: nothing here can tell whether they still run.
        """
        try:
            runs = self.client.search_runs(
                [self.experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=1000
            )
        except Exception as exc:  # noqa: BLE001 - a failed clean-up must not stop a run from starting
            _log.warning("could not look for runs left RUNNING in MLflow at %s: %s", self.uri, exc)
            return []
        killed = []
        for found in runs:
            tags = found.data.tags
            owner = {
                "pid": tags.get(OWNER_PID_TAG, ""),
                "host": tags.get(OWNER_HOST_TAG, ""),
                "start": tags.get(OWNER_START_TAG, ""),
            }
            if not owner["pid"] or not owner_is_dead(owner):
                continue
            run_id = found.info.run_id
            try:
                self.client.set_tag(run_id, "swerl.killed", "owner process gone; marked by a later run")
                self.client.set_terminated(run_id, status="KILLED")
            except Exception as exc:  # noqa: BLE001
                _log.warning("could not mark MLflow run %s KILLED: %s", run_id, exc)
                continue
            _log.warning(
                "MLflow run %s (%s) was left RUNNING by process %s on %s, which is gone: marked KILLED",
                run_id, tags.get("mlflow.runName", "?"), owner["pid"], owner["host"],
            )  # fmt: skip
            killed.append(run_id)
        return killed

    def _start(self, name: str, tags: Mapping[str, Any], parent: StageRun | None) -> StageRun:
        self.mark_dead_runs()
        owner = process_owner()
        all_tags = {
            "mlflow.runName": name,
            OWNER_PID_TAG: owner["pid"],
            OWNER_HOST_TAG: owner["host"],
            OWNER_START_TAG: owner["start"],
            **{k: str(v) for k, v in tags.items()},
        }
        if parent is not None:
            all_tags["mlflow.parentRunId"] = parent.run_id
        run = self.client.create_run(self.experiment_id, tags=all_tags, run_name=name)
        return StageRun(self.client, run.info.run_id)

    @contextmanager
    def run(
        self, name: str, tags: Mapping[str, Any] | None = None, parent: StageRun | None = None
    ) -> Iterator[StageRun]:
        """A run that ends FINISHED, or FAILED if the body raises (and KILLED on KeyboardInterrupt)."""
        handle = self._start(name, tags or {}, parent)
        status = "FAILED"
        try:
            yield handle
            status = "FINISHED"
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            self.client.set_terminated(handle.run_id, status=status)


_TRACKERS: dict[tuple[str, str], Tracker] = {}
_TRACKERS_LOCK = threading.Lock()


def get_tracker(uri: str, experiment: str) -> Tracker:
    """A Tracker shared per (store, experiment) in this process.

    Opening a sqlite store imports MLflow and checks the schema (seconds on 2 cores); `swerl run` does it on a
    thread while Prefect starts, and the flow then finds it ready (a second caller waits on the lock).
    """
    key = (_prepare_uri(uri), experiment)
    with _TRACKERS_LOCK:
        if key not in _TRACKERS:
            _TRACKERS[key] = Tracker(uri, experiment)
        return _TRACKERS[key]
