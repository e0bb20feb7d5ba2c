"""The layout rules `make lint` keeps, checked by the suite too (CI runs the suite, not `make lint`).

- The import layers (import-linter's contracts in pyproject.toml) hold on the tree, and a deliberately upward import
  in a copy of it breaks them: the contracts can fail.
- The rooms (scripts/check_rooms.py): no product module over 800 lines, no function over 60 lines without a line
  saying why, at most 20 `# fmt: skip` markers; and the checker finds each breach planted in a copy.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _checker():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("check_rooms", ROOT / "scripts" / "check_rooms.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "resources")
    for name in ("swerl", "flows", "tasks"):
        shutil.copytree(ROOT / name, copy / name, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    return copy


def _lint_imports(where: Path) -> subprocess.CompletedProcess[str]:
    assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} missing: install the dev extra"
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=where, capture_output=True, text=True, timeout=600, check=False
    )


def test_the_import_layers_hold_on_the_tree() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "upward"),
    [
        ("swerl/errors.py", "import swerl.cli"),  # the bottom layer reaching the top
        ("swerl/grading/verdict.py", "import swerl.agent.episode"),  # the grader below the agent it grades
        ("swerl/config/base.py", "import swerl.engine.router"),  # the config below the engines
    ],
)
def test_a_deliberately_upward_import_breaks_the_layers(tmp_path: Path, module: str, upward: str) -> None:
    copy = _copy(tmp_path)
    target = copy / module
    target.write_text(target.read_text() + f"\n{upward}  # planted by tests/test_layout.py\n")
    result = _lint_imports(copy)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout and upward.split()[-1] in result.stdout


def test_the_rooms_are_within_their_sizes() -> None:
    assert _checker().breaches(ROOT) == []


def test_the_room_checker_finds_each_kind_of_breach(tmp_path: Path) -> None:
    checker = _checker()
    copy = tmp_path / "tree"
    (copy / "swerl").mkdir(parents=True)
    body = "\n".join(f"    x{i} = {i}" for i in range(checker.MAX_FUNCTION_LINES))
    (copy / "swerl" / "long.py").write_text(f'def long():\n    """Doc."""\n{body}\n')
    (copy / "swerl" / "said.py").write_text(f'def said():\n    """Doc."""\n    {checker.LONG_MARKER}: why.\n{body}\n')
    (copy / "swerl" / "big.py").write_text("x = 1\n" * (checker.MAX_MODULE_LINES + 1))
    (copy / "tests").mkdir()
    (copy / "tests" / "skips.py").write_text("x = 1  # fmt: skip\n" * (checker.MAX_FMT_SKIPS + 1))
    found = checker.breaches(copy)
    assert any(line.startswith("swerl/long.py:1: long is") for line in found), found
    assert not any("said" in line for line in found), found
    assert any(line.startswith("swerl/big.py:") for line in found), found
    assert any("'# fmt: skip' markers" in line for line in found), found
    assert len(found) == 3, found
