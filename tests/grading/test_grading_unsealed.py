"""A task whose harness is no command a sealed runner can take apart runs unsealed, as its harness runs it, and is
read under swebench 5's rules (swerl.grading.harness.read_harness_log over swebench's get_logs_eval): the exit code
recorded after the markers counts, a run with no sign of the suite is no verdict, a skipped FAIL_TO_PASS test is not
a fix. The harness here is a shell script printing pytest's `-rA` lines as the workspace's `mode` file says: the
patch under grade decides what it prints, as code under test decides what an unsealed harness's log says."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from swerl.data.schema import TaskInstance
from swerl.grading.grader import grade_patch
from swerl.grading.plan import grading_plan
from tests.sandbox_helpers import local_provider

RUN = """\
case "$(cat mode)" in
  fixed) echo "PASSED tests/t.py::f2p"; echo "PASSED tests/t.py::p2p"; exit 0 ;;
  lying) echo "PASSED tests/t.py::f2p"; echo "PASSED tests/t.py::p2p"; exit 3 ;;
  skipped) echo "SKIPPED tests/t.py::f2p"; echo "PASSED tests/t.py::p2p"; exit 0 ;;
  silent) exit 0 ;;
  *) echo "FAILED tests/t.py::f2p - AssertionError"; echo "PASSED tests/t.py::p2p"; exit 1 ;;
esac
"""


def mode_patch(mode: str) -> str:
    return f"diff --git a/mode b/mode\n--- a/mode\n+++ b/mode\n@@ -1 +1 @@\n-broken\n+{mode}\n"


@pytest.fixture
def task(tmp_path: Path) -> TaskInstance:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "mode").write_text("broken\n")
    (repo / "run.sh").write_text(RUN)
    return TaskInstance(
        instance_id="own__harness-1",
        repo="own/harness",
        base_commit="0" * 40,
        problem_statement="p",
        patch=mode_patch("fixed"),
        patch_kind="fix",
        FAIL_TO_PASS=["tests/t.py::f2p"],
        PASS_TO_PASS=["tests/t.py::p2p"],
        image=f"local://{repo}",
        test_cmd="sh run.sh",
        source="own",
    )


@pytest.mark.parametrize(
    ("mode", "status"),
    [
        ("fixed", "RESOLVED_FULL"),
        ("broken", "RESOLVED_NO"),
        ("skipped", "RESOLVED_NO"),  # a skipped FAIL_TO_PASS test is no fix
        ("lying", "INCOMPLETE"),  # PASSED lines from a command that exited 3: the log is not the run
        ("silent", "INCOMPLETE"),  # no result and no sign the suite ran
    ],
)
def test_an_unsealed_harness_is_graded_by_swebench_5s_rules(
    task: TaskInstance, tmp_path: Path, mode: str, status: str
) -> None:
    assert grading_plan(task).mode is None
    provider = local_provider(sys.executable, root_dir=tmp_path / "sandboxes")
    patch = "" if mode == "broken" else mode_patch(mode)
    graded = asyncio.run(grade_patch(provider, task, patch, 30.0))
    assert (graded.status, graded.sealed) == (status, False), (graded.detail, graded.log[-800:])
    assert graded.reward == float(status == "RESOLVED_FULL")
    assert graded.harness.startswith("unsealed")
