"""Task environments that are plain directories: the shipped repositories and any local path.

An environment reference (`TaskInstance.image`) is `local://repos/NAME` for a shipped repository,
`local:///ABSOLUTE/PATH` for any other directory and `micro://SPLIT/SEED/INDEX` for a procedural micro repository
(swerl.data.micro, regenerated into a cache directory on first use); `base_commit` is the sha256 of the clean
tree's contents.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

BUILTIN_ROOT = Path(__file__).parent / "resources" / "repos"
"""Where the shipped repositories live (written by scripts/make_repos.py)."""

_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".git", ".hg", ".tox", ".venv", ".mypy_cache", ".ruff_cache"}


@dataclass(frozen=True)
class RepoSpec:
    """A repository to synthesize tasks from: a directory, its published name and environment reference."""

    name: str
    path: Path
    repo: str
    image: str
    test_cmd: str = ""
    """The repository's own test command (TaskInstance.test_cmd); empty means pytest."""


def builtin_repo_names() -> list[str]:
    """Names of the shipped repositories, sorted."""
    if not BUILTIN_ROOT.is_dir():
        return []
    return sorted(p.name for p in BUILTIN_ROOT.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def builtin_repo(name: str) -> RepoSpec:
    """The shipped repository `name`."""
    path = BUILTIN_ROOT / name
    if not path.is_dir():
        raise ValueError(f"no shipped repository {name!r}; shipped: {builtin_repo_names()}")
    return RepoSpec(name=name, path=path, repo=f"swerl-builtin/{name}", image=f"local://repos/{name}")


def directory_repo(path: str | os.PathLike[str]) -> RepoSpec:
    """Any local directory as a repository."""
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_dir():
        raise ValueError(f"repository directory {path} does not exist")
    return RepoSpec(name=resolved.name, path=resolved, repo=f"local/{resolved.name}", image=f"local://{resolved}")


def resolve_repos(entries: list[str]) -> list[RepoSpec]:
    """Config entries -> repositories: 'builtin' (all shipped), 'builtin:NAME', or a directory path."""
    specs: list[RepoSpec] = []
    for entry in entries:
        if entry == "builtin":
            specs += [builtin_repo(n) for n in builtin_repo_names()]
        elif entry.startswith("builtin:"):
            specs.append(builtin_repo(entry.split(":", 1)[1]))
        else:
            specs.append(directory_repo(entry))
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"repositories listed more than once (by name): {duplicates}")
    return specs


def iter_files(root: Path) -> list[Path]:
    """Repo-relative paths of the tree's files, sorted, without caches and VCS metadata."""
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.endswith(".egg-info"))
        for name in filenames:
            if not name.endswith((".pyc", ".pyo")):
                files.append((Path(dirpath) / name).relative_to(root))
    return sorted(files)


def tree_hash(root: Path) -> str:
    """sha256 over the tree's paths and contents: a deterministic stand-in for a commit id."""
    digest = hashlib.sha256()
    for rel in iter_files(root):
        data = (root / rel).read_bytes()
        digest.update(f"{rel.as_posix()}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def is_test_file(rel: Path) -> bool:
    """Test code, test configuration and a `run_tests.py` harness (never a bug site; restored before grading)."""
    parts = rel.parts
    name = rel.name
    return (
        any(p in ("tests", "test", "testing") for p in parts[:-1])
        or name.startswith("test_")
        or name.endswith("_test.py")
        or name in ("conftest.py", "run_tests.py")
    )


def source_files(root: Path) -> list[Path]:
    """Python files that may hold a bug: package code, not tests, docs, examples or build scripts."""
    excluded_dirs = {"docs", "doc", "examples", "example", "benchmarks", "scripts", "build", "dist"}
    return [
        rel
        for rel in iter_files(root)
        if rel.suffix == ".py"
        and not is_test_file(rel)
        and rel.name not in ("setup.py", "conftest.py", "noxfile.py", "versioneer.py", "_version.py")
        and not any(p in excluded_dirs or p.startswith(".") for p in rel.parts[:-1])
    ]


def has_tests(root: Path) -> bool:
    """Whether the tree holds any pytest-style test file."""
    return any(
        rel.suffix == ".py" and (rel.name.startswith("test_") or rel.name.endswith("_test.py"))
        for rel in iter_files(root)
    )
