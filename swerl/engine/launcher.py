"""Start N engine server processes on 127.0.0.1, wait until each is healthy, stop them by process id.

Local: `python -m swerl.engine.server` (the local engine behind SGLang's API; on CPU, or engine i on GPU i with
device cuda). GPU: `python -m sglang.launch_server` with the model path, tensor-parallel size, context-length cap,
memory fraction and port from the config, each engine on its own GPUs (CUDA_VISIBLE_DEVICES). A weight-sync
interface (socket_ifname) reaches every engine as GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME. sglang is never imported
here: the command runs in a child process, so a CPU machine needs only the `gpu` extra's absence checked (shutil.which /
find_spec). Each engine's stdout and stderr go to its own log file; a start failure raises with the log's tail.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from swerl.services import Service, free_port


@dataclass(frozen=True)
class LocalServerSpec:
    """What the local engine server needs (plain arguments; the factory maps the config onto them)."""

    model_dir: str
    max_batch_size: int
    max_context_tokens: int
    threads: int
    seed: int
    weight_version: int = 0
    prefix_cache_size: int = 0
    device: str = "cpu"
    """cpu, or cuda: engine i runs on GPU i (CUDA_VISIBLE_DEVICES=i)."""
    dtype: str = "float32"
    weight_sync_timeout_s: float = 600.0
    socket_ifname: str | None = None
    prefill_tokens_per_step: int = 1024


@dataclass(frozen=True)
class SGLangSpec:
    """What `sglang.launch_server` needs; every cap explicit (no SGLang default decides one)."""

    model_dir: str
    tp_size: int
    context_length: int
    mem_fraction_static: float | None
    max_running_requests: int
    seed: int
    weight_version: int = 0
    extra_args: tuple[str, ...] = ()
    socket_ifname: str | None = None


def local_server_command(spec: LocalServerSpec, host: str, port: int, index: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "swerl.engine.server",
        "--model",
        spec.model_dir,
        "--host",
        host,
        "--port",
        str(port),
        "--max-batch-size",
        str(spec.max_batch_size),
        "--max-context-tokens",
        str(spec.max_context_tokens),
        "--threads",
        str(spec.threads),
        "--seed",
        str(spec.seed + index),  # engines sample independent streams
        "--weight-version",
        str(spec.weight_version),
        "--prefix-cache-size",
        str(spec.prefix_cache_size),
        "--device",
        spec.device,
        "--dtype",
        spec.dtype,
        "--weight-sync-timeout-s",
        str(spec.weight_sync_timeout_s),
        "--prefill-tokens-per-step",
        str(spec.prefill_tokens_per_step),
        "--parent-pid",
        str(os.getpid()),  # the server exits when the process that launched it is gone
    ]


def sglang_command(spec: SGLangSpec, host: str, port: int, index: int) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        spec.model_dir,
        "--host",
        host,
        "--port",
        str(port),
        "--tp-size",
        str(spec.tp_size),
        "--context-length",
        str(spec.context_length),
        "--max-running-requests",
        str(spec.max_running_requests),
        "--random-seed",
        str(spec.seed + index),
        "--weight-version",
        str(spec.weight_version),
        "--skip-server-warmup",
    ]
    if spec.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", str(spec.mem_fraction_static)]
    return argv + list(spec.extra_args)


def sglang_available() -> bool:
    """Whether the `gpu` extra is installed (checked without importing sglang or its CUDA stack)."""
    return importlib.util.find_spec("sglang") is not None


class EngineLauncher:
    """N engine processes, each a swerl.services.Service (own process group, health URL, log file).

    swerl.engine.factory.open_engine maps EngineConfig (which holds the defaults) onto these arguments.

    Args:
        spec: LocalServerSpec (CPU) or SGLangSpec (GPU).
        num_engines: processes to start.
        log_dir: where engine_I.log files go.
        host: bind address (loopback).
        base_port: engine i listens on base_port + i; 0 picks free ports.
        startup_timeout_s: how long each engine may take to become healthy.
        stop_timeout_s: how long an engine may take to stop after SIGTERM before SIGKILL.
    """

    def __init__(
        self,
        spec: LocalServerSpec | SGLangSpec,
        num_engines: int,
        log_dir: Path,
        *,
        host: str,
        base_port: int,
        startup_timeout_s: float,
        stop_timeout_s: float = 30.0,
    ) -> None:
        self.spec = spec
        self.num_engines = num_engines
        self.log_dir = Path(log_dir)
        self.host = host
        self.base_port = base_port
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.services: list[Service] = []

    def commands(self) -> list[tuple[int, list[str], dict[str, str]]]:
        """(port, argv, extra environment) of every engine."""
        result = []
        for index in range(self.num_engines):
            port = self.base_port + index if self.base_port else free_port(self.host)
            if isinstance(self.spec, SGLangSpec):
                first = index * self.spec.tp_size
                gpus = ",".join(str(gpu) for gpu in range(first, first + self.spec.tp_size))
                argv = sglang_command(self.spec, self.host, port, index)
                env = {"CUDA_VISIBLE_DEVICES": gpus}
            else:
                argv = local_server_command(self.spec, self.host, port, index)
                env = {"OMP_NUM_THREADS": str(self.spec.threads)}
                if self.spec.device == "cuda":
                    env["CUDA_VISIBLE_DEVICES"] = str(index)
            if self.spec.socket_ifname:
                env |= {
                    "GLOO_SOCKET_IFNAME": self.spec.socket_ifname,
                    "NCCL_SOCKET_IFNAME": self.spec.socket_ifname,
                }
            result.append((port, argv, env))
        return result

    @property
    def urls(self) -> list[str]:
        return [service.health_url.rsplit("/", 1)[0] for service in self.services]

    @property
    def pids(self) -> list[int | None]:
        return [service.pid for service in self.services]

    async def start(self) -> list[str]:
        """Start every engine, wait for all to be healthy (in parallel); returns their base URLs."""
        if isinstance(self.spec, SGLangSpec) and not sglang_available():
            raise RuntimeError("engine.kind sglang needs the `gpu` extra (pip install 'swerl[gpu]') on a GPU host")
        self.services = [
            Service(
                name=f"engine-{index}",
                argv=argv,
                health_url=f"http://{self.host}:{port}/health",
                log_path=self.log_dir / f"engine_{index}.log",
                env=env,
                startup_timeout_s=self.startup_timeout_s,
                stop_timeout_s=self.stop_timeout_s,
            )
            for index, (port, argv, env) in enumerate(self.commands())
        ]
        results = await asyncio.gather(
            *(asyncio.to_thread(service.start) for service in self.services), return_exceptions=True
        )
        failures = [result for result in results if isinstance(result, BaseException)]
        if failures:
            self.stop()
            raise failures[0]
        return self.urls

    def stop(self) -> None:
        """Stop every engine by its process group (SIGTERM, then SIGKILL after stop_timeout_s)."""
        for service in self.services:
            service.stop()

    def logs(self) -> dict[str, str]:
        """Each engine's log file path by name."""
        return {service.name: str(service.log_path) for service in self.services}

    async def __aenter__(self) -> EngineLauncher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)
