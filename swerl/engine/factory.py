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

    local: LocalEngine in this process. http_local / sglang: `cfg.num_engines` servers launched on loopback (or
    `cfg.urls`), behind an in-process Router; the servers are stopped (by pid) on exit. Local engines run on
    cfg.device in cfg.dtype (http_local with cuda: engine i on GPU i).
    """
    if cfg.kind in ("local", "http_local") and cfg.device == "cuda" and not cfg.urls:
        check_cuda(cfg.num_engines if cfg.kind == "http_local" else 1)
    if cfg.kind == "local":
        async with LocalEngine(
            model_dir, max_batch_size=cfg.max_batch_size, max_context_tokens=cfg.max_context_tokens, seed=seed,
            weight_version=weight_version, intra_op_threads=cfg.threads, prefix_cache_size=cfg.prefix_cache_size,
            device=cfg.device, dtype=DTYPES[cfg.dtype], weight_sync_timeout_s=cfg.weight_sync.timeout_s,
            prefill_tokens_per_step=cfg.prefill_tokens_per_step,
        ) as engine:  # fmt: skip
            yield engine
        return
    launcher: EngineLauncher | None = None
    urls = list(cfg.urls)
    if not urls:
        spec = server_spec(cfg, model_dir, seed, weight_version)
        launcher = EngineLauncher(spec, cfg.num_engines, log_dir or Path("runs/engines"), host=cfg.host,
                                  base_port=cfg.base_port, startup_timeout_s=cfg.startup_timeout_s)  # fmt: skip
    pool_size = cfg.pool_size(concurrency)
    try:
        if launcher is not None:
            urls = await launcher.start()
            log.info("engines %s up (logs %s)", urls, launcher.logs())
        clients = [
            EngineClient(url, pool_size=pool_size, connect_timeout_s=cfg.connect_timeout_s,
                         request_timeout_s=cfg.request_timeout_s, control_timeout_s=cfg.control_timeout_s,
                         health_timeout_s=cfg.health_timeout_s, retries=0, control_retries=cfg.retries,
                         retry_backoff_s=cfg.retry_backoff_s, weight_version=weight_version,
                         tp_size=cfg.tp_size if cfg.kind == "sglang" else 1)
            for url in urls
        ]  # fmt: skip
        log.info("engine limits: %d engines, %d connections each, request timeout %.0f s, retries %d, context %d",
                 len(urls), pool_size, cfg.request_timeout_s, cfg.retries, cfg.max_context_tokens)  # fmt: skip
        async with Router(
            clients, retries=cfg.retries, health_interval_s=cfg.health_interval_s,
            sticky_capacity=cfg.sticky_capacity, sticky_max_excess=cfg.sticky_max_excess,
            weight_update_mode=cfg.weight_update_mode, pause_mode=cfg.pause_mode, weight_version=weight_version,
        ) as router:  # fmt: skip
            yield router
    finally:
        if launcher is not None:
            launcher.stop()


def server_spec(
    cfg: EngineConfig, model_dir: str | Path, seed: int, weight_version: int
) -> LocalServerSpec | SGLangSpec:
    """What each launched engine process is started with (kind http_local or sglang)."""
    sync = cfg.weight_sync
    if cfg.kind == "http_local":
        return LocalServerSpec(str(model_dir), cfg.max_batch_size, cfg.max_context_tokens, cfg.threads, seed,
                               weight_version, cfg.prefix_cache_size, cfg.device, cfg.dtype, sync.timeout_s,
                               sync.socket_ifname, cfg.prefill_tokens_per_step)  # fmt: skip
    if cfg.kind == "sglang":
        return SGLangSpec(str(model_dir), cfg.tp_size, cfg.max_context_tokens, cfg.mem_fraction_static,
                          cfg.max_batch_size, seed, weight_version, tuple(cfg.sglang_args),
                          sync.socket_ifname)  # fmt: skip
    raise ValueError(f"engine kind {cfg.kind!r} runs in process: no server to launch")


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def check_cuda(gpus: int) -> None:
    """engine.device cuda needs `gpus` GPUs visible to torch here; a clear error otherwise."""
    if not torch.cuda.is_available():
        raise ValueError(
            f"engine.device is cuda but torch.cuda.is_available() is False (no GPU visible, or a CPU build of "
            f"torch {torch.__version__}): set engine.device cpu"
        )
    if torch.cuda.device_count() < gpus:
        raise ValueError(
            f"engine.device cuda needs {gpus} GPUs (one per engine), {torch.cuda.device_count()} visible"
        )
