"""Write the shipped pure-Python repositories (with pytest suites) that task synthesis starts from.

Deterministic: the same files every run. Usage: python scripts/make_repos.py [OUTPUT_DIR]
(default swerl/data/resources/repos). Each repository is flat-layout, so `python -m pytest` from its root
imports the package from the working directory.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from repo_sources import REPOS  # noqa: E402

PYPROJECT = """[project]
name = "{name}"
version = "0.1.0"
description = "{description}"
requires-python = ">=3.10"

[tool.pytest.ini_options]
testpaths = ["tests"]
"""

CONFTEST = '"""Marks the repository root as pytest\'s rootdir so `{name}` imports from the working tree."""\n'


def write_repos(out: Path) -> list[Path]:
    """(Re)write every repository under `out`; returns their directories."""
    written = []
    for name, (description, files) in sorted(REPOS.items()):
        root = out / name
        if root.exists():
            shutil.rmtree(root)
        for rel, text in {
            "pyproject.toml": PYPROJECT.format(name=name, description=description),
            "conftest.py": CONFTEST.format(name=name),
            **files,
        }.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text.lstrip("\n"), encoding="utf-8")
        written.append(root)
    return written


def main() -> None:
    default = Path(__file__).resolve().parent.parent / "swerl" / "data" / "resources" / "repos"
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    for root in write_repos(out):
        print(root)


if __name__ == "__main__":
    main()
