"""Rows of each published source (SWE-bench 5, SWE-bench Pro, SWE-rebench) and swerl's own task files loaded
through the same `load_tasks` path as any local dataset, with their images and harnesses; the harness swerl's
grader would run for a row of each of SWE-bench Verified's 12 repositories; dataset revisions.

The rows are tests/fixtures/task_rows/*.jsonl (README there): nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from swerl.config.data import CurateConfig, DatasetSource
from swerl.data.loaders import RowError, SchemaMismatch, load_tasks, rows_to_tasks, task_schema_of
from swerl.data.schema import TaskInstance
from swerl.data.sources import END_TEST_OUTPUT, NON_TEST_EXTS, START_TEST_OUTPUT, rebench_eval_script
from swerl.data.taskio import tasks_to_parquet
from swerl.stages.runner import stage_key

pytest.importorskip("swebench")

from swerl.grading.harness import HarnessSpecError, command_formats, harness_for, parser_format  # noqa: E402

ROWS = Path(__file__).parent.parent / "fixtures" / "task_rows"
PYTEST_RA = "pytest -rA"
SYMPY = "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose"

VERIFIED: dict[str, tuple[str, str]] = {
    "astropy/astropy": (f"{PYTEST_RA} astropy/modeling/tests/test_separable.py", "parse_log_astropy"),
    "django/django": (
        "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 auth_tests.test_validators",
        "parse_log_django",
    ),
    "matplotlib/matplotlib": (f"{PYTEST_RA} lib/mpl_toolkits/tests/test_mplot3d.py", "parse_log_matplotlib"),
    "mwaskom/seaborn": ("pytest --no-header -rA tests/_core/test_plot.py", "parse_log_seaborn"),
    "pallets/flask": (f"{PYTEST_RA} tests/test_blueprints.py", "parse_log_flask"),
    "psf/requests": (f"{PYTEST_RA} test_requests.py", "parse_log_requests"),
    "pydata/xarray": (f"{PYTEST_RA} xarray/tests/test_dataset.py", "parse_log_xarray"),
    "pylint-dev/pylint": (f"{PYTEST_RA} tests/test_self.py", "parse_log_pylint"),
    "pytest-dev/pytest": (f"{PYTEST_RA} testing/logging/test_reporting.py", "parse_log_pytest"),
    "scikit-learn/scikit-learn": (
        f"{PYTEST_RA} sklearn/mixture/tests/test_bayesian_mixture.py sklearn/mixture/tests/test_gaussian_mixture.py",
        "parse_log_scikit",
    ),
    "sphinx-doc/sphinx": ("tox --current-env -epy39 -v -- tests/test_ext_viewcode.py", "parse_log_sphinx"),
    "sympy/sympy": (f"{SYMPY} sympy/core/tests/test_basic.py", "parse_log_sympy"),
}
"""Verified's 12 repositories: the command swebench's eval script runs for the row, and swebench's parser."""


def rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (ROWS / name).read_text().splitlines() if line]


def as_parquet(tmp_path: Path, name: str) -> str:
    path = tmp_path / name.replace(".jsonl", ".parquet")
    pq.write_table(pa.Table.from_pylist(rows(name)), path)
    return str(path)


@pytest.mark.parametrize("form", ["jsonl", "parquet"])
def test_a_row_of_each_verified_repository_carries_its_own_harness(tmp_path: Path, form: str) -> None:
    path = (
        str(ROWS / "swebench5_verified.jsonl") if form == "jsonl" else as_parquet(tmp_path, "swebench5_verified.jsonl")
    )
    tasks, report = load_tasks(path, "swebench", split="test")
    assert report.accepted == 12 and not report.rejected
    assert {t.repo for t in tasks} == set(VERIFIED)
    by_id = {r["instance_id"]: r for r in rows("swebench5_verified.jsonl")}
    for task in tasks:
        row = by_id[task.instance_id]
        assert (task.version, task.eval_script, task.log_parser) == (
            row["version"],
            row["eval_script"],
            row["log_parser"],
        )
        assert task.image == row["image"] and task.patch_kind == "fix" and task.difficulty == row["difficulty"]
        spec = harness_for(task)
        command, parser = VERIFIED[task.repo]
        assert (spec.harness, spec.test_cmd, spec.parser) == ("swebench", command, parser), task.instance_id
        # and without the row's parser name, swebench's parser for the repository is the same one
        assert harness_for(task.model_copy(update={"log_parser": None})).parser == parser
    commands = {t.repo: harness_for(t).test_cmd for t in tasks}
    assert command_formats(commands["django/django"]) == {"unittest"}
    assert parser_format(VERIFIED["django/django"][1]) == "unittest"
    assert (
        commands["sympy/sympy"].startswith("PYTHONWARNINGS=") and " bin/test -C --verbose " in commands["sympy/sympy"]
    )
    pytest_repos = set(VERIFIED) - {"django/django", "sympy/sympy", "sphinx-doc/sphinx"}
    assert all(command_formats(commands[r]) == {"pytest-rA"} for r in pytest_repos)
    # sphinx runs pytest -rA through tox (the image's tox.ini), read by a -rA parser
    assert all(parser_format(VERIFIED[r][1]) == "pytest-rA" for r in pytest_repos | {"sphinx-doc/sphinx"})


def test_the_command_is_the_same_once_swebench_records_the_exit_code() -> None:
    """swebench 5's run_evaluation inserts `SWEBENCH_TEST_EXIT_CODE=$?` after the command (make_test_spec): the
    command swerl reads from the script it would run is unchanged."""
    from swebench.harness.utils import make_test_spec

    tasks, _ = load_tasks(str(ROWS / "swebench5_verified.jsonl"), "swebench")
    by_id = {r["instance_id"]: r for r in rows("swebench5_verified.jsonl")}
    for task in tasks:
        spec = make_test_spec(by_id[task.instance_id])
        assert spec.image == task.image and spec.log_parser == task.log_parser
        recorded = task.model_copy(update={"eval_script": spec.eval_script})
        assert "SWEBENCH_TEST_EXIT_CODE=$?" in spec.eval_script
        assert harness_for(recorded).test_cmd == VERIFIED[task.repo][0]


def test_a_swebench_task_with_no_harness_is_a_clear_error() -> None:
    row = rows("swebench5_verified.jsonl")[1]
    del row["eval_script"]
    (task,), _ = rows_to_tasks([row], "swebench", source="princeton-nlp/SWE-bench_Verified")
    assert task.version == "3.0" and task.eval_script is None
    with pytest.raises(HarnessSpecError) as caught:
        harness_for(task)
    message = str(caught.value)
    assert "django__django-11099" in message and "princeton-nlp/SWE-bench_Verified" in message
    assert "version '3.0'" in message and "eval_script" in message
    bad = rows("swebench5_verified.jsonl")[0] | {"log_parser": "parse_log_nothing"}
    (task,), _ = rows_to_tasks([bad], "swebench", source="mem")
    with pytest.raises(HarnessSpecError, match=r"astropy__astropy-12907.*'parse_log_nothing'"):
        harness_for(task)


def test_an_eval_script_without_markers_is_rejected_naming_the_field() -> None:
    row = rows("swebench5_verified.jsonl")[0] | {"eval_script": "#!/bin/bash\npytest -rA\n"}
    with pytest.raises(RowError, match=r"row 0 \(astropy__astropy-12907\): eval_script: has no"):
        rows_to_tasks([row], "swebench", source="mem", strict=True)


def test_the_markers_and_test_suffixes_are_swebenchs() -> None:
    from swebench.harness import constants

    assert (START_TEST_OUTPUT, END_TEST_OUTPUT) == (constants.START_TEST_OUTPUT, constants.END_TEST_OUTPUT)
    assert list(NON_TEST_EXTS) == list(constants.NON_TEST_EXTS)


def test_swebench_pro_rows_keep_their_image_statement_and_tests(tmp_path: Path) -> None:
    for path in (str(ROWS / "swebench_pro.jsonl"), as_parquet(tmp_path, "swebench_pro.jsonl")):
        tasks, report = load_tasks(path, "swebench_pro", split="test")
        assert report.accepted == 2 and not report.rejected
        python, js = tasks
        raw = rows("swebench_pro.jsonl")
        assert python.image == f"jefzda/sweap-images:{raw[0]['dockerhub_tag']}"
        assert js.image == f"jefzda/sweap-images:{raw[1]['dockerhub_tag']}"
        # a Python list literal (single and double quotes) and a JSON list: the same kind of list
        assert python.FAIL_TO_PASS == [
            "tests/unit/utils/test_urlutils.py::test_safe_display[http://user:pw@host/-http://user@host/]",
            "tests/unit/utils/test_urlutils.py::test_safe_display[ftp://h/-ftp://h/]",
        ]
        assert js.FAIL_TO_PASS == ["test/translator.js | Translator shim .translate() should not allow path traversal"]
        # what the agent sees: the issue, then the requirements and the new interfaces, as Pro's harness shows them
        assert python.problem_statement.startswith(raw[0]["problem_statement"])
        assert f"\n\nRequirements:\n{raw[0]['requirements']}" in python.problem_statement
        assert python.problem_statement.endswith(f"\n\nNew interfaces introduced:\n{raw[0]['interface']}")
        assert python.patch_kind == "fix" and python.test_patch == raw[0]["test_patch"]
    # its tests run through per-instance scripts the rows do not hold: asking for its harness says so
    with pytest.raises(HarnessSpecError, match=r"SWE-bench task instance_qutebrowser__qutebrowser-.*eval_script"):
        harness_for(python)


@pytest.mark.parametrize(
    "change,field",
    [
        ({"fail_to_pass": "not a list ["}, "fail_to_pass"),
        ({"fail_to_pass": "{'a': 1}"}, "fail_to_pass"),
        ({"fail_to_pass": "[]"}, "FAIL_TO_PASS"),
        ({"dockerhub_tag": "bad tag:with space"}, "dockerhub_tag"),
        ({"dockerhub_tag": None}, "dockerhub_tag"),
    ],
)
def test_bad_swebench_pro_rows_name_the_row_and_field(change: dict[str, Any], field: str) -> None:
    good, other = rows("swebench_pro.jsonl")
    tasks, report = rows_to_tasks([good, other | change], "swebench_pro", source="mem")
    assert [t.instance_id for t in tasks] == [good["instance_id"]]
    (rejection,) = report.rejected
    assert (rejection.row, rejection.instance_id, rejection.field) == (1, other["instance_id"], field)


def test_swerebench_rows_carry_their_image_and_a_harness_from_install_config(tmp_path: Path) -> None:
    tasks, report = load_tasks(as_parquet(tmp_path, "swerebench.jsonl"), "swerebench", split="test")
    assert report.accepted == 2 and not report.rejected
    tespy, spectree = tasks
    raw = rows("swerebench.jsonl")
    assert tespy.image == raw[0]["docker_image"] == "swerebench/sweb.eval.x86_64.oemof_1776_tespy-653"
    assert tespy.version == "0.8" and tespy.log_parser == "parse_log_pytest"
    spec = harness_for(tespy)
    test_cmd = raw[0]["install_config"]["test_cmd"]
    assert spec.test_cmd == f"{test_cmd} tests/test_components/test_heat_exchanger.py"
    assert spec.parser == "parse_log_pytest" and command_formats(spec.test_cmd) == {"pytest-rA"}
    # the modified test file is reset to the base commit around the run; a created one is removed
    assert f"git checkout {raw[0]['base_commit']} tests/test_components/test_heat_exchanger.py" in tespy.eval_script
    assert spectree.eval_script is not None and "rm -f tests/test_param_desc.py" in spectree.eval_script
    assert harness_for(spectree).test_cmd.endswith(" tests/test_param_desc.py")
    # without docker_image: SWE-rebench's own name for the instance image
    row = {k: v for k, v in raw[1].items() if k != "docker_image"}
    (task,), _ = rows_to_tasks([row], "swerebench", source="mem")
    assert task.image == "swerebench/sweb.eval.x86_64.0b01001001_1776_spectree-64:latest"


def test_swerebench_scripts_run_under_swebench_5s_exit_code_rule() -> None:
    from swebench.harness.utils import make_test_spec

    (task, _), _ = load_tasks(str(ROWS / "swerebench.jsonl"), "swerebench")
    spec = make_test_spec({**task.model_dump(), "eval_type": "pass_and_fail"})
    assert "SWEBENCH_TEST_EXIT_CODE=$?" in spec.eval_script
    assert harness_for(task.model_copy(update={"eval_script": spec.eval_script})).test_cmd == harness_for(task).test_cmd
    assert rebench_eval_script("abc", "", ["make", "pytest -rA"]).count(": no test patch") == 1


@pytest.mark.parametrize(
    "config,field",
    [({"test_cmd": ""}, "install_config.test_cmd"), ({"log_parser": None}, "install_config.log_parser")],
)
def test_bad_swerebench_rows_name_the_row_and_field(config: dict[str, Any], field: str) -> None:
    good, other = rows("swerebench.jsonl")
    bad = other | {"install_config": other["install_config"] | config}
    with pytest.raises(RowError, match=rf"row 1 \(0b01001001__spectree-64\): {field}: missing or empty"):
        rows_to_tasks([good, bad], "swerebench", source="mem", strict=True)
    with pytest.raises(RowError, match=r"row 0 \(oemof__tespy-653\): install_config: expected a mapping"):
        rows_to_tasks([good | {"install_config": 7}], "swerebench", source="mem", strict=True)


def swerl_tasks() -> list[TaskInstance]:
    (bench,), _ = rows_to_tasks(rows("swebench5_verified.jsonl")[:1], "swebench", source="hub", split="eval")
    micro = TaskInstance(
        instance_id="micro-eval-0.flip",
        repo="swerl-micro/eval-0",
        base_commit="0" * 8,
        problem_statement="The comparison is inverted.",
        patch="diff --git a/m.py b/m.py\n",
        patch_kind="bug",
        FAIL_TO_PASS=["tests/test_m.py::test_a"],
        image="micro://eval/0/0",
        test_cmd="python run_tests.py",
        source="swerl-synth",
        split="eval",
    )
    return [micro, bench]


def test_swerl_task_files_load_as_written_and_are_refused_under_a_published_schema(tmp_path: Path) -> None:
    path = tmp_path / "eval.parquet"
    path.write_bytes(tasks_to_parquet(swerl_tasks()))
    tasks, report = load_tasks(str(path), "swerl", split="train")
    assert tasks == swerl_tasks() and not report.rejected  # image, test_cmd, source, split: all as written
    assert task_schema_of(rows("swebench_pro.jsonl")[0]) == "swebench_pro"
    assert task_schema_of(rows("swerebench.jsonl")[0]) == "swerebench"
    assert task_schema_of(swerl_tasks()[0].model_dump()) == "swerl"
    # read as SWE-bench or SWE-smith rows, the micro task would lose its environment: the whole file is refused
    for schema in ("swebench", "swesmith"):
        with pytest.raises(SchemaMismatch, match=r"row 0 .*micro://eval/0/0.*set the dataset's schema to swerl"):
            load_tasks(str(path), schema)  # type: ignore[arg-type]


def test_a_revision_pins_hub_rows_and_is_part_of_the_curate_key(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import datasets

    local = str(ROWS / "swerebench.jsonl")
    with pytest.raises(ValueError, match=r"revision 'abc123' given for a local path"):
        load_tasks(local, "swerebench", revision="abc123")
    calls: list[tuple[str, dict[str, Any]]] = []
    real = datasets.load_dataset

    def hub(path: str, **kwargs: Any) -> Any:  # the hub's answer, from the shipped rows: nothing downloaded
        calls.append((path, kwargs))
        return real("json", data_files=local, split="train")

    monkeypatch.setattr(datasets, "load_dataset", hub)
    tasks, _ = load_tasks("nebius/SWE-rebench", "swerebench", split="test", revision="4c1e2f0")
    assert calls == [("nebius/SWE-rebench", {"split": "test", "revision": "4c1e2f0"})]
    assert {t.source for t in tasks} == {"nebius/SWE-rebench@4c1e2f0"}

    def curate_key(revision: str | None) -> str:
        source = DatasetSource(schema="swerebench", path="nebius/SWE-rebench", split="test", revision=revision)
        return stage_key("curate", CurateConfig(repos=[], datasets=[source]), [])

    assert len({curate_key(None), curate_key("4c1e2f0"), curate_key("9d8b7a6")}) == 3
    with pytest.raises(ValueError, match="revision"):
        DatasetSource(schema="swebench", path="x/y", revision="-rf /")


def test_the_recipes_evaluation_grades_django_and_sympy_with_their_own_commands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """configs/qwen3-30b-a3b.yaml evaluates on swebench 5's own Verified rows: loaded as that config loads them
    (the hub answered by the shipped rows of the same shape), every task carries the command its repository runs."""
    import datasets

    from swerl.config import load_config

    source = load_config(Path(__file__).resolve().parents[2] / "configs" / "qwen3-30b-a3b.yaml").evaluate.dataset
    assert source is not None and (source.schema_name, source.path) == (
        "swebench",
        "SWE-bench/SWE-bench_Verified",
    )
    shipped = str(ROWS / "swebench5_verified.jsonl")
    monkeypatch.setattr(datasets, "load_dataset", lambda path, **kw: datasets.Dataset.from_json(shipped))
    tasks, _ = load_tasks(source.path, source.schema_name, source.split, source.limit, revision=source.revision)
    commands = {t.repo: harness_for(t).test_cmd for t in tasks}
    assert commands == {repo: command for repo, (command, _) in VERIFIED.items()}
    assert commands["django/django"].startswith("./tests/runtests.py --verbosity 2 --settings=test_sqlite ")
    assert commands["sympy/sympy"].startswith(SYMPY)
