"""The plan's checks of the model against its parallelism, of ports, and its notes on what swerl launches where."""

from __future__ import annotations

from swerl.config import PipelineConfig
from swerl.config.train import DistributedConfig
from swerl.plan.architecture import Architecture
from swerl.plan.placement import engine_count, engine_gpus_each, trainer_stages
from swerl.plan.report import Plan, PlanCheck


def model_checks(
    cfg: PipelineConfig, arch: Architecture, stages: dict[str, DistributedConfig], checks: list[PlanCheck]
) -> None:
    e = cfg.engine
    if arch.max_positions:
        ok = e.max_context_tokens <= arch.max_positions
        checks.append(
            PlanCheck(
                "context",
                ok,
                f"engine.max_context_tokens {e.max_context_tokens:,} vs the model's "
                f"max_position_embeddings {arch.max_positions:,}",
            )
        )
    if e.kind == "sglang":
        ok = arch.num_heads % e.sglang.tp_size == 0
        checks.append(
            PlanCheck(
                "engine.sglang.tp_size",
                ok,
                f"tp_size {e.sglang.tp_size} {'divides' if ok else 'does not divide'} the "
                f"model's {arch.num_heads} attention heads (SGLang splits heads over its GPUs)",
            )
        )
    for name, d in stages.items():
        if d.backend != "megatron":
            continue
        m = d.megatron
        problems = []
        if arch.num_heads % m.tensor_parallel or arch.num_kv_heads % m.tensor_parallel:
            problems.append(
                f"tensor_parallel {m.tensor_parallel} must divide the {arch.num_heads} heads and "
                f"{arch.num_kv_heads} KV heads"
            )
        if arch.num_layers % m.pipeline_parallel:
            problems.append(f"pipeline_parallel {m.pipeline_parallel} must divide the {arch.num_layers} layers")
        if m.expert_parallel > 1 and (not arch.moe or arch.num_experts % m.expert_parallel):
            problems.append(f"expert_parallel {m.expert_parallel} must divide the model's {arch.num_experts} experts")
        checks.append(
            PlanCheck(
                f"megatron.{name}",
                not problems,
                "; ".join(problems)
                or f"TP {m.tensor_parallel}, PP {m.pipeline_parallel}, CP {m.context_parallel}, "
                f"EP {m.expert_parallel} fit the model",
            )
        )


def port_checks(cfg: PipelineConfig, plan: Plan, engine_gpus: list[int], trainer_gpus: list[int]) -> None:
    # Over 60 lines: every process's line and its fixed ports in one pass, so a clash shows across all owners.
    c, e = cfg.cluster, cfg.engine
    per_node = max(c.gpus_per_node, 1)
    engines = engine_count(cfg)
    each = engine_gpus_each(cfg)
    driver = trainer_gpus[0] // per_node if trainer_gpus else 0
    used: list[tuple[int, int, str]] = []  # (node, port, owner)
    if e.kind == "local":
        plan.processes.append("engine: in swerl's process (no port)")
    elif e.launch.urls:
        plan.processes.append(f"engines: {', '.join(e.launch.urls)} (engine.launch.urls)")
    else:
        count = 2 + each if e.kind == "sglang" else 1
        ports = (
            f"ports {e.launch.base_port}-{e.launch.base_port + engines - 1}"
            if e.launch.base_port
            else "free ports picked at launch"
        )
        plan.processes.append(
            f"engines: {engines} x {count} process{'es' if count > 1 else ''} ({e.kind}), host {e.launch.host}, {ports}"
        )
        if e.launch.base_port:
            last = e.launch.base_port + engines - 1
            ok = last <= 65535
            plan.checks.append(
                PlanCheck(
                    "ports.engines", ok, f"engine ports {e.launch.base_port}-{last}" + ("" if ok else ": past 65535")
                )
            )
            for i in range(engines):
                node = (i * each) // per_node if engine_gpus else driver
                used.append((node, e.launch.base_port + i, f"engine {i}"))
    plan.processes.append(f"swerl run (stages, router, rollouts): node {driver}")
    for name, d in trainer_stages(cfg).items():
        if d.backend == "torch":
            alone = name == "grpo" and cfg.grpo.trainer_process
            where = "1 child process" if alone else "in swerl's process"
            plan.processes.append(f"{name} trainer: {where}")
            continue
        port = f":{d.master_port}" if d.master_port else ", port picked at launch"
        plan.processes.append(
            f"{name} trainer: {d.ranks} rank processes ({d.group_backend}), rendezvous {d.master_addr}{port}"
        )
        if d.master_port:
            used.append((driver, d.master_port, f"{name} rendezvous"))
    ws = e.weight_sync
    if ws.method == "distributed":
        port = f":{ws.master_port}" if ws.master_port else ", port picked at launch"
        plan.processes.append(f"weight sync: process group {ws.group_name} at {ws.master_addr}{port}")
        if ws.master_port:
            used.append((driver, ws.master_port, "weight sync group"))
    else:
        plan.processes.append("weight sync: through disk (update_weights_from_disk)")
    clashes: dict[tuple[int, int], list[str]] = {}
    for node, number, owner in used:
        clashes.setdefault((node, number), []).append(owner)
    # sft and grpo run one after the other: their rendezvous may share a port
    bad = {k: v for k, v in clashes.items() if len(v) > 1 and set(v) != {"sft rendezvous", "grpo rendezvous"}}
    if used:
        plan.checks.append(
            PlanCheck(
                "ports",
                not bad,
                "; ".join(
                    f"node {node} port {number}: {' and '.join(owners)}" for (node, number), owners in bad.items()
                )
                or f"{len(used)} fixed ports, no two on one node alike",
            )
        )


def launch_notes(cfg: PipelineConfig, plan: Plan, engine_gpus: list[int], trainer_gpus: list[int]) -> None:
    """What swerl itself starts where, against the plan's placement (honest about what is not built)."""
    c, e = cfg.cluster, cfg.engine
    per_node = max(c.gpus_per_node, 1)
    if not c.gpus_per_node:
        return
    driver = trainer_gpus[0] // per_node if trainer_gpus else 0
    engine_nodes = sorted({g // per_node for g in engine_gpus})
    trainer_nodes = sorted({g // per_node for g in trainer_gpus})
    elsewhere = [n for n in engine_nodes if n != driver]
    if elsewhere and e.launch.urls:
        plan.notes.append(
            "engines at engine.launch.urls are planned as engine.* describes them (max_batch_size, "
            "max_context_tokens, sglang.mem_fraction_static, sglang.tp_size): start them with those values"
        )
    elif elsewhere:
        plan.notes.append(
            f"swerl launches engines on the machine it runs on (node {driver} here): the engines of node"
            f"{'s' if len(elsewhere) > 1 else ''} {', '.join(map(str, elsewhere))} are started there with the same "
            "arguments and listed in engine.launch.urls (engine.launch.host must then be reachable, not loopback)"
        )
    if len(trainer_nodes) > 1:
        plan.notes.append(
            f"the trainer spans nodes {', '.join(map(str, trainer_nodes))}: swerl.train.ranks starts ranks on its "
            "own node only; a multi-node trainer needs torchrun on each node (not built)"
        )
    shared = sorted(set(engine_nodes) & set(trainer_nodes))
    if shared and e.kind == "local":
        plan.notes.append(
            "the local engine runs in swerl's own process on its first visible GPU, as does a one-process trainer: "
            "they share that GPU whatever the placement says (engine.kind http_local or sglang keeps them apart)"
        )
    elif shared and not e.launch.urls:
        local = [g % per_node for g in trainer_gpus if g // per_node == shared[0]]
        plan.notes.append(
            f"engines and trainer share node {shared[0]}: swerl starts trainer rank r on cuda:r and engine i on GPUs "
            f"from i x tp_size; start swerl with CUDA_VISIBLE_DEVICES={','.join(map(str, local))} so the ranks land "
            "on their GPUs (SGLang engines set their own CUDA_VISIBLE_DEVICES)"
        )
