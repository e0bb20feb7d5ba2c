"""The inference engines episodes sample from, and how new weights reach them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from swerl.config.base import StrictModel


class EngineLaunchConfig(StrictModel):
    """Where the engine servers come from (http_local, sglang): launched here, or already running at `urls`."""

    num_engines: int = Field(1, ge=1, le=4096)
    """Engine processes behind the router (http_local, sglang)."""
    urls: list[str] = Field(default_factory=list)
    """Already running engine servers (http://HOST:PORT) to route to instead of launching `num_engines`."""
    host: str = "127.0.0.1"
    """Bind address of launched engines (loopback unless you mean otherwise)."""
    base_port: int = Field(0, ge=0, le=65535)
    """Engine i listens on base_port + i; 0: free ports picked at launch."""
    startup_timeout_s: float = Field(900.0, gt=0, le=86400)
    """How long each launched engine may take to become healthy."""


class EngineLocalConfig(StrictModel):
    """swerl's own engine (local, and each http_local server): threads, prefix cache, prefill, device and dtype."""

    threads: int = Field(1, ge=1, le=1024)
    """torch intra-op threads of the engine's forward passes (local engines)."""
    prefix_cache_size: int = Field(0, ge=0, le=1_000_000)
    """Local engines: finished requests whose KV cache is kept for the next turn of the same trajectory (rid), so
    a turn prefills only its new tokens (SGLang's radix cache does this on its own); 0: no prefix cache."""
    prefill_tokens_per_step: int = Field(1024, ge=1, le=10_000_000)
    """Local engines: most prompt tokens prefilled in one model step, unless one request alone has more: admitted
    requests share a step up to it (one pass over the weights for several prompts); past it the activations
    outgrow a CPU's caches (16 prompts of ~420 tokens took 1.3x as long in one step as in steps of 2-4)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Where local engines (local, http_local) run their model; cuda: engine i on GPU i (SGLang picks its own)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of local engines' weights and forward passes."""


class EngineHTTPConfig(StrictModel):
    """Connections to engine servers (http_local, sglang): pool sizes, timeouts, retries."""

    max_connections: int | None = Field(None, ge=1, le=1_000_000)
    """HTTP connections per engine; None: the stage's episode concurrency + control_connections (one /generate
    in flight per episode), never a library default."""
    control_connections: int = Field(4, ge=1, le=1024)
    """Connections per engine kept beyond the episode concurrency for health probes and weight updates."""
    connect_timeout_s: float = Field(10.0, gt=0, le=3600)
    """Time to open a connection to an engine."""
    request_timeout_s: float = Field(1800.0, gt=0, le=86400)
    """Wall clock of one /generate call; past it the call is an InfraError(engine_timeout)."""
    control_timeout_s: float = Field(1800.0, gt=0, le=86400)
    """Wall clock of a weight update, pause, continue or cache flush."""
    retries: int = Field(2, ge=0, le=100)
    """Times a /generate that failed with an InfraError is retried on another engine, and a control call
    (weight update, pause, continue) on the same engine after retry_backoff_s."""
    retry_backoff_s: float = Field(0.5, ge=0, le=600)
    """First wait before a control call is retried; doubled after each retry."""


class EngineRouterConfig(StrictModel):
    """swerl's router in front of engine servers (http_local, sglang): health probes and trajectory stickiness."""

    health_interval_s: float = Field(5.0, ge=0, le=3600)
    """Seconds between the router's health probes of every engine (0: no probes, a dead engine stays out)."""
    health_timeout_s: float = Field(30.0, gt=0, le=3600)
    """Wall clock of one health probe (/health_generate)."""
    sticky_capacity: int = Field(100_000, ge=1, le=100_000_000)
    """Trajectory ids the router remembers for stickiness (prefix-cache reuse); least recently used forgotten."""
    sticky_max_excess: int = Field(64, ge=0, le=1_000_000)
    """A trajectory leaves its engine when that engine has this many more requests outstanding than the least."""


class SGLangConfig(StrictModel):
    """SGLang servers (kind sglang): GPUs per engine, memory share, extra launch arguments."""

    tp_size: int = Field(1, ge=1, le=1024)
    """SGLang tensor-parallel size: GPUs per engine (engine i gets GPUs i*tp_size ...)."""
    mem_fraction_static: float | None = Field(None, gt=0, lt=1)
    """SGLang --mem-fraction-static (weights + KV cache share of GPU memory); None: SGLang's own choice."""
    sglang_args: list[str] = Field(default_factory=list)
    """Extra `sglang.launch_server` arguments, appended as they are."""


class WeightSyncConfig(StrictModel):
    """How new weights reach the engines after a GRPO step, and what the engines' running requests do meanwhile."""

    method: Literal["disk", "distributed"] = "disk"
    """disk: the trainer writes an HF folder, engines load it (update_weights_from_disk); distributed: trainer rank 0
    and every engine join one process group and the weights are broadcast (SGLang's init_weights_update_group +
    update_weights_from_distributed; NCCL on GPUs, gloo on CPU; the local engine server speaks the same API)."""
    bucket_mb: int = Field(512, ge=1, le=1_048_576)
    """Tensors sent per update_weights_from_distributed request, in MiB (one request per bucket)."""
    master_addr: str = Field("127.0.0.1", min_length=1, max_length=255)
    """Address engines reach trainer rank 0 at for the weight group. On a cluster, the trainer node's address on
    the interface given in socket_ifname (the recipe's sync hung on duplicate container IPs)."""
    master_port: int = Field(0, ge=0, le=65535)
    """Port of the weight group's rendezvous; 0: a free port picked by the trainer."""
    process_group: Literal["auto", "gloo", "nccl"] = "auto"
    """Backend of the weight group; auto: nccl when the trainer runs on cuda, else gloo."""
    socket_ifname: str | None = Field(None, max_length=64)
    """Network interface of the weight group (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME on both sides)."""
    group_name: str = Field("swerl-weights", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._-]+$")
    """Name of the weight group on the engines."""
    timeout_s: float = Field(600.0, gt=0, le=86_400)
    """How long forming the group, or one bucket's broadcast, may take."""
    update_mode: Literal["pause", "drain"] = "pause"
    """pause: engines pause in place, load, continue (requests may span versions); drain: wait for in-flight
    requests to finish first (every response from one version)."""
    pause_mode: Literal["retract", "in_place"] = "retract"
    """SGLang /pause_generation mode of a pause-mode update: retract (running requests requeued, KV recomputed after
    the update; SGLang cannot flush its cache under in_place while requests run) or in_place."""


_ENGINE_SECTIONS: dict[str, type[StrictModel]] = {
    "launch": EngineLaunchConfig,
    "local": EngineLocalConfig,
    "http": EngineHTTPConfig,
    "router": EngineRouterConfig,
    "sglang": SGLangConfig,
}
ENGINE_RENAMED_KEYS: dict[str, str] = {
    **{
        f"engine.{key}": f"engine.{section}.{key}"
        for section, model in _ENGINE_SECTIONS.items()
        for key in model.model_fields
    },
    "engine.weight_update_mode": "engine.weight_sync.update_mode",
    "engine.pause_mode": "engine.weight_sync.pause_mode",
}
"""Flat engine keys of earlier swerl versions and where each lives now: the one table of renamed engine keys,
checked before an engine section is validated (from a YAML file, a --set override, a GRPO phase's changes or a
deployment's parameters), so an old key is an error naming the new one."""


class EngineConfig(StrictModel):
    """The inference engines episodes sample from: in process, local engine servers, or SGLang servers."""

    kind: Literal["local", "http_local", "sglang"] = "local"
    """local: LocalEngine in process; http_local: `launch.num_engines` local engine servers (swerl.engine.server)
    behind the router, over HTTP; sglang: `launch.num_engines` SGLang servers (GPU, the `gpu` extra) behind the
    router."""
    max_batch_size: int = Field(8, ge=1, le=100_000)
    """Requests decoded together per engine; more wait in the engine's queue (SGLang: --max-running-requests)."""
    max_context_tokens: int = Field(2048, ge=2, le=1_048_576)
    """Engine-side context cap: a request that would exceed it finishes with reason length."""
    launch: EngineLaunchConfig = Field(default_factory=EngineLaunchConfig)
    """How many engine servers are launched and where (http_local, sglang), or the running ones to use."""
    local: EngineLocalConfig = Field(default_factory=EngineLocalConfig)
    """swerl's own engine (local, http_local): threads, prefix cache, prefill, device, dtype."""
    http: EngineHTTPConfig = Field(default_factory=EngineHTTPConfig)
    """Connections, timeouts and retries of the calls to engine servers (http_local, sglang)."""
    router: EngineRouterConfig = Field(default_factory=EngineRouterConfig)
    """The router's health probes and stickiness (http_local, sglang)."""
    sglang: SGLangConfig = Field(default_factory=SGLangConfig)
    """SGLang's own settings (sglang)."""
    weight_sync: WeightSyncConfig = Field(default_factory=WeightSyncConfig)
    """How GRPO's new weights reach the engines."""

    @model_validator(mode="before")
    @classmethod
    def _no_renamed_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            renamed = [f"engine.{key}" for key in data if f"engine.{key}" in ENGINE_RENAMED_KEYS]
            if renamed:
                raise ValueError("; ".join(f"{old} was renamed to {ENGINE_RENAMED_KEYS[old]}" for old in renamed))
        return data

    def pool_size(self, concurrency: int) -> int:
        """HTTP connections per engine for a stage running `concurrency` episodes."""
        return self.http.max_connections or concurrency + self.http.control_connections
