"""Crash safety of asynchronous rollouts: every finished attempt is written to the store as it finishes, and the
trainer's checkpoint holds the ledger of the groups it consumed.

Groups are numbered by their data position `seq` (group seq runs task order[seq % len(order)]); a requeued
group keeps its seq and gets the next `generation`. The journal holds `g{seq}/r{generation}-a{attempt}.json`
per finished attempt (the trajectory with its start and finish times). After a crash, the newest checkpoint's
ledger says which groups the restored model has consumed (trained or discarded); every other group below the
highest seq in the journal is either complete (back to the buffer), partial (only its missing attempts rerun)
or absent (rerun). So nothing finished is lost and nothing is trained twice, whatever the timing of the crash.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swerl.rollout.curriculum import GroupPlan
from swerl.storage import CorruptStoreFile, Store
from swerl.trajectory import Trajectory

_log = logging.getLogger("swerl.journal")

LEDGER_FILE = "rollout_ledger.json"
_ATTEMPT_NAME = re.compile(r"^r(\d+)-a(\d+)\.json$")
_OUTCOME_NAME = re.compile(r"^outcome-r(\d+)\.json$")


@dataclass(frozen=True)
class FinishedAttempt:
    """One attempt's final trajectory (after infra retries) and when it ran (epoch seconds)."""

    seq: int
    generation: int
    trajectory: Trajectory
    started_at: float
    finished_at: float

    @property
    def duration_s(self) -> float:
        return self.finished_at - self.started_at

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "seq": self.seq,
                "generation": self.generation,
                "started_at": self.started_at,
                "finished_at": self.finished_at,
                "trajectory": self.trajectory.model_dump(mode="json"),
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> FinishedAttempt:
        body = json.loads(data)
        return cls(
            body["seq"],
            body["generation"],
            Trajectory.model_validate(body["trajectory"]),
            body["started_at"],
            body["finished_at"],
        )


@dataclass
class FinishedGroup:
    """All n attempts of one group (attempt order), or only its probe's when the probe stopped it."""

    seq: int
    generation: int
    attempts: list[FinishedAttempt]
    stopped_early: bool = False
    """Its probe's attempts all scored the same, so its other attempts never ran (swerl.rollout.curriculum)."""

    @property
    def trajectories(self) -> list[Trajectory]:
        return [attempt.trajectory for attempt in self.attempts]

    @property
    def finished_at(self) -> float:
        return max(attempt.finished_at for attempt in self.attempts)


@dataclass
class Ledger:
    """Groups consumed by the trainer, in order: (seq, step, reason); reason 'trained' or why it was discarded.

    'trained' means consumed by a step's batch. Which of a trained group's attempts the trainer really scored (in
    the group's baseline and the loss: its valid attempts, none if the trainer dropped the group for having fewer
    than two) is the trainer's own account, kept per step in `scored` as (group_id, attempt) pairs.
    """

    entries: list[tuple[int, int, str]] = field(default_factory=list)
    scored: dict[int, list[tuple[str, int]]] = field(default_factory=dict)

    def add(self, seq: int, step: int, reason: str) -> None:
        self.entries.append((seq, step, reason))

    def remove(self, seq: int, step: int, reason: str) -> None:
        """Take back an entry (a batch that was not trained after all); ValueError if it is not there."""
        self.entries.remove((seq, step, reason))

    def record_scored(self, step: int, scored: list[tuple[str, int]]) -> None:
        self.scored[step] = list(scored)

    @property
    def consumed(self) -> set[int]:
        return {seq for seq, _, _ in self.entries}

    def save(self, directory: Path) -> Path:
        path = directory / LEDGER_FILE
        tmp = path.with_name(f"{path.name}.tmp-{uuid.uuid4().hex[:8]}")
        body = {
            "entries": self.entries,
            "scored": {str(step): pairs for step, pairs in self.scored.items()},
            "written_at": time.time(),
        }
        tmp.write_text(json.dumps(body))
        os.replace(tmp, path)  # atomic: a crash leaves the old ledger or the new one, never half of one
        return path

    @classmethod
    def load(cls, directory: Path | None) -> Ledger:
        """The ledger saved in a checkpoint directory (empty if none); CorruptStoreFile naming it if damaged.
        A ledger written before `scored` existed loads with none."""
        if directory is None or not (directory / LEDGER_FILE).is_file():
            return cls()
        path = directory / LEDGER_FILE
        try:
            body: dict[str, Any] = json.loads(path.read_text())
            entries = [(int(seq), int(step), str(reason)) for seq, step, reason in body["entries"]]
            scored = {
                int(step): [(str(group), int(attempt)) for group, attempt in pairs]
                for step, pairs in body.get("scored", {}).items()
            }
            return cls(entries, scored)
        except Exception as exc:  # noqa: BLE001 - whatever fails, the file is what is wrong
            raise CorruptStoreFile(str(path), f"not a valid rollout ledger ({type(exc).__name__}: {exc})") from exc


@dataclass
class JournalState:
    """What the journal holds: per seq, its newest generation's finished attempts; the highest seq seen."""

    groups: dict[int, tuple[int, dict[int, FinishedAttempt]]]
    max_seq: int  # -1 when empty
    damaged: list[str] = field(default_factory=list)
    """URIs of journal entries that could not be read: skipped (their attempts rerun), logged and counted."""


class RolloutJournal:
    """Finished attempts in the store under `prefix` (None store: nothing is persisted, for benchmarks).

    `earlier`: the journals of earlier GRPO phases (read-only, oldest first). A later phase reads them with its own
    as one journal, so the groups an earlier phase left unconsumed (finished, or partly finished) carry on in this
    phase exactly as after a crash, and nothing finished is lost between phases; it writes only under `prefix`."""

    def __init__(self, store: Store | None, prefix: str, earlier: Sequence[str] = ()) -> None:
        self.store = store
        self.prefix = prefix.strip("/")
        self.earlier = [e.strip("/") for e in earlier]

    def _folders(self) -> list[tuple[int, str]]:
        """(seq, folder) of every group folder in the earlier journals and this one, in that order."""
        assert self.store is not None
        out = []
        for prefix in [*self.earlier, self.prefix]:
            for folder in self.store.list(prefix):
                name = folder.rsplit("/", 1)[-1]
                if name.startswith("g") and name[1:].isdigit():
                    out.append((int(name[1:]), folder))
        return out

    def entry_path(self, seq: int, generation: int, attempt: int) -> str:
        """The store path of one finished attempt's entry."""
        return f"{self.prefix}/g{seq:08d}/r{generation:03d}-a{attempt:04d}.json"

    def record(self, attempt: FinishedAttempt) -> None:
        """Write one finished attempt (atomically); blocking I/O, run it off the event loop."""
        if self.store is not None:
            path = self.entry_path(attempt.seq, attempt.generation, attempt.trajectory.attempt)
            self.store.write_bytes(path, attempt.to_json())

    def record_plan(self, plan: GroupPlan) -> None:
        """Write a group's plan (task, source, probe) as it opens, before any of its attempts is written."""
        if self.store is not None:
            self.store.write_bytes(f"{self.prefix}/g{plan.seq:08d}/plan.json", plan.to_json())

    def record_outcome(self, seq: int, generation: int, rewards: list[float | None], finished_at: float) -> None:
        """Write a finished group's rewards (what the curriculum observed), before the group can be consumed."""
        if self.store is not None:
            body = {"seq": seq, "generation": generation, "rewards": rewards, "finished_at": finished_at}
            self.store.write_bytes(
                f"{self.prefix}/g{seq:08d}/outcome-r{generation:03d}.json", json.dumps(body).encode()
            )

    def load_curriculum(self) -> tuple[list[GroupPlan], list[tuple[float, int, list[float | None]]]]:
        """Every group's plan and every finished group's (finished_at, seq, rewards): what Curriculum.restore
        replays. A damaged record is skipped with a warning (its group's attempts are still in the journal)."""
        plans: dict[int, GroupPlan] = {}
        finishes: dict[tuple[int, int], tuple[float, int, list[float | None]]] = {}
        if self.store is None:
            return [], []
        for _, folder in self._folders():
            for rel in self.store.list(folder):
                name = rel.rsplit("/", 1)[-1]
                try:
                    if name == "plan.json":
                        plan = self.store.read_parsed(rel, GroupPlan.from_json, "group plan")
                        plans[plan.seq] = plan
                    elif match := _OUTCOME_NAME.match(name):
                        body = self.store.read_parsed(rel, json.loads, "group outcome")
                        rewards = [None if r is None else float(r) for r in body["rewards"]]
                        seq = int(body["seq"])
                        finishes[(seq, int(match[1]))] = (float(body["finished_at"]), seq, rewards)
                except (CorruptStoreFile, KeyError, TypeError, ValueError) as exc:
                    _log.warning("rollout journal: %s skipped (%s)", rel, exc)
        return list(plans.values()), list(finishes.values())

    def load(self, skip: set[int]) -> JournalState:
        """Read the journal; groups in `skip` (consumed) are only counted for the data position, not read."""
        groups: dict[int, tuple[int, dict[int, FinishedAttempt]]] = {}
        damaged: list[str] = []
        max_seq = -1
        if self.store is None:
            return JournalState(groups, max_seq)
        files: dict[int, dict[int, dict[int, str]]] = {}  # seq -> generation -> attempt -> path
        for seq, folder in self._folders():
            max_seq = max(max_seq, seq)
            if seq in skip:
                continue
            for rel in self.store.list(folder):
                match = _ATTEMPT_NAME.match(rel.rsplit("/", 1)[-1])
                if match:
                    files.setdefault(seq, {}).setdefault(int(match[1]), {})[int(match[2])] = rel
        for seq, by_generation in files.items():
            generation = max(by_generation)
            attempts = {}
            for index, rel in by_generation[generation].items():
                try:
                    attempts[index] = self.store.read_parsed(rel, FinishedAttempt.from_json, "journal entry")
                except CorruptStoreFile as exc:
                    damaged.append(exc.uri)
                    _log.warning("%s: skipped, its attempt reruns", exc)
            groups[seq] = (generation, attempts)
        if damaged:
            _log.warning(
                "rollout journal %s: %d damaged entries skipped (their attempts rerun)",
                self.store.uri(self.prefix),
                len(damaged),
            )
        return JournalState(groups, max_seq, damaged)
