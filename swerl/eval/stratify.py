"""Stratified evaluation subsets: strata by repository x difficulty, proportional allocation, seeded choice.

SWE-bench Verified labels each task with a difficulty bucket (the annotators' estimate of the time a fix takes).
A subset of n tasks gives each (repository, difficulty) stratum a share proportional to its size, rounded by the
largest-remainder (Hamilton) method so the shares sum to exactly n, and draws that many tasks from the stratum
with a generator seeded by (seed, stratum). The chosen ids are saved (`Subset.to_json`) and reused, so every
checkpoint is evaluated on the same tasks. A dataset without difficulty labels (swerl's micro tasks, SWE-smith)
falls back to repository-only strata, and the subset says so in `note`.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

from swerl.data.schema import TaskInstance

DIFFICULTY_BUCKETS: tuple[str, ...] = ("<15 min fix", "15 min - 1 hour", "1-4 hours", ">4 hours")
"""SWE-bench Verified's difficulty labels, easiest first."""

SUBSET_VERSION = 1


class SubsetError(ValueError):
    """A subset that cannot be drawn or reused; the message says why and what to change."""


def largest_remainder(sizes: Mapping[str, int], n: int) -> dict[str, int]:
    """Split n over strata in proportion to their sizes; the shares sum to n and never exceed a stratum's size.

    Each stratum gets floor(n * size / total); the seats left go one each to the largest remainders (exact
    fractions, ties by stratum name), so the result does not depend on dict order or float rounding.
    """
    empty = sorted(k for k, v in sizes.items() if v <= 0)
    if empty:
        raise SubsetError(f"stratum/strata with no tasks: {empty}; every stratum needs at least one task")
    total = sum(sizes.values())
    if n < 0:
        raise SubsetError(f"subset size must be >= 0, got {n}")
    if n > total:
        raise SubsetError(
            f"subset size {n} is larger than the dataset ({total} tasks): lower evaluate.max_tasks to at most {total}"
        )
    quotas = {k: Fraction(n * v, total) for k, v in sizes.items()}
    shares = {k: int(q) for k, q in quotas.items()}  # floor (quotas are >= 0)
    left = n - sum(shares.values())
    by_remainder = sorted(quotas, key=lambda k: (-(quotas[k] - shares[k]), k))
    for key in by_remainder[:left]:
        shares[key] += 1  # a positive remainder means quota > floor, so floor + 1 <= ceil(quota) <= size
    return shares


def stratum_of(task: TaskInstance, by_difficulty: bool) -> str:
    """The stratum name: 'owner/repo' or 'owner/repo | difficulty'."""
    if not by_difficulty:
        return task.repo_key
    return f"{task.repo_key} | {task.difficulty or 'unlabeled'}"


@dataclass
class Subset:
    """The chosen tasks and how they were chosen; saved as JSON and reused for every checkpoint."""

    instance_ids: list[str]
    """Chosen ids, sorted."""
    strata: dict[str, list[str]]
    """Stratum -> chosen ids (sorted); strata that got no task map to []."""
    population: dict[str, int]
    """Stratum -> tasks the dataset has in it."""
    by_difficulty: bool
    """Strata are repository x difficulty (True) or repository only (False)."""
    seed: int
    size: int
    """The requested subset size."""
    dataset_fingerprint: str
    """sha256 of the sorted instance ids the subset was drawn from."""
    note: str = ""
    """What the reader must know: a fallback to repository-only strata, unlabeled tasks, strata left empty."""
    version: int = SUBSET_VERSION
    stratum_of_task: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> Subset:
        raw: dict[str, Any] = json.loads(data)
        if raw.get("version") != SUBSET_VERSION:
            raise SubsetError(f"saved subset has version {raw.get('version')}, this swerl reads {SUBSET_VERSION}")
        return cls(**raw)

    def select(self, tasks: Sequence[TaskInstance]) -> list[TaskInstance]:
        """The subset's tasks out of `tasks` (sorted by id); a saved id missing from them is an error."""
        by_id = {t.instance_id: t for t in tasks}
        missing = [i for i in self.instance_ids if i not in by_id]
        if missing:
            raise SubsetError(
                f"{len(missing)} task(s) of the saved subset are not in the dataset (first: {missing[:3]}); "
                "the subset was drawn from another dataset"
            )
        return [by_id[i] for i in self.instance_ids]


def dataset_fingerprint(tasks: Sequence[TaskInstance]) -> str:
    ids = sorted(t.instance_id for t in tasks)
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()


def stratify(tasks: Sequence[TaskInstance], size: int, seed: int, by_difficulty: bool = True) -> Subset:
    """Draw `size` tasks proportionally from repository x difficulty strata (repository only without labels)."""
    ids = [t.instance_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise SubsetError("the dataset has duplicate instance ids; stratification needs unique ids")
    notes = []
    labeled = [t for t in tasks if t.difficulty]
    if by_difficulty and not labeled:
        by_difficulty = False
        notes.append("the dataset has no difficulty labels: strata are repositories only")
    elif by_difficulty and len(labeled) < len(tasks):
        notes.append(f"{len(tasks) - len(labeled)} task(s) have no difficulty label: stratum 'unlabeled'")
    if by_difficulty:
        unknown = sorted({str(t.difficulty) for t in labeled} - set(DIFFICULTY_BUCKETS))
        if unknown:
            notes.append(f"difficulty labels outside SWE-bench Verified's buckets kept as strata: {unknown}")
    members: dict[str, list[str]] = {}
    stratum_of_task = {}
    for task in tasks:
        name = stratum_of(task, by_difficulty)
        members.setdefault(name, []).append(task.instance_id)
        stratum_of_task[task.instance_id] = name
    shares = largest_remainder({k: len(v) for k, v in members.items()}, size)
    chosen: dict[str, list[str]] = {}
    for name in sorted(members):
        # Seeded per stratum and from sorted ids: the choice does not depend on the dataset's row order.
        rng = random.Random(f"{seed}:{name}")
        chosen[name] = sorted(rng.sample(sorted(members[name]), shares[name]))
    skipped = sorted(k for k, v in chosen.items() if not v)
    if skipped:
        notes.append(f"{len(skipped)} stratum/strata too small for a share of {size} tasks: {skipped}")
    picked = sorted(i for v in chosen.values() for i in v)
    return Subset(
        instance_ids=picked,
        strata=chosen,
        population={k: len(v) for k, v in sorted(members.items())},
        by_difficulty=by_difficulty,
        seed=seed,
        size=size,
        dataset_fingerprint=dataset_fingerprint(tasks),
        note="; ".join(notes),
        stratum_of_task={i: stratum_of_task[i] for i in picked},
    )


def subset_path(dataset_fingerprint: str, size: int, seed: int, by_difficulty: bool) -> str:
    """Store path of a saved subset: one per (dataset, size, seed, strata kind), shared by every checkpoint."""
    kind = "repo-difficulty" if by_difficulty else "repo"
    return f"eval_subsets/{dataset_fingerprint[:16]}-n{size}-s{seed}-{kind}.json"
