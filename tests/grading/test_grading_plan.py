"""What the grader runs for a task of each of SWE-bench Verified's 12 repositories (their rows as swebench 5
publishes them: tests/fixtures/task_rows/swebench5_verified.jsonl), for SWE-smith and for swerl's own tasks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swerl.data.loaders import load_tasks
from swerl.data.micro import TEST_CMD as MICRO_TEST_CMD
from swerl.data.schema import TaskInstance
from swerl.grading.plan import HarnessSpecError, grading_plan, pytest_invocation

ROWS = Path(__file__).parent.parent / "fixtures" / "task_rows" / "swebench5_verified.jsonl"

# repository -> (sealed runner mode or None, the start of what it runs, the log parser where unsealed)
EXPECTED = {
    "astropy/astropy": ("pytest", ["-rA", "astropy/modeling/tests/test_separable.py"], None),
    "django/django": ("unittest", ["./tests/runtests.py", "--verbosity", "2", "--settings=test_sqlite"], None),
    "matplotlib/matplotlib": ("pytest", ["-rA", "lib/mpl_toolkits/tests/test_mplot3d.py"], None),
    "mwaskom/seaborn": ("pytest", ["--no-header", "-rA", "tests/_core/test_plot.py"], None),
    "pallets/flask": ("pytest", ["-rA", "tests/test_blueprints.py"], None),
    "psf/requests": ("pytest", ["-rA", "test_requests.py"], None),
    "pydata/xarray": ("pytest", ["-rA", "xarray/tests/test_dataset.py"], None),
    "pylint-dev/pylint": ("pytest", ["-rA", "tests/test_self.py"], None),
    "pytest-dev/pytest": (None, "pytest -rA testing/logging/test_reporting.py", "parse_log_pytest"),
    "scikit-learn/scikit-learn": ("pytest", ["-rA", "sklearn/mixture/tests/test_bayesian_mixture.py"], None),
    "sphinx-doc/sphinx": (None, "tox --current-env -epy39 -v -- tests/test_ext_viewcode.py", "parse_log_sphinx"),
    "sympy/sympy": (
        None,
        "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose",
        "parse_log_sympy",
    ),
}


def test_each_verified_repository_is_run_with_its_own_harness() -> None:
    tasks, _ = load_tasks(str(ROWS), "swebench")
    assert {t.repo for t in tasks} == set(EXPECTED)
    for task in tasks:
        mode, start, parser = EXPECTED[task.repo]
        plan = grading_plan(task)
        assert plan.mode == mode, task.repo
        if mode == "unittest":  # the runner gets the command's argv (JSON) first, then the ids
            assert json.loads(plan.args[0])[: len(start)] == start
            assert plan.args[1:] == (*task.FAIL_TO_PASS, *task.PASS_TO_PASS)
        elif mode == "pytest":  # the harness's own arguments: its targets, not the node ids
            assert list(plan.args[: len(start)]) == start, (task.repo, plan.args)
        else:  # unsealed: the harness's command between the markers, read by the harness's parser
            assert plan.command.startswith(start) and plan.parser == parser, (task.repo, plan)


def task(**update: object) -> TaskInstance:
    base = TaskInstance(
        instance_id="x__y-1",
        repo="x/y",
        base_commit="0" * 40,
        problem_statement="p",
        patch="diff",
        patch_kind="fix",
        FAIL_TO_PASS=["tests/test_a.py::test_a"],
        PASS_TO_PASS=["tests/test_a.py::test_b"],
        source="swerl-synth",
    )
    return base.model_copy(update=update)


def test_swerls_own_tasks_run_pytest_on_their_ids_or_their_command() -> None:
    own = task(patch_kind="bug")
    assert grading_plan(own).mode == "pytest" and grading_plan(own).args == (
        "tests/test_a.py::test_a",
        "tests/test_a.py::test_b",
    )
    assert grading_plan(own.model_copy(update={"test_cmd": MICRO_TEST_CMD})).mode == "micro"
    flagged = grading_plan(own.model_copy(update={"test_cmd": "FOO=1 python -m pytest -x -q"}))
    assert flagged.mode == "pytest" and flagged.env == ("FOO=1",) and flagged.args[:2] == ("-x", "-q")
    shell = grading_plan(own.model_copy(update={"test_cmd": "make test && echo done"}))
    assert shell.mode is None and shell.command.startswith("make test && echo done")


def test_a_swebench_row_with_no_harness_runs_its_pytest_ids_or_is_refused() -> None:
    assert grading_plan(task()).mode == "pytest"  # node ids: pytest runs them
    django = task(repo="django/django", FAIL_TO_PASS=["test_a (app.tests.T.test_a)"], PASS_TO_PASS=[])
    with pytest.raises(HarnessSpecError, match="x__y-1"):
        grading_plan(django)


def test_swesmith_rows_run_their_profiles_command_and_grade_only_its_files() -> None:
    smith = task(
        repo="swesmith/pallets__click.fde47b4b",
        source="SWE-bench/SWE-smith",
        patch_kind="bug",
        PASS_TO_PASS=["tests/test_a.py::test_b", "tests/test_other.py::test_c"],
    )
    plan = grading_plan(smith)
    assert plan.mode == "pytest" and plan.args[-1] == "tests/test_a.py" and "--verbose" in plan.args
    assert plan.graded_files == ("tests/test_a.py",)


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("pytest -rA t.py", ((), ("-rA", "t.py"))),
        ("python3 -m pytest t.py::a", ((), ("t.py::a",))),
        ("A=1 B='x y' pytest", (("A=1", "B=x y"), ())),
        ("/opt/venv/bin/pytest -q", ((), ("-q",))),
        ("pytest t.py | tee log", None),
        ("tox -e py39 -- pytest", None),
        ("bin/test -C", None),
        ("pytest 'unclosed", None),
    ],
)
def test_pytest_invocations_are_taken_apart_or_left_to_the_shell(command: str, expected: object) -> None:
    assert pytest_invocation(command) == expected


def test_the_sealed_runner_passes_pytest_the_flags_swerls_own_runs_use() -> None:
    """The runner is one script with no swerl import, so it spells swerl.data.testrun.PYTEST_ARGS out itself."""
    import ast

    from swerl.data.testrun import PYTEST_ARGS
    from swerl.grading.grader import runner_source

    lists = [
        [e.value for e in node.value.elts]
        for node in ast.walk(ast.parse(runner_source()))
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.List)
        and [getattr(t, "id", None) for t in node.targets] == ["args"]
    ]
    assert list(PYTEST_ARGS) in lists
