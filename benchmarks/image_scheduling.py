"""Image-aware scheduling: N tasks over K task images on the docker backend, interleaved vs grouped order.

    nice -n 19 .venv/bin/python benchmarks/image_scheduling.py [--tasks 24] [--images 6] [--workers 4] [--work-s 1]

K tiny task images are built FROM swerl-base:bookworm (removed at the end). Each arm runs the same N tasks (task i
on image i mod K) through a fresh docker sandbox pool with `--workers` at a time, as evaluation and the oracle
traces stage do: start a sandbox of the task's image (its sandbox layer prepared on first need, by
DockerSandboxProvider.environment_image), run `sleep --work-s` in it, close it. The arms differ only in the order
tasks are started: interleaved (the order given: a, b, c, ..., a, b, c, ...) and grouped
(swerl.data.environments.environment_order: every task of a before b, in order of first need). Each arm starts
with none of the sandbox layers built, and the arms alternate (interleaved, grouped, grouped, interleaved) so
neither gets a warmer engine. Prints per arm: wall time, sandbox layers built, the most built at once, the
worker-seconds spent waiting for an image, and the grouped/interleaved ratios.

`--pulls P --pull-window-s S`: each image's preparation first takes a token of the provider's own sliding-window
limit (sandbox.ratelimit.WindowLimit, what docker.pulls_per_hour drives), P per S seconds, standing in for pulls
under a registry's budget (no registry is reachable here, so the images are built locally, not pulled).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import secrets
import statistics
import time
from typing import Any

import docker
import docker.errors

from swerl.config.sandbox import SandboxLimits, SandboxPoolConfig
from swerl.data.environments import environment_order
from swerl.sandbox.base import ImageEnvironment
from swerl.sandbox.ratelimit import WindowLimit
from swerl.stages.common import sandbox_pool


def build_images(client: Any, count: int) -> list[str]:
    tag = f"swerl-bench-sched-{secrets.token_hex(3)}"
    names = []
    for index in range(count):
        name = f"{tag}:{index}"
        dockerfile = f"FROM swerl-base:bookworm\nLABEL org.swerl.bench={name}\nWORKDIR /testbed\n"
        client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=name, pull=False, network_mode="none")
        names.append(name)
    return names


async def run_arm(
    images: list[str], order: list[int], workers: int, work_s: float, pull_budget: tuple[int, float] | None
) -> dict[str, Any]:
    limits = SandboxLimits(backend="docker", pool=SandboxPoolConfig(max_concurrent=workers))
    pool = sandbox_pool(limits)
    backend: Any = pool.provider
    budget = None if pull_budget is None else WindowLimit(pull_budget[0], pull_budget[1], "simulated pulls")
    building: set[Any] = set()
    peak = [0]
    prepare = backend.environment_image

    async def counted(env: Any) -> Any:  # counts distinct images being prepared at once (a cached one: none)
        if env in backend._images or env in building:
            return await prepare(env)
        building.add(env)
        peak[0] = max(peak[0], len(building))
        try:
            if budget is not None:  # as a pull would: the provider's own sliding-window limit
                await budget.acquire()
            return await prepare(env)
        finally:
            building.discard(env)

    backend.environment_image = counted
    gate = asyncio.Semaphore(workers)
    waited: list[float] = []

    async def one(index: int) -> None:
        env = ImageEnvironment(images[index % len(images)])
        async with gate:
            asked = time.monotonic()
            await counted(env)
            waited.append(time.monotonic() - asked)
            sandbox = await pool.start(env)
            try:
                await sandbox.exec(f"sleep {work_s}", timeout=60)
            finally:
                await sandbox.close()

    started = time.monotonic()
    async with pool:
        await asyncio.gather(*(one(i) for i in order))
    wall = time.monotonic() - started
    layers = [prepared.tag for prepared in backend._images.values()]
    return {
        "wall_s": wall,
        "built": backend.image_counters["built"],
        "reused": backend.image_counters["reused"],
        "peak_building": peak[0],
        "image_wait_s": sum(waited),
        "layers": layers,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--images", type=int, default=6)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--work-s", type=float, default=1.0)
    parser.add_argument("--pulls", type=int, default=None, help="simulated pull budget: images per window")
    parser.add_argument("--pull-window-s", type=float, default=10.0)
    args = parser.parse_args()
    client = docker.from_env()
    images = build_images(client, args.images)

    class _Task:  # environment_order reads only `image`
        def __init__(self, image: str) -> None:
            self.image = image

    tasks: list[Any] = [_Task(images[i % len(images)]) for i in range(args.tasks)]
    orders = {"interleaved": list(range(args.tasks)), "grouped": environment_order(tasks)}
    results: dict[str, list[dict[str, Any]]] = {"interleaved": [], "grouped": []}
    budget = None if args.pulls is None else (args.pulls, args.pull_window_s)
    try:
        for arm in ("interleaved", "grouped", "grouped", "interleaved"):
            result = asyncio.run(run_arm(images, orders[arm], args.workers, args.work_s, budget))
            for layer in result.pop("layers"):  # the next arm prepares every image again
                with contextlib.suppress(docker.errors.ImageNotFound):
                    client.images.remove(layer)
            results[arm].append(result)
            print(
                f"{arm:12s} "
                + " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()),
                flush=True,
            )
    finally:
        for name in images:
            client.images.remove(name)
    mean = {arm: {k: statistics.mean(r[k] for r in rs) for k in rs[0]} for arm, rs in results.items()}
    print(f"\n{args.tasks} tasks over {args.images} images, {args.workers} workers, {args.work_s} s of work each")
    for arm, m in mean.items():
        print(
            f"{arm:12s} wall {m['wall_s']:.1f} s, layers built {m['built']:.0f}, at most {m['peak_building']:.0f} "
            f"at once, workers waiting for an image {m['image_wait_s']:.1f} s"
        )
    g, i = mean["grouped"], mean["interleaved"]
    print(
        f"grouped/interleaved: wall {g['wall_s'] / i['wall_s']:.2f}x, builds {g['built'] / i['built']:.2f}x, "
        f"image wait {g['image_wait_s'] / max(i['image_wait_s'], 1e-9):.2f}x"
    )


if __name__ == "__main__":
    main()
