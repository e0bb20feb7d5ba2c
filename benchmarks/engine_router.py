"""Client + router overhead at high concurrency, against latency-emulating engine servers on loopback.

    .venv/bin/python benchmarks/engine_router.py [--concurrency 1024] [--engines 2] [--latency 5.0] [--rounds 3] \
        [--repeats 2]

Starts `--engines` emulated SGLang servers (swerl.engine.emulated_server, each its own process: every /generate
sleeps `--latency` s and answers 16 tokens), then runs `--concurrency` closed-loop workers, each making `--rounds`
sequential /generate calls (worker i starts after i/(2 concurrency) of the latency, so all are in flight
together from half a latency on), alternating `--repeats` times in one run (direct first, then router first, ...):
  direct: each worker calls one engine through a plain EngineClient (the baseline);
  router: every call goes through the in-process Router over EngineClients.
Connection pools are sized by EngineConfig.pool_size(concurrency), as the stages do. Reports the achieved
concurrency (the router's peak of requests outstanding and the engines' peaks in flight, which must equal
--concurrency: no hidden cap), the client process's CPU time per call in each mode, and the latency above the
emulated one (p50, p99) in each mode, with the router's added latency versus direct.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from swerl.config.engine import EngineConfig
from swerl.engine.base import Engine, GenerateRequest, SamplingParams
from swerl.engine.client import EngineClient
from swerl.engine.router import Router
from swerl.services import Service

# The checkout's tests.doubles, whether this runs as a script or with -m:
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.doubles import launch_emulated  # noqa: E402


def start_engines(count: int, latency_s: float, log_dir: Path) -> list[Service]:
    """`count` emulated SGLang servers (16 tokens an answer), each listening with a backlog of 4096."""
    return [launch_emulated(log_dir, latency_s, output_tokens=None, backlog=4096) for _ in range(count)]


def engine_stats(url: str, reset: bool = False) -> dict[str, Any]:
    if reset:
        request = urllib.request.Request(url + "/engine_stats/reset", data=b"{}", method="POST")
        urllib.request.urlopen(request, timeout=10).close()  # noqa: S310 - loopback
    with urllib.request.urlopen(url + "/engine_stats", timeout=10) as response:  # noqa: S310 - loopback
        return dict(json.loads(response.read()))


async def drive(
    engines: list[Engine], concurrency: int, rounds: int, latency_s: float
) -> tuple[list[float], float, int]:
    """concurrency workers x rounds calls; worker i uses engines[i % len]. Returns latencies above the emulated
    one (s), CPU seconds of this process, and calls made."""
    extra: list[float] = []

    async def worker(index: int) -> None:
        engine = engines[index % len(engines)]
        # starts spread over half a latency (not one burst): all are in flight together from then on
        await asyncio.sleep(index * latency_s / 2 / concurrency)
        for call in range(rounds):
            sampling = SamplingParams(max_new_tokens=16, temperature=1.0)
            request = GenerateRequest(input_ids=[1 + index % 500, 2, 3], sampling_params=sampling, rid=f"w{index}")
            started = time.perf_counter()
            response = await engine.generate(request)
            extra.append(time.perf_counter() - started - latency_s)
            assert len(response.output_ids) == 16, (index, call)

    cpu = time.process_time()
    await asyncio.gather(*(worker(index) for index in range(concurrency)))
    return extra, time.process_time() - cpu, concurrency * rounds


CLIENT_ARGS: dict[str, Any] = dict(
    connect_timeout_s=10.0,
    request_timeout_s=600.0,
    control_timeout_s=600.0,
    health_timeout_s=30.0,
    retries=0,
    retry_backoff_s=0.5,
)
"""The clients' timeouts and retries the numbers in docs/benchmarks.md were measured with."""
ROUTER_ARGS: dict[str, Any] = dict(
    sticky_capacity=100_000, sticky_max_excess=64, weight_update_mode="pause", pause_mode="retract"
)
"""The router's stickiness and weight-update settings those numbers were measured with."""


def router_bookkeeping_us(engines: int, calls: int = 200_000) -> float:
    """The router's own work per call (pick with stickiness + outstanding accounting), timed in isolation: the
    part of its added latency that does not depend on the machine's load."""
    clients = [EngineClient(f"http://127.0.0.1:{1 + i}", pool_size=1, **CLIENT_ARGS) for i in range(engines)]
    router = Router(clients, retries=2, health_interval_s=5.0, **ROUTER_ARGS)
    started = time.perf_counter()
    for index in range(calls):
        slot = router.pick(f"w{index % 1024}")
        router._begin(slot)
        router._end(slot)
    return 1e6 * (time.perf_counter() - started) / calls


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 10) - 1]


async def main(args: argparse.Namespace) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * args.concurrency + 256
    if soft < needed:
        raise SystemExit(f"open-file limit {soft} < {needed} needed for {args.concurrency} connections")
    config = EngineConfig.model_validate({"kind": "http_local", "launch": {"num_engines": args.engines}})
    pool_size = config.pool_size(args.concurrency)
    with tempfile.TemporaryDirectory() as logs:
        services = start_engines(args.engines, args.latency, Path(logs))
        urls = [service.health_url.rsplit("/", 1)[0] for service in services]
        try:
            results: dict[str, Any] = {}
            pairs = [
                ("direct", "router") if repeat % 2 == 0 else ("router", "direct") for repeat in range(args.repeats)
            ]
            for mode in ("warm-up", *(mode for pair in pairs for mode in pair)):  # ABBA: no order advantage
                clients = [EngineClient(url, pool_size=pool_size, **CLIENT_ARGS) for url in urls]
                for url in urls:
                    engine_stats(url, reset=True)
                router = Router(clients, health_interval_s=0, retries=config.http.retries, **ROUTER_ARGS)
                engines: list[Engine] = [router] if mode == "router" else list(clients)
                rounds = 1 if mode == "warm-up" else args.rounds
                extra, cpu_s, calls = await drive(engines, args.concurrency, rounds, args.latency)
                peaks = [engine_stats(url)["peak_in_flight"] for url in urls]
                row = results.setdefault(mode, {"extra": [], "cpu_s": 0.0, "calls": 0, "peaks": [], "router": []})
                row["extra"] += extra
                row["cpu_s"] += cpu_s
                row["calls"] += calls
                row["peaks"].append(sum(peaks))
                row["router"].append(router.max_outstanding)
                if mode == "router":
                    stats = router.stats()
                    row.setdefault("retried", []).append(stats["retried"])
                    row.setdefault("errors", []).extend(e["last_error"] for e in stats["engines"] if e["last_error"])
                await router.close()
            for row in results.values():
                row["cpu_ms_per_call"] = 1000 * row["cpu_s"] / row["calls"]
                row["p50_ms"] = 1000 * percentile(row["extra"], 50)
                row["p99_ms"] = 1000 * percentile(row["extra"], 99)
        finally:
            for service in services:
                service.stop()
    direct, routed = results["direct"], results["router"]
    print(
        f"{args.engines} emulated engines, {args.latency:.2f} s per /generate, {args.concurrency} concurrent "
        f"workers x {args.rounds} calls, pool {pool_size} connections per engine, open-file limit {soft}/{hard}"
    )
    print("load average (1, 5, 15 min) at the end: " + ", ".join(f"{load:.1f}" for load in os.getloadavg()))
    print(
        f"achieved concurrency (per repeat): router peak outstanding {routed['router']}, engines' peaks in "
        f"flight summed {routed['peaks']} (direct: {direct['peaks']}); configured {args.concurrency}"
    )
    for name, row in (("direct (baseline)", direct), ("client + router", routed)):
        print(
            f"{name:18s} CPU {row['cpu_ms_per_call']:.3f} ms/call; latency above the emulated "
            f"{args.latency:.2f} s: p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms"
        )
    print(
        f"router adds: CPU {routed['cpu_ms_per_call'] - direct['cpu_ms_per_call']:+.3f} ms/call "
        f"({routed['cpu_ms_per_call'] / direct['cpu_ms_per_call']:.2f}x direct), p50 "
        f"{routed['p50_ms'] - direct['p50_ms']:+.1f} ms, p99 {routed['p99_ms'] - direct['p99_ms']:+.1f} ms"
    )
    print(f"router bookkeeping per call, timed in isolation: {router_bookkeeping_us(args.engines):.2f} us")
    print(f"router retries per repeat: {routed['retried']}; engine errors: {routed['errors'] or 'none'}")
    achieved = {*routed["peaks"], *routed["router"], *direct["peaks"]}
    if achieved != {args.concurrency}:
        raise SystemExit("achieved concurrency differs from the configured one: a hidden cap")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=1024)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--latency", type=float, default=5.0, help="emulated seconds per /generate")
    parser.add_argument("--rounds", type=int, default=3, help="sequential calls per worker")
    parser.add_argument("--repeats", type=int, default=2, help="direct/router alternations (pooled)")
    asyncio.run(main(parser.parse_args()))
