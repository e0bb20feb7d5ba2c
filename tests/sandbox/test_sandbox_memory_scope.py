"""What memory_mb caps, as the limits record says it (issue 36): under bubblewrap each process's address space, so
one sandbox's processes together hold more than memory_mb; under the supervisor with cgroups, the whole sandbox."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from swerl.doctor import cgroups_state
from swerl.sandbox.tmpfs import can_mount
from tests.sandbox_helpers import local_provider

HOLD = "import sys, time; b = bytearray(48 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(3)"
"""A process that touches 48 MB and holds it for 3 s."""


def _three_at_once(runtime: str, tmp_path: Path) -> tuple[dict[str, int | float], str]:
    env = tmp_path / "env"
    env.mkdir()
    provider = local_provider(
        sys.executable, memory_mb=128, max_processes=32, root_dir=tmp_path / "sb", runtime=runtime
    )
    limits = provider.limits()  # before any start: the runtime is decided for the record

    async def body() -> str:
        sandbox = await provider.start(env)
        try:
            # three processes of 48 MB each at once: 144 MB in a sandbox of memory_mb 128 (plus the interpreters)
            cmd = f'for i in 1 2 3; do python3 -c "{HOLD}" & done; wait; echo held'
            return (await sandbox.exec(cmd, 60)).output
        finally:
            await sandbox.close()

    return limits, asyncio.run(body())


def test_bubblewrap_caps_memory_per_process_and_says_so(tmp_path: Path) -> None:
    limits, output = _three_at_once("bubblewrap", tmp_path)
    assert limits["memory_per_sandbox"] == 0 and limits["memory_mb"] == 128
    assert output.strip().endswith("held") and "MemoryError" not in output, output


@pytest.mark.skipif(not (cgroups_state()[0] and can_mount(Path("/tmp"))[0]), reason="needs root with cgroups")
def test_the_supervisor_with_cgroups_caps_the_whole_sandbox_and_says_so(tmp_path: Path) -> None:
    limits, output = _three_at_once("supervisor", tmp_path)
    assert limits["memory_per_sandbox"] == 1
    assert "Killed" in output or "MemoryError" in output, output
