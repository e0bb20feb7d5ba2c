"""`swerl plan`: where a run's engines and trainer ranks go, and whether each one's memory fits, before it starts.

The plan reads the config only (and the model's config.json; never weights, never the GPUs): `cluster` (nodes,
GPUs per node, GPU and host memory), `engine`, `sft.distributed` and `grpo.distributed`, and the model's
architecture. It prints the placement (which GPU, as node and index, runs which engine or trainer rank), the
processes and ports, the memory of every GPU and of every node's host, and a list of checks; a failed check
names what does not fit where and by how much. `swerl plan` exits 1 on a failed check, `swerl run` refuses with
the same lines before any stage starts, and `swerl doctor` lists the checks among its own.

The plan's parts: architecture (the model's numbers), memory (bytes per GPU and host), placement
(GPUs of engines and trainer ranks), checks (model, ports, launch notes), report (the printed plan).

Everything here is an estimate for refusing plans that cannot fit, not a promise that one that passes will.
"""

from __future__ import annotations

from swerl.config import PipelineConfig
from swerl.plan.architecture import load_architecture
from swerl.plan.checks import launch_notes, model_checks, port_checks
from swerl.plan.memory import DTYPE_BYTES, gpu_memory_lines, host_memory_gib, host_memory_lines
from swerl.plan.placement import place, placement_lines, trainer_stages
from swerl.plan.report import Plan, count_text, decimal_text, size_text


def make_plan(cfg: PipelineConfig, source: str = "the config") -> Plan:
    """The placement and memory plan of a config, with its checks (a PlanError when the architecture is missing)."""
    arch = load_architecture(cfg)
    c, e = cfg.cluster, cfg.engine
    params = arch.params()
    ctx = e.max_context_tokens
    per_node = c.gpus_per_node
    host_gib, host_source = host_memory_gib(cfg)
    plan = Plan(
        source=source,
        arch=arch,
        cluster=(
            f"{c.nodes} node{'s' if c.nodes > 1 else ''} x {per_node} GPUs x {c.gpu_memory_gib:g} GiB"
            if per_node
            else f"{c.nodes} CPU machine{'s' if c.nodes > 1 else ''} (cluster.gpus_per_node 0)"
        )
        + f"; host {host_gib:,.1f} GiB per node ({host_source}); usable fraction {c.usable_memory_fraction:g}",
    )
    kv_dtype = "bfloat16" if e.kind == "sglang" else e.local.dtype
    kv_token = arch.kv_bytes_per_token(DTYPE_BYTES[kv_dtype])
    plan.model_lines = [
        f"{arch.describe()}",
        f"from {arch.source}",
        f"{count_text(params.total)} parameters ({count_text(params.experts)} in experts), "
        f"{count_text(params.active)} active per token",
        f"KV cache per token ({kv_dtype}, the engines'): {arch.num_layers} layers x {arch.num_kv_heads} KV heads x "
        f"{arch.head_dim} x 2 (K, V) x {DTYPE_BYTES[kv_dtype]} B = {kv_token:,} B; {ctx:,} tokens "
        f"(engine.max_context_tokens) = {decimal_text(kv_token * ctx)} ({size_text(kv_token * ctx)}) per trajectory",
    ]
    stages = trainer_stages(cfg)
    cuda_stages = {name: d for name, d in stages.items() if d.device == "cuda"}
    model_checks(cfg, arch, stages, plan.checks)
    engine_gpus, trainer_gpus = place(cfg, plan, cuda_stages)
    placement_lines(cfg, plan, engine_gpus, trainer_gpus, cuda_stages)
    gpu_memory_lines(cfg, plan, arch, engine_gpus, trainer_gpus, cuda_stages)
    host_memory_lines(cfg, plan, arch, engine_gpus, trainer_gpus, stages, host_gib, host_source)
    port_checks(cfg, plan, engine_gpus, trainer_gpus)
    launch_notes(cfg, plan, engine_gpus, trainer_gpus)
    return plan
