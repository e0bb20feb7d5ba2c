"""Checkpointed stages: a stage is done when its manifest exists.

A stage is a plain function `fn(stage_config, ctx) -> StageResult`. `run_stage` computes the stage's key from its
config hash, the fingerprints of its input manifests and the run seed; if `stages/NAME/KEY/manifest.json` exists
the stage is skipped. Otherwise it runs in a fresh attempt folder `stages/NAME/KEY/ATTEMPT/`, so a failed or forced
rerun never overwrites the artifacts a published manifest points to, and the manifest is written last, atomically. A
failed stage leaves no manifest, and the next run resumes there.

Manifests record store-relative paths (artifacts, inputs, their own), so a store copied or synced elsewhere is
reused as it is; `load_manifest` resolves them against the store it reads from. A damaged manifest (truncated,
not a manifest) means the stage is not done: it is logged and the stage reruns.

State that outlives an attempt (training checkpoints, GRPO's rollout journal) lives under the key, not the
attempt: in `stages/NAME/KEY/` for the key's first line of attempts, so that a crashed stage resumes there. A forced
run opens a new *force epoch* (its attempt id, recorded in `stages/NAME/KEY/force_epoch.json` before it starts) and
keeps that state in `stages/NAME/KEY/forced/EPOCH/` instead: it starts from its inputs, never from what earlier
attempts left, and never touches it (a published result may reference it). Until an attempt of that epoch publishes,
the stage counts as not done even though the older manifest is still there (and still readable): the next run,
forced or not, is no skip, and without `--force` it resumes the forced attempt from its own checkpoints.

Each attempt's scratch workdir lives under `WORK_ROOT` beside an owner file (pid, host, process start); the next
run of the same stage removes the workdirs of owners that are gone (a killed stage), never a live one's.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from swerl.config.load import config_hash
from swerl.config.run import StorageConfig
from swerl.errors import InfraError
from swerl.storage import Artifact, CorruptStoreFile, Store
from swerl.tracking import (
    CONFIG_HASH_TAG,
    KIND_TAG,
    StageRun,
    Tracker,
    git_tags,
    log_dataset_inputs,
    owner_is_dead,
    process_owner,
)

MANIFEST_VERSION = 1


class ArtifactRecord(BaseModel):
    name: str
    uri: str
    sha256: str
    size: int


class InputRef(BaseModel):
    stage: str
    key: str
    fingerprint: str
    uri: str


class Manifest(BaseModel):
    """What a stage wrote: artifacts with hashes, its config hash, its inputs, its MLflow run, its timings."""

    # A metric may be NaN (a held-out pass@1 with every task missing, a resumed SFT with no step left): written
    # as NaN, not null, so that the manifest reads back (a null would fail the float check and the stage could
    # never be skipped again).
    model_config = ConfigDict(ser_json_inf_nan="constants")

    version: int = MANIFEST_VERSION
    stage: str
    key: str
    attempt: str
    config_hash: str
    inputs: list[InputRef] = Field(default_factory=list)
    artifacts: dict[str, ArtifactRecord] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    mlflow_run_id: str | None = None
    started_at: str
    finished_at: str
    duration_s: float
    uri: str = ""
    force_epoch: str = ""
    """The force epoch the publishing attempt ran in ("": the key's first line of attempts, never forced)."""

    @property
    def fingerprint(self) -> str:
        """Identity of the stage's output: its key and the content hashes of what it wrote."""
        body = json.dumps(
            {
                "stage": self.stage,
                "key": self.key,
                "artifacts": {k: a.sha256 for k, a in self.artifacts.items()},
            },
            sort_keys=True,
        )
        return hashlib.sha256(body.encode()).hexdigest()

    def artifact(self, name: str) -> ArtifactRecord:
        if name not in self.artifacts:
            raise KeyError(f"stage {self.stage} manifest has no artifact {name!r}; has {sorted(self.artifacts)}")
        return self.artifacts[name]

    def as_input(self) -> InputRef:
        return InputRef(stage=self.stage, key=self.key, fingerprint=self.fingerprint, uri=self.uri)


@dataclass
class StageResult:
    """What a stage function returns besides its artifacts (which it writes through the context)."""

    metrics: dict[str, float] = field(default_factory=dict)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    markdown: dict[str, str] = field(default_factory=dict)
    summary: str = ""
    images: dict[str, bytes] = field(default_factory=dict)
    """Plots as PNG bytes by title (e.g. "reward"): logged to the stage's MLflow run under plots/TITLE.png and
    published by the Prefect task as an image artifact."""


ProgressFn = Callable[[float, str], None]
"""progress(fraction done in [0, 1], a short note): how a long stage reports where it is (a Prefect progress
artifact when run by a flow); never raises into the stage."""


@dataclass
class StageContext:
    """Everything a stage function may touch: its output folder in the store, scratch space, tracking."""

    stage: str
    store: Store
    prefix: str
    workdir: Path
    inputs: dict[str, Manifest]
    run: StageRun
    log: logging.Logger
    seed: int = 0
    artifacts: dict[str, Artifact] = field(default_factory=dict)
    progress_fn: ProgressFn | None = None
    registered_model: str | None = None
    """The MLflow registered model a model-producing stage (sft, grpo) adds a version to; None: log, not register."""
    durable_prefix: str = ""
    """Where state that outlives the attempt goes (checkpoints, journals): `stages/NAME/KEY`, or a forced run's
    `stages/NAME/KEY/forced/EPOCH` (durable_root); "": the attempt folder's parent."""

    def durable(self, name: str) -> str:
        """The store folder `name` (checkpoints, rollouts) of the state that outlives this attempt."""
        return f"{self.durable_prefix or self.prefix.rsplit('/', 1)[0]}/{name}"

    def log_model(self, local_dir: Path, artifact: str = "model") -> dict[str, str]:
        """Log a saved checkpoint (published as `artifact`) as this stage run's MLflow model, with its signature,
        and register it (swerl.model_logging); a failure is only logged."""
        from swerl.model_logging import log_and_register

        experiment_id = self.run.client.get_run(self.run.run_id).info.experiment_id
        uri = self.store.uri(f"{self.prefix}/{artifact}")
        return log_and_register(
            self.run, experiment_id, local_dir, stage=self.stage, checkpoint_uri=uri, registered=self.registered_model
        )

    def progress(self, done: float, total: float, note: str = "") -> None:
        """Report `done` of `total` (steps, models, tasks) to whoever watches the stage; errors only logged."""
        if self.progress_fn is None or total <= 0:
            return
        try:
            self.progress_fn(min(1.0, max(0.0, done / total)), note)
        except Exception as exc:  # noqa: BLE001 - a progress display must never fail a stage
            self.log.warning("stage %s: could not report progress: %s", self.stage, exc)

    def write_artifact(self, name: str, data: bytes) -> Artifact:
        art = self.store.write_bytes(f"{self.prefix}/{name}", data, name=name)
        self.artifacts[name] = art
        return art

    def put_artifact(self, name: str, local: Path) -> Artifact:
        art = self.store.put_file(local, f"{self.prefix}/{name}", name=name)
        self.artifacts[name] = art
        return art

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.run.log_metrics(metrics, step=step)

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.run.log_params(params)


@dataclass
class StageOutcome:
    manifest: Manifest
    skipped: bool
    result: StageResult | None = None


def stage_key(stage: str, cfg: BaseModel, inputs: list[Manifest], seed: int = 0, content: str = "") -> str:
    """Checkpoint key: the stage's config hash, its inputs' fingerprints and the run seed (stages derive theirs),
    and `content`, a fingerprint of what the stage reads from outside the store (curate: the repositories'
    contents, curate.content_key); an empty one leaves the key as it was without it."""
    fields: dict[str, Any] = {
        "stage": stage,
        "config": config_hash(cfg),
        "inputs": [m.fingerprint for m in inputs],
        "seed": seed,
    }
    if content:
        fields["content"] = content
    body = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:20]


def manifest_path(stage: str, key: str) -> str:
    return f"stages/{stage}/{key}/manifest.json"


FORCE_EPOCH_FILE = "force_epoch.json"


class ForceEpoch(BaseModel):
    """`stages/NAME/KEY/force_epoch.json`: the newest forced run of the key (written before it starts)."""

    epoch: str
    """The forced attempt's id: its durable state is under durable_root(stage, key, epoch)."""
    forced_at: str
    previous: str = ""
    """The epoch it replaced ("": the key's first line of attempts)."""


def force_epoch_path(stage: str, key: str) -> str:
    return f"stages/{stage}/{key}/{FORCE_EPOCH_FILE}"


def durable_root(stage: str, key: str, epoch: str = "") -> str:
    """The store folder of a stage key's state that outlives attempts: the key's own folder, or a force epoch's."""
    return f"stages/{stage}/{key}/forced/{epoch}" if epoch else f"stages/{stage}/{key}"


def _exists_through_outage(store: Store, rel: str, waits: Sequence[float] | None) -> bool:
    """store.exists(rel), tried again after each of `waits` (s) while the store is unreachable (InfraError storage):
    a stage restarted during a storage outage of a few seconds (an S3 server restarting) waits for it instead of
    dying at its start. None: storage.start_outage_* defaults."""
    waits = StorageConfig().start_outage_waits() if waits is None else waits
    for wait in (*waits, None):
        try:
            return store.exists(rel)
        except InfraError as exc:
            if exc.cause != "storage" or wait is None:
                raise
            logging.getLogger("swerl.stages").warning(
                "store unreachable at the stage's start (%s): trying again in %.1f s", exc, wait
            )
            time.sleep(wait)
    raise AssertionError("unreachable")


def read_force_epoch(
    store: Store, stage: str, key: str, outage_waits: Sequence[float] | None = None
) -> ForceEpoch | None:
    """The key's newest force epoch; None when the key was never forced. A damaged record raises CorruptStoreFile
    (which attempts' checkpoints to resume from is then unknown: `--force STAGE` starts afresh). outage_waits: the
    waits (s) of the first read through a storage outage (StorageConfig.start_outage_waits; None: its defaults)."""
    rel = force_epoch_path(stage, key)
    if not _exists_through_outage(store, rel, outage_waits):
        return None
    try:
        return store.read_parsed(rel, ForceEpoch.model_validate_json, "force epoch record")
    except CorruptStoreFile as exc:
        raise CorruptStoreFile(exc.uri, f"{exc.reason}; rerun with --force {stage} to start it afresh") from exc


def _rebase(store: Store, uri: str) -> str:
    """A URI recorded in a manifest, as a full URI of `store`.

    Store-relative paths (what manifests record now) resolve against the store; an absolute URI inside the store
    is kept; an absolute URI of a store since moved (an older manifest in a copied store) is rebased by its
    `stages/...` part when that is present.
    """
    if "://" not in uri:
        return store.uri(uri)
    try:
        store.rel_of(uri)
        return uri
    except ValueError:
        pass
    marker = uri.find("/stages/")
    return store.uri(uri[marker + 1 :]) if marker >= 0 else uri


def manifest_bytes(store: Store, manifest: Manifest) -> bytes:
    """A manifest as stored: its URIs relative to the store root."""
    body = manifest.model_copy(deep=True)
    body.uri = store.relative(body.uri)
    for record in body.artifacts.values():
        record.uri = store.relative(record.uri)
    for ref in body.inputs:
        ref.uri = store.relative(ref.uri)
    return body.model_dump_json(indent=2).encode()


def read_manifest(store: Store, rel: str) -> Manifest:
    """Read a stored manifest, its URIs resolved against `store`; CorruptStoreFile (naming it) if damaged."""
    manifest = store.read_parsed(rel, Manifest.model_validate_json, "stage manifest")
    manifest.uri = _rebase(store, manifest.uri) if manifest.uri else store.uri(rel)
    for record in manifest.artifacts.values():
        record.uri = _rebase(store, record.uri)
    for ref in manifest.inputs:
        ref.uri = _rebase(store, ref.uri)
    return manifest


def load_manifest(store: Store, stage: str, key: str, log: logging.Logger | None = None) -> Manifest | None:
    """The stage's manifest, or None when it is absent or damaged (then the stage is not done and reruns)."""
    rel = manifest_path(stage, key)
    if not store.exists(rel):
        return None
    try:
        return read_manifest(store, rel)
    except CorruptStoreFile as exc:
        (log or logging.getLogger(f"swerl.{stage}")).warning(
            "stage %s: %s; the stage counts as not done and reruns", stage, exc
        )
        return None


def damaged_artifacts(store: Store, manifest: Manifest) -> list[str]:
    """A published manifest's artifacts that are missing or not the size it records ("URI: what"). Sizes only: a
    store read per artifact, no download; the sha256 is checked by the stage that reads the artifact (read_input,
    get_dir), once, as it reads it."""
    found = []
    for record in manifest.artifacts.values():
        size = store.size(store.rel_of(record.uri))
        if size != record.size:
            what = "missing" if size is None else f"{size} bytes where the manifest records {record.size}"
            found.append(f"{record.uri}: {what}")
    return found


WORK_ROOT = Path(tempfile.gettempdir()) / "swerl-work"
"""Where stages' scratch workdirs live (one per attempt, with an owner file beside it)."""


def _owner_file(workdir: Path) -> Path:
    return workdir.with_name(workdir.name + ".owner")


def _make_workdir(stage: str, key: str, attempt: str) -> Path:
    WORK_ROOT.mkdir(parents=True, exist_ok=True)
    workdir = WORK_ROOT / f"{stage}-{key}-{attempt}"
    owner = _owner_file(workdir)
    tmp = owner.with_name(owner.name + f".tmp-{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps({**process_owner(), "stage": stage}))
    os.replace(tmp, owner)  # the owner file exists before its workdir does
    workdir.mkdir()
    return workdir


def _remove_workdir(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)
    _owner_file(workdir).unlink(missing_ok=True)


def remove_dead_workdirs(stage: str, log: logging.Logger | None = None) -> list[Path]:
    """Remove this stage's workdirs whose owning process is gone (killed); a live owner's are kept."""
    removed: list[Path] = []
    if not WORK_ROOT.is_dir():
        return removed
    for owner_path in sorted(WORK_ROOT.glob(f"{stage}-*.owner")):
        try:
            owner = json.loads(owner_path.read_text())
        except (OSError, ValueError):
            continue  # being written, or unreadable: not ours to judge
        if not isinstance(owner, dict) or owner.get("stage") != stage or not owner_is_dead(owner):
            continue
        workdir = owner_path.with_name(owner_path.name[: -len(".owner")])
        _remove_workdir(workdir)
        removed.append(workdir)
        (log or logging.getLogger(f"swerl.{stage}")).warning(
            "stage %s: removed workdir %s left by process %s, which is gone (a killed run)",
            stage,
            workdir,
            owner.get("pid"),
        )
    return removed


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


StageFn = Callable[[Any, StageContext], StageResult]
PLOTS_DIR = "plots"
"""Where a stage's plots go in its MLflow run's artifacts."""
RESUMABLE_STATUSES = ("FAILED", "KILLED")
"""A stage attempt's MLflow run that ended so is continued by the next attempt of the same key and force epoch
under the same parent (one run, one curve across resumes); a FINISHED one is not, and a forced run never continues
one."""
FORCED_TAG = "swerl.forced"
"""On a forced attempt's MLflow run ("true"); an attempt that resumes it continues that run, tag and all."""
FORCE_EPOCH_TAG = "swerl.force_epoch"
"""The force epoch of a stage run's attempts (absent: the key's first line of attempts, never forced)."""


def _publish(
    ctx: StageContext,
    cfg: BaseModel,
    key: str,
    attempt: str,
    inputs: list[Manifest],
    result: StageResult,
    started: str,
    duration: float,
    force_epoch: str = "",
) -> Manifest:
    """Record a finished attempt: its metrics and report to MLflow, then its manifest to the store, last."""
    stage, store, run = ctx.stage, ctx.store, ctx.run
    manifest = Manifest(
        stage=stage,
        key=key,
        attempt=attempt,
        config_hash=config_hash(cfg),
        inputs=[m.as_input() for m in inputs],
        artifacts={n: ArtifactRecord(**a.to_dict()) for n, a in ctx.artifacts.items()},
        metrics=result.metrics,
        mlflow_run_id=run.run_id,
        started_at=started,
        finished_at=_now(),
        duration_s=round(duration, 3),
        uri=store.uri(manifest_path(stage, key)),
        force_epoch=force_epoch,
    )
    run.log_metrics({**result.metrics, "stage_duration_s": duration})
    run.log_dict(manifest.model_dump(mode="json"), "manifest.json")
    for title, text in result.markdown.items():
        run.log_text(text, f"{title}.md")
    for title, png in result.images.items():
        run.log_image(png, f"{PLOTS_DIR}/{title}.png")
    # Written last: the stage counts as done only once this object exists.
    store.write_bytes(manifest_path(stage, key), manifest_bytes(store, manifest))
    return manifest


def run_stage(
    stage: str,
    fn: StageFn,
    cfg: BaseModel,
    *,
    store: Store,
    tracker: Tracker,
    parent: StageRun | None,
    inputs: list[Manifest] | None = None,
    force: bool = False,
    seed: int = 0,
    log: logging.Logger | None = None,
    content: str = "",
    progress: ProgressFn | None = None,
    datasets: list[tuple[str, str, str, str]] | None = None,
    registered_model: str | None = None,
    outage_waits: Sequence[float] | None = None,
) -> StageOutcome:
    """Run a stage unless its manifest already exists (or `force`), recording it to the store and MLflow.

    A resumed attempt (same key, no manifest) continues the MLflow run of the attempt that failed or was killed
    under the same parent, so its per-step metrics continue the same curves. A forced run opens a new force epoch
    (see the module's doc): a new MLflow run tagged swerl.forced, and durable state (checkpoints) of its own, so it
    trains from its inputs; until that epoch publishes, a run without `force` resumes it instead of skipping the
    stage. datasets: (name, uri, sha256, context) of what the stage trains or evaluates on, logged as the run's
    MLflow dataset inputs. outage_waits: how the stage's first store read waits through a storage outage
    (StorageConfig.start_outage_waits; None: its defaults)."""
    # Over 60 lines: 25 are the signature and docstring; the body is one pass: skip or resume, run, publish.
    log = log or logging.getLogger(f"swerl.{stage}")
    inputs = inputs or []
    key = stage_key(stage, cfg, inputs, seed, content)
    attempt = datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]
    if force:
        epoch = _open_force_epoch(store, stage, key, attempt, log, outage_waits)
    else:
        done, epoch = _done_or_epoch(store, stage, key, log, outage_waits)
        if done is not None:
            return StageOutcome(manifest=done, skipped=True)

    prefix = f"stages/{stage}/{key}/{attempt}"
    started, t0 = _now(), time.monotonic()
    note = ", forced" if force else (f", force epoch {epoch}" if epoch else "")
    log.info("stage %s: running (key %s%s) -> %s", stage, key, note, store.uri(prefix))
    remove_dead_workdirs(stage, log)
    workdir = _make_workdir(stage, key, attempt)
    try:
        identity = {KIND_TAG: "stage", "swerl.stage": stage, "swerl.key": key}
        if epoch:
            identity[FORCE_EPOCH_TAG] = epoch
        resume = None if force else tracker.find_run(identity, parent, RESUMABLE_STATUSES)
        tags = {**identity, CONFIG_HASH_TAG: config_hash(cfg), **git_tags()}
        if force:
            tags[FORCED_TAG] = "true"
        with tracker.run(stage, tags=tags, parent=parent, resume=resume) as run:
            run.log_params(cfg.model_dump(mode="json", by_alias=True))
            log_dataset_inputs(run, datasets or [])
            ctx = StageContext(
                stage=stage,
                store=store,
                prefix=prefix,
                workdir=workdir,
                inputs={m.stage: m for m in inputs},
                run=run,
                log=log,
                seed=seed,
                progress_fn=progress,
                registered_model=registered_model,
                durable_prefix=durable_root(stage, key, epoch),
            )
            result = fn(cfg, ctx)
            manifest = _publish(ctx, cfg, key, attempt, inputs, result, started, time.monotonic() - t0, epoch)
    finally:
        _remove_workdir(workdir)
    log.info("stage %s: done in %.1fs (%s)", stage, manifest.duration_s, result.summary or "no summary")
    return StageOutcome(manifest=manifest, skipped=False, result=result)


def _done_or_epoch(
    store: Store, stage: str, key: str, log: logging.Logger, outage_waits: Sequence[float] | None
) -> tuple[Manifest | None, str]:
    """Without `force`: the published manifest when the stage is done (in the current force epoch), and the force
    epoch a run continues ("" where none was ever opened)."""
    current = read_force_epoch(store, stage, key, outage_waits)
    epoch = current.epoch if current is not None else ""
    existing = load_manifest(store, stage, key, log)
    if existing is not None and existing.force_epoch == epoch:
        damaged = damaged_artifacts(store, existing)
        if damaged:
            # Rerun rather than fail: the rerun writes a new attempt folder and replaces the manifest only once it
            # has finished (the damaged files are referenced by nothing after that), resuming from durable state.
            log.warning(
                "stage %s: published but its artifacts are damaged (%s); the stage reruns (key %s)",
                stage,
                "; ".join(damaged),
                key,
            )
            return None, epoch
        log.info("stage %s: skipped, already done (key %s, manifest %s)", stage, key, existing.uri)
        return existing, epoch
    if existing is not None:
        log.warning(
            "stage %s: the forced run of %s (force epoch %s) did not finish; resuming it (the published "
            "manifest %s stays until it does)",
            stage,
            current.forced_at if current else "?",
            epoch,
            existing.uri,
        )
    return None, epoch


def _open_force_epoch(
    store: Store, stage: str, key: str, attempt: str, log: logging.Logger, outage_waits: Sequence[float] | None
) -> str:
    """Record `attempt` as the key's new force epoch (before it writes anything) and return it."""
    try:
        previous = read_force_epoch(store, stage, key, outage_waits)
    except CorruptStoreFile as exc:
        log.warning("stage %s: %s; replaced by the new force epoch", stage, exc)
        previous = None
    record = ForceEpoch(epoch=attempt, forced_at=_now(), previous=previous.epoch if previous else "")
    store.write_bytes(force_epoch_path(stage, key), record.model_dump_json(indent=2).encode())
    log.info(
        "stage %s: forced: force epoch %s, durable state (checkpoints) in %s, none of earlier attempts' reused",
        stage,
        attempt,
        store.uri(durable_root(stage, key, attempt)),
    )
    return attempt
