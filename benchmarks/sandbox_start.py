"""Sandbox start-to-first-exec latency under bursts of concurrent starts, against each backend's raw floor.

    .venv/bin/python benchmarks/sandbox_start.py [--local 64,384] [--docker 16,64] [--skip-docker] [--repeat 3]
                                                 [--workspace-dir /dev/shm] [--runtime auto]

For each burst size N, all N starts are issued at once; a sandbox's latency is the time from the burst's start
to the return of its first command (`true`). The raw floor is measured in the same run at the same concurrency:
N `bwrap ... /bin/true` processes (the namespaces the local backend uses, nothing else) for local, and N
`docker run --rm --network none IMAGE /bin/true` for docker. Raw and swerl bursts alternate for --repeat rounds
(the machine may be shared); prints the median round's p50/p99 of each and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from swerl.config.sandbox import DockerSandboxConfig, SandboxLimits
from swerl.sandbox.docker import DockerSandboxProvider
from swerl.sandbox.images import BASE_IMAGE
from swerl.sandbox.local import LocalSandboxProvider
from swerl.stages.common import sandbox_provider


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


async def burst(count: int, one) -> list[float]:
    """Latency of each of `count` concurrent calls of one(t0), from the common start."""
    t0 = time.monotonic()
    return list(await asyncio.gather(*(one(t0) for _ in range(count))))


async def run_process(argv: list[str], t0: float) -> float:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({proc.returncode}): {err.decode()[-300:]}")
    return time.monotonic() - t0


def raw_bwrap_argv() -> list[str]:
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"]
    for link in ("bin", "sbin", "lib", "lib64"):
        host = Path("/") / link
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), f"/{link}"]
    return [*argv, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--clearenv", "/bin/true"]


async def sandbox_latency(provider, env_dir: Path, t0: float, closing: list) -> float:
    sandbox = await provider.start(env_dir)
    result = await sandbox.exec("true", 60)
    latency = time.monotonic() - t0
    assert result.exit_code == 0, result
    closing.append(sandbox)
    return latency


async def measure(name: str, count: int, provider, env_dir: Path, raw_argv: list[str], repeat: int) -> None:
    """`repeat` rounds of (raw burst, swerl burst), interleaved; prints the median round's p50 and p99."""
    rounds = []
    for _ in range(repeat):
        raw = await burst(count, lambda t0: run_process(raw_argv, t0))
        closing: list = []
        ours = await burst(count, lambda t0, closing=closing: sandbox_latency(provider, env_dir, t0, closing))
        await asyncio.gather(*(s.close() for s in closing))
        await asyncio.sleep(1.0)  # let removals settle before the next burst
        rounds.append((percentile(raw, 50), percentile(raw, 99), percentile(ours, 50), percentile(ours, 99)))
    raw50, raw99, our50, our99 = (statistics.median(r[i] for r in rounds) for i in range(4))
    print(
        f"{name:6} N={count:4}  raw p50 {raw50:6.2f} s  p99 {raw99:6.2f} s | swerl p50 {our50:6.2f} s  "
        f"p99 {our99:6.2f} s | ratio p50 {our50 / raw50:4.2f}x  p99 {our99 / raw99:4.2f}x  "
        f"(median of {repeat}; per-round p99 ratios {', '.join(f'{r[3] / r[1]:.2f}' for r in rounds)})",
        flush=True,
    )


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="swerl-bench-") as tmp:
        env_dir = Path(tmp) / "env"
        (env_dir / "pkg").mkdir(parents=True)
        for i in range(8):  # a micro repository's size: a module, tests, a harness
            (env_dir / "pkg" / f"mod{i}.py").write_text("def f(x):\n    return x + 1\n" * 20)
        workspaces = Path(args.workspace_dir or tmp) / f"swerl-bench-{os.getpid()}"
        local = sandbox_provider(
            SandboxLimits(
                workspace_dir=str(workspaces),
                max_processes=256,
                workspace_quota=args.workspace_quota,
                runtime=args.runtime,
            )
        )
        assert isinstance(local, LocalSandboxProvider)
        await (await local.start(env_dir)).close()  # warm the interpreter probe, as a running stage has
        for count in args.local:
            await measure("local", count, local, env_dir, raw_bwrap_argv(), args.repeat)
        local.close()
        shutil.rmtree(workspaces, ignore_errors=True)
        if args.skip_docker or shutil.which("docker") is None:
            return
        threads = max(4, max(args.docker) * 2)  # the config's floor is 4
        docker = sandbox_provider(
            SandboxLimits(backend="docker", docker=DockerSandboxConfig(base_image=args.image, api_threads=threads))
        )
        assert isinstance(docker, DockerSandboxProvider)
        await (await docker.start(env_dir)).close()  # builds the environment image once
        raw_docker = ["docker", "run", "--rm", "--network", "none", args.image, "/bin/true"]
        for count in args.docker:
            await measure("docker", count, docker, env_dir, raw_docker, args.repeat)
        docker.close()


def sizes(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--local", type=sizes, default=[64, 384])
    parser.add_argument("--docker", type=sizes, default=[16, 64])
    parser.add_argument("--image", default=BASE_IMAGE)
    parser.add_argument("--skip-docker", action="store_true")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per burst size (median reported)")
    parser.add_argument(
        "--workspace-quota",
        default="auto",
        choices=["auto", "tmpfs", "none"],
        help="local: a size-capped tmpfs per sandbox (auto/tmpfs, as root) or a plain directory",
    )
    parser.add_argument(
        "--runtime",
        default="auto",
        choices=["auto", "supervisor", "bubblewrap"],
        help="local: the supervisor (auto as root) or a bubblewrap per command",
    )
    parser.add_argument("--workspace-dir", default=None, help="where local workspaces go (default: temp dir)")
    asyncio.run(main(parser.parse_args()))
