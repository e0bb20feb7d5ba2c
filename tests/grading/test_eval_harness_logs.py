"""Harness fidelity: each harness's test command and log parser, and grading REAL logs of each kind as that
harness's own grader does.

The pytest logs are made here, live: a small test file (a parametrized test, a failure, a setup error, a skip,
an xfail, an xpass) run by the pytest this suite runs under, once as SWE-bench's eval script runs it (`-rA`,
markers, the test exit code) and once as SWE-smith's does (`set -x`, its `--verbose` command on the FAIL_TO_PASS
files). The Django log is shipped (tests/fixtures/harness_logs/README.md says how it was made). Verdicts are checked
against swebench's own parser and grader for SWE-bench logs, and against SWE-smith's convention for its logs.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from swerl.data.schema import TaskInstance
from swerl.data.testrun import pytest_command
from swerl.grading.harness import (
    SWESMITH_TEST_CMD,
    SWESMITH_VERBOSE,
    HarnessSpecError,
    detect_log_formats,
    harness_for,
    harness_kind,
    parse_swesmith_verbose,
    swebench_spec,
)
from swerl.grading.verdict import DEFAULT_PARSER, grade_log

pytest.importorskip("swebench")

DATA = Path(__file__).parent.parent / "fixtures" / "harness_logs"
SWEBENCH_PYTEST = "pytest --no-header -rA --tb=no -p no:cacheprovider"
"""SWE-bench's pytest command for most Python repositories (swebench <= 4's TEST_PYTEST)."""

TEST_FILE = """\
import pytest


def test_pass():
    assert 1 + 1 == 2


@pytest.mark.parametrize("n", [1, 2, 3])
def test_param(n):
    assert n < 3


def test_fail():
    assert [1, 2] == [1, 3]


@pytest.fixture
def broken():
    raise RuntimeError("fixture setup failed")


def test_error(broken):
    pass


@pytest.mark.skip(reason="not on this platform")
def test_skip():
    pass


@pytest.mark.xfail(reason="known bug")
def test_xfail():
    assert False


@pytest.mark.xfail(reason="fixed upstream")
def test_xpass():
    pass
"""

T = "tests/test_mod.py::"
TRUTH = {
    f"{T}test_pass": "PASSED",
    f"{T}test_param[1]": "PASSED",
    f"{T}test_param[2]": "PASSED",
    f"{T}test_param[3]": "FAILED",
    f"{T}test_fail": "FAILED",
    f"{T}test_error": "ERROR",
    f"{T}test_skip": "SKIPPED",
    f"{T}test_xfail": "XFAIL",
    f"{T}test_xpass": "XPASS",
}
"""What pytest did with each test of TEST_FILE."""


def run_script(workdir: Path, lines: list[str]) -> str:
    """Run an eval script with bash in `workdir`, stdout and stderr in one stream (as a container's exec has
    them), `pytest` on PATH being this interpreter's."""
    bin_dir = workdir / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "pytest"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m pytest "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    script = workdir / "eval.sh"
    script.write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        ["bash", str(script)],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        check=False,
    )
    return done.stdout


def swebench_eval_script(workdir: Path, test_cmd: str) -> list[str]:
    """An eval script in swebench 5's shape: its own record_test_exit_code over the marked test command."""
    from swebench.harness.utils import parse_eval_script, record_test_exit_code
    from swebench.types import TestSpec

    body = f"cd {shlex.quote(str(workdir))}\n: '>>>>> Start Test Output'\n{test_cmd}\n: '>>>>> End Test Output'"
    spec = TestSpec(
        instance_id="x",
        image="",
        eval_script_list=record_test_exit_code(parse_eval_script(body)),
        repo="",
        version="",
        FAIL_TO_PASS=[],
        PASS_TO_PASS=[],
    )
    return spec.eval_script.splitlines()


def swesmith_eval_script(workdir: Path, test_cmd: str) -> list[str]:
    """SWE-smith's eval script (swesmith/harness/utils.py, without its conda activation)."""
    return [
        "#!/bin/bash",
        "set -uxo pipefail",
        f"cd {shlex.quote(str(workdir))}",
        ": '>>>>> Start Test Output'",
        test_cmd,
        ": '>>>>> End Test Output'",
    ]


def task(repo: str, f2p: list[str], p2p: list[str], kind: str = "swesmith") -> TaskInstance:
    return TaskInstance(
        instance_id=f"{repo.replace('/', '__')}.demo",
        repo=repo,
        base_commit="c" * 40,
        problem_statement="",
        patch="diff --git a/x b/x",
        patch_kind="fix" if kind == "swebench" else "bug",
        FAIL_TO_PASS=f2p,
        PASS_TO_PASS=p2p,
        source={"swesmith": "SWE-bench/SWE-smith", "swebench": "SWE-bench/SWE-bench"}.get(kind, kind),
    )


def swesmith_task(f2p: list[str], p2p: list[str]) -> TaskInstance:
    return task("swesmith/acme__shop.1234abcd", f2p, p2p)


def swebench_task(f2p: list[str], p2p: list[str], repo: str = "pytest-dev/pytest") -> TaskInstance:
    return task(repo, f2p, p2p, kind="swebench")


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The two real pytest logs of TEST_FILE: SWE-bench's (`-rA`) and SWE-smith's (`--verbose`)."""
    out: dict[str, str] = {}
    for name in ("swebench", "swesmith"):
        workdir = tmp_path_factory.mktemp(name)
        (workdir / "tests").mkdir()
        (workdir / "tests" / "test_mod.py").write_text(TEST_FILE)
        if name == "swebench":
            out[name] = run_script(workdir, swebench_eval_script(workdir, f"{SWEBENCH_PYTEST} tests/test_mod.py"))
        else:
            command = harness_for(swesmith_task([f"{T}test_pass"], [])).test_cmd
            out[name] = run_script(workdir, swesmith_eval_script(workdir, command))
    return out


def swebench_own(t: TaskInstance, log: str, parser: str = DEFAULT_PARSER) -> tuple[bool, dict, dict[str, str]]:
    """swebench's own grader on the log: (resolved, tests_status, its parser's status map)."""
    import tempfile

    from swebench.harness.grading import get_eval_report, get_logs_eval
    from swebench.types import TestSpec

    spec = TestSpec(
        instance_id=t.instance_id,
        image="",
        eval_script_list=[],
        repo=t.repo,
        version="",
        FAIL_TO_PASS=list(t.FAIL_TO_PASS),
        PASS_TO_PASS=list(t.PASS_TO_PASS),
        log_parser=parser,
        eval_type="pass_and_fail",
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "test_output.txt"
        path.write_text(log)
        report = get_eval_report(spec, {"instance_id": t.instance_id, "model_patch": "p"}, str(path), True)
        status_map, _ = get_logs_eval(spec, str(path))
    entry = report[t.instance_id]
    tests = {k: v for k, v in entry.get("tests_status", {}).items() if k in ("FAIL_TO_PASS", "PASS_TO_PASS")}
    return entry["resolved"], tests, status_map


# (FAIL_TO_PASS, PASS_TO_PASS, swebench's status on the -rA log, SWE-smith's status on the --verbose log)
CASES = [
    ([f"{T}test_param[1]", f"{T}test_param[2]"], [f"{T}test_pass"], "RESOLVED_FULL", "RESOLVED_FULL"),
    ([f"{T}test_param[3]"], [f"{T}test_pass"], "RESOLVED_NO", "RESOLVED_NO"),
    ([f"{T}test_param[1]", f"{T}test_param[3]"], [f"{T}test_pass"], "RESOLVED_PARTIAL", "RESOLVED_PARTIAL"),
    ([f"{T}test_pass"], [f"{T}test_fail"], "RESOLVED_NO", "RESOLVED_NO"),
    ([f"{T}test_pass"], [f"{T}test_error"], "RESOLVED_NO", "RESOLVED_NO"),
    ([f"{T}test_xfail"], [f"{T}test_pass"], "RESOLVED_FULL", "RESOLVED_FULL"),
    # -rA prints a skip as `SKIPPED [1] file:line: reason` (no id): swebench finds no result, a failure. SWE-smith
    # reads `SKIPPED` and counts it for neither side, so a FAIL_TO_PASS list of skips has nothing left to fail.
    ([f"{T}test_skip"], [f"{T}test_pass"], "RESOLVED_NO", "RESOLVED_FULL"),
    # XPASS is no swebench TestStatus: no result in either reading; missing fails for swebench, passes for SWE-smith.
    ([f"{T}test_xpass"], [], "RESOLVED_NO", "RESOLVED_FULL"),
    ([f"{T}test_not_collected"], [f"{T}test_pass"], "RESOLVED_NO", "RESOLVED_FULL"),
    # SWE-smith grades only tests in the FAIL_TO_PASS files (the files its command ran).
    ([f"{T}test_pass"], ["tests/test_other.py::test_y"], "RESOLVED_NO", "RESOLVED_FULL"),
]


def test_the_logs_are_real_runs_of_each_harness(logs: dict[str, str]) -> None:
    from swebench.harness.log_parsers import PARSER_REGISTRY

    rA, verbose = logs["swebench"], logs["swesmith"]
    assert f"+ {SWEBENCH_PYTEST} tests/test_mod.py" in rA and ">>>>> Test Exit Code: 1" in rA
    assert f"+ {SWESMITH_TEST_CMD} tests/test_mod.py" in verbose and "+ : '>>>>> End Test Output'" in verbose
    assert detect_log_formats(rA) == {"pytest-rA"} and detect_log_formats(verbose) == {"pytest-verbose"}
    # What each harness's parser reads from its own log is what pytest did, less what it has no word or id for.
    unread_by_rA = {f"{T}test_skip", f"{T}test_xpass"}  # `SKIPPED [1] ...` has no id; XPASS is no TestStatus
    assert PARSER_REGISTRY[DEFAULT_PARSER](rA, None) == {k: v for k, v in TRUTH.items() if k not in unread_by_rA}
    assert parse_swesmith_verbose(verbose) == {k: v for k, v in TRUTH.items() if k != f"{T}test_xpass"}
    # The issue: swebench's -rA parser on SWE-smith's log sees only pytest's default FAILED/ERROR summary lines.
    assert PARSER_REGISTRY[DEFAULT_PARSER](verbose, None) == {
        k: v for k, v in TRUTH.items() if v in ("FAILED", "ERROR")
    }


@pytest.mark.parametrize(("f2p", "p2p", "swebench_status", "swesmith_status"), CASES)
def test_rA_log_graded_as_swebench_grades_it(
    logs: dict[str, str], f2p: list[str], p2p: list[str], swebench_status: str, swesmith_status: str
) -> None:
    for t in (
        swebench_task(f2p, p2p),
        swesmith_task(f2p, p2p),
        task("micro/demo", f2p, p2p, kind="swerl-synth"),
    ):
        grade = grade_log(t, logs["swebench"])
        resolved, tests, _ = swebench_own(t, logs["swebench"])
        assert (grade.resolved, grade.tests) == (resolved, tests), t.repo
        assert grade.status == swebench_status and grade.log_valid and grade.parser == DEFAULT_PARSER
        assert grade.harness == ("swerl" if harness_kind(t) == "swerl" else "swebench")


@pytest.mark.parametrize(("f2p", "p2p", "swebench_status", "swesmith_status"), CASES)
def test_verbose_log_graded_as_swesmith_grades_it(
    logs: dict[str, str], f2p: list[str], p2p: list[str], swebench_status: str, swesmith_status: str
) -> None:
    for t in (swesmith_task(f2p, p2p), swebench_task(f2p, p2p)):  # the log's format decides, not the task
        grade = grade_log(t, logs["swesmith"])
        assert grade.harness == "swesmith" and grade.parser == SWESMITH_VERBOSE and grade.log_valid
        assert grade.status == swesmith_status and grade.resolved == (swesmith_status == "RESOLVED_FULL")
        graded = [x for x in [*f2p, *p2p] if x.startswith("tests/test_mod.py")]
        assert set(grade.assumed_passing) == {x for x in graded if x not in TRUTH or x == f"{T}test_xpass"}


def test_before_the_fix_a_verbose_log_counted_passing_tests_as_failed(logs: dict[str, str]) -> None:
    f2p, p2p = [f"{T}test_param[1]", f"{T}test_param[2]"], [f"{T}test_pass"]
    # swebench's -rA reading, which grade_log used for every log before:
    old = grade_log(swesmith_task(f2p, p2p), logs["swesmith"], parser=DEFAULT_PARSER)
    assert old.harness == "swebench" and not old.resolved and old.tests["FAIL_TO_PASS"]["failure"] == f2p
    assert grade_log(swesmith_task(f2p, p2p), logs["swesmith"]).resolved


def test_a_truncated_swesmith_log_is_invalid(logs: dict[str, str]) -> None:
    t = swesmith_task([f"{T}test_pass"], [])
    cut = logs["swesmith"].split("+ : '>>>>> End Test Output'")[0]
    assert grade_log(t, cut).status == "LOG_INVALID"
    timed_out = logs["swesmith"] + "\n>>>>> Tests Timed Out: 60 seconds exceeded"
    assert grade_log(t, timed_out).status == "LOG_INVALID"


def test_a_test_file_that_does_not_import(tmp_path: Path) -> None:
    """Nothing ran: SWE-smith's rule counts every FAIL_TO_PASS test missing from its log as passing, so its
    grader resolves the task; swerl says so too (the log came from its verbose command) and lists the tests it
    assumed. swebench's rule, on its -rA run, fails them."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_broken.py").write_text("import not_a_module\n\n\ndef test_f2p():\n    pass\n")
    t = swesmith_task(["tests/test_broken.py::test_f2p"], [])
    verbose = run_script(tmp_path, swesmith_eval_script(tmp_path, harness_for(t).test_cmd))
    assert "ERROR tests/test_broken.py" in verbose and detect_log_formats(verbose) == {"pytest-verbose"}
    grade = grade_log(t, verbose)
    assert grade.harness == "swesmith" and grade.resolved and grade.assumed_passing == tuple(t.FAIL_TO_PASS)
    rA = run_script(tmp_path, swebench_eval_script(tmp_path, f"{SWEBENCH_PYTEST} tests/test_broken.py"))
    swebench_t = swebench_task(list(t.FAIL_TO_PASS), [])
    assert not swebench_own(swebench_t, rA)[0] and grade_log(swebench_t, rA).status == "RESOLVED_NO"


def test_django_runner_log() -> None:
    """A real Django 5.2 `--verbosity 2` run (tests/fixtures/harness_logs/README.md): swebench's parse_log_django
    and swerl read the same statuses, and their verdicts agree with what the log says."""
    from swebench.harness.log_parsers import PARSER_REGISTRY

    log = (DATA / "django_verbosity2.log").read_text()
    assert detect_log_formats(log) == {"unittest"}
    c = "(shop.tests.{}.{})"
    names = {
        n: f"{n} {c.format(k, n)}"
        for k, ns in (
            ("TotalTests", ("test_total", "test_discount", "test_missing_item", "test_noisy", "test_described")),
            ("FormatTests", ("test_cents", "test_locale", "test_rounding")),
        )
        for n in ns
    }
    described = "Totals of an empty basket are zero."  # a docstring's first line stands for its test
    statuses = PARSER_REGISTRY["parse_log_django"](log, None)
    assert {k: statuses.get(v) for k, v in names.items()} == {
        "test_total": "PASSED",
        "test_discount": "FAILED",
        "test_missing_item": "ERROR",
        "test_noisy": "PASSED",  # its stderr line split `... ok` over two lines
        "test_described": None,
        "test_cents": "PASSED",
        "test_locale": "SKIPPED",
        "test_rounding": None,  # `... expected failure`: no status in swebench's reading
    }
    assert statuses[described] == "PASSED"
    cases = [
        (
            [names["test_total"], names["test_noisy"], described],
            [names["test_cents"], names["test_locale"]],
            True,
        ),
        ([names["test_discount"]], [names["test_total"]], False),
        ([names["test_total"]], [names["test_missing_item"]], False),
        ([names["test_rounding"]], [], False),
        ([names["test_locale"]], [], False),  # a skipped FAIL_TO_PASS test is no fix
    ]
    for f2p, p2p, expected in cases:
        for t in (
            swebench_task(f2p, p2p, repo="django/django"),
            task("acme/shop", f2p, p2p, kind="swerl-synth"),
        ):
            grade = grade_log(t, log)
            resolved, tests, _ = swebench_own(t, log, parser="parse_log_django")
            assert grade.parser == "parse_log_django" and grade.log_valid, t.repo
            assert (grade.resolved, grade.tests) == (resolved, tests) and resolved is expected, (t.repo, f2p)


FORGING_CONFTEST = """\
def pytest_unconfigure(config):  # after pytest's own summary: the last word on the test
    print("tests/test_forge.py::test_f2p PASSED")
    print("PASSED tests/test_forge.py::test_f2p")
"""


def test_a_log_that_prints_fake_passed_lines_is_trusted_as_a_log_trusting_harness_trusts_it(
    tmp_path: Path,
) -> None:
    """grade_log reads the log as its harness does, forged lines included: for SWE-smith's verbose reading, a
    conftest printing `<id> PASSED` after pytest's real FAILED line resolves the task, exactly as SWE-smith's own
    grader (which trusts the log) says. That is why grade_log is for third-party logs only: the policy is
    scored by the sealed runner (swerl/grading/grader.py), whose results code under test cannot forge.
    swebench's grader catches this one by the exit code: 1, with no failure left in the log."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_forge.py").write_text(
        "def test_f2p():\n    assert False\n\n\ndef test_ok():\n    pass\n"
    )
    (tmp_path / "conftest.py").write_text(FORGING_CONFTEST)
    t = swesmith_task(["tests/test_forge.py::test_f2p"], ["tests/test_forge.py::test_ok"])
    verbose = run_script(tmp_path, swesmith_eval_script(tmp_path, harness_for(t).test_cmd))
    assert "tests/test_forge.py::test_f2p FAILED" in verbose  # the real result, then the forged line
    grade = grade_log(t, verbose)
    assert grade.harness == "swesmith" and grade.resolved and grade.status == "RESOLVED_FULL"
    assert parse_swesmith_verbose(swesmith_region(verbose))["tests/test_forge.py::test_f2p"] == "PASSED"

    rA = run_script(tmp_path, swebench_eval_script(tmp_path, f"{SWEBENCH_PYTEST} tests/test_forge.py"))
    swebench_resolved, _, _ = swebench_own(swebench_task(list(t.FAIL_TO_PASS), list(t.PASS_TO_PASS)), rA)
    on_rA = grade_log(swebench_task(list(t.FAIL_TO_PASS), list(t.PASS_TO_PASS)), rA)
    assert not swebench_resolved and on_rA.status == "LOG_INVALID" and not on_rA.resolved


def swesmith_region(log: str) -> str:
    from swerl.grading.harness import swesmith_test_region

    region = swesmith_test_region(log)
    assert region is not None
    return region


# -- specs -------------------------------------------------------------------------------------------------


def test_swesmith_spec_is_its_profiles_command_on_the_fail_to_pass_files() -> None:
    t = swesmith_task(["tests/b/test_y.py::test_1", "tests/a/test_x.py::T::test_2", "tests/b/test_y.py::test_3"], [])
    spec = harness_for(t)
    assert spec.harness == "swesmith" and spec.rule == "swesmith" and spec.parser == SWESMITH_VERBOSE
    assert spec.test_cmd == f"{SWESMITH_TEST_CMD} tests/a/test_x.py tests/b/test_y.py"
    assert spec.test_files == ("tests/a/test_x.py", "tests/b/test_y.py")
    paramiko = harness_for(task("swesmith/paramiko__paramiko.23f92003", ["tests/test_a.py::t"], []))
    assert paramiko.test_cmd.startswith("pytest -rA ") and paramiko.parser == "swesmith.parse_log_paramiko"
    with pytest.raises(HarnessSpecError, match="tornadoweb/tornado"):
        harness_for(task("swesmith/tornadoweb__tornado.d5ac65c1", ["tornado.test.x"], []))
    with pytest.raises(HarnessSpecError, match="not pytest node ids"):
        harness_for(task("swesmith/gohugoio__hugo.1234abcd", ["TestShortcodes"], []))


def test_swerl_spec_is_todays_command() -> None:
    t = task("micro/demo", ["tests/test_a.py::t"], [], kind="swerl-synth")
    assert harness_for(t).test_cmd == pytest_command() and harness_for(t).parser == DEFAULT_PARSER
    own = t.model_copy(update={"test_cmd": "python run_tests.py"})
    assert harness_for(own).test_cmd == "python run_tests.py" and harness_for(own).harness == "swerl"


def test_swebench_spec_from_the_rows_eval_script(tmp_path: Path) -> None:
    script = "\n".join(swebench_eval_script(tmp_path, "./tests/runtests.py --verbosity 2 admin_views.tests"))
    spec = swebench_spec("django/django", "4.0", eval_script=script)
    assert spec.test_cmd == "./tests/runtests.py --verbosity 2 admin_views.tests"
    assert spec.parser == "parse_log_django" and spec.harness == "swebench"
    t = swebench_task(["a"], [], repo="django/django")
    assert harness_for(t, eval_script=script).test_cmd == spec.test_cmd
    with pytest.raises(HarnessSpecError, match="markers"):
        swebench_spec("django/django", "4.0", eval_script="#!/bin/bash\npytest\n")


def test_swebench_spec_from_map_repo_version_to_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed swebench (5.0.2) moved test commands into each row's eval_script and ships no table: asking
    for one without the row is a clear error, never a guess. With swebench <= 4's table, it is looked up."""
    import swebench.harness.constants as constants

    t = swebench_task(["a"], [], repo="django/django")
    if not hasattr(constants, "MAP_REPO_VERSION_TO_SPECS"):
        with pytest.raises(HarnessSpecError, match=r"django/django version '3\.0'.*eval_script"):
            harness_for(t, version="3.0")
    table = {
        "django/django": {
            "3.0": {"test_cmd": "./tests/runtests.py --verbosity 2 --settings=test_sqlite"},
            "3.1": {"test_cmd": "./tests/runtests.py --verbosity 2 --parallel 1"},
        },
        "sympy/sympy": {"1.1": {"test_cmd": "bin/test -C --verbose"}},
    }
    monkeypatch.setattr(constants, "MAP_REPO_VERSION_TO_SPECS", table, raising=False)
    spec = harness_for(t, version="3.0")
    assert spec.test_cmd == "./tests/runtests.py --verbosity 2 --settings=test_sqlite"
    assert spec.parser == "parse_log_django" and "MAP_REPO_VERSION_TO_SPECS" in spec.source
    assert swebench_spec("sympy/sympy", "1.1").parser == "parse_log_sympy"
    with pytest.raises(HarnessSpecError, match=r"django/django version '9\.9'; known versions: 3\.0, 3\.1"):
        harness_for(t, version="9.9")
    with pytest.raises(HarnessSpecError, match="django/django.*known versions"):
        harness_for(t)  # TaskInstance carries no version
    with pytest.raises(HarnessSpecError, match="astropy/astropy"):
        swebench_spec("astropy/astropy", "5.0")
    with pytest.raises(HarnessSpecError, match="acme/unknown"):
        swebench_spec("acme/unknown", "1.0")
