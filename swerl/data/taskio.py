"""TaskInstances to and from parquet (the curate stage's train.parquet / eval.parquet)."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

from swerl.data.schema import TaskInstance

_LIST = pa.list_(pa.string())
TASK_SCHEMA = pa.schema(
    [(name, _LIST if name in ("FAIL_TO_PASS", "PASS_TO_PASS") else pa.string()) for name in TaskInstance.model_fields]
)
"""Arrow schema of a task file: every TaskInstance field, test lists as list<string>."""


def tasks_to_parquet(tasks: list[TaskInstance]) -> bytes:
    """Parquet bytes holding one row per task (an empty file still carries the schema)."""
    rows = [task.model_dump(mode="json") for task in tasks]
    table = pa.Table.from_pylist(rows, schema=TASK_SCHEMA)
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def tasks_from_parquet(data: bytes) -> list[TaskInstance]:
    """The tasks in parquet bytes written by tasks_to_parquet."""
    table = pq.read_table(io.BytesIO(data))
    return [TaskInstance.model_validate(row) for row in table.to_pylist()]
