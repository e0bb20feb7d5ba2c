"""swebench grading of real-format test logs (pytest -rA summaries, Django's runner), wrapped the way our eval
sandbox wraps them, and the FAIL_TO_PASS / PASS_TO_PASS rule for SWE-smith and swerl tasks."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from swerl.data.schema import TaskInstance
from swerl.data.testrun import TestOutcome, TestStatus
from swerl.grading.grader import resolution_status
from swerl.grading.verdict import grade_log, log_parser_for

START, END = ">>>>> Start Test Output", ">>>>> End Test Output"


def swebench_task(repo: str, f2p: list[str], p2p: list[str]) -> TaskInstance:
    return TaskInstance(
        instance_id=f"{repo.replace('/', '__')}-1",
        repo=repo,
        base_commit="a" * 40,
        problem_statement="p",
        patch="diff --git a/x b/x",
        patch_kind="fix",
        FAIL_TO_PASS=f2p,
        PASS_TO_PASS=p2p,
        difficulty="<15 min fix",
        source="test",
    )


def wrap(body: str, code: int) -> str:
    return f"+ git apply -v -\nChecking patch x.py...\n{START}\n{body}\n{END}\n>>>>> Test Exit Code: {code}\n"


PYTEST_BODY = """\
============================= test session starts ==============================
platform linux -- Python 3.9.20, pytest-8.3.3, pluggy-1.5.0
rootdir: /testbed
configfile: setup.cfg
collected 4 items

astropy/modeling/tests/test_separable.py ..F.                            [100%]

=================================== FAILURES ===================================
_______________________ test_separable[compound_model6] ________________________
astropy/modeling/tests/test_separable.py:151: in test_separable
    assert_allclose(separability_matrix(compound_model), result[1])
E   AssertionError: Not equal to tolerance rtol=1e-07, atol=0
==================================== PASSES ====================================
=========================== short test summary info ============================
PASSED astropy/modeling/tests/test_separable.py::test_coord_matrix
PASSED astropy/modeling/tests/test_separable.py::test_cdot
FAILED astropy/modeling/tests/test_separable.py::test_separable[compound_model6] - AssertionError: Not equal to tolerance rtol=1e-07, atol=0
PASSED astropy/modeling/tests/test_separable.py::test_custom_model_separable
========================= 1 failed, 3 passed in 0.29s ==========================
"""

ASTROPY_F2P = ["astropy/modeling/tests/test_separable.py::test_separable[compound_model6]"]
ASTROPY_P2P = [
    "astropy/modeling/tests/test_separable.py::test_coord_matrix",
    "astropy/modeling/tests/test_separable.py::test_cdot",
    "astropy/modeling/tests/test_separable.py::test_custom_model_separable",
]


def test_pytest_log_unresolved_then_resolved() -> None:
    task = swebench_task("astropy/astropy", ASTROPY_F2P, ASTROPY_P2P)
    assert log_parser_for(task) == "parse_log_astropy"
    grade = grade_log(task, wrap(PYTEST_BODY, 1))
    assert grade.log_valid and not grade.resolved and grade.status == "RESOLVED_NO"
    assert grade.tests["FAIL_TO_PASS"] == {"success": [], "failure": ASTROPY_F2P}
    assert grade.tests["PASS_TO_PASS"]["success"] == ASTROPY_P2P

    fixed = PYTEST_BODY.replace(
        "FAILED astropy/modeling/tests/test_separable.py::test_separable[compound_model6] - "
        "AssertionError: Not equal to tolerance rtol=1e-07, atol=0",
        "PASSED astropy/modeling/tests/test_separable.py::test_separable[compound_model6]",
    )
    grade = grade_log(task, wrap(fixed.replace("1 failed, 3 passed", "4 passed"), 0))
    assert grade.resolved and grade.status == "RESOLVED_FULL"

    # Breaking a PASS_TO_PASS test loses the task even though the FAIL_TO_PASS test now passes.
    regressed = fixed.replace(
        "PASSED astropy/modeling/tests/test_separable.py::test_cdot",
        "FAILED astropy/modeling/tests/test_separable.py::test_cdot - ValueError: boom",
    )
    grade = grade_log(task, wrap(regressed, 1))
    assert not grade.resolved and grade.tests["PASS_TO_PASS"]["failure"] == [ASTROPY_P2P[1]]


DJANGO_BODY = """\
Testing against Django installed in '/testbed/django'
Importing application admin_views
Skipping setup of unused database(s): other.
Operations to perform:
  Synchronize unmigrated apps: admin_views, auth, contenttypes, messages, sessions, staticfiles
  Apply all migrations: admin, sites
System check identified no issues (0 silenced).
test_add_view (admin_views.tests.AdminViewBasicTest) ... ok
test_change_view (admin_views.tests.AdminViewBasicTest) ... ok
test_readonly_foreignkey_links (admin_views.tests.ReadonlyTest) ... FAIL
test_save_as_new (admin_views.tests.AdminViewBasicTest) ... skipped 'Database has feature(s) foo'

======================================================================
FAIL: test_readonly_foreignkey_links (admin_views.tests.ReadonlyTest)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/testbed/tests/admin_views/tests.py", line 5093, in test_readonly_foreignkey_links
    self.assertContains(response, '<div class="readonly"><a href="%s">' % user_url, html=True)
AssertionError: False is not true : Couldn't find '<div class="readonly"><a href="/admin/">' in response

----------------------------------------------------------------------
Ran 4 tests in 0.412s

FAILED (failures=1, skipped=1)
Destroying test database for alias 'default'...
"""


def test_django_log() -> None:
    f2p = ["test_readonly_foreignkey_links (admin_views.tests.ReadonlyTest)"]
    p2p = [
        "test_add_view (admin_views.tests.AdminViewBasicTest)",
        "test_change_view (admin_views.tests.AdminViewBasicTest)",
    ]
    task = swebench_task("django/django", f2p, p2p)
    assert log_parser_for(task) == "parse_log_django"
    grade = grade_log(task, wrap(DJANGO_BODY, 1))
    assert not grade.resolved and grade.tests["FAIL_TO_PASS"]["failure"] == f2p
    fixed = DJANGO_BODY.replace("ReadonlyTest) ... FAIL", "ReadonlyTest) ... ok")
    assert grade_log(task, wrap(fixed, 0)).resolved
    # A skipped PASS_TO_PASS test is not a regression in swebench's rule; a skipped FAIL_TO_PASS is no fix.
    skipped = fixed.replace(
        "test_add_view (admin_views.tests.AdminViewBasicTest) ... ok",
        "test_add_view (admin_views.tests.AdminViewBasicTest) ... skipped 'no db'",
    )
    assert grade_log(task, wrap(skipped, 0)).resolved
    not_run = fixed.replace("ReadonlyTest) ... ok", "ReadonlyTest) ... skipped 'x'")
    assert not grade_log(task, wrap(not_run, 0)).resolved


def test_logs_without_markers_or_with_a_lying_exit_code_are_not_resolved() -> None:
    task = swebench_task("astropy/astropy", ASTROPY_F2P, ASTROPY_P2P)
    all_pass = PYTEST_BODY.replace(
        "FAILED astropy/modeling/tests/test_separable.py::test_separable[compound_model6] - "
        "AssertionError: Not equal to tolerance rtol=1e-07, atol=0",
        "PASSED astropy/modeling/tests/test_separable.py::test_separable[compound_model6]",
    )
    cut = f"{START}\n{all_pass}"  # the run never reached the end marker (killed, timed out)
    grade = grade_log(task, cut)
    assert not grade.log_valid and not grade.resolved and grade.status == "LOG_INVALID"
    # PASSED lines printed by a patch while the test command exited 1 with no failure: not trusted.
    assert not grade_log(task, wrap(all_pass, 1)).resolved
    oom = grade_log(task, f"{START}\nKilled\n")
    assert oom.infra_reason == "out_of_memory" and not oom.resolved


@pytest.mark.parametrize("repo", ["swesmith/pandas-dev__pandas.95280573", "micro/eval-0-7"])
def test_swe_smith_and_swerl_tasks_use_the_same_rule_on_pytest_summaries(repo: str) -> None:
    task = TaskInstance(
        instance_id="x.1",
        repo=repo,
        base_commit="b",
        problem_statement="",
        patch="bug",
        patch_kind="bug",
        FAIL_TO_PASS=["tests/test_mod.py::test_clamp_1"],
        PASS_TO_PASS=["tests/test_mod.py::test_other_1"],
        source="swerl-synth",
    )
    assert log_parser_for(task) == "parse_log_pytest"
    # swerl's micro harness prints pytest's -rA summary lines
    body = (
        "PASSED tests/test_mod.py::test_other_1\n"
        "FAILED tests/test_mod.py::test_clamp_1 - AssertionError: 3 != 4\n1 failed, 1 passed in 0.01s"
    )
    assert not grade_log(task, wrap(body, 1)).resolved
    assert grade_log(
        task,
        wrap(
            body.replace(
                "FAILED tests/test_mod.py::test_clamp_1 - AssertionError: 3 != 4",
                "PASSED tests/test_mod.py::test_clamp_1",
            ),
            0,
        ),
    ).resolved
    missing = grade_log(task, wrap("PASSED tests/test_mod.py::test_other_1\n1 passed", 0))
    assert not missing.resolved and missing.tests["FAIL_TO_PASS"]["failure"] == ["tests/test_mod.py::test_clamp_1"]


def test_the_graders_markers_are_swebenchs() -> None:
    """An unsealed run's log is printed between SWE-bench's markers so that swebench's parsers read it."""
    from swebench.harness import constants

    from swerl.grading.grader import RESOLVED_FULL, RESOLVED_NO, RESOLVED_PARTIAL, SWEBENCH_MARKERS

    assert SWEBENCH_MARKERS == (
        constants.START_TEST_OUTPUT,
        constants.END_TEST_OUTPUT,
        constants.TEST_EXIT_CODE,
    )
    statuses = {s.value for s in constants.ResolvedStatus}
    assert statuses == {RESOLVED_FULL, RESOLVED_PARTIAL, RESOLVED_NO}


_IDS = ["t.py::a", "t.py::b", "t.py::c[x-1]", "t.py::c[x-2]", "t.py::c[x"]


@given(
    statuses=st.lists(st.sampled_from([*TestStatus, None]), min_size=len(_IDS), max_size=len(_IDS)),
    roles=st.lists(st.sampled_from(["f2p", "p2p", "-"]), min_size=len(_IDS), max_size=len(_IDS)),
)
@settings(max_examples=400, deadline=None)
def test_the_graders_resolution_rule_is_swebench_5s(statuses: list, roles: list[str]) -> None:
    """swerl's pure rule (training reward, no swebench needed) against swebench's own report and status, on every
    status including skips, expected failures, unexpected passes and ids cut inside their parameters."""
    from swebench.harness import grading
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS

    f2p = [t for t, r in zip(_IDS, roles, strict=True) if r == "f2p"]
    p2p = [t for t, r in zip(_IDS, roles, strict=True) if r == "p2p"]
    assume(f2p)
    outcomes = {
        t: TestOutcome(s) for t, s in zip(_IDS, statuses, strict=True) if s is not None and not t.endswith("[x")
    }
    status_map = {t: o.status.value for t, o in outcomes.items() if o.status != TestStatus.XPASS}
    report = grading.get_eval_tests_report(status_map, {FAIL_TO_PASS: f2p, PASS_TO_PASS: p2p})
    assert resolution_status(f2p, p2p, outcomes) == str(grading.get_resolution_status(report))
