"""Decontamination against SWE-bench Verified's repositories and evaluation problem statements."""

from __future__ import annotations

import pytest

from swerl.data.decontam import decontaminate, normalize_statement, verified_repos
from swerl.data.schema import TaskInstance, normalize_repo


def task(instance_id: str, repo: str, statement: str = "something breaks") -> TaskInstance:
    return TaskInstance(
        instance_id=instance_id,
        repo=repo,
        base_commit="c",
        problem_statement=statement,
        patch="diff",
        patch_kind="bug",
        FAIL_TO_PASS=["t::a"],
        source="test",
    )


def test_verified_repos_shipped():
    repos = verified_repos()
    assert len(repos) == 12 and "django/django" in repos and "pylint-dev/pylint" in repos


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("swesmith/django__django.4c1a1e4b", "django/django"),
        ("swesmith/Pylint-Dev__pylint.1f8c4d9e", "pylint-dev/pylint"),
        (
            "swesmith/scikit-learn__scikit-learn.586f4318ffcdfbd9a1093f35ad43e81983740b66",
            "scikit-learn/scikit-learn",
        ),
        ("swesmith/pydantic__pydantic.acb0f10f", "pydantic/pydantic"),
        ("https://github.com/psf/requests.git", "psf/requests"),
        ("Django/Django", "django/django"),
        ("sympy__sympy", "sympy/sympy"),
        ("swerl-builtin/textkit", "swerl-builtin/textkit"),
    ],
)
def test_normalize_repo(raw, expected):
    assert normalize_repo(raw) == expected


def test_normalize_statement():
    assert normalize_statement("  Foo()  FAILS,\n when x=1! ") == normalize_statement("foo fails when x 1")


def test_decontaminate_drops_verified_repos_and_eval_statements():
    tasks = [
        task("a", "swesmith/django__django.4c1a1e4b"),
        task("b", "swesmith/pydantic__pydantic.acb0f10f", "Parsing a date   FAILS."),
        task("c", "swesmith/pydantic__pydantic.acb0f10f", "another bug"),
        task("d", "sympy/sympy"),
        task("e", "local/x", ""),
    ]
    kept, report = decontaminate(tasks, eval_statements=["parsing a date fails", ""])
    assert [t.instance_id for t in kept] == ["c", "e"]
    assert report.to_dict() == {
        "input": 5,
        "kept": 2,
        "dropped_repo": 2,
        "dropped_statement": 1,
        "dropped_by_repo": {"django/django": 1, "pydantic/pydantic": 1, "sympy/sympy": 1},
    }


def test_decontaminate_custom_repo_list():
    kept, report = decontaminate([task("a", "django/django"), task("b", "o/n")], excluded_repos=["O/N"])
    assert [t.instance_id for t in kept] == ["a"] and report.dropped_repo == 1
