"""Loading SWE-smith and SWE-bench rows from local files through `datasets`, malformed rows included."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from swerl.data.loaders import RowError, load_tasks, rows_to_tasks, swebench_image
from swerl.data.schema import TaskInstance, parse_test_list
from swerl.data.taskio import tasks_from_parquet, tasks_to_parquet

SWESMITH_ROW = {
    "instance_id": "pandas-dev__pandas.95280573.func_pm_op_swap__abcd1234",
    "repo": "swesmith/pandas-dev__pandas.95280573",
    "patch": "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n",
    "FAIL_TO_PASS": ["tests/test_x.py::test_a"],
    "PASS_TO_PASS": ["tests/test_x.py::test_b", "tests/test_x.py::test_c"],
    "created_at": "2025-03-01T00:00:00",
    "image_name": "jyangballin/swesmith.x86_64.pandas-dev_1776_pandas.95280573",
    "base_commit": "95280573e15be59036f98d82a8792599c10c6603",
    "problem_statement": "Adding two frames gives the wrong sum.",
}

SWEBENCH_ROW = {
    "instance_id": "psf__requests-2317",
    "repo": "psf/requests",
    "base_commit": "091991be0da19de9108dbe5e3752917fea3d7fdc",
    "patch": "diff --git a/requests/sessions.py b/requests/sessions.py\n",
    "test_patch": "diff --git a/test_requests.py b/test_requests.py\n",
    "problem_statement": "method = builtin_str(method) problem",
    "FAIL_TO_PASS": json.dumps(["test_requests.py::RequestsTestCase::test_HTTP_200_OK_GET_ALTERNATIVE"]),
    "PASS_TO_PASS": json.dumps(["test_requests.py::RequestsTestCase::test_BASICAUTH_TUPLE_HTTP_200_OK_GET"]),
    "version": "2.4",
    "environment_setup_commit": "091991be0da19de9108dbe5e3752917fea3d7fdc",
    "difficulty": "<15 min fix",
}


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_swesmith_rows_from_parquet(tmp_path: Path):
    second = SWESMITH_ROW | {"instance_id": "p.2", "FAIL_TO_PASS": ["t::x"], "PASS_TO_PASS": []}
    path = tmp_path / "smith.parquet"
    pq.write_table(pa.Table.from_pylist([SWESMITH_ROW, second]), path)
    tasks, report = load_tasks(str(path), "swesmith")
    assert report.accepted == 2 and not report.rejected
    first = tasks[0]
    assert first.patch_kind == "bug" and first.image == SWESMITH_ROW["image_name"]
    assert SWESMITH_ROW["PASS_TO_PASS"] == first.PASS_TO_PASS and first.source == str(path)
    assert first.repo_key == "pandas-dev/pandas"
    assert tasks[1].FAIL_TO_PASS == ["t::x"] and tasks[1].PASS_TO_PASS == []


def test_swebench_rows_from_jsonl_with_json_string_lists(tmp_path: Path):
    tasks, report = load_tasks(write_jsonl(tmp_path / "bench.jsonl", [SWEBENCH_ROW]), "swebench", limit=5)
    (task,) = tasks
    assert task.patch_kind == "fix" and task.difficulty == "<15 min fix"
    assert task.FAIL_TO_PASS == ["test_requests.py::RequestsTestCase::test_HTTP_200_OK_GET_ALTERNATIVE"]
    assert task.test_patch.startswith("diff --git") and task.image == swebench_image("psf__requests-2317")
    assert "psf_1776_requests-2317" in task.image


def test_swesmith_json_string_lists_from_json_file(tmp_path: Path):
    row = SWESMITH_ROW | {"FAIL_TO_PASS": json.dumps(["t::x"]), "PASS_TO_PASS": "[]"}
    path = tmp_path / "smith.json"
    path.write_text(json.dumps([row]))
    (task,), _ = load_tasks(str(path), "swesmith")
    assert task.FAIL_TO_PASS == ["t::x"] and task.PASS_TO_PASS == []


def test_swesmith_allows_what_the_published_schema_allows():
    row = {k: v for k, v in SWESMITH_ROW.items() if k not in ("base_commit", "PASS_TO_PASS")}
    row["problem_statement"] = ""
    (task,), report = rows_to_tasks([row], "swesmith", source="mem")
    assert task.base_commit == "95280573" and task.PASS_TO_PASS == [] and task.problem_statement == ""


@pytest.mark.parametrize(
    "schema,change,field",
    [
        ("swesmith", {"FAIL_TO_PASS": "[not json"}, "FAIL_TO_PASS"),
        ("swesmith", {"FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS"),
        ("swesmith", {"patch": None}, "patch"),
        ("swesmith", {"PASS_TO_PASS": [1, 2]}, "PASS_TO_PASS"),
        ("swebench", {"problem_statement": "  "}, "problem_statement"),
        ("swebench", {"base_commit": None}, "base_commit"),
        ("swebench", {"FAIL_TO_PASS": 7}, "FAIL_TO_PASS"),
    ],
)
def test_malformed_rows_are_rejected_with_row_and_field(schema, change, field):
    base = SWESMITH_ROW if schema == "swesmith" else SWEBENCH_ROW
    good = base | {"instance_id": "good"}
    bad = base | {"instance_id": "bad-one"} | change
    tasks, report = rows_to_tasks([good, bad], schema, source="mem")
    assert [t.instance_id for t in tasks] == ["good"]
    (rejection,) = report.rejected
    assert (rejection.row, rejection.instance_id, rejection.field) == (1, "bad-one", field)
    assert "row 1 (bad-one)" in str(rejection) and report.to_dict()["rejected"] == 1
    with pytest.raises(RowError, match=f"row 1 \\(bad-one\\): {field}"):
        rows_to_tasks([good, bad], schema, source="mem", strict=True)


def test_duplicate_and_idless_rows():
    rows = [SWEBENCH_ROW, SWEBENCH_ROW, SWEBENCH_ROW | {"instance_id": None}]
    tasks, report = rows_to_tasks(rows, "swebench", source="mem")
    assert len(tasks) == 1
    assert [(r.row, r.field) for r in report.rejected] == [(1, "instance_id"), (2, "instance_id")]
    assert "no instance_id" in str(report.rejected[1])


def test_unknown_schema_and_bad_paths(tmp_path: Path):
    with pytest.raises(ValueError, match="unknown dataset schema"):
        rows_to_tasks([SWEBENCH_ROW], "swegym", source="mem")  # type: ignore[arg-type]
    (tmp_path / "rows.csv").write_text("a\n")
    with pytest.raises(ValueError, match="unsupported dataset file"):
        load_tasks(str(tmp_path / "rows.csv"), "swebench")
    with pytest.raises(ValueError, match="neither an existing file"):
        load_tasks("not a dataset id", "swebench")


def test_parse_test_list():
    assert parse_test_list('["a", "b"]') == ["a", "b"] and parse_test_list(None) == [] and parse_test_list("") == []
    with pytest.raises(ValueError, match="expected a list"):
        parse_test_list('{"a": 1}')


def test_task_parquet_round_trip():
    (task,), _ = rows_to_tasks([SWEBENCH_ROW], "swebench", source="mem", split="test")
    assert tasks_from_parquet(tasks_to_parquet([task])) == [task]
    assert tasks_from_parquet(tasks_to_parquet([])) == []
    assert isinstance(task, TaskInstance) and task.split == "test"
