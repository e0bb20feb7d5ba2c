"""The evaluate stage's journal: every finished attempt written to the store as it finishes, so that a rerun after a
crash runs only the attempts that are missing.

The journal lives under the stage key (`stages/evaluate/KEY/eval_journal/MODEL/`; a forced run's in its force
epoch's folder, StageContext.durable), so the key already ties it to the stage's config (evaluate, agent, engine:
sampling, grader, limits), its inputs' fingerprints (the checkpoints' sha256s) and the run seed. Each entry also
carries an identity digest of (model, its source manifest's fingerprint, the stage config hash, the seed) and its
task id and attempt index; an entry whose identity differs (a journal written under another config, or copied from
elsewhere) is never reused: it is ignored, logged and rerun.

One entry per attempt, `TASKDIGEST-aATTEMPT.json`, holding the final trajectory (after its infrastructure retries),
its swebench grade (none with the episode grader), the infrastructure errors its retries met, and the stage attempt
that ran it. Entries are written atomically (Store.write_bytes); one that does not parse anyway (truncated by a
crash of a non-atomic copy, a full disk) is skipped with a warning and its attempt runs again. An attempt that ended
in an infrastructure error after its retries is not journaled: a rerun tries it again, the infrastructure may have
recovered.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from swerl.storage import CorruptStoreFile, Store
from swerl.trajectory import EpisodeStatus, Trajectory

_log = logging.getLogger("swerl.evaluate.journal")

JOURNAL_FOLDER = "eval_journal"
"""The journal's folder under the stage key's durable folder (StageContext.durable)."""


def identity_digest(identity: dict[str, Any]) -> str:
    """sha256 of an identity (canonical JSON): what an entry must match to be reused."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class JournaledAttempt:
    """One finished attempt: its final trajectory, its grade (swebench grader), the infrastructure errors its
    retries met (counts by `infra_error.CAUSE`), and the stage attempt (its folder name) that ran it."""

    task_id: str
    attempt: int
    trajectory: Trajectory
    grade: dict[str, Any] | None
    failures: dict[str, int]
    ran_by: str
    identity: str

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "identity": self.identity,
                "task_id": self.task_id,
                "attempt": self.attempt,
                "ran_by": self.ran_by,
                "failures": self.failures,
                "grade": self.grade,
                "trajectory": self.trajectory.model_dump(mode="json"),
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> JournaledAttempt:
        body = json.loads(data)
        return cls(
            task_id=str(body["task_id"]),
            attempt=int(body["attempt"]),
            trajectory=Trajectory.model_validate(body["trajectory"]),
            grade=body["grade"],
            failures={str(k): int(v) for k, v in body["failures"].items()},
            ran_by=str(body["ran_by"]),
            identity=str(body["identity"]),
        )


@dataclass
class JournalRead:
    """What a journal held for one model: the reusable attempts by (task, attempt), and what was passed over."""

    attempts: dict[tuple[str, int], JournaledAttempt] = field(default_factory=dict)
    damaged: list[str] = field(default_factory=list)
    """URIs of entries that did not parse (their attempts run again)."""
    foreign: list[str] = field(default_factory=list)
    """URIs of entries written under another identity or for a task/attempt not asked for (never reused)."""


class EvalJournal:
    """One model's finished attempts in the store under `prefix`, tagged with `identity` (see the module)."""

    def __init__(self, store: Store, prefix: str, identity: dict[str, Any], ran_by: str) -> None:
        self.store = store
        self.prefix = prefix.strip("/")
        self.identity = identity_digest(identity)
        self.ran_by = ran_by
        self.reused = 0
        """Attempts the last load found reusable."""
        self.written = 0
        """Attempts this journal object wrote."""

    def entry_path(self, task_id: str, attempt: int) -> str:
        """The store path of one attempt's entry (task ids are hashed: they may hold any character)."""
        digest = hashlib.sha256(task_id.encode()).hexdigest()[:24]
        return f"{self.prefix}/{digest}-a{attempt:05d}.json"

    def record(
        self, task_id: str, attempt: int, trajectory: Trajectory, grade: dict[str, Any] | None, failures: dict[str, int]
    ) -> bool:
        """Write one finished attempt (atomically; blocking I/O, run it off the event loop). An attempt lost to the
        infrastructure is not written (a rerun tries it again): returns whether it was written."""
        if trajectory.status is EpisodeStatus.INFRA_ERROR:
            return False
        entry = JournaledAttempt(task_id, attempt, trajectory, grade, dict(failures), self.ran_by, self.identity)
        self.store.write_bytes(self.entry_path(task_id, attempt), entry.to_json())
        self.written += 1
        return True

    def load(self, wanted: list[tuple[str, int]]) -> JournalRead:
        """The journaled attempts among `wanted` (task id, attempt index) that this identity may reuse."""
        read = JournalRead()
        paths = {self.entry_path(task, attempt): (task, attempt) for task, attempt in wanted}
        for rel in self.store.list(self.prefix):
            if not rel.endswith(".json"):
                continue
            try:
                entry = self.store.read_parsed(rel, JournaledAttempt.from_json, "evaluation journal entry")
            except CorruptStoreFile as exc:
                read.damaged.append(exc.uri)
                _log.warning("%s: skipped, its attempt runs again", exc)
                continue
            if entry.identity != self.identity or paths.get(rel) != (entry.task_id, entry.attempt):
                read.foreign.append(self.store.uri(rel))
                continue
            read.attempts[(entry.task_id, entry.attempt)] = entry
        self.reused = len(read.attempts)
        if read.foreign:
            _log.warning(
                "evaluation journal %s: %d entries written under another identity (model, checkpoint, config, seed) "
                "or for attempts not asked for: not reused, e.g. %s",
                self.store.uri(self.prefix),
                len(read.foreign),
                read.foreign[0],
            )
        return read
