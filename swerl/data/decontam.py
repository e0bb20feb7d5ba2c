"""Decontamination: keep evaluation repositories and evaluation problem statements out of training data."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from swerl.data.schema import TaskInstance, normalize_repo


def verified_repos() -> frozenset[str]:
    """SWE-bench Verified's 12 repositories, normalised ('owner/name', lowercase)."""
    text = resources.files("swerl.data").joinpath("resources/swebench_verified_repos.txt").read_text()
    return frozenset(normalize_repo(line) for line in text.splitlines() if line.strip())


def normalize_statement(text: str) -> str:
    """Case-, whitespace- and punctuation-insensitive form of a problem statement."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


@dataclass
class DecontamReport:
    """How many tasks were dropped, and why."""

    input: int = 0
    kept: int = 0
    dropped_repo: int = 0
    dropped_statement: int = 0
    dropped_by_repo: Counter[str] = field(default_factory=Counter)

    def to_dict(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "kept": self.kept,
            "dropped_repo": self.dropped_repo,
            "dropped_statement": self.dropped_statement,
            "dropped_by_repo": dict(sorted(self.dropped_by_repo.items())),
        }


def decontaminate(
    tasks: Sequence[TaskInstance],
    eval_statements: Iterable[str] = (),
    excluded_repos: Iterable[str] | None = None,
) -> tuple[list[TaskInstance], DecontamReport]:
    """Drop tasks from excluded repositories (default: SWE-bench Verified's) or matching an eval statement."""
    excluded = verified_repos() if excluded_repos is None else frozenset(normalize_repo(r) for r in excluded_repos)
    banned = {s for s in (normalize_statement(t) for t in eval_statements) if s}
    report = DecontamReport(input=len(tasks))
    kept = []
    for task in tasks:
        repo = normalize_repo(task.repo)
        if repo in excluded:
            report.dropped_repo += 1
            report.dropped_by_repo[repo] += 1
        elif normalize_statement(task.problem_statement) in banned:
            report.dropped_statement += 1
            report.dropped_by_repo[repo] += 1
        else:
            kept.append(task)
    report.kept = len(kept)
    return kept, report
