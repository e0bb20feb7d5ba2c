"""Task synthesis: sampling, problem statements, and validation end to end on a shipped repository."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

from swerl.data.bugs import MODIFIERS, BugCandidate
from swerl.data.environments import resolve_environment
from swerl.data.repos import builtin_repo, builtin_repo_names, directory_repo, tree_hash
from swerl.data.synth import problem_statement, sample_candidates, summarize, synthesize_repo
from swerl.data.testrun import TestOutcome, TestStatus
from swerl.sandbox import LocalSandboxProvider
from tests.sandbox_helpers import local_provider

ROOT = Path(__file__).resolve().parents[2]


def cand(modifier: str, i: int) -> BugCandidate:
    return BugCandidate(modifier, "pkg/m.py", i, i, "d", f"bug{modifier}{i}", f"fix{modifier}{i}")


def test_sample_candidates_round_robin_and_deterministic():
    pools = {"a": [cand("a", i) for i in range(5)], "b": [cand("b", i) for i in range(2)], "c": []}
    picked = sample_candidates(pools, 6, seed=1)
    assert [c.modifier for c in picked] == ["a", "b", "a", "b", "a", "a"]
    assert picked == sample_candidates(pools, 6, seed=1)
    assert len(sample_candidates(pools, 100, seed=1)) == 7
    assert {c.line for c in sample_candidates(pools, 7, seed=2)} == {c.line for c in picked} | {4}


def test_problem_statement_names_tests_not_the_patch():
    failing = {
        "tests/test_ops.py::test_merge": TestOutcome(TestStatus.FAILED, "assert [(1, 2)] == [(1, 4)]"),
        "tests/test_ops.py::test_gap": TestOutcome(TestStatus.ERROR, ""),
    }
    text = problem_statement("swerl-builtin/intervals", failing, total_failing=7, max_listed=2)
    assert "tests/test_ops.py::test_merge" in text and "assert [(1, 2)] == [(1, 4)]" in text
    assert "and 5 more" in text and "could not be collected" in text
    assert "@@" not in text and "intervals/ops.py" not in text


def test_shipped_repositories_match_their_generator(tmp_path: Path):
    spec = importlib.util.spec_from_file_location("make_repos", ROOT / "scripts" / "make_repos.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_repos(tmp_path)
    names = builtin_repo_names()
    assert names == sorted(p.name for p in tmp_path.iterdir()) and len(names) >= 6
    for name in names:
        assert tree_hash(tmp_path / name) == tree_hash(builtin_repo(name).path), f"{name}: rerun make_repos.py"


def test_environment_references(tmp_path: Path):
    spec = builtin_repo("textkit")
    assert resolve_environment(spec.image) == spec.path
    local = directory_repo(tmp_path)
    assert resolve_environment(local.image) == tmp_path.resolve()
    with pytest.raises(ValueError, match="no shipped repository"):
        builtin_repo("nope")
    with pytest.raises(ValueError, match="not a local directory reference"):
        resolve_environment("docker.io/x:latest")


@pytest.fixture(scope="module")
def provider() -> LocalSandboxProvider:
    return local_provider()


def synth(spec, provider, **kw):
    # clean_runs and the bugged-suite timeout: the values these tests were written against (CurateConfig's).
    args = dict(
        modifiers=list(MODIFIERS),
        max_candidates=7,
        max_tasks=100,
        seed=0,
        workers=2,
        test_timeout_s=60,
        clean_runs=2,
        bugged_timeout_factor=5.0,
        min_bugged_timeout_s=10.0,
    )
    return asyncio.run(synthesize_repo(spec, provider, **(args | kw)))


def test_synthesis_end_to_end_on_a_shipped_repo(provider: LocalSandboxProvider):
    spec = builtin_repo("intervals")
    tasks, report = synth(spec, provider)
    assert report.skipped is None and report.clean_tests == report.clean_passing >= 15
    assert sum(report.candidates.values()) == 7 and len(report.candidates) == len(MODIFIERS)
    assert len(tasks) >= 1 and sum(report.valid.values()) == len(tasks)
    assert sum(report.rejections.values()) + len(tasks) == 7
    for task in tasks:
        assert task.FAIL_TO_PASS and task.PASS_TO_PASS and not set(task.FAIL_TO_PASS) & set(task.PASS_TO_PASS)
        assert task.patch_kind == "bug" and task.image == "local://repos/intervals"
        assert task.base_commit == tree_hash(spec.path) and task.repo == "swerl-builtin/intervals"
        assert "intervals/" not in task.problem_statement and "@@" not in task.problem_statement
        assert task.FAIL_TO_PASS[0] in task.problem_statement
    # Deterministic: the same seed validates the same candidates into the same tasks.
    again, _ = synth(spec, provider)
    assert [t.instance_id for t in again] == [t.instance_id for t in tasks]
    summary = summarize([report])
    assert summary["valid"] == len(tasks) and summary["by_repo"]["intervals"]["skipped"] is None


def test_repos_without_tests_or_with_a_failing_suite_are_skipped(provider: LocalSandboxProvider, tmp_path: Path):
    no_tests = tmp_path / "no_tests"
    (no_tests / "pkg").mkdir(parents=True)
    (no_tests / "pkg" / "m.py").write_text("def f(a):\n    return a + 1\n")
    tasks, report = synth(directory_repo(no_tests), provider)
    assert tasks == [] and report.skipped == "no_tests"

    failing = tmp_path / "failing"
    (failing / "tests").mkdir(parents=True)
    (failing / "m.py").write_text("def f(a):\n    return a + 1\n")
    (failing / "tests" / "test_m.py").write_text(
        "from m import f\n\ndef test_ok():\n    assert f(1) == 2\n\ndef test_bad():\n    assert f(1) == 3\n"
    )
    tasks, report = synth(directory_repo(failing), provider)
    assert tasks == [] and report.skipped == "clean_suite_fails"
    assert summarize([report])["skipped_repos"] == {"failing": "clean_suite_fails"}
