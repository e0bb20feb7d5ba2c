"""Curating real repositories (config.RepoSource): their own virtualenv, failing clean tests left out and counted,
unstable ids dropped, every task confirmed by the sealed grader, a repository yielding nothing failing loudly, and
the stage key following the repository's contents.

The environments are built with pip (pytest from the registry, cached after the first build)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from swerl.config import ConfigError, load_config
from swerl.config.data import CurateConfig, RepoSource
from swerl.data.repoenv import materialize_source
from swerl.data.taskio import tasks_from_parquet
from swerl.grading.grader import RESOLVED_FULL, grade_patch
from swerl.stages.common import run_async, sandbox_provider
from swerl.stages.curate import NoTasksError, content_key, run_curate
from swerl.stages.runner import run_stage, stage_key
from swerl.storage import Store
from swerl.tracking import Tracker

SOURCE = """\
def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def tag(pair):
    key, value = pair
    if key == "c":
        return value.upper()
    return value
"""

TESTS = """\
import pytest

from calc import clamp, tag


def test_low():
    assert clamp(-1, 0, 10) == 0


def test_high():
    assert clamp(11, 0, 10) == 10


def test_mid():
    assert clamp(5, 0, 10) == 5


def test_broken_on_clean_code():
    assert clamp(5, 0, 10) == 6


@pytest.mark.parametrize("pair", {("a", "x"), ("b", "y"), ("c", "z"), ("d", "w"), ("e", "v"), ("f", "u")})
def test_tag_over_a_set(pair):
    assert tag(pair) == (pair[1].upper() if pair[0] == "c" else pair[1])


def test_tag_plain():
    assert tag(("c", "q")) == "Q"
"""


def src_repo(root: Path) -> Path:
    """A src-layout project: a failing clean test, a test module that cannot be collected, a set-parametrized
    test."""
    (root / "src" / "calc").mkdir(parents=True)
    (root / "src" / "calc" / "__init__.py").write_text(SOURCE)
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text(TESTS)
    (root / "tests" / "test_needs_plugin.py").write_text("import not_installed_anywhere\n\n\ndef test_x():\n    pass\n")
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "calc"\nversion = "0.1"\n'
    )
    return root


def _stage(tmp_path: Path, cfg: CurateConfig):
    store = Store(str(tmp_path / "store"))
    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "curate-real")
    outcome = run_stage(
        "curate", run_curate, cfg, store=store, tracker=tracker, parent=None, seed=0, content=content_key(cfg)
    )
    prefix = f"stages/curate/{outcome.manifest.key}/{outcome.manifest.attempt}"
    report = json.loads(store.read_bytes(f"{prefix}/curate_report.json"))
    tasks = tasks_from_parquet(store.read_bytes(f"{prefix}/train.parquet"))
    return outcome, report, tasks


@pytest.mark.network
def test_a_real_repository_in_its_own_environment(tmp_path: Path):
    repo = src_repo(tmp_path / "calc-src")
    with tarfile.open(tmp_path / "calc-0.1.tar.gz", "w:gz") as tar:
        tar.add(repo, arcname="calc-0.1")
    cfg = CurateConfig(
        repos=[RepoSource(path=str(tmp_path / "calc-0.1.tar.gz"), name="calc")],
        modifiers=["flip_comparison", "swap_binop", "negate_condition", "off_by_one"],
        max_candidates_per_repo=8,
        validation_workers=2,
        decontaminate=False,
    )
    outcome, report, tasks = _stage(tmp_path, cfg)
    calc = report["synthesis"]["by_repo"]["calc"]
    assert calc["skipped"] is None, calc
    # The failing clean test and the module that cannot be collected are left out, counted, not fatal.
    assert calc["skipped_tests"]["clean_failed"] == 1 and calc["skipped_tests"]["uncollectable"] == 1, calc
    # The set-parametrized ids map to other values in other processes: dropped before they can be FAIL_TO_PASS.
    assert calc["skipped_tests"]["unstable_id"] == 6, calc
    assert tasks and calc["gold_resolved"] == len(tasks) == sum(calc["valid"].values())
    assert outcome.result.metrics["gold_resolved_repo.calc"] == len(tasks)
    assert "| calc |" in outcome.result.markdown["curate"]
    assert calc["environment"]["python"].startswith(str(Path(calc["environment"]["python"]).parents[1]))
    for task in tasks:
        ids = task.FAIL_TO_PASS + task.PASS_TO_PASS
        assert not any("over_a_set" in t or "broken_on_clean" in t or "needs_plugin" in t for t in ids), ids
    # What the stage kept grades the way the trainer will grade it: the bug unresolved.
    python = calc["environment"]["python"]
    provider = sandbox_provider(cfg.sandbox.model_copy(update={"python": python}))
    grade = run_async(grade_patch(provider, tasks[0], "", 60))
    assert grade.status != RESOLVED_FULL and grade.sealed


@pytest.mark.network
def test_a_repository_yielding_nothing_fails_with_the_runner_output_and_what_to_set(tmp_path: Path):
    repo = tmp_path / "needs"
    repo.mkdir()
    (repo / "mod.py").write_text("def f(a, b):\n    return a + b if a < b else b + a\n")
    (repo / "test_mod.py").write_text(
        "import hypothesis_missing_here\n\nfrom mod import f\n\n\ndef test_f():\n    assert f(1, 2) == 3\n"
    )
    cfg = CurateConfig(
        repos=[RepoSource(path=str(repo))], max_candidates_per_repo=2, validation_workers=1, decontaminate=False
    )
    with pytest.raises(NoTasksError) as caught:
        _stage(tmp_path, cfg)
    message = str(caught.value)
    assert "needs: skipped" in message and "hypothesis_missing_here" in message, message
    assert "`install`" in message and "`python_path`" in message and "`test_cmd`" in message, message


def test_the_stage_key_follows_the_repository_contents(tmp_path: Path):
    repo = src_repo(tmp_path / "calc")
    cfg = CurateConfig(repos=[RepoSource(path=str(repo))])
    key = stage_key("curate", cfg, [], 0, content_key(cfg))
    assert stage_key("curate", cfg, [], 0, content_key(cfg)) == key  # unchanged: the same key (skipped)
    (repo / "src" / "calc" / "__init__.py").write_text(SOURCE + "\n# changed\n")
    assert stage_key("curate", cfg, [], 0, content_key(cfg)) != key
    # Shipped repositories and micro ones add nothing: the CPU default's key is what it was.
    assert content_key(CurateConfig(repos=["builtin"])) == ""


def test_git_sources_are_cloned_and_keyed_by_head(tmp_path: Path):
    import subprocess

    work = src_repo(tmp_path / "work")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", str(work)], check=True)
    subprocess.run([*git, "-C", str(work), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", "one"], check=True)
    path, name = materialize_source(work.as_uri())
    assert name == "work" and (path / "src" / "calc" / "__init__.py").read_text() == SOURCE
    key = content_key(CurateConfig(repos=[RepoSource(path=work.as_uri())]))
    (work / "README").write_text("x")
    subprocess.run([*git, "-C", str(work), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", "two"], check=True)
    assert content_key(CurateConfig(repos=[RepoSource(path=work.as_uri())])) != key


def test_structured_entries_name_the_bad_key(tmp_path: Path):
    config = tmp_path / "c.yaml"
    config.write_text("curate:\n  repos:\n    - builtin\n    - {path: /x, instal: [hypothesis]}\n")
    with pytest.raises(ConfigError, match=r"curate\.repos\.1\.source\.instal"):
        load_config(config)
    config.write_text("curate:\n  repos:\n    - {path: /x, python_path: ../up}\n")
    with pytest.raises(ConfigError, match=r"curate\.repos\.0\.source\.python_path"):
        load_config(config)


@pytest.mark.network
def test_the_environment_sees_neither_swerls_packages_nor_an_installed_copy_of_the_repository(tmp_path: Path):
    import subprocess

    from swerl.data.repoenv import build_env

    repo = src_repo(tmp_path / "calc")
    env = build_env(repo, [], None)
    assert env.python_path == "src" and any(p.startswith("pytest==") for p in env.installed)
    probe = "import importlib.util as u; print([m for m in ('pydantic', 'swerl', 'calc') if u.find_spec(m)])"
    out = subprocess.run([env.python, "-I", "-c", probe], capture_output=True, text=True, cwd=tmp_path, check=True)
    # swerl's own dependencies cannot shadow the repository's; the code comes from /workspace, never site-packages.
    assert out.stdout.strip() == "[]", out.stdout
    pth = next(Path(env.root).glob("lib/python*/site-packages/swerl-workspace.pth"))
    assert pth.read_text().strip() == "/workspace/src"


@pytest.mark.network
def test_a_fail_to_pass_id_passing_only_after_another_test_is_dropped(tmp_path: Path):
    repo = tmp_path / "order"
    (repo / "tests").mkdir(parents=True)
    (repo / "mod.py").write_text("def double(x):\n    return x * 2\n\n\ndef inc(x):\n    return x + 1\n")
    (repo / "tests" / "test_mod.py").write_text(
        "from mod import double, inc\n\nseen = []\n\n\n"
        "def test_a_warm():\n    seen.append(1)\n    assert False, 'fails on clean code: left out'\n\n\n"
        "def test_b_needs_warm():\n    assert seen, 'passes only after test_a_warm ran'\n"
        "    assert double(3) == 6\n\n\n"
        "def test_c_double():\n    assert double(2) == 4\n\n\n"
        "def test_d_inc():\n    assert inc(1) == 2\n"
    )
    cfg = CurateConfig(
        repos=[RepoSource(path=str(repo))],
        modifiers=["swap_binop", "off_by_one"],
        max_candidates_per_repo=6,
        validation_workers=2,
        decontaminate=False,
    )
    _, report, tasks = _stage(tmp_path, cfg)
    order = report["synthesis"]["by_repo"]["order"]
    assert order["skipped_tests"] == {"clean_failed": 1}, order
    # Validation (the whole suite in one process) saw test_b pass clean and fail with a bug in double; graded alone,
    # as grading runs it, it fails even with the fix: dropped from every task, counted, the task regraded.
    assert order["dropped_ids"].get("fail_to_pass_fails_with_fix", 0) >= 1, order
    doubles = [t for t in tasks if "tests/test_mod.py::test_c_double" in t.FAIL_TO_PASS]
    assert doubles and not any("test_b_needs_warm" in t.FAIL_TO_PASS + t.PASS_TO_PASS for t in tasks)
