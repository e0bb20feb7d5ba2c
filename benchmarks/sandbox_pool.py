"""Warm-pool hand-out latency while many trajectories are in flight, against cold starts in the same run.

    nice -n 19 .venv/bin/python benchmarks/sandbox_pool.py [--in-flight 384] [--warm 16] [--handouts 100]

Local backend (the runtime `auto` picks). First `--in-flight` trajectories start and stay in flight: each holds a
sandbox and runs agent-like commands (`sleep` in the sandbox, a host pause standing in for the LLM). Then the pool keeps
`--warm` sandboxes of one task's starting state ready, and requests for that state arrive one after another;
each hand-out's latency (request to a ready sandbox) is recorded, the sandbox used for one command and closed
(the pool refills in the background). Cold starts of another starting state are measured in the same run,
interleaved, under the same load. Prints p50/p99 of both and the cold/warm ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from swerl.config.sandbox import SandboxLimits, SandboxPoolConfig
from swerl.sandbox.pool import SandboxPool
from swerl.stages.common import sandbox_pool

PATCH = "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1,2 +1,2 @@\n def answer():\n-    return 41\n+    return 42\n"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def trajectory(pool: SandboxPool, env_dir: Path, stop: asyncio.Event, ready: list[int]) -> None:
    sandbox = await pool.start(env_dir)
    ready.append(1)
    try:
        while not stop.is_set():
            await sandbox.exec("sleep 4; echo step", 30)
            await asyncio.sleep(1.5)  # the LLM's turn
    finally:
        await sandbox.close()


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="swerl-bench-pool-") as tmp:
        env_dir = Path(tmp) / "env"
        (env_dir / "pkg").mkdir(parents=True)
        (env_dir / "pkg" / "mod.py").write_text("def answer():\n    return 41\n")
        capacity = args.in_flight + args.warm + 4
        limits = SandboxLimits(
            max_processes=64,
            workspace_dir=str(Path(tmp) / "sandboxes"),
            pool=SandboxPoolConfig(max_concurrent=capacity, warm_size=args.warm),
        )
        async with sandbox_pool(limits) as pool:
            stop, ready = asyncio.Event(), []
            t0 = time.monotonic()
            flights = [asyncio.ensure_future(trajectory(pool, env_dir, stop, ready)) for _ in range(args.in_flight)]
            while len(ready) < args.in_flight:
                await asyncio.sleep(0.1)
            print(f"{args.in_flight} trajectories in flight after {time.monotonic() - t0:.1f}s")
            pool.keep_warm(env_dir, PATCH)
            await pool.wait_warm(300)
            warm_latencies, cold_latencies = [], []
            served_warm = 0
            for i in range(args.handouts):
                started = time.perf_counter()
                sandbox = await pool.start(env_dir, PATCH)
                warm_latencies.append(time.perf_counter() - started)
                served_warm += sandbox.warm
                result = await sandbox.exec("python -c 'from pkg.mod import answer; print(answer())'", 30)
                assert result.output == "42\n", result.output
                await sandbox.close()
                if i % max(1, args.handouts // args.cold) == 0:  # a cold start under the same load
                    started = time.perf_counter()
                    cold = await pool.start(env_dir)  # another starting state: nothing warm for it
                    cold_latencies.append(time.perf_counter() - started)
                    await cold.close()
                await asyncio.sleep(args.interval)
            stop.set()
            await asyncio.gather(*flights)
        in_flight_now = args.in_flight
    warm_p50, warm_p99 = percentile(warm_latencies, 50) * 1000, percentile(warm_latencies, 99) * 1000
    cold_p50, cold_p99 = percentile(cold_latencies, 50) * 1000, percentile(cold_latencies, 99) * 1000
    print(f"in flight: {in_flight_now} trajectories; warm pool size {args.warm}")
    print(
        f"warm hand-out ({len(warm_latencies)}, {served_warm} served warm): p50 {warm_p50:.1f} ms, "
        f"p99 {warm_p99:.1f} ms, mean {statistics.mean(warm_latencies) * 1000:.1f} ms"
    )
    print(f"cold start    ({len(cold_latencies)}): p50 {cold_p50:.1f} ms, p99 {cold_p99:.1f} ms")
    print(
        f"ratio cold/warm: p50 {cold_p50 / warm_p50:.0f}x, p99 {cold_p99 / warm_p99:.0f}x; "
        f"target warm p99 <= 50 ms: {'met' if warm_p99 <= 50 else 'NOT met'}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, default=384)
    parser.add_argument("--warm", type=int, default=16)
    parser.add_argument("--handouts", type=int, default=100)
    parser.add_argument("--cold", type=int, default=25, help="cold starts measured, interleaved")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between hand-out requests")
    asyncio.run(main(parser.parse_args()))
