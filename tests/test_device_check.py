"""The device check cannot rot: scripts/device_bench.py runs its CPU smoke test (--cpu --tiny: the FSDP2 SFT and GRPO
steps on one gloo rank, the export and the local engine's load, the table and the JSON), and
scripts/device_check.sh parses and installs only from the carried wheel folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_device_bench_smoke_on_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "scripts/device_bench.py", "--cpu", "--tiny"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "tokens/s" in result.stdout
    report = json.loads((tmp_path / "device_bench.json").read_text())
    for part in ("sft", "grpo"):
        assert report[part]["tokens_per_s"] > 0, report[part]
        assert report[part]["tokens"] > 0 and report[part]["mfu"] is None  # no MFU on CPU
    assert report["sync"]["weights_gb"] > 0 and report["sync"]["load_s"] > 0
    assert report["environment"]["cpu_only"] is True


def test_device_check_script_parses_and_downloads_nothing() -> None:
    subprocess.run(["bash", "-n", "scripts/device_check.sh"], cwd=ROOT, check=True)
    text = (ROOT / "scripts/device_check.sh").read_text()
    installs = [
        line for line in text.splitlines() if "pip install" in line and not line.lstrip().startswith("#")
    ]
    assert installs and all("--no-index" in line for line in installs), installs
