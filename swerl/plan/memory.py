"""Memory estimates (bytes) of engines, trainer ranks and hosts, and the plan's memory lines and checks.

Engines (per GPU of an engine):
- SGLang: weights P x 2 (bf16) / tp_size + KV max_batch_size x max_context_tokens x KV per token (bf16, KV heads
  split over tp_size, at least one head per GPU), checked against gpu_memory x engine.sglang.mem_fraction_static:
  SGLang's static budget (weights plus its KV pool) is that fraction of the GPU's whole memory (None: SGLang chooses
  at start; the plan assumes SGLANG_ASSUMED_MEM_FRACTION and says so). SGLang fills the rest of the budget with KV
  pool, so the plan also reports the pool's tokens. With grpo.eval.every (async) a second engine set is opened on
  the same GPUs for evaluation: the engines' fractions must then sum to at most 1.
- local engines on cuda (local: one in the stage's process; http_local: one per engine): weights P x
  engine.local.dtype + KV (max_batch_size + local.prefix_cache_size) x max_context_tokens x KV per token in
  engine.local.dtype, checked against gpu_memory x cluster.usable_memory_fraction. On cpu the same bytes count in the
  host's memory.

Trainer (per rank; N ranks; b = bytes of distributed.param_dtype; U = the largest FSDP unit: a decoder layer, the
embedding or the lm_head; T = tokens in one micro-batch: sft.seq_len x rows_per_micro_batch for SFT,
max(grpo.algorithm.micro_batch_tokens, agent.max_trajectory_tokens) for GRPO, since a longer trajectory is a
micro-batch of its own):
- torch (one process, nothing sharded): float32 weights 4P + gradients 4P + AdamW moments 8P; autocast's bf16
  copies of the weights 2P when bf16; a KL reference model 4P (grpo.algorithm.kl_coef > 0).
- fsdp2: float32 master weights 4P/N, gradients 4P/N and AdamW moments 8P/N (all sharded over the N ranks), plus
  the gathered units: 3 U b (one unit computing, the next prefetched, one unit's unsharded gradient); without
  reshard_after_forward every gathered unit stays from forward to backward: P b + U b. A reference model 4P/N.
- megatron (TP tensor, PP pipeline, CP context, EP expert, ETP expert-tensor parallel; D = ranks / (TP PP CP)
  data parallel; D_e = ranks / (EP ETP PP) expert data parallel): non-expert parameters P_d = P - P_x split
  P_d / (TP PP), expert parameters P_x / (EP ETP PP); each shard holds b (weights) + 4 (float32 main gradients)
  + 12 (float32 master and two moments) bytes per parameter, the 12 divided by D x CP (non-expert) and D_e
  (expert) under the distributed optimizer.
- activations, a rough estimate per token (bytes a, of the compute dtype: param_dtype; torch: 2 under autocast,
  else 4): a layer keeps A = a (4 h + 2 q + 2 kv + 3 I_a) + 4 E, where I_a = I (dense) or k I_e (+ I_s) for MoE
  and 4 E the float32 router logits (flash/SDPA attention: no T x T scores). Without checkpointing T L A; with
  activation checkpointing (fsdp2 distributed.activation_checkpointing; megatron recompute full) T (L h a + A):
  every layer's input plus one layer recomputed. The torch backend does not checkpoint. megatron divides by TP
  and CP.
- logits: T V (a + 12): the logits in the compute dtype, the float32 scores the loss keeps for its backward (4)
  and the float32 transients of the log-softmax and entropy (8); megatron divides by TP (vocab-parallel).
Checked against gpu_memory x cluster.usable_memory_fraction (on cpu: the host's memory).

Host memory per node: every GPU process (an SGLang engine is 2 + tp_size: tokenizer, detokenizer, a scheduler
per GPU; a trainer rank; the stage's own process) takes PROCESS_HOST_GIB; the node of trainer rank 0 holds the
whole float32 model (4P) while rank 0 loads it and gathers exports; trainers and engines on cpu take their whole
memory there (a cpu process PROCESS_HOST_GIB_CPU). Checked per stage against cluster.host_memory_gib (None: this
machine's MemTotal) x usable_memory_fraction. Sandboxes are `swerl doctor`'s business.
"""

from __future__ import annotations

import math
from pathlib import Path

from swerl.config import PipelineConfig
from swerl.config.train import DistributedConfig
from swerl.plan.architecture import Architecture
from swerl.plan.placement import engine_count, engine_gpus_each
from swerl.plan.report import GIB, MemoryLine, Plan, PlanCheck, each_gpu, size_text, span_text, where_text

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
SGLANG_ASSUMED_MEM_FRACTION = 0.85
"""The static memory fraction planned for SGLang engines when engine.sglang.mem_fraction_static is None (SGLang
then chooses its own at start, from the GPU; set the field to plan with the fraction SGLang will really use)."""
PROCESS_HOST_GIB = 4.0
"""Host memory of one GPU process (Python, torch, the CUDA runtime and its pinned buffers): rough."""
PROCESS_HOST_GIB_CPU = 0.5
"""Host memory of one CPU process beyond its model (Python, torch): rough."""


def trainer_tokens(cfg: PipelineConfig, stage: str) -> int:
    """T: tokens of one micro-batch of a stage's trainer."""
    if stage == "sft":
        return cfg.sft.seq_len * cfg.sft.rows_per_micro_batch
    return max(cfg.grpo.algorithm.micro_batch_tokens, cfg.agent.max_trajectory_tokens)


def _compute_bytes(cfg: PipelineConfig, stage: str) -> int:
    d = cfg.sft.distributed if stage == "sft" else cfg.grpo.distributed
    if d.backend != "torch":
        return DTYPE_BYTES[d.param_dtype]
    autocast = d.param_dtype == "bfloat16" or (stage == "sft" and cfg.sft.bf16)
    return 2 if autocast else 4


def trainer_memory(arch: Architecture, cfg: PipelineConfig, stage: str) -> dict[str, int]:
    """Bytes one trainer rank of a stage ("sft" or "grpo") holds at its peak, by item (module docstring)."""
    d: DistributedConfig = cfg.sft.distributed if stage == "sft" else cfg.grpo.distributed
    p = arch.params()
    P, n = p.total, d.ranks
    a = _compute_bytes(cfg, stage)
    b = DTYPE_BYTES[d.param_dtype]
    reference = stage == "grpo" and cfg.grpo.algorithm.kl_coef > 0
    T = trainer_tokens(cfg, stage)
    A = arch.activation_bytes_per_token_layer(a)
    L, h, V = arch.num_layers, arch.hidden_size, arch.vocab_size
    out: dict[str, int] = {}
    if d.backend == "torch":
        out = {"weights": 4 * P, "grads": 4 * P, "optimizer": 8 * P}
        if a == 2:
            out["autocast copies"] = 2 * P
        if reference:
            out["reference"] = 4 * P
        out["activations"] = T * L * A  # the torch backend does not checkpoint
        out["logits"] = T * V * (a + 12)
    elif d.backend == "fsdp2":
        out = {
            "weights": math.ceil(4 * P / n),
            "grads": math.ceil(4 * P / n),
            "optimizer": math.ceil(8 * P / n),
        }
        out["gathered"] = 3 * p.largest_unit * b if d.reshard_after_forward else (P + p.largest_unit) * b
        if reference:
            out["reference"] = math.ceil(4 * P / n)
        out["activations"] = T * (L * h * a + A) if d.activation_checkpointing else T * L * A
        out["logits"] = T * V * (a + 12)
    else:
        m = d.megatron
        dense_shard = (P - p.experts) / (m.tensor_parallel * m.pipeline_parallel)
        expert_shard = p.experts / (m.expert_parallel * m.expert_tensor_parallel * m.pipeline_parallel)
        data_parallel = n // m.model_parallel
        expert_dp = max(1, n // (m.expert_parallel * m.expert_tensor_parallel * m.pipeline_parallel))
        dense_div = data_parallel * m.context_parallel if m.distributed_optimizer else 1
        expert_div = expert_dp if m.distributed_optimizer else 1
        shard = dense_shard + expert_shard
        out = {"weights": math.ceil(b * shard), "grads": math.ceil(4 * shard)}
        out["optimizer"] = math.ceil(12 * dense_shard / dense_div + 12 * expert_shard / expert_div)
        if reference:
            out["reference"] = math.ceil(b * shard)
        split = m.tensor_parallel * m.context_parallel
        per_token = L * h * a + A if m.recompute == "full" else L * A
        out["activations"] = math.ceil(T * per_token / split)
        out["logits"] = math.ceil(T * V * (a + 12) / (m.tensor_parallel * m.context_parallel))
    return out


def engine_memory(arch: Architecture, cfg: PipelineConfig) -> tuple[dict[str, int], str]:
    """Bytes on one GPU of an engine (or in the host for a cpu engine), by item, and the KV line's wording."""
    e = cfg.engine
    if e.kind == "sglang":
        tp = e.sglang.tp_size
        kv_heads = max(1, math.ceil(arch.num_kv_heads / tp))
        per_token = arch.num_layers * kv_heads * arch.head_dim * 2 * 2
        weights = math.ceil(arch.params().total * 2 / tp)
        kv = e.max_batch_size * e.max_context_tokens * per_token
        return {"weights": weights, "KV": kv}, f"{e.max_batch_size} x {e.max_context_tokens:,} tokens"
    dtype = DTYPE_BYTES[e.local.dtype]
    slots = e.max_batch_size + e.local.prefix_cache_size
    kv = slots * e.max_context_tokens * arch.kv_bytes_per_token(dtype)
    words = f"({e.max_batch_size} + {e.local.prefix_cache_size} cached) x {e.max_context_tokens:,} tokens"
    return {"weights": arch.params().total * dtype, "KV": kv}, words


def host_memory_gib(cfg: PipelineConfig) -> tuple[float, str]:
    if cfg.cluster.host_memory_gib is not None:
        return cfg.cluster.host_memory_gib, "cluster.host_memory_gib"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20, "this machine's MemTotal"
    except (OSError, ValueError, IndexError):
        pass
    return 0.0, "unknown (set cluster.host_memory_gib)"


def gpu_memory_lines(
    cfg: PipelineConfig,
    plan: Plan,
    arch: Architecture,
    engine_gpus: list[int],
    trainer_gpus: list[int],
    cuda_stages: dict[str, DistributedConfig],
) -> None:
    # Over 60 lines: the engines' GPUs then the trainer's, each a straight loop over nodes under one budget.
    c, e = cfg.cluster, cfg.engine
    per_node = c.gpus_per_node
    gpu_bytes = c.gpu_memory_gib * GIB
    usable = gpu_bytes * c.usable_memory_fraction
    each = engine_gpus_each(cfg)
    beside = cfg.grpo.mode == "async" and cfg.grpo.eval.every > 0
    if engine_gpus:
        items, kv_words = engine_memory(arch, cfg)
        items = {"weights": items["weights"], f"KV ({kv_words})": items["KV"]}
        if e.kind == "sglang":
            fraction = e.sglang.mem_fraction_static
            said = (
                "engine.sglang.mem_fraction_static" if fraction is not None else "assumed: mem_fraction_static is None"
            )
            fraction = fraction if fraction is not None else SGLANG_ASSUMED_MEM_FRACTION
            budget = gpu_bytes * fraction
            budget_text = f"{size_text(budget)} ({c.gpu_memory_gib:g} GiB x {fraction:g}, {said})"
            kv_head_share = max(1, math.ceil(arch.num_kv_heads / e.sglang.tp_size))
            per_token = arch.num_layers * kv_head_share * arch.head_dim * 2 * 2
            pool = max(0, int((budget - items["weights"]) // per_token))
            extra = f"SGLang's KV pool: the rest of the budget, ~{pool:,} tokens"
            if beside:
                ok = 2 * fraction <= 1
                plan.checks.append(
                    PlanCheck(
                        "engine.eval_beside",
                        ok,
                        f"grpo.eval.every {cfg.grpo.eval.every} opens a second engine set on the same GPUs: 2 x "
                        f"mem_fraction_static {fraction:g} = {2 * fraction:g} of each GPU" + ("" if ok else ": over 1"),
                    )
                )
        else:
            budget = usable
            budget_text = f"{size_text(budget)} ({c.gpu_memory_gib:g} GiB x {c.usable_memory_fraction:g})"
            extra = ""
            if beside:
                items = {f"{k} x 2 (eval engines beside)": 2 * v for k, v in items.items()}
        engines = engine_count(cfg)
        for node in sorted({g // per_node for g in engine_gpus}):
            gpus = [g for g in engine_gpus if g // per_node == node]
            mine = [i for i in range(engines) if i * each // per_node == node]
            line = MemoryLine(
                where=where_text(gpus, per_node),
                who=f"engine{'s' if len(mine) > 1 else ''} {span_text(mine[0], mine[-1])}" + each_gpu(gpus),
                items=items,
                budget=budget,
                budget_text=budget_text,
                extra=extra,
            )
            plan.gpu_memory.append(line)
            plan.checks.append(
                PlanCheck(f"memory.engines.node{node}", line.ok, line.fits() if line.ok else line.shortfall())
            )
    if trainer_gpus:
        budget_text = f"{size_text(usable)} ({c.gpu_memory_gib:g} GiB x {c.usable_memory_fraction:g})"
        for name, d in cuda_stages.items():
            items = trainer_memory(arch, cfg, name)
            tokens = trainer_tokens(cfg, name)
            for node in sorted({g // per_node for g in trainer_gpus}):
                gpus = [g for g in trainer_gpus if g // per_node == node]
                first, last = gpus[0] - trainer_gpus[0], gpus[-1] - trainer_gpus[0]
                line = MemoryLine(
                    where=where_text(gpus, per_node),
                    who=f"{name} {d.backend} rank{'s' if len(gpus) > 1 else ''} {span_text(first, last)}, {tokens:,} "
                    f"tokens per micro-batch" + each_gpu(gpus),
                    items=items,
                    budget=usable,
                    budget_text=budget_text,
                )
                plan.gpu_memory.append(line)
                plan.checks.append(
                    PlanCheck(f"memory.{name}.node{node}", line.ok, line.fits() if line.ok else line.shortfall())
                )


def host_memory_lines(
    cfg: PipelineConfig,
    plan: Plan,
    arch: Architecture,
    engine_gpus: list[int],
    trainer_gpus: list[int],
    stages: dict[str, DistributedConfig],
    host_gib: float,
    host_source: str,
) -> None:
    """Per node, the peak over stages of what its host holds (this module's docstring)."""
    # Over 60 lines: one table of what each stage puts on each node's host, then one check per node.
    c, e = cfg.cluster, cfg.engine
    per_node = max(c.gpus_per_node, 1)
    nodes = c.nodes if c.gpus_per_node else 1
    driver = trainer_gpus[0] // per_node if trainer_gpus else 0
    P = arch.params().total
    by_stage: dict[str, dict[int, dict[str, int]]] = {}

    def add(stage: str, node: int, item: str, value: float) -> None:
        slot = by_stage.setdefault(stage, {}).setdefault(node, {})
        slot[item] = slot.get(item, 0) + int(value)

    proc_gpu, proc_cpu = PROCESS_HOST_GIB * GIB, PROCESS_HOST_GIB_CPU * GIB
    for stage in ("sft", "grpo", "evaluate"):
        add(stage, driver, "swerl's process", proc_gpu if c.gpus_per_node else proc_cpu)
    engines = engine_count(cfg)
    each = engine_gpus_each(cfg)
    for stage in (
        "grpo",
        "evaluate",
    ):  # engines at engine.launch.urls are planned where engine.* says they run
        if engine_gpus and e.kind != "local":  # a local engine runs in swerl's own process
            for i in range(engines):
                processes = 2 + each if e.kind == "sglang" else 1
                add(stage, (i * each) // per_node, "engine processes", processes * proc_gpu)
        elif not engine_gpus:
            items, _ = engine_memory(arch, cfg)
            add(stage, driver, "engines (cpu)", engines * (items["weights"] + items["KV"]))
            if e.kind != "local":
                add(stage, driver, "engine processes", engines * proc_cpu)
    for name, d in stages.items():
        if d.device == "cuda":
            nodes_of = [g // per_node for g in trainer_gpus]
            alone = d.backend != "torch" or (name == "grpo" and cfg.grpo.trainer_process)
            for node in set(nodes_of) if alone else ():  # a torch trainer may run in swerl's own process
                add(name, node, "trainer ranks", nodes_of.count(node) * proc_gpu)
            if trainer_gpus:
                add(name, driver, "full model (rank 0, fp32)", 4 * P)
        else:
            per_rank = sum(trainer_memory(arch, cfg, name).values())
            add(name, driver, "trainer (cpu)", d.ranks * per_rank)
            if d.backend != "torch":
                add(name, driver, "trainer ranks", d.ranks * proc_cpu)
                add(name, driver, "full model (rank 0, fp32)", 4 * P)
    budget = host_gib * GIB * c.usable_memory_fraction
    budget_text = f"{size_text(budget)} ({host_gib:,.1f} GiB x {c.usable_memory_fraction:g}, {host_source})"
    for node in range(nodes):
        peak_stage, peak = max(
            ((stage, by_stage.get(stage, {}).get(node, {})) for stage in ("sft", "grpo", "evaluate")),
            key=lambda pair: sum(pair[1].values()),
        )
        where = f"node {node}" if c.gpus_per_node else "this machine"
        line = MemoryLine(where=where, who=f"{peak_stage} stage", items=peak, budget=budget, budget_text=budget_text)
        plan.host_memory.append(line)
        plan.checks.append(PlanCheck(f"host_memory.node{node}", line.ok, line.fits() if line.ok else line.shortfall()))
