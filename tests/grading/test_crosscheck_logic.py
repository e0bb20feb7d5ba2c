"""The cross-check's own logic, without Docker: rounds, prediction files, outcomes, what swebench's harness is given.
(tests/grading/test_crosscheck.py runs the real thing.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swerl.data.schema import TaskInstance
from swerl.grading.crosscheck import (
    AGREE,
    DISAGREE,
    NO_VERDICT,
    Comparison,
    Prediction,
    Verdict,
    read_predictions,
    rounds,
    swebench_row,
)

SCRIPT = "#!/bin/bash\nset -uxo pipefail\n: '>>>>> Start Test Output'\npytest -rA t.py\n: '>>>>> End Test Output'\n"


def task(**fields: object) -> TaskInstance:
    base: dict[str, object] = {
        "instance_id": "o__r-1",
        "repo": "o/r",
        "base_commit": "abc",
        "problem_statement": "p",
        "patch": "fix",
        "patch_kind": "fix",
        "FAIL_TO_PASS": ["t.py::a"],
        "PASS_TO_PASS": ["t.py::b"],
        "image": "img:latest",
        "source": "test",
        "version": "1.0",
        "eval_script": SCRIPT,
    }
    return TaskInstance.model_validate(base | fields)


def test_rounds_hold_at_most_one_prediction_per_instance_in_order() -> None:
    preds = [
        Prediction("a", "", "gold"),
        Prediction("b", "", "gold"),
        Prediction("a", "", "empty"),
        Prediction("a", "", "wrong"),
        Prediction("b", "", "empty"),
    ]
    dealt = rounds(preds)
    assert [[(p.instance_id, p.label) for p in r] for r in dealt] == [
        [("a", "gold"), ("b", "gold")],
        [("a", "empty"), ("b", "empty")],
        [("a", "wrong")],
    ]


def test_prediction_files_of_swebench_and_of_an_evaluate_stage(tmp_path: Path) -> None:
    swebench = tmp_path / "preds.jsonl"
    swebench.write_text(json.dumps({"instance_id": "a", "model_patch": "d", "model_name_or_path": "m/x"}) + "\n")
    assert read_predictions(swebench) == [Prediction("a", "d", "m/x")]
    episodes = tmp_path / "episodes_grpo.jsonl"
    episodes.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in (
                {"task_id": "a", "attempt": 1, "patch": "d", "reward": 1.0},
                {"task_id": "b", "attempt": 0, "patch": None, "reward": None},  # an infra error: nothing recorded
            )
        )
    )
    assert read_predictions(episodes) == [
        Prediction("a", "d", "grpo/attempt-1", True),
        Prediction("b", "", "grpo/attempt-0", None),
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instance_id": "a"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: neither"):
        read_predictions(bad)


def test_outcomes_need_every_verdict_and_agreement() -> None:
    yes, no, none = (
        Verdict(True, "RESOLVED_FULL"),
        Verdict(False, "RESOLVED_NO"),
        Verdict(None, "INFRA_ERROR:x"),
    )
    assert Comparison("a", "gold", yes, yes).outcome == AGREE
    assert Comparison("a", "gold", yes, no).outcome == DISAGREE
    assert Comparison("a", "gold", none, no).outcome == NO_VERDICT
    assert Comparison("a", "sft/attempt-0", no, no, recorded=True).outcome == DISAGREE


def test_the_row_swebench_reads_is_the_tasks_own() -> None:
    row = swebench_row(task())
    assert (row["image"], row["eval_script"], row["version"]) == ("img:latest", SCRIPT, "1.0")
    assert json.loads(row["FAIL_TO_PASS"]) == ["t.py::a"] and row["eval_type"] == "pass_and_fail"
    assert row["log_parser"] == "parse_log_pytest"  # swebench's parser for a repository it has none of its own for
    assert swebench_row(task(repo="django/django"))["log_parser"] == "parse_log_django"
    with pytest.raises(ValueError, match="without eval_script"):
        swebench_row(task(eval_script=None))
    with pytest.raises(ValueError, match="bug-kind"):
        swebench_row(task(patch_kind="bug"))
