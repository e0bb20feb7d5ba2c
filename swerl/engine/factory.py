"""The one place stages get an engine from: config in, an Engine out (a builder; classes take plain arguments)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import torch

from swerl.config.engine import EngineConfig
from swerl.engine.base import Engine
from swerl.engine.client import EngineClient
from swerl.engine.launcher import EngineLauncher, LocalServerSpec, SGLangSpec
from swerl.engine.local import LocalEngine
from swerl.engine.router import Router

log = logging.getLogger("swerl.engine")


@asynccontextmanager
async def open_engine(
    cfg: EngineConfig,
    model_dir: str | Path,
    *,
    concurrency: int,
    seed: int = 0,
    weight_version: int = 0,
    log_dir: Path | None = None,
) -> AsyncIterator[Engine]:
    """An engine serving `model_dir` at `weight_version` for a stage running `concurrency` episodes at once.

    local: LocalEngine in this process. http_local / sglang: `cfg.launch.num_engines` servers launched on loopback
    (or `cfg.launch.urls`), behind an in-process Router; the servers are stopped (by pid) on exit. Local engines run
    on cfg.local.device in cfg.local.dtype (http_local with cuda: engine i on GPU i).
    """
    launch, local, http = cfg.launch, cfg.local, cfg.http
    if cfg.kind in ("local", "http_local") and local.device == "cuda" and not launch.urls:
        check_cuda(launch.num_engines if cfg.kind == "http_local" else 1)
    if cfg.kind == "local":
        async with _local_engine(cfg, model_dir, seed, weight_version) as engine:
            yield engine
        return
    launcher: EngineLauncher | None = None
    urls = list(launch.urls)
    if not urls:
        spec = server_spec(cfg, model_dir, seed, weight_version)
        launcher = EngineLauncher(
            spec,
            launch.num_engines,
            log_dir or Path("runs/engines"),
            host=launch.host,
            base_port=launch.base_port,
            startup_timeout_s=launch.startup_timeout_s,
        )
    pool_size = cfg.pool_size(concurrency)
    try:
        if launcher is not None:
            urls = await launcher.start()
            log.info("engines %s up (logs %s)", urls, launcher.logs())
        clients = [_engine_client(cfg, url, pool_size, weight_version) for url in urls]
        log.info(
            "engine limits: %d engines, %d connections each, request timeout %.0f s, retries %d, context %d",
            len(urls),
            pool_size,
            http.request_timeout_s,
            http.retries,
            cfg.max_context_tokens,
        )
        async with _router(cfg, clients, weight_version) as engine_router:
            yield engine_router
    finally:
        if launcher is not None:
            launcher.stop()


def _local_engine(cfg: EngineConfig, model_dir: str | Path, seed: int, weight_version: int) -> LocalEngine:
    """Kind local: the engine in this process."""
    local = cfg.local
    return LocalEngine(
        model_dir,
        max_batch_size=cfg.max_batch_size,
        max_context_tokens=cfg.max_context_tokens,
        seed=seed,
        weight_version=weight_version,
        intra_op_threads=local.threads,
        prefix_cache_size=local.prefix_cache_size,
        device=local.device,
        dtype=DTYPES[local.dtype],
        weight_sync_timeout_s=cfg.weight_sync.timeout_s,
        prefill_tokens_per_step=local.prefill_tokens_per_step,
    )


def _engine_client(cfg: EngineConfig, url: str, pool_size: int, weight_version: int) -> EngineClient:
    """The client of one engine server (the router does the retries of generation calls)."""
    http = cfg.http
    return EngineClient(
        url,
        pool_size=pool_size,
        connect_timeout_s=http.connect_timeout_s,
        request_timeout_s=http.request_timeout_s,
        control_timeout_s=http.control_timeout_s,
        health_timeout_s=cfg.router.health_timeout_s,
        retries=0,
        control_retries=http.retries,
        retry_backoff_s=http.retry_backoff_s,
        weight_version=weight_version,
        tp_size=cfg.sglang.tp_size if cfg.kind == "sglang" else 1,
    )


def _router(cfg: EngineConfig, clients: list[EngineClient], weight_version: int) -> Router:
    """The router in front of the engine servers' clients."""
    router = cfg.router
    return Router(
        clients,
        retries=cfg.http.retries,
        health_interval_s=router.health_interval_s,
        sticky_capacity=router.sticky_capacity,
        sticky_max_excess=router.sticky_max_excess,
        weight_update_mode=cfg.weight_sync.update_mode,
        pause_mode=cfg.weight_sync.pause_mode,
        weight_version=weight_version,
    )


def server_spec(
    cfg: EngineConfig, model_dir: str | Path, seed: int, weight_version: int
) -> LocalServerSpec | SGLangSpec:
    """What each launched engine process is started with (kind http_local or sglang)."""
    sync, local, sglang = cfg.weight_sync, cfg.local, cfg.sglang
    if cfg.kind == "http_local":
        return LocalServerSpec(
            str(model_dir),
            cfg.max_batch_size,
            cfg.max_context_tokens,
            local.threads,
            seed,
            weight_version,
            local.prefix_cache_size,
            local.device,
            local.dtype,
            sync.timeout_s,
            sync.socket_ifname,
            local.prefill_tokens_per_step,
        )
    if cfg.kind == "sglang":
        return SGLangSpec(
            str(model_dir),
            sglang.tp_size,
            cfg.max_context_tokens,
            sglang.mem_fraction_static,
            cfg.max_batch_size,
            seed,
            weight_version,
            tuple(sglang.sglang_args),
            sync.socket_ifname,
        )
    raise ValueError(f"engine kind {cfg.kind!r} runs in process: no server to launch")


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def check_cuda(gpus: int) -> None:
    """engine.local.device cuda needs `gpus` GPUs visible to torch here; a clear error otherwise."""
    if not torch.cuda.is_available():
        raise ValueError(
            f"engine.local.device is cuda but torch.cuda.is_available() is False (no GPU visible, or a CPU build "
            f"of torch {torch.__version__}): set engine.local.device cpu"
        )
    if torch.cuda.device_count() < gpus:
        raise ValueError(
            f"engine.local.device cuda needs {gpus} GPUs (one per engine), {torch.cuda.device_count()} visible"
        )
