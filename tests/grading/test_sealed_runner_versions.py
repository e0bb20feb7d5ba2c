"""The sealed runner under the pytest releases SWE-bench's images carry (pytest 6 and 7 among them): hook names and
arguments that only newer pytest has would make every task of such an image ungradable. Run directly in a
throwaway directory with a virtualenv of that pytest (no sandbox: what is checked is the runner's compatibility)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from swerl.grading.grader import read_sealed, sealed_command

TESTS = """\
import unittest
import pytest

class TestPlain:
    def test_a(self):
        assert 1 == 1
    @pytest.mark.parametrize("x", [1, 2])
    def test_p(self, x):
        assert x

class TestUnit(unittest.TestCase):
    def test_u(self):
        self.assertEqual(1, 1)

def test_f():
    assert False
"""


@pytest.mark.network
@pytest.mark.slow
@pytest.mark.parametrize("version", ["6.2.5", "7.4.4"])
def test_the_sealed_runner_works_under_older_pytest(tmp_path: Path, version: str) -> None:
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    python = str(env / "bin" / "python")
    subprocess.run([python, "-m", "pip", "install", "--quiet", f"pytest=={version}"], check=True, timeout=600)
    work = tmp_path / "repo"
    (work / "tests").mkdir(parents=True)
    (work / "tests" / "test_c.py").write_text(TESTS)
    key = secrets.token_bytes(32)
    (work / "keyfile").write_text(key.hex())
    done = subprocess.run(
        sealed_command("pytest", "keyfile", ["tests/test_c.py"], python, {}),
        shell=True,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = read_sealed(done.stdout, key.hex().encode())
    assert report.complete and not report.tampered, (report, done.stdout[-2000:], done.stderr[-2000:])
    statuses = {node: outcome.status.value for node, outcome in report.outcomes.items()}
    assert statuses == {
        "tests/test_c.py::TestPlain::test_a": "PASSED",
        "tests/test_c.py::TestPlain::test_p[1]": "PASSED",
        "tests/test_c.py::TestPlain::test_p[2]": "PASSED",
        "tests/test_c.py::TestUnit::test_u": "PASSED",
        "tests/test_c.py::test_f": "FAILED",
    }
    assert report.exit_code == done.returncode == 1 and report.command_exit == 1
    assert json.dumps(statuses) and sys.version_info >= (3, 8)  # audit hooks: the guarded runner
