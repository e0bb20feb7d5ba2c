"""Pytest summary parsing and the FAIL_TO_PASS / PASS_TO_PASS split on crafted outcomes."""

from __future__ import annotations

from swerl.data.testrun import (
    TestOutcome,
    TestStatus,
    is_resolved,
    parse_pytest_summary,
    pytest_command,
    split_fail_pass,
)

OUTPUT = """\
============================= test session starts ==============================
tests/test_a.py ..F
=========================== short test summary info ============================
PASSED tests/test_a.py::test_one
PASSED tests/test_a.py::test_param[a - b]
FAILED tests/test_a.py::test_two - AssertionError: assert 1 == 2
ERROR tests/test_b.py::test_fixture - RuntimeError: boom
SKIPPED [1] tests/test_c.py:3: no numpy
XFAIL tests/test_c.py::test_known - reason: later
XPASS tests/test_c.py::test_lucky
ERROR tests/test_d.py - ImportError: cannot import name 'x'
========================= 1 failed, 2 passed in 0.01s ==========================
"""

P, F, E = TestStatus.PASSED, TestStatus.FAILED, TestStatus.ERROR


def outcomes(**statuses: TestStatus) -> dict[str, TestOutcome]:
    return {f"t.py::{name}": TestOutcome(status) for name, status in statuses.items()}


def test_parse_summary():
    parsed = parse_pytest_summary(OUTPUT)
    assert parsed["tests/test_a.py::test_one"] == TestOutcome(P)
    assert parsed["tests/test_a.py::test_param[a - b]"] == TestOutcome(P)
    assert parsed["tests/test_a.py::test_two"] == TestOutcome(F, "AssertionError: assert 1 == 2")
    assert parsed["tests/test_b.py::test_fixture"].status is E
    assert parsed["tests/test_c.py::test_known"].status is TestStatus.XFAIL
    assert parsed["tests/test_c.py::test_lucky"].status is TestStatus.XPASS
    assert parsed["tests/test_d.py"].message.startswith("ImportError")
    assert not any(k.startswith("[") for k in parsed)  # the SKIPPED line without a node id


def test_parse_summary_of_unrelated_output_is_empty():
    assert parse_pytest_summary("Traceback (most recent call last):\nKeyError: 1\n") == {}


def test_split_basic():
    clean = outcomes(a=P, b=P, c=P, d=F)
    bugged = outcomes(a=F, b=P, c=E, d=F)
    assert split_fail_pass([clean], bugged) == (["t.py::a", "t.py::c"], ["t.py::b"])


def test_split_missing_in_bugged_run_counts_as_failing():
    clean = outcomes(a=P, b=P)
    bugged = {"t.py::b": TestOutcome(P), "t.py": TestOutcome(E, "ImportError")}
    assert split_fail_pass([clean], bugged) == (["t.py::a"], ["t.py::b"])


def test_split_drops_flaky_tests():
    first, second = outcomes(a=P, b=P, c=P), outcomes(a=P, b=F, c=P)
    bugged = outcomes(a=F, b=F, c=P)
    assert split_fail_pass([first, second], bugged) == (["t.py::a"], ["t.py::c"])


def test_split_tests_failing_cleanly_are_neither():
    assert split_fail_pass([outcomes(a=F, b=E)], outcomes(a=P, b=P)) == ([], [])


def test_split_brute_force_reference():
    # Every combination of clean/bugged status for one test, against the definition written out directly.
    statuses = [P, F, E, TestStatus.SKIPPED, TestStatus.XPASS, None]
    for clean_status in statuses:
        for bugged_status in statuses:
            clean = {} if clean_status is None else {"t.py::x": TestOutcome(clean_status)}
            bugged = {} if bugged_status is None else {"t.py::x": TestOutcome(bugged_status)}
            ok = (P, TestStatus.XPASS)
            expect_f2p = clean_status in ok and bugged_status not in ok
            expect_p2p = clean_status in ok and bugged_status in ok
            f2p, p2p = split_fail_pass([clean], bugged)
            assert (f2p == ["t.py::x"], p2p == ["t.py::x"]) == (expect_f2p, expect_p2p)


def test_split_without_clean_runs():
    assert split_fail_pass([], outcomes(a=P)) == ([], [])


def test_is_resolved():
    results = outcomes(a=P, b=P, c=F)
    assert is_resolved(["t.py::a"], ["t.py::b"], results)
    assert not is_resolved(["t.py::a"], ["t.py::c"], results)
    assert not is_resolved(["t.py::missing"], [], results)


def test_pytest_command_quotes_ids():
    cmd = pytest_command("python", ["tests/t.py::test_x[a b]"])
    assert cmd.startswith("COLUMNS=") and "'tests/t.py::test_x[a b]'" in cmd and "-rA" in cmd
