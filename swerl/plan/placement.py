"""Which GPU (node and index) runs which engine or trainer rank, with the checks that they exist.

Placement. Engines take GPUs first, in (node, index) order: engine i gets tp_size GPUs from i x tp_size (SGLang
engines; a local engine on cuda one GPU). With cluster.engine_nodes the engines own that many whole nodes and the
trainer starts on the next node; otherwise the trainer's GPUs follow the engines' at once. The trainer gets
cluster.trainer_gpus GPUs, or every GPU left; on cuda it runs one rank per GPU, so a stage's distributed.ranks must
equal its GPUs. SFT and GRPO run one after the other on the same trainer GPUs; engines run in grpo and evaluate.
"""

from __future__ import annotations

from swerl.config import PipelineConfig
from swerl.config.train import DistributedConfig
from swerl.plan.report import Plan, PlanCheck, span_text, where_text


def trainer_stages(cfg: PipelineConfig) -> dict[str, DistributedConfig]:
    stages = {"sft": cfg.sft.distributed}
    if cfg.grpo.schedule.steps > 0:
        stages["grpo"] = cfg.grpo.distributed
    return stages


def engine_gpus_each(cfg: PipelineConfig) -> int:
    """GPUs of one engine (0: the engine runs on cpu)."""
    e = cfg.engine
    if e.kind == "sglang":
        return e.sglang.tp_size
    return 1 if e.local.device == "cuda" else 0


def engine_count(cfg: PipelineConfig) -> int:
    """Engines: one in process (local), the servers at engine.launch.urls (planned as engine.* describes them,
    started by someone else), or launch.num_engines launched by swerl."""
    e = cfg.engine
    if e.kind == "local":
        return 1
    return len(e.launch.urls) if e.launch.urls else e.launch.num_engines


def place(cfg: PipelineConfig, plan: Plan, cuda_stages: dict[str, DistributedConfig]) -> tuple[list[int], list[int]]:
    """The engines' and the trainer's GPUs (global indices: node x gpus_per_node + index), with the checks that
    they exist: enough GPUs, engines within their nodes, one trainer rank per trainer GPU."""
    # Over 60 lines: GPU count, engine nodes, trainer GPUs and rank checks all read one set of indices.
    c, e = cfg.cluster, cfg.engine
    per_node = c.gpus_per_node
    engine_each = engine_gpus_each(cfg)
    engines = engine_count(cfg)
    engine_need = engines * engine_each
    total_gpus = c.nodes * per_node
    engine_gpus: list[int] = []
    trainer_gpus: list[int] = []
    wanted = max((d.ranks for d in cuda_stages.values()), default=0)
    if (engine_need or cuda_stages) and per_node == 0:
        engine_user = "engine.kind sglang" if e.kind == "sglang" else f"engine.kind {e.kind} on device cuda"
        users = ([engine_user] if engine_need else []) + [f"{name}.distributed.device cuda" for name in cuda_stages]
        verb = "needs" if len(users) == 1 else "need"
        plan.checks.append(
            PlanCheck("gpus", False, f"{' and '.join(users)} {verb} GPUs, but cluster.gpus_per_node is 0")
        )
    elif per_node:
        start = engine_need
        if c.engine_nodes is not None:
            room = c.engine_nodes * per_node
            fits = engine_need <= room and c.engine_nodes <= c.nodes
            plan.checks.append(
                PlanCheck(
                    "engines",
                    fits,
                    f"{engines} engines x {engine_each} GPU{'s' if engine_each > 1 else ''} = {engine_need} GPUs in "
                    f"cluster.engine_nodes "
                    f"{c.engine_nodes} x {per_node} GPUs ({room})"
                    + ("" if engine_need <= room else f": {engine_need - room} GPUs short")
                    + ("" if c.engine_nodes <= c.nodes else f"; the cluster has only {c.nodes} nodes"),
                )
            )
            start = room
        start = min(start, total_gpus)
        engine_gpus = list(range(min(engine_need, total_gpus)))
        available = total_gpus - start
        want = c.trainer_gpus if c.trainer_gpus is not None else (wanted if cuda_stages else 0)
        given = c.trainer_gpus if c.trainer_gpus is not None else (available if cuda_stages else 0)
        short = max(0, engine_need - min(engine_need, total_gpus)) + max(0, want - available)
        layout = f"{c.nodes} node{'s' if c.nodes > 1 else ''} x {per_node}"
        who = (
            [f"engines {engine_need} ({engines} x {engine_each} GPU{'s' if engine_each > 1 else ''})"]
            if engine_need
            else []
        )
        if want:
            ranks = ", ".join(f"{name}.distributed.ranks {d.ranks}" for name, d in cuda_stages.items())
            who.append(f"the trainer {want} ({'cluster.trainer_gpus' if c.trainer_gpus is not None else ranks})")
        detail = f"the cluster has {total_gpus} GPUs ({layout})" + (f"; {' and '.join(who)}" if who else "")
        if c.engine_nodes is not None and want:
            detail += f", after the engines' {c.engine_nodes} node{'s' if c.engine_nodes != 1 else ''}"
        if short:
            detail += f": {short} GPUs short"
        plan.checks.append(PlanCheck("gpus", short == 0, detail))
        trainer_gpus = list(range(start, start + min(given, available)))
        if c.trainer_gpus is not None and not cuda_stages:
            plan.checks.append(
                PlanCheck(
                    "trainer_gpus",
                    False,
                    f"cluster.trainer_gpus {c.trainer_gpus}, but no trainer runs on cuda (sft/grpo.distributed.device)",
                )
            )
        for name, d in cuda_stages.items():
            if d.ranks <= available and trainer_gpus:
                ok = d.ranks == len(trainer_gpus)
                plan.checks.append(
                    PlanCheck(
                        f"ranks.{name}",
                        ok,
                        f"{name}.distributed.ranks {d.ranks} vs {len(trainer_gpus)} trainer GPU"
                        f"{'s' if len(trainer_gpus) > 1 else ''} "
                        f"({where_text(trainer_gpus, per_node)}): one rank per GPU"
                        + ("" if ok else "; set the ranks, or cluster.trainer_gpus, or give the engines the rest"),
                    )
                )
        spans = [
            i
            for i in range(engines)
            if engine_each and (i * engine_each) // per_node != (i * engine_each + engine_each - 1) // per_node
        ]
        if spans:
            plan.checks.append(
                PlanCheck(
                    "engines.nodes",
                    False,
                    f"engine {spans[0]} (tp_size {engine_each}) would span two nodes: tp_size must divide "
                    f"cluster.gpus_per_node {per_node}",
                )
            )
        idle = total_gpus - len(engine_gpus) - len(trainer_gpus)
        if idle > 0 and not short:
            plan.notes.append(f"{idle} GPUs run nothing")

    return engine_gpus, trainer_gpus


def _stage_label(name: str, d: DistributedConfig) -> str:
    extra = ""
    if d.backend == "megatron":
        m = d.megatron
        extra = f" TP{m.tensor_parallel} PP{m.pipeline_parallel} CP{m.context_parallel} EP{m.expert_parallel}"
    return f"{name}: {d.backend}{extra}, {d.param_dtype}"


def placement_lines(
    cfg: PipelineConfig,
    plan: Plan,
    engine_gpus: list[int],
    trainer_gpus: list[int],
    cuda_stages: dict[str, DistributedConfig],
) -> None:
    c, e = cfg.cluster, cfg.engine
    per_node = c.gpus_per_node
    each = engine_gpus_each(cfg)
    engines = engine_count(cfg)
    started = "; at engine.launch.urls, started by you" if e.launch.urls and e.kind != "local" else ""
    if engine_gpus:
        for node in sorted({g // per_node for g in engine_gpus}):
            mine = [i for i in range(engines) if (i * each) // per_node == node and i * each < len(engine_gpus)]
            if not mine:
                continue
            gpus = [g for g in engine_gpus if g // per_node == node]
            plan.placement.append(
                f"{where_text(gpus, per_node)}: engine{'s' if len(mine) > 1 else ''} {span_text(mine[0], mine[-1])} "
                f"({e.kind}, {each} GPU"
                f"{'s' if each > 1 else ''} each{started})"
            )
    else:
        where = "in the stage's process" if e.kind == "local" else f"{engines} processes"
        plan.placement.append(f"engines: {e.kind} on cpu, {where} (node 0's host{started})")
    if trainer_gpus:
        for node in sorted({g // per_node for g in trainer_gpus}):
            gpus = [g for g in trainer_gpus if g // per_node == node]
            first, last = gpus[0] - trainer_gpus[0], gpus[-1] - trainer_gpus[0]
            labels = "; ".join(_stage_label(name, d) for name, d in cuda_stages.items())
            plan.placement.append(
                f"{where_text(gpus, per_node)}: trainer rank{'s' if last > first else ''} "
                f"{span_text(first, last)} ({labels})"
            )
    for name, d in trainer_stages(cfg).items():
        if d.device == "cpu":
            plan.placement.append(
                f"trainer ({_stage_label(name, d)}): {d.ranks} cpu process{'es' if d.ranks > 1 else ''} on the "
                "host of the node swerl runs on"
            )
