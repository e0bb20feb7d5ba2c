"""`swerl run` starts without racing: 30 runs in a row on a finished store, each exits 0 (issue 36).

It died at start-up 11 times in 31 with `ImportError: cannot import name '_entity_corresponds_to' from partially
initialized module 'sqlalchemy.orm.util'`: a thread opened the MLflow store (importing sqlalchemy.orm) while Prefect's
client imported its ephemeral server (importing sqlalchemy.orm too). The runs here use Prefect's ephemeral API, as a
user without `swerl up` does, since that is the import that raced. The store is finished once by a run whose stage
functions are literal ones (each stage has its own tests); the 30 runs are plain `swerl run`: each starts, sees every
stage done and exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RUNS = 30
"""Runs in a row that must all start and finish (the race failed about one in three)."""

_FINISH = """
import importlib, json, sys
from swerl.stages.runner import StageResult
def literal(name):
    def run(cfg, ctx):
        ctx.write_artifact(name + ".json", json.dumps({"stage": name}).encode())
        return StageResult(metrics={"n": 1.0}, summary=name)
    return run
for module, function in [("curate", "run_curate"), ("traces", "run_traces"), ("sft", "run_sft"),
                         ("grpo", "run_grpo"), ("evaluate", "run_evaluate")]:
    setattr(importlib.import_module("swerl.stages." + module), function, literal(module))
from swerl.cli import main
sys.exit(main(["run", sys.argv[1], "--ignore-doctor"]))
"""


def _swerl_run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_HOME": str(tmp_path / "prefect-home")}
    env.pop("PREFECT_API_URL", None)  # Prefect's ephemeral API, whose start raced
    return subprocess.run(
        [sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.timeout(RUNS * 600)  # a guard against a hang only: each run has its own 600 s (15-30 s here, 2 cores)
def test_swerl_run_on_a_finished_store_starts_30_times_in_a_row(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "run": {"name": "startup"},
                "storage": {"root": f"file://{tmp_path}/store"},
                "tracking": {"uri": f"sqlite:///{tmp_path}/mlflow.db"},
                "curate": {"repos": ["builtin:toy"], "max_candidates_per_repo": 1},
            }
        )
    )
    first = _swerl_run(["-c", _FINISH, str(config)], tmp_path)
    assert first.returncode == 0, first.stderr[-4000:]
    for i in range(RUNS):
        done = _swerl_run(["-m", "swerl.cli", "run", str(config), "--ignore-doctor"], tmp_path)
        assert done.returncode == 0, f"run {i + 1} of {RUNS} failed:\n{done.stderr[-4000:]}"
        assert done.stderr.count("skipped, already done") == 5, done.stderr[-4000:]
