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
SECRET_KEY_PATTERN = re.compile(r"(secret|password|passwd|api[_-]?key|access[_-]?key|credential|(^|[._-])token$)", re.I)
MLFLOW_PARAM_VALUE_MAX = 6000

# MLflow 3 opens an experiment without this tag in its GenAI view (runs listed as "Evaluations"); this value is the
# one its UI calls "Machine learning": runs, charts and the compare view of a training experiment.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
KIND_TAG = "swerl.kind"  # pipeline | stage | eval
CONFIG_HASH_TAG = "swerl.config_hash"
RESUMES_TAG = "swerl.resumes"  # how many times a later process continued this run
GIT_COMMIT_TAG = "mlflow.source.git.commit"
GIT_DIRTY_TAG = "swerl.git.dirty"
GIT_TIMEOUT_S = 10.0

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

    def log_params(self, params: Mapping[str, Any], record_changes: bool = True) -> None:
        """Log params; on a continued run, those already logged are kept (MLflow params never change) and a
        changed value is recorded as a `swerl.param_changed.KEY` tag instead (unless not `record_changes`: values
        measured at each start, such as the machine's free memory)."""
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        fresh = {k: v for k, v in safe_params(params).items() if k not in existing}
        changed = {
            f"swerl.param_changed.{k}": v for k, v in safe_params(params).items() if k in existing and existing[k] != v
        }
        if changed and record_changes:
            self.set_tags(changed)
        items = [Param(k, v) for k, v in fresh.items()]
        for i in range(0, len(items), 100):  # MLflow accepts at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step or 0) for k, v in metrics.items()]
        for i in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[i : i + 1000])

    def log_image(self, png: bytes, artifact_file: str) -> None:
        """A PNG as a run artifact (under plots/ by convention), shown inline by MLflow's artifact view."""
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(artifact_file).name
            path.write_bytes(png)
            parent = str(Path(artifact_file).parent)
            self.client.log_artifact(self.run_id, str(path), None if parent == "." else parent)

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
            kind = (found.tags if found is not None else {}).get(EXPERIMENT_KIND_TAG, "")
            if kind in ("", "no_inferred_type") or kind.endswith("_inferred"):
                self.client.set_experiment_tag(self.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
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
                run_id,
                tags.get("mlflow.runName", "?"),
                owner["pid"],
                owner["host"],
            )
            killed.append(run_id)
        return killed

    def find_run(
        self, tags: Mapping[str, str], parent: StageRun | None = None, statuses: tuple[str, ...] = ()
    ) -> str | None:
        """The newest run of this experiment with these tags (and this parent), not RUNNING, in `statuses` when
        given; None when there is none. A run still RUNNING belongs to a live process and is never continued; one
        whose owner died (SIGKILL) is marked KILLED first, and so continued."""
        self.mark_dead_runs()
        clauses = [f"tags.`{k}` = '{v}'" for k, v in tags.items()]
        if parent is not None:
            clauses.append(f"tags.`mlflow.parentRunId` = '{parent.run_id}'")
        try:
            found = self.client.search_runs(
                [self.experiment_id],
                filter_string=" and ".join(clauses),
                order_by=["attributes.start_time DESC"],
                max_results=FIND_RUN_MAX_RESULTS,
            )
        except Exception as exc:  # noqa: BLE001 - then a new run starts, as before
            _log.warning("could not search MLflow at %s for a run to continue: %s", self.uri, exc)
            return None
        for run in found:
            status = run.info.status
            if status == "RUNNING" or (statuses and status not in statuses):
                continue
            return str(run.info.run_id)
        return None

    def _start(
        self, name: str, tags: Mapping[str, Any], parent: StageRun | None, resume: str | None = None
    ) -> StageRun:
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
        if resume is not None:
            previous = self.client.get_run(resume)
            resumes = int(previous.data.tags.get(RESUMES_TAG, "0") or 0) + 1
            self.client.update_run(resume, status="RUNNING")
            handle = StageRun(self.client, resume)
            handle.set_tags({**all_tags, RESUMES_TAG: resumes})
            _log.info("continuing MLflow run %s (%s), resume %d", resume, name, resumes)
            return handle
        run = self.client.create_run(self.experiment_id, tags=all_tags, run_name=name)
        return StageRun(self.client, run.info.run_id)

    @contextmanager
    def run(
        self,
        name: str,
        tags: Mapping[str, Any] | None = None,
        parent: StageRun | None = None,
        *,
        resume: str | None = None,
        system_metrics: float | None = None,
    ) -> Iterator[StageRun]:
        """A run that ends FINISHED, or FAILED if the body raises (and KILLED on KeyboardInterrupt).

        resume: the id of an ended run to continue (find_run) instead of creating one; its metrics go on at the
        steps the body logs. system_metrics: seconds between samples of CPU, memory, disk, network (and GPU) into
        the run while the body runs (MLflow's `system/*` metrics; config tracking.system_metrics_interval_s); None:
        none.
        """
        handle = self._start(name, tags or {}, parent, resume)
        monitor = _system_monitor(handle.run_id, self.uri, system_metrics) if system_metrics else None
        status = "FAILED"
        try:
            yield handle
            status = "FINISHED"
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            if monitor is not None:
                try:
                    monitor.finish()
                except Exception as exc:  # noqa: BLE001 - metrics of the machine must never fail a run
                    _log.warning("MLflow system metrics of run %s: %s", handle.run_id, exc)
            self.client.set_terminated(handle.run_id, status=status)


FIND_RUN_MAX_RESULTS = 20


def _system_monitor(run_id: str, uri: str, interval_s: float) -> Any:
    """MLflow's system metrics monitor on `run_id`, started; None (and a warning) where it cannot run."""
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, resume_logging=True, tracking_uri=uri)
        monitor.start()
        return monitor
    except Exception as exc:  # noqa: BLE001 - e.g. psutil missing
        _log.warning("MLflow system metrics unavailable for run %s: %s", run_id, exc)
        return None


def git_tags(path: Path | None = None) -> dict[str, str]:
    """The commit of the swerl checkout running (MLflow's source tag) and whether it has local changes; {} when it
    is not a git checkout (an installed wheel)."""
    import subprocess

    where = str(path or Path(__file__).resolve().parent)
    try:
        commit = subprocess.run(
            ["git", "-C", where, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", where, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {GIT_COMMIT_TAG: commit, GIT_DIRTY_TAG: "true" if dirty else "false"} if commit else {}


MLFLOW_UI_MODE_QUERY = "workflowType=machine_learning"
"""MLflow 3.17's UI picks GenAI or "Model training" per browser (this query parameter, else localStorage
`mlflow.workflowType`, GenAI by default), whatever the experiment's kind tag: swerl's links carry it (checked in
headless Chromium: without it the experiment opens on the GenAI overview, with it on its runs)."""


def run_url(uri: str, experiment_id: str, run_id: str) -> str | None:
    """The MLflow UI's page of a run, in its model-training mode, when the tracking URI is a server (http/https);
    None for a local store."""
    if not uri.startswith(("http://", "https://")):
        return None
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{MLFLOW_UI_MODE_QUERY}"


_TRACKERS: dict[tuple[str, str], Tracker] = {}
_TRACKERS_LOCK = threading.Lock()


def get_tracker(uri: str, experiment: str) -> Tracker:
    """A Tracker shared per (store, experiment) in this process.

    Opening a sqlite store imports MLflow and checks the schema (seconds on 2 cores); a second caller (another
    thread of the flow) waits on the lock. Never opened on a thread while Prefect starts: see cli.cmd_run.
    """
    key = (_prepare_uri(uri), experiment)
    with _TRACKERS_LOCK:
        if key not in _TRACKERS:
            _TRACKERS[key] = Tracker(uri, experiment)
        return _TRACKERS[key]


DATASET_CONTEXT_TAG = "mlflow.data.context"  # MLflow's input tag: training | evaluation


def dataset_input(name: str, uri: str, digest: str, context: str) -> Any:
    """An MLflow dataset input for a stored artifact (by URI and content hash; nothing is read or copied)."""
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.http_dataset_source import HTTPDatasetSource
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "can be interpreted in multiple ways": all local sources agree
            source = resolve_dataset_source(uri)
    except Exception:  # noqa: BLE001 - an unknown scheme: record the URI as it is
        source = HTTPDatasetSource(uri)
    dataset = MetaDataset(source, name=name, digest=digest[:36])  # type: ignore[abstract]
    return DatasetInput(dataset._to_mlflow_entity(), tags=[InputTag(DATASET_CONTEXT_TAG, context)])


def log_dataset_inputs(run: StageRun, datasets: list[tuple[str, str, str, str]]) -> None:
    """Log (name, uri, sha256, context) records as the run's dataset inputs; a failure is only logged."""
    if not datasets:
        return
    try:
        run.client.log_inputs(run.run_id, datasets=[dataset_input(*d) for d in datasets])
    except Exception as exc:  # noqa: BLE001 - lineage must never fail a stage
        _log.warning("could not log dataset inputs of MLflow run %s: %s", run.run_id, exc)
