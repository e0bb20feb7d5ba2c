"""Micro repositories: deterministic generation, the harness against real pytest, synthesis, grading, curation."""

from __future__ import annotations

import ast
import asyncio
import builtins
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from swerl.config.data import CurateConfig, MicroSource
from swerl.data.bugs import candidates
from swerl.data.environments import resolve_environment
from swerl.data.micro import (
    GENERATOR_VERSION,
    TEST_CMD,
    materialize_micro_repo,
    micro_image,
    micro_repo_files,
    micro_repo_spec,
    micro_split,
    parse_micro_image,
    render_repo,
    vocabulary,
)
from swerl.data.micro_templates import TEMPLATES
from swerl.data.repos import is_test_file, source_files, tree_hash
from swerl.data.schema import TaskInstance
from swerl.data.synth import synthesize_repo
from swerl.data.taskio import tasks_from_parquet
from swerl.data.testrun import TestStatus, parse_pytest_summary, passing, run_tests, task_test_command
from swerl.errors import InfraError
from swerl.grading.grader import grade_workspace, start_task_sandbox
from swerl.stages.curate import run_curate, split_by_repo
from swerl.stages.runner import run_stage
from swerl.storage import Store
from swerl.tracking import Tracker
from tests.sandbox_helpers import local_provider

MODIFIERS = ["flip_comparison", "swap_binop", "negate_condition", "off_by_one", "swap_call_args"]
GOLDEN_TRAIN_0_0 = "abe06016d0bb72ad7054577586a4b225188da26ab6666e4cd09efb8fb2e1fa07"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Micro repositories materialize under a per-session directory, never the user's ~/.cache."""
    monkeypatch.setenv("SWERL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "swerl-cache"))


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def harness(root: Path, *ids: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "run_tests.py", *ids], cwd=root, capture_output=True, text=True, timeout=60)


def template_groups() -> list[list[str]]:
    """Every template, in groups of five per repository (names stay unique within a module)."""
    names = [t.name for t in TEMPLATES]
    return [names[i : i + 5] for i in range(0, len(names), 5)]


def by_name(names: list[str]):
    return [t for t in TEMPLATES if t.name in names]


def test_generation_is_deterministic(tmp_path: Path):
    files = micro_repo_files("train", 0, 7)
    assert files == micro_repo_files("train", 0, 7)
    assert set(files) == {"mod.py", "run_tests.py", "tests/conftest.py", "tests/test_mod.py"}
    assert files != micro_repo_files("train", 0, 8) and files != micro_repo_files("train", 1, 7)
    a = materialize_micro_repo("train", 0, 7, tmp_path / "a")
    b = materialize_micro_repo("train", 0, 7, tmp_path / "b")
    assert a == tmp_path / "a" / "train-0-7" and tree_hash(a) == tree_hash(b)
    inode = a.stat().st_ino
    assert materialize_micro_repo("train", 0, 7, tmp_path / "a") == a and a.stat().st_ino == inode  # reused
    (a / "mod.py").write_text("stale\n")  # left by another generator build, or edited: replaced
    assert materialize_micro_repo("train", 0, 7, tmp_path / "a") == a and tree_hash(a) == tree_hash(b)
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".")]  # no staging left behind
    assert tree_hash(materialize_micro_repo("train", 0, 8, tmp_path / "a")) != tree_hash(a)


def test_generation_is_pinned():
    """Same bytes on every machine: a change here must come with a GENERATOR_VERSION bump."""
    files = micro_repo_files("train", 0, 0)
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    assert (GENERATOR_VERSION, digest) == (3, GOLDEN_TRAIN_0_0), files["mod.py"]


def test_subprocess_generation_matches_under_hash_randomization():
    code = (
        "import json, sys; from swerl.data.micro import micro_repo_files; "
        "print(json.dumps(micro_repo_files('eval', 3, 5)))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": s},
        ).stdout
        for s in ("1", "2")
    }
    assert len(outputs) == 1 and json.loads(outputs.pop()) == micro_repo_files("eval", 3, 5)


def identifier_parts(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef):
            names.add(node.name)
            names |= {a.arg for a in node.args.args}
        elif isinstance(node, ast.Name):
            names.add(node.id)
    names -= set(dir(builtins)) | {"_"}
    return {part for name in names for part in name.split("_")}


def test_vocabularies_are_disjoint_and_splits_use_their_own():
    train, held_out = set(vocabulary("train")), set(vocabulary("eval"))
    assert len(train) > 1000 and len(held_out) > 1000 and not train & held_out
    for split, words in (("train", train), ("eval", held_out)):
        for index in range(10):
            assert identifier_parts(micro_repo_files(split, 0, index)["mod.py"]) <= words
    with pytest.raises(ValueError, match="split"):
        micro_repo_files("test", 0, 0)


def test_modules_are_small_and_formatted():
    for index in range(40):
        files = micro_repo_files("train", 0, index)
        source = files["mod.py"]
        tree = ast.parse(source)
        functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        assert 2 <= len(functions) <= 3 and source.count("\n") <= 25
        assert all(2 <= (f.end_lineno or 0) - f.lineno + 1 <= 7 for f in functions)
        assert '"""' not in source and "#" not in source and "\t" not in source
        tests = [line for line in files["tests/test_mod.py"].splitlines() if line.startswith("def test_")]
        assert len(tests) == 3 * len(functions)


def test_every_template_has_a_site_and_every_modifier_is_reached():
    reached = dict.fromkeys(MODIFIERS, 0)
    for template in TEMPLATES:
        source = render_repo([template], "train", f"sites:{template.name}")["mod.py"]
        found = {m: len(candidates(m, "mod.py", source)) for m in MODIFIERS}
        assert sum(found.values()) >= 1, template.name
        for m, n in found.items():
            reached[m] += n > 0
    assert all(n >= 3 for n in reached.values()), reached


@pytest.mark.parametrize("group", template_groups(), ids=lambda g: g[0])
def test_clean_tests_pass_under_the_harness_and_pytest(tmp_path: Path, group: list[str]):
    root = write(tmp_path, render_repo(by_name(group), "eval", f"group:{group[0]}"))
    ran = harness(root)
    outcomes = parse_pytest_summary(ran.stdout)
    assert ran.returncode == 0 and len(outcomes) >= 3 * len(group), ran.stdout + ran.stderr
    assert all(o.status is TestStatus.PASSED for o in outcomes.values())
    assert ran.stdout.splitlines()[-1] == f"{len(outcomes)} passed"
    real = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "tests"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert real.returncode == 0, real.stdout
    assert parse_pytest_summary(real.stdout) == outcomes


def test_plain_pytest_finds_mod_from_the_tests_directory(tmp_path: Path):
    root = write(tmp_path, micro_repo_files("train", 0, 3))
    pytest_bin = Path(sys.executable).parent / "pytest"
    ran = subprocess.run(
        [str(pytest_bin), "-q", "-p", "no:cacheprovider", "."],
        cwd=root / "tests",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout


def test_harness_reports_failures_errors_and_selected_ids(tmp_path: Path):
    files = micro_repo_files("train", 0, 11)
    root = write(tmp_path, files)
    ids = list(parse_pytest_summary(harness(root).stdout))
    bug = next(
        c for m in ("swap_binop", "off_by_one", "negate_condition") for c in candidates(m, "mod.py", files["mod.py"])
    )
    subprocess.run(["git", "apply", "-"], input=bug.bug_patch, cwd=root, text=True, check=True)
    ran = harness(root)
    outcomes = parse_pytest_summary(ran.stdout)
    failed = sorted(n for n, o in outcomes.items() if o.status is TestStatus.FAILED)
    assert ran.returncode == 1 and failed and set(outcomes) == set(ids)
    assert all(outcomes[n].message.split(":")[0].endswith("Error") for n in failed)
    assert ran.stdout.splitlines()[-1] == f"{len(failed)} failed, {len(ids) - len(failed)} passed"

    selected = harness(root, ids[0], "tests/test_mod.py::test_absent")
    picked = parse_pytest_summary(selected.stdout)
    assert set(picked) == {ids[0], "tests/test_mod.py::test_absent"}
    assert picked["tests/test_mod.py::test_absent"].status is TestStatus.ERROR
    assert selected.returncode == 1 and selected.stdout.splitlines()[-1].endswith("1 error")

    (root / "mod.py").write_text(files["mod.py"].replace("return", "return return", 1))
    broken = harness(root)
    outcomes = parse_pytest_summary(broken.stdout)
    assert broken.returncode == 1 and set(outcomes) == set(ids)
    assert all(o.status is TestStatus.ERROR and o.message.startswith("SyntaxError") for o in outcomes.values())


def test_harness_stops_a_looping_test(tmp_path: Path):
    root = write(tmp_path, micro_repo_files("train", 0, 11))
    name = ast.parse((root / "mod.py").read_text()).body[0].name  # type: ignore[attr-defined]
    (root / "mod.py").write_text(
        (root / "mod.py").read_text() + f"\n\ndef {name}(*args):\n    while True:\n        pass\n"
    )
    ran = harness(root)
    outcomes = parse_pytest_summary(ran.stdout)
    looping = [o for n, o in outcomes.items() if f"test_{name}_" in n]
    assert len(looping) == 3 and all(o.message.startswith("TimeoutError") for o in looping)
    assert passing(outcomes) and ran.returncode == 1


def test_test_command_and_file_roles():
    assert task_test_command(TEST_CMD, test_ids=["tests/test_mod.py::test_a b"]) == (
        "python run_tests.py 'tests/test_mod.py::test_a b'"
    )
    assert task_test_command("", test_ids=["t.py::x"]).endswith(
        "-m pytest -rA -p no:cacheprovider --color=no --tb=short -o console_output_style=classic t.py::x"
    )
    assert is_test_file(Path("run_tests.py")) and is_test_file(Path("tests/conftest.py"))
    root = materialize_micro_repo("train", 0, 2)
    assert [p.as_posix() for p in source_files(root)] == ["mod.py"]


def test_environment_reference_and_base_commit_check(tmp_path: Path):
    assert parse_micro_image(micro_image("eval", 4, 12)) == ("eval", 4, 12)
    for bad in ("micro://train/0", "micro://dev/0/1", "micro://train/x/1", "local://repos/x"):
        with pytest.raises(ValueError):
            parse_micro_image(bad)
    path = resolve_environment("micro://train/0/5")
    assert path == materialize_micro_repo("train", 0, 5) and path.is_dir()
    assert resolve_environment("micro://train/0/5", tree_hash(path)) == path
    with pytest.raises(ValueError, match="generator version"):
        resolve_environment("micro://train/0/5", "0" * 64)


def test_sandboxed_harness_run():
    async def scenario() -> dict[str, object]:
        provider = local_provider()
        sandbox = await provider.start(materialize_micro_repo("train", 0, 4))
        try:
            result, outcomes = await run_tests(sandbox, 60, TEST_CMD)
        finally:
            await sandbox.close()
        assert result.exit_code == 0, result.output
        return outcomes

    outcomes = asyncio.run(scenario())
    assert outcomes and all(o.status is TestStatus.PASSED for o in outcomes.values())


def test_synthesize_and_grade_micro_tasks():
    provider = local_provider(git_baseline=True)

    async def scenario() -> list[TaskInstance]:
        tasks: list[TaskInstance] = []
        for index in (0, 1):
            spec = micro_repo_spec("eval", 0, index)
            found, report = await synthesize_repo(
                spec,
                provider,
                modifiers=MODIFIERS,
                max_candidates=3,
                max_tasks=10,
                seed=0,
                workers=2,
                test_timeout_s=30,
                clean_runs=1,
                bugged_timeout_factor=5.0,
                min_bugged_timeout_s=10.0,
                shuffle_modifiers=True,
            )
            assert report.skipped is None and report.clean_tests >= 6, report.to_dict()
            tasks += found
        for task in tasks[:3]:
            sandbox = await start_task_sandbox(provider, task)
            try:
                assert (await grade_workspace(sandbox, provider, task, 30)).reward == 0.0
                await sandbox.write_file("fix.patch", task.patch)
                undo = await sandbox.exec("git apply -R fix.patch && rm fix.patch", timeout=30)
                assert undo.exit_code == 0, undo.output
                graded = await grade_workspace(sandbox, provider, task, 30)
                assert graded.reward == 1.0, graded
            finally:
                await sandbox.close()
        return tasks

    tasks = asyncio.run(scenario())
    assert len(tasks) >= 2
    for task in tasks:
        assert task.test_cmd == TEST_CMD and task.image.startswith("micro://eval/0/")
        assert task.repo.startswith("swerl-micro/eval-") and task.FAIL_TO_PASS and task.PASS_TO_PASS
        assert task.base_commit == tree_hash(resolve_environment(task.image))
        assert all(t.startswith("tests/test_mod.py::test_") for t in task.FAIL_TO_PASS + task.PASS_TO_PASS)


def test_grading_refuses_a_regenerated_environment_that_differs():
    task = TaskInstance(
        instance_id="m",
        repo="swerl-micro/train-0001",
        base_commit="f" * 64,
        problem_statement="p",
        patch="d",
        patch_kind="bug",
        FAIL_TO_PASS=["tests/test_mod.py::test_a_1"],
        image="micro://train/0/1",
        test_cmd=TEST_CMD,
        source="test",
    )
    with pytest.raises(InfraError, match="generator version"):
        asyncio.run(start_task_sandbox(local_provider(), task))


def test_micro_tasks_keep_their_split_whatever_eval_repos_says():
    def task(instance_id: str, repo: str) -> TaskInstance:
        return TaskInstance(
            instance_id=instance_id,
            repo=repo,
            base_commit="c",
            problem_statement="p",
            patch="d",
            patch_kind="bug",
            FAIL_TO_PASS=["t::a"],
            source="test",
        )

    assert micro_split("swerl-micro/eval-0003") == "eval" and micro_split("other/eval-0003") is None
    tasks = [task("a", "swerl-micro/train-0000"), task("b", "swerl-micro/eval-0000"), task("c", "o/money")]
    train, held_out, unmatched = split_by_repo(tasks, ["train-0000", "money"])
    assert [t.instance_id for t in train] == ["a"] and [t.instance_id for t in held_out] == ["b", "c"]
    assert unmatched == ["train-0000"]


def test_curate_stage_with_micro_repositories(tmp_path: Path):
    cfg = CurateConfig(
        repos=[],
        micro=MicroSource(train_repos=3, eval_repos=2, seed=0),
        modifiers=MODIFIERS,
        max_candidates_per_repo=3,
        clean_runs=1,
        validation_workers=2,
    )
    store = Store(str(tmp_path / "store"))
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "curate-micro-test")
    outcome = run_stage("curate", run_curate, cfg, store=store, tracker=tracker, parent=None, seed=0)
    manifest, result = outcome.manifest, outcome.result
    assert result is not None
    prefix = f"stages/curate/{manifest.key}/{manifest.attempt}"
    train = tasks_from_parquet(store.read_bytes(f"{prefix}/train.parquet"))
    held_out = tasks_from_parquet(store.read_bytes(f"{prefix}/eval.parquet"))
    assert train and held_out
    assert {t.repo for t in train} <= {f"swerl-micro/train-{i:04d}" for i in range(3)}
    assert {t.repo for t in held_out} <= {f"swerl-micro/eval-{i:04d}" for i in range(2)}
    assert {t.split for t in train} == {"train"} and {t.split for t in held_out} == {"eval"}
    assert {t.test_cmd for t in train + held_out} == {TEST_CMD}
    report = json.loads(store.read_bytes(f"{prefix}/curate_report.json"))
    by_repo = report["synthesis"]["by_repo"]
    assert set(by_repo) == {"micro-train", "micro-eval"}
    assert by_repo["micro-train"]["repos"] == 3 and by_repo["micro-eval"]["repos"] == 2
    # At most 3 candidates per repository (a function may have fewer sites).
    assert (
        5 <= report["synthesis"]["candidates"] <= 15
        and report["synthesis"]["candidates"] == result.metrics["candidates"]
    )
    assert report["synthesis"]["valid"] == len(train) + len(held_out)
    assert {r["repo"] for r in result.tables["yield"]} == {"micro-train", "micro-eval"}
    assert result.metrics["valid_repo.micro-train"] + result.metrics["valid_repo.micro-eval"] == len(train) + len(
        held_out
    )
