"""Shared by the engine tests: what their tiny models are made of (the models: tests/engine/conftest.py), real
engine processes on 127.0.0.1 stopped by pid, clients, routers and requests."""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

from swerl.engine.base import GenerateRequest, SamplingParams
from swerl.engine.client import EngineClient
from swerl.engine.launcher import EngineLauncher, LocalServerSpec
from swerl.engine.router import Router
from swerl.services import Service

CORPUS = [
    "def add(left, right):\n    return left + right\n",
    "for index in range(10):\n    total += index * 2  # 3.14 != 2.71\n",
    "task 0: name a letter\nthe quick brown fox jumps over the lazy dog\n",
]
POSITIONS = 256  # the models' (tests.tiny_models.DENSE, hidden 96 for "wide")
CONTEXT = 128
VOCAB = 300

# The engine tests were written against the classes' own defaults, before EngineConfig became the one home of
# every default: these are those values, passed explicitly.
CLIENT_ARGS: dict[str, Any] = dict(
    connect_timeout_s=10.0,
    request_timeout_s=600.0,
    control_timeout_s=600.0,
    health_timeout_s=30.0,
    retries=0,
    retry_backoff_s=0.5,
)
ROUTER_ARGS: dict[str, Any] = dict(
    retries=2,
    health_interval_s=5.0,
    sticky_capacity=100_000,
    sticky_max_excess=64,
    weight_update_mode="pause",
    pause_mode="retract",
)
LAUNCHER_ARGS: dict[str, Any] = dict(host="127.0.0.1", base_port=0, startup_timeout_s=600.0)


def make_client(base_url: str, pool_size: int, **args: Any) -> EngineClient:
    """An EngineClient with CLIENT_ARGS, `args` replacing some."""
    return EngineClient(base_url, pool_size=pool_size, **(CLIENT_ARGS | args))


def make_router(clients: list[EngineClient], **args: Any) -> Router:
    """A Router with ROUTER_ARGS, `args` replacing some."""
    return Router(clients, **(ROUTER_ARGS | args))


def launch_local(model_dir: Path, num_engines: int, log_dir: Path, **spec: Any) -> EngineLauncher:
    """num_engines real local engine servers (python -m swerl.engine.server), healthy on return."""
    options = dict(max_batch_size=8, max_context_tokens=CONTEXT, threads=1, seed=0) | spec
    launcher = EngineLauncher(
        LocalServerSpec(str(model_dir), **options),
        num_engines,
        log_dir,
        **(LAUNCHER_ARGS | {"startup_timeout_s": 240}),
        stop_timeout_s=5,
    )
    asyncio.run(launcher.start())
    return launcher


def base_url(service: Service) -> str:
    return service.health_url.rsplit("/", 1)[0]


def post(url: str, body: bytes = b"{}") -> bytes:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
        return bytes(response.read())


def greedy(prompt: list[int], max_new_tokens: int = 8, rid: str | None = None, **params: Any) -> GenerateRequest:
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True, **params)
    return GenerateRequest(input_ids=prompt, sampling_params=sampling, rid=rid)


def prompt_of(length: int, offset: int = 0) -> list[int]:
    return [10 + (offset + 7 * index) % 250 for index in range(length)]


def process_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False
