"""The device check cannot rot: scripts/device_bench.py runs its CPU smoke test (--cpu --tiny: the FSDP2 SFT and GRPO
steps on one gloo rank, the export and the local engine's load, the GRPO trainer's weights to a local engine over a
gloo process group with the check that the engine then holds them, the table and the JSON), its NCCL probe answers
in JSON, and scripts/device_check.sh parses and installs only from the carried wheel folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_device_bench_smoke_on_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "scripts/device_bench.py", "--cpu", "--tiny"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "tokens/s" in result.stdout
    report = json.loads((tmp_path / "device_bench.json").read_text())
    for part in ("sft", "grpo"):
        assert report[part]["tokens_per_s"] > 0, report[part]
        assert report[part]["tokens"] > 0 and report[part]["mfu"] is None  # no MFU on CPU
    disk = report["sync"]
    assert disk["weights_gb"] > 0 and disk["load_s"] > 0, disk
    assert disk["seconds_per_sync"] > 0 and disk["s_per_gb"] > 0 and disk["gb_per_s"] > 0, disk
    # Over a process group (DistributedWeights): gloo on CPU, a warm-up and 3 timed syncs, then the weights check.
    group = report["sync_group"]
    assert "error" not in group, group
    assert group["backend"] == "gloo" and group["engine_device"] == "cpu" and group["syncs"] == 3, group
    assert group["seconds_per_sync"] > 0 and group["first_sync_s"] > 0, group
    assert group["s_per_gb"] > 0 and group["gb_per_s"] > 0 and group["buckets"] >= 1, group
    # Every weight in float32 (the tied lm_head sent too): at least what the export holds on disk.
    assert group["bytes_per_sync"] >= 0.9 * disk["weights_gb"] * 1e9 and group["gb_per_sync"] > 0, group
    check = group["weights_check"]
    # The engine starts from zeroed weights, so a sync that moves nothing fails the check.
    assert check["differed_before"], check
    assert check["state_dict_equal"] and check["state_dict"]["tensors"] == group["tensors"], check
    assert check["greedy_equal"] and check["greedy_tokens"] == 8, check  # as an engine loaded from an export
    assert check["engine_version"] == check["expected_version"] == 4 and check["ok"], check
    assert "group (gloo)" in result.stdout and "weights check ok" in result.stdout, result.stdout[-2000:]
    assert report["environment"]["cpu_only"] is True


def test_nccl_probe_answers_in_json() -> None:
    """The child process that asks NCCL for two ranks on one GPU (on a GPU machine with one device) reports in JSON
    whatever happens; here, without CUDA, that NCCL is unavailable."""
    code = (
        "import json, sys; sys.path.insert(0, 'scripts'); import device_bench; "
        "print(json.dumps(device_bench.probe_nccl_one_gpu(60.0)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe["exit"] == 0 and probe["seconds"] > 0, probe
    if not torch_cuda_available():
        assert probe["ok"] is False and "nccl needs CUDA" in probe["error"], probe


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def test_device_check_script_parses_and_downloads_nothing() -> None:
    subprocess.run(["bash", "-n", "scripts/device_check.sh"], cwd=ROOT, check=True)
    shown = subprocess.run(
        ["bash", "scripts/device_check.sh", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
    )
    assert "SWERL_DEVICE_BUDGET_S" in shown.stdout and "process group" in shown.stdout, shown.stdout
    stray = subprocess.run(["bash", "scripts/device_check.sh", "--bogus"], cwd=ROOT, capture_output=True, timeout=30)
    assert stray.returncode == 2  # an unknown argument runs nothing
    text = (ROOT / "scripts/device_check.sh").read_text()
    installs = [line for line in text.splitlines() if "pip install" in line and not line.lstrip().startswith("#")]
    assert installs and all("--no-index" in line for line in installs), installs
