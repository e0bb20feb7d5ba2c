"""No leaks: 200 sandbox lifecycles through the pool with random kills leave no process, workspace or container.

Real sandboxes (bubblewrap; Docker when an engine answers, skipped with the reason otherwise). Each lifecycle
starts a sandbox and runs commands, and is randomly: closed normally, cancelled mid-command, cancelled mid-start,
hit by SIGKILL on its sandboxed processes from outside (an OOM killer, an operator), closed while a command runs,
or left with background processes behind. Afterwards the pool holds nothing, no process of any lifecycle's
commands is alive on the host, no descendant of this test process is alive, and the backend's leftovers (local:
workspace directories; docker: containers) are empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
import uuid
from pathlib import Path

import psutil
import pytest

from swerl.errors import InfraError
from swerl.sandbox.pool import PooledSandbox, SandboxPool
from tests.sandbox_backends import Limits, host_processes_matching, make_backend
from tests.sandbox_helpers import pool_around

LIFECYCLES = 200
CONCURRENCY = {"local": 12, "local-bwrap": 12, "docker": 8}
ACTIONS = ("normal", "cancel_exec", "cancel_start", "kill_procs", "close_mid_exec", "background")


async def _kill_from_outside(marker: str, delay: float) -> None:
    """SIGKILL the host processes of a command (found by a marker in its command line) once they run."""
    await asyncio.sleep(delay)
    for _ in range(1000):
        victims = [pid for pid in host_processes_matching(marker) if _is_sleep(pid)]
        if victims:
            for pid in victims:
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).send_signal(signal.SIGKILL)
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no process of the command marked {marker} to kill")


def _describe(pid: int) -> str:
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        return f"{proc.status()} uid={proc.uids().real} ppid={proc.ppid()} {proc.cmdline()}"
    return "gone"


def _is_sleep(pid: int) -> bool:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).name() == "sleep"
    return False


async def _lifecycle(pool: SandboxPool, env_dir: Path, rng: random.Random, run_tag: str, outcomes: dict) -> None:
    action = rng.choice(ACTIONS)
    outcomes[action] = outcomes.get(action, 0) + 1
    # Every long command sleeps a duration unique to this run, so its host processes can be found and counted.
    long = f"sleep 20.{run_tag}"
    if action == "cancel_start":
        start = asyncio.ensure_future(pool.start(env_dir))
        await asyncio.sleep(rng.uniform(0.0, 0.05))
        start.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await (await start).close()  # it finished before the cancel landed
        return
    sandbox: PooledSandbox = await pool.start(env_dir)
    try:
        assert (await sandbox.exec("echo ok > out.txt && cat out.txt", 60)).output == "ok\n"
        if action == "cancel_exec":
            run = asyncio.ensure_future(sandbox.exec(f"{long} & {long}; echo never", 60))
            await asyncio.sleep(rng.uniform(0.01, 0.3))
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
        elif action == "kill_procs":
            marker = f"20.{run_tag}{rng.randrange(10**6):06d}"
            killer = asyncio.ensure_future(_kill_from_outside(marker, rng.uniform(0.05, 0.3)))
            with contextlib.suppress(InfraError):
                result = await sandbox.exec(f"sleep {marker} && echo never", 60)
                assert "never" not in result.output
            await killer
        elif action == "close_mid_exec":
            run = asyncio.ensure_future(sandbox.exec(long, 60))
            await asyncio.sleep(rng.uniform(0.01, 0.3))
            await sandbox.close()
            with pytest.raises(InfraError):
                await run
        elif action == "background":
            await sandbox.exec(f"({long} &) ; nohup {long} >/dev/null 2>&1 & echo left", 60)
    finally:
        await sandbox.close()


@pytest.mark.parametrize(
    "backend_name",
    [  # local: ~30 s on 2 cores; docker: ~2 min (a container start costs seconds here)
        pytest.param("local", id="local"),
        pytest.param("local-bwrap", id="local-bwrap"),
        pytest.param("docker", marks=[pytest.mark.docker, pytest.mark.slow], id="docker"),
    ],
)
def test_no_leaks_after_200_lifecycles_with_random_kills(backend_name: str, tmp_path: Path) -> None:
    backend = make_backend(backend_name, tmp_path, Limits(), kill_grace_s=5)
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    (env_dir / "mod.py").write_text("x = 1\n")
    rng = random.Random(4)
    run_tag = str(uuid.uuid4().int % 10**6).zfill(6)
    outcomes: dict[str, int] = {}
    concurrency = CONCURRENCY[backend_name]
    started = time.monotonic()

    async def body() -> SandboxPool:
        async with pool_around(backend.provider, max_concurrent=concurrency) as pool:
            gate = asyncio.Semaphore(concurrency)

            async def one() -> None:
                async with gate:
                    await _lifecycle(pool, env_dir, random.Random(rng.random()), run_tag, outcomes)

            async def watchdog() -> None:
                await asyncio.sleep(150)  # a hang prints where every task waits (diagnostics)
                for t in asyncio.all_tasks():
                    t.print_stack(limit=6)

            dog = asyncio.ensure_future(watchdog())
            await asyncio.gather(*(one() for _ in range(LIFECYCLES)))
            dog.cancel()
        return pool

    # Servers the test session started (Prefect, MLflow, SeaweedFS) are this process's children too: not leaks.
    before = {p.pid for p in psutil.Process().children(recursive=True)}

    def new_children() -> list[psutil.Process]:
        return [p for p in psutil.Process().children(recursive=True) if p.pid not in before]

    try:
        pool = asyncio.run(body())
        elapsed = time.monotonic() - started
        assert sum(outcomes.values()) == LIFECYCLES and set(outcomes) == set(ACTIONS), outcomes
        assert pool.in_use == 0 and pool._slots == 0
        deadline = time.monotonic() + 15  # the kernel and dockerd reap killed processes asynchronously
        while time.monotonic() < deadline and (host_processes_matching(f"20.{run_tag}") or new_children()):
            time.sleep(0.1)
        left = [(pid, _describe(pid)) for pid in host_processes_matching(f"20.{run_tag}")]
        assert left == []
        # The supervisor's zygote (the provider's, a child of this process) lives until the provider is closed;
        # every sandbox's init is its child, and must be gone.
        left_children = [
            (p.pid, _describe(p.pid))
            for p in new_children()
            if p.name() != "docker" and not (p.ppid() == os.getpid() and "nsinit" in " ".join(p.cmdline()))
        ]
        assert left_children == []
        assert backend.leftovers() == []
        backend.teardown()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and [p for p in new_children() if p.name() != "docker"]:
            time.sleep(0.1)
        assert [(p.pid, _describe(p.pid)) for p in new_children() if p.name() != "docker"] == []
        print(f"{backend_name}: {LIFECYCLES} lifecycles in {elapsed:.1f}s: {outcomes}; {dict(pool.counters)}")
    finally:
        backend.teardown()
