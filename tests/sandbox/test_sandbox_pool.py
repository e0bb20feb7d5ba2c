"""The sandbox pool around the real bubblewrap backend: limits, retries, warm hand-outs, cost, environments."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from swerl.data.schema import TaskInstance
from swerl.errors import InfraError
from swerl.rollout.environments import (
    EnvironmentPlanner,
    LocalEnvironments,
    group_by_environment,
)
from swerl.sandbox.base import SandboxProvider
from swerl.sandbox.local import LocalSandboxProvider
from swerl.sandbox.ratelimit import TokenBucket
from tests.sandbox_helpers import local_provider, pool_around

PATCH = "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,2 +1,2 @@\n def answer():\n-    return 41\n+    return 42\n"


@pytest.fixture
def env_dir(tmp_path: Path) -> Path:
    root = tmp_path / "env"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("def answer():\n    return 41\n")
    return root


@pytest.fixture
def sandboxes(tmp_path: Path) -> Path:
    return tmp_path / "sandboxes"


@pytest.fixture
def local(sandboxes: Path) -> LocalSandboxProvider:
    return local_provider(max_processes=64, root_dir=sandboxes)


def leftovers(root: Path) -> list[str]:
    """What sandboxes left under root (a supervisor's mount point is its provider's, and must be empty)."""
    if not root.exists():
        return []
    return sorted(p.name for p in root.iterdir() if not ("-mnt-" in p.name and not any(p.iterdir())))


def test_concurrency_limit_waits_for_a_close(local: LocalSandboxProvider, env_dir: Path, sandboxes: Path) -> None:
    async def body() -> None:
        async with pool_around(local, max_concurrent=2) as pool:
            assert isinstance(pool, SandboxProvider)
            first, second = await pool.start(env_dir), await pool.start(env_dir)
            third = asyncio.ensure_future(pool.start(env_dir))
            await asyncio.sleep(0.5)
            assert not third.done() and pool.in_use == 2 and pool.counters["slot.waits"] >= 1
            await first.close()
            sandbox = await asyncio.wait_for(third, 30)
            assert (await sandbox.exec("cat pkg/mod.py", 10)).exit_code == 0
            for s in (second, sandbox):
                await s.close()
            assert pool.in_use == 0
        assert leftovers(sandboxes) == []

    asyncio.run(body())


def test_start_failures_retried_by_cause(local: LocalSandboxProvider, env_dir: Path, sandboxes: Path) -> None:
    async def body() -> None:
        broken = local_provider(root_dir=sandboxes, bwrap="no-such-bwrap", runtime="bubblewrap")
        async with pool_around(broken, start_retries=2, retry_backoff_s=0.01) as pool:
            with pytest.raises(InfraError) as info:
                await pool.start(env_dir)
            assert info.value.cause == "start_failed"
            assert pool.counters["start_error.start_failed"] == 3
            assert pool.counters["start_retry.start_failed"] == 2
            assert pool.in_use == 0 and pool._slots == 0
        async with pool_around(local, start_retries=2, retry_backoff_s=0.01) as pool:
            # image_missing is not in retry_causes: one try only.
            with pytest.raises(InfraError) as info:
                await pool.start(env_dir / "missing")
            assert pool.counters["start_error.image_missing"] == 1
            assert "start_retry.image_missing" not in pool.counters
            assert pool.in_use == 0 and pool._slots == 0

    asyncio.run(body())


def test_start_timeout_and_the_late_sandbox_is_closed(
    local: LocalSandboxProvider, env_dir: Path, sandboxes: Path
) -> None:
    async def body() -> None:
        async with pool_around(local, start_timeout_s=0.001, start_retries=1, retry_backoff_s=0.0) as pool:
            with pytest.raises(InfraError) as info:
                await pool.start(env_dir)
            assert info.value.cause == "start_timeout"
            assert pool.counters["start_error.start_timeout"] == 2
            await pool.drain()
            assert pool.counters["start.abandoned"] == 2  # both late sandboxes arrived and were closed
        assert leftovers(sandboxes) == []

    asyncio.run(body())


def test_warm_pool_hands_out_ready_sandboxes_and_refills(
    local: LocalSandboxProvider, env_dir: Path, sandboxes: Path
) -> None:
    async def body() -> None:
        async with pool_around(local, max_concurrent=4, warm_size=2) as pool:
            pool.keep_warm(env_dir, PATCH)
            await pool.wait_warm(60)
            assert pool.warm_ready(env_dir, PATCH) == 2
            started = time.perf_counter()
            sandbox = await pool.start(env_dir, PATCH)
            handout = time.perf_counter() - started
            assert sandbox.warm and handout < 0.05, handout
            out = await sandbox.exec("python -c 'from pkg.mod import answer; print(answer())'", 30)
            assert out.output == "42\n"  # the warm sandbox is in the task's starting state
            await pool.wait_warm(60)
            assert pool.warm_ready(env_dir, PATCH) == 2 and pool.counters["start.warm"] == 1
            # Another starting state is cold; with 4 slots (1 in use + 2 warm) it fits, a second evicts.
            other = await pool.start(env_dir)
            assert not other.warm
            another = await pool.start(env_dir)
            assert pool.counters["warm.evicted"] == 1
            for s in (sandbox, other, another):
                await s.close()
        assert leftovers(sandboxes) == []

    asyncio.run(body())


def test_warm_ahead_serves_one_group_then_forgets(local: LocalSandboxProvider, env_dir: Path, sandboxes: Path) -> None:
    """warm_ahead(count) starts `count` sandboxes for the next starts of that state and refills nothing: a group's
    attempts take them as they start; one that came before they were ready went cold and a spare is closed."""

    async def body() -> None:
        async with pool_around(local, max_concurrent=8) as pool:
            pool.warm_ahead(env_dir, PATCH, 3)
            pool.warm_ahead(env_dir, PATCH, 0)  # nothing
            early = await pool.start(env_dir, PATCH)  # before any is ready: cold, and one fewer is wanted
            assert not early.warm
            await pool.wait_warm(60)
            await pool.drain()  # the third warm start arrives unwanted and is closed
            assert pool.warm_ready(env_dir, PATCH) == 2 and pool.counters["warm.unused"] == 1
            taken = [await pool.start(env_dir, PATCH) for _ in range(2)]
            assert all(s.warm for s in taken) and pool.counters["start.warm"] == 2
            out = await taken[0].exec("python -c 'from pkg.mod import answer; print(answer())'", 30)
            assert out.output == "42\n"
            assert pool.warm_ready() == 0 and pool._warm == {}  # spent: nothing refills
            late = await pool.start(env_dir, PATCH)
            assert not late.warm and pool._warm == {}
            for s in (early, *taken, late):
                await s.close()
            # Leftovers of a group that never started are closed with the pool.
            pool.warm_ahead(env_dir, None, 2)
            await pool.wait_warm(60)
            assert pool.warm_ready(env_dir) == 2
        assert leftovers(sandboxes) == []

    asyncio.run(body())


def test_sandbox_seconds_and_cost(local: LocalSandboxProvider, env_dir: Path) -> None:
    async def body() -> None:
        async with pool_around(local, price_per_sandbox_hour=3.6) as pool:
            sandbox = await pool.start(env_dir)
            await sandbox.exec("sleep 0.3", 10)
            await sandbox.close()
            seconds = pool.sandbox_seconds()
            assert sandbox.seconds() >= 0.3 and seconds == pytest.approx(sandbox.seconds())
            assert pool.cost_usd(seconds) == pytest.approx(seconds / 1000)
            step = pool.step_metrics()
            assert step["sandbox_seconds_step"] == pytest.approx(seconds)
            assert step["sandbox_cost_usd_step"] == pytest.approx(seconds / 1000)
            assert step["pool/start.cold"] == 1.0
            assert pool.step_metrics()["sandbox_seconds_step"] == pytest.approx(0.0)  # nothing ran since

    asyncio.run(body())


def _task(image: str, n: int) -> TaskInstance:
    return TaskInstance(
        instance_id=f"t{n}",
        repo="r",
        base_commit="",
        problem_statement="p",
        patch=PATCH,
        patch_kind="bug",
        image=image,
        FAIL_TO_PASS=["a"],
        source="test",
    )


def test_environments_grouped_prepared_once_at_the_pull_rate(env_dir: Path, tmp_path: Path) -> None:
    tasks = [_task(f"local://{env_dir}", 0), _task("local:///nowhere", 1), _task(f"local://{env_dir}", 2)]
    backend = LocalEnvironments()
    groups = group_by_environment(tasks, backend)
    assert list(groups) == [f"local://{env_dir}", "local:///nowhere"] and len(groups[f"local://{env_dir}"]) == 2

    async def body() -> None:
        planner = EnvironmentPlanner(backend, pulls_per_minute=600, burst=1)  # one every 0.1 s
        started = time.monotonic()
        results = await planner.prepare_all(tasks)
        assert results[f"local://{env_dir}"] == env_dir
        missing = results["local:///nowhere"]
        assert isinstance(missing, InfraError) and missing.cause == "image_missing"
        assert planner.counters["prepared"] == 1 and planner.counters["failed"] == 1
        assert time.monotonic() - started >= 0.09  # the second preparation waited for a token
        assert await planner.environment(tasks[2]) == env_dir  # no new preparation
        assert planner.counters["prepared"] == 1

        bucket = TokenBucket(rate_per_s=20, burst=2)
        t0 = time.monotonic()
        for _ in range(6):
            await bucket.acquire()
        assert 0.18 <= time.monotonic() - t0 < 1.0  # 2 free, then 4 at 20/s

    asyncio.run(body())


def test_a_waiter_cancelled_after_a_release_does_not_strand_the_next(
    local: LocalSandboxProvider, env_dir: Path
) -> None:
    async def body() -> None:
        async with pool_around(local, max_concurrent=1) as pool:
            holder = await pool.start(env_dir)
            first = asyncio.ensure_future(pool.start(env_dir))
            second = asyncio.ensure_future(pool.start(env_dir))
            await asyncio.sleep(0.2)
            await holder.close()  # frees the slot and schedules the wake-up
            await asyncio.sleep(0)  # the wake-up reaches `first`, which has not run yet...
            first.cancel()  # ...and is cancelled then (on 3.11 a plain notify() is swallowed by it)
            sandbox = await asyncio.wait_for(second, 10)
            assert first.cancelled() and pool.in_use == 1
            await sandbox.close()

    asyncio.run(body())


def test_a_pool_that_owns_its_provider_releases_it(env_dir: Path, sandboxes: Path) -> None:
    """owns_provider (what the stages' pools set): closing the pool ends what the provider itself holds (the
    supervisor's zygote, its mount point), and the provider still serves a later pool."""
    provider = local_provider(max_processes=64, root_dir=sandboxes)
    zygotes: list[int] = []

    async def body() -> None:
        async with pool_around(provider, owns_provider=True) as pool:
            sandbox = await pool.start(env_dir)
            assert (await sandbox.exec("echo hi", 10)).output == "hi\n"
            launcher = provider._launcher  # the supervisor's (as root); None under bubblewrap
            if launcher is not None and launcher._proc is not None:
                zygotes.append(launcher._proc.pid)
            await sandbox.close()

    for _ in range(2):
        asyncio.run(body())
        assert [pid for pid in zygotes if Path(f"/proc/{pid}").exists()] == []
        assert list(sandboxes.iterdir()) == []
    assert len(set(zygotes)) == (2 if provider.mount_point is not None else 0)  # a new zygote for the second pool
