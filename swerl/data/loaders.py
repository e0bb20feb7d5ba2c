"""Loading published task datasets (SWE-smith, SWE-bench, SWE-bench Pro, SWE-rebench) and swerl's own task files
into TaskInstances.

Rows come through `datasets`: a hub id (`datasets.load_dataset(id, split=..., revision=...)`) or a local parquet /
jsonl / json file. A row the published schema allows is accepted (test lists as lists or JSON strings, a missing
PASS_TO_PASS, SWE-smith's often empty problem statement); anything else is rejected with the row's id and the
offending field, collected into a report, or raised at once in strict mode. What each source's columns mean, its
image names and harness: swerl/data/sources.py. Rows of swerl's own task files (the curate stage's
train/eval.parquet) load under the schema `swerl` as they were written, environment and harness included; under
any other schema they are refused, since reading them as published rows would replace their environment.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from swerl.data.schema import TaskInstance
from swerl.data.sources import (
    FieldError,
    pro_columns,
    pro_fields,
    rebench_fields,
    swebench_fields,
    swebench_image,  # noqa: F401 - re-exported: callers name images through the loaders
)

TaskSchema = Literal["swesmith", "swebench", "swebench_pro", "swerebench", "swerl"]
Schema = TaskSchema

_BENCH = ("instance_id", "repo", "base_commit", "patch", "problem_statement", "FAIL_TO_PASS")
REQUIRED: dict[str, tuple[str, ...]] = {
    "swesmith": ("instance_id", "repo", "patch", "FAIL_TO_PASS"),
    "swebench": _BENCH,
    "swebench_pro": (*_BENCH, "dockerhub_tag"),
    "swerebench": (*_BENCH, "install_config"),
    "swerl": ("instance_id", "repo", "patch_kind", "FAIL_TO_PASS", "source"),
}
"""Columns a row must have (non-null) under each schema (SWE-bench Pro's test lists after pro_columns)."""

SCHEMA_NAMES: dict[str, str] = {
    "swesmith": "SWE-smith",
    "swebench": "SWE-bench",
    "swebench_pro": "SWE-bench Pro",
    "swerebench": "SWE-rebench",
    "swerl": "swerl",
}
SWERL_MARKER = "patch_kind"
"""A column only swerl's own task rows have (TaskInstance.patch_kind)."""

TRACE_COLUMN = "messages"
"""The column of an agent trace row (SWE-smith-trajectories: instance_id, traj_id, messages, resolved...)."""

_LOCAL_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}


@dataclass(frozen=True)
class Rejection:
    """Why one row was not loaded."""

    row: int
    instance_id: str | None
    field: str
    reason: str

    def __str__(self) -> str:
        return f"row {self.row} ({self.instance_id or 'no instance_id'}): {self.field}: {self.reason}"


class RowError(ValueError):
    """A malformed dataset row: which row, which field, what is wrong."""

    def __init__(self, row: int, instance_id: str | None, field_name: str, reason: str) -> None:
        self.rejection = Rejection(row, instance_id, field_name, reason)
        super().__init__(str(self.rejection))


class SchemaMismatch(RowError):
    """Rows read under a schema they do not follow (raised at the first one, even when not strict)."""


@dataclass
class LoadReport:
    """Rows read, accepted and rejected from one source."""

    source: str
    schema: str
    rows: int = 0
    accepted: int = 0
    rejected: list[Rejection] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "schema": self.schema,
            "rows": self.rows,
            "accepted": self.accepted,
            "rejected": len(self.rejected),
            "rejections": [str(r) for r in self.rejected[:100]],
        }


def _present(row: Mapping[str, Any], name: str) -> bool:
    value = row.get(name)
    return value is not None and not (isinstance(value, str) and not value.strip())


def task_schema_of(row: Mapping[str, Any]) -> Schema | None:
    """The task schema a row looks like (all its required columns present), or None: swerl's own rows, SWE-bench
    Pro's (dockerhub_tag) and SWE-rebench's (install_config) by their own columns; SWE-smith where the row names a
    SWE-smith image or repository, else SWE-bench before the looser SWE-smith."""
    if _present(row, SWERL_MARKER):
        return "swerl"
    if _present(row, "dockerhub_tag"):
        return "swebench_pro"
    if _present(row, "install_config"):
        return "swerebench"
    smith = all(_present(row, name) for name in REQUIRED["swesmith"])
    if smith and (_present(row, "image_name") or str(row.get("repo", "")).startswith("swesmith/")):
        return "swesmith"
    if all(_present(row, name) for name in REQUIRED["swebench"]):
        return "swebench"
    return "swesmith" if smith else None


def is_trace_row(row: Mapping[str, Any]) -> bool:
    """Whether a row is shaped like an agent trace (it has messages) rather than a task."""
    return row.get(TRACE_COLUMN) is not None


def _swesmith_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    repo = str(row["repo"])
    commit = row.get("base_commit")
    if not commit:  # older SWE-smith releases encode the commit only in the repo name
        match = re.search(r"\.([0-9a-f]{7,40})$", repo)
        commit = match.group(1) if match else ""
    return {
        "base_commit": commit,
        "problem_statement": row.get("problem_statement") or "",
        "patch_kind": "bug",
        "test_patch": "",
        "image": row.get("image_name") or "",
        "difficulty": None,
    }


def _swerl_task(row: Mapping[str, Any], index: int) -> TaskInstance:
    """A row of swerl's own task file, as it was written (source, split, environment and harness its own)."""
    instance_id = str(row.get("instance_id") or "") or None
    known = {k: v for k, v in row.items() if k in TaskInstance.model_fields or v is not None}
    try:
        return TaskInstance.model_validate(known)
    except ValidationError as exc:
        first = exc.errors()[0]
        field_name = ".".join(str(p) for p in first["loc"]) or "<row>"
        raise RowError(index, instance_id, field_name, first["msg"]) from None


_FIELDS = {
    "swesmith": _swesmith_fields,
    "swebench": swebench_fields,
    "swebench_pro": pro_fields,
    "swerebench": rebench_fields,
}


def row_to_task(row: Mapping[str, Any], schema: Schema, source: str, split: str | None, index: int) -> TaskInstance:
    """One row -> TaskInstance, or RowError naming the row and field (SchemaMismatch for a row of swerl's own
    task files read under a published schema)."""
    if schema not in REQUIRED:
        raise ValueError(f"unknown dataset schema {schema!r}; known: {sorted(REQUIRED)}")
    raw_id = row.get("instance_id")
    instance_id = str(raw_id) if raw_id else None
    if schema != "swerl" and _present(row, SWERL_MARKER):
        raise SchemaMismatch(
            index,
            instance_id,
            SWERL_MARKER,
            f"a row of swerl's own task file (the curate stage's train/eval.parquet: it has {SWERL_MARKER}, "
            f"image {str(row.get('image') or '')[:80]!r}), read as {SCHEMA_NAMES[schema]} rows would lose its "
            "environment and harness: set the dataset's schema to swerl",
        )
    if schema == "swebench_pro":
        try:
            row = pro_columns(row)
        except FieldError as exc:
            raise RowError(index, instance_id, exc.field_name, str(exc)) from None
    missing = [name for name in REQUIRED[schema] if not _present(row, name)]
    if missing and is_trace_row(row):
        columns = ", ".join(c for c in (TRACE_COLUMN, "traj_id", "resolved") if c in row)
        raise RowError(
            index,
            instance_id,
            TRACE_COLUMN,
            f"the row looks like an agent trace (SWE-smith-trajectories: it has {columns}), not a "
            f"{SCHEMA_NAMES[schema]} task (it lacks {', '.join(missing)}): load it as traces "
            "(traces.source=dataset), not as tasks",
        )
    if missing:
        raise RowError(index, instance_id, missing[0], f"missing or empty (required by the {schema} schema)")
    if schema == "swerl":
        return _swerl_task(row, index)
    try:
        fields = _FIELDS[schema](row)
    except FieldError as exc:
        raise RowError(index, instance_id, exc.field_name, str(exc)) from None
    try:
        return TaskInstance(
            instance_id=str(instance_id),
            repo=str(row["repo"]),
            patch=row["patch"],
            FAIL_TO_PASS=row["FAIL_TO_PASS"],
            PASS_TO_PASS=row.get("PASS_TO_PASS") or [],
            source=source,
            split=split,
            **fields,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field_name = ".".join(str(p) for p in first["loc"]) or "<row>"
        raise RowError(index, instance_id, field_name, first["msg"]) from None


def rows_to_tasks(
    rows: Iterable[Mapping[str, Any]],
    schema: Schema,
    source: str,
    split: str | None = None,
    strict: bool = False,
) -> tuple[list[TaskInstance], LoadReport]:
    """Convert rows, rejecting malformed and duplicate ones into the report (or raising RowError if strict)."""
    report = LoadReport(source=source, schema=schema)
    tasks: list[TaskInstance] = []
    seen: set[str] = set()
    for index, row in enumerate(rows):
        report.rows += 1
        try:
            task = row_to_task(row, schema, source, split, index)
            if task.instance_id in seen:
                raise RowError(index, task.instance_id, "instance_id", "duplicate of an earlier row")
        except RowError as exc:
            if strict or isinstance(exc, SchemaMismatch):  # the whole file is misread: not one bad row
                raise
            report.rejected.append(exc.rejection)
            continue
        seen.add(task.instance_id)
        tasks.append(task)
    report.accepted = len(tasks)
    return tasks, report


def check_json_file(path: str | Path) -> None:
    """Raise ValueError naming the file and the line if a local .jsonl/.json file is not JSON objects, one per
    line (or, for .json, one JSON document): `datasets` would otherwise fail on it naming neither."""
    read_json_rows(path)


def read_json_rows(path: str | Path) -> list[tuple[int | None, dict[str, Any]]]:
    """The rows of a local .jsonl/.json file read with the json module, each with the line it is on (None for
    the rows of a .json document); a ValueError names the file and the line of anything that is not a row.

    No Arrow type inference is involved, so a column whose values differ in type from row to row (a message's
    content a string in one message and a list of parts in the next, as in published agent traces) is read as
    written."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from None
    if path.suffix.lower() == ".json":
        try:
            document = json.loads(text)
        except (ValueError, RecursionError):
            pass  # maybe JSON lines under a .json name: read line by line below
        else:
            if isinstance(document, list) and all(isinstance(row, dict) for row in document):
                return [(None, row) for row in document]
            if isinstance(document, dict):
                return [(None, document)]
            raise ValueError(f"{path}: a .json dataset must be an object or a list of objects")
    rows: list[tuple[int | None, dict[str, Any]]] = []
    for number, row_text in enumerate(text.split("\n"), start=1):
        if not row_text.strip():
            continue
        try:
            row = json.loads(row_text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        except (ValueError, RecursionError) as exc:  # an integer over the digit limit, absurd nesting
            detail = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:100]
            raise ValueError(f"{path}:{number}: not valid JSON ({detail})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{number}: a row must be a JSON object, got {type(row).__name__}")
        rows.append((number, row))
    return rows


def _json_files(local: Path) -> list[Path]:
    if local.is_dir():
        return sorted(p for p in local.rglob("*") if p.is_file() and p.suffix.lower() in (".jsonl", ".json"))
    return [local] if local.suffix.lower() in (".jsonl", ".json") else []


def read_rows(
    path: str, split: str = "train", limit: int | None = None, revision: str | None = None
) -> list[dict[str, Any]]:
    """Rows of a local parquet/jsonl/json file or directory, or of a hub dataset (at `revision`, if given),
    through `datasets`.

    A local JSON file with a broken line is a ValueError naming the file and the line (check_json_file); any
    other failure to read a local file names the file. A revision for a local path is refused: it would pin
    nothing."""
    import datasets

    local = Path(path).expanduser()
    if local.exists():
        if revision is not None:
            raise ValueError(
                f"dataset {path}: revision {revision!r} given for a local path (a revision pins a hub dataset's "
                "rows; a local file's rows are its contents): drop the revision or name the hub id"
            )
        for file in _json_files(local):
            check_json_file(file)
    try:
        return _read_rows(datasets, local, path, split, limit, revision)
    except (
        datasets.exceptions.DatasetGenerationError,
        ArithmeticError,
        TypeError,
        KeyError,
        ValueError,
    ) as exc:
        if not local.exists() or (isinstance(exc, ValueError) and path in str(exc)):
            raise
        cause = exc.__cause__ or exc
        raise ValueError(f"{path}: cannot be read as a dataset: {type(cause).__name__}: {cause}") from exc


def _read_rows(
    datasets: Any, local: Path, path: str, split: str, limit: int | None, revision: str | None
) -> list[dict[str, Any]]:
    if local.is_file():
        builder = _LOCAL_BUILDERS.get(local.suffix.lower())
        if builder is None:
            raise ValueError(f"unsupported dataset file {path}: use one of {sorted(_LOCAL_BUILDERS)}")
        # A local file is one split, which `datasets` always names 'train'.
        dataset = datasets.load_dataset(builder, data_files=str(local), split="train")
    elif local.is_dir():
        dataset = datasets.load_dataset(str(local), split=split)
    elif re.fullmatch(r"[\w.-]+/[\w.-]+", path):
        dataset = datasets.load_dataset(path, split=split, revision=revision)
    else:
        raise ValueError(f"dataset {path!r} is neither an existing file or directory nor a hub id (owner/name)")
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return [dict(row) for row in dataset]


def load_tasks(
    path: str,
    schema: Schema,
    split: str = "train",
    limit: int | None = None,
    strict: bool = False,
    revision: str | None = None,
) -> tuple[list[TaskInstance], LoadReport]:
    """Load and validate a dataset's task instances (a hub dataset at `revision`, if given)."""
    rows = read_rows(path, split, limit, revision)
    source = path if revision is None else f"{path}@{revision}"
    return rows_to_tasks(rows, schema, source=source, split=split, strict=strict)
