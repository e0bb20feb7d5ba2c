"""The machines `swerl plan` places a run on (read by no stage)."""

from __future__ import annotations

from pydantic import Field

from swerl.config.base import StrictModel


class ClusterConfig(StrictModel):
    """The machines a run is planned on (`swerl plan`, swerl.plan): nodes of identical GPUs. No stage reads it:
    it places engines and trainer ranks on GPUs and checks that each one's memory fits before a run starts.

    Placement: engines take GPUs first, in (node, index) order (engine i: engine.sglang.tp_size GPUs from
    i x tp_size), the trainer the GPUs after them; with engine_nodes, engines own whole nodes and the trainer starts
    on the node after them. A trainer on cuda runs one rank per GPU: its ranks must equal its GPUs."""

    nodes: int = Field(1, ge=1, le=4096)
    """Machines in the cluster, all alike."""
    gpus_per_node: int = Field(0, ge=0, le=64)
    """GPUs per machine; 0: CPU machines (the plan then reports host memory and processes and checks those)."""
    gpu_memory_gib: float = Field(80.0, gt=0, le=4096)
    """Memory of one GPU, in GiB (2^30 bytes)."""
    engine_nodes: int | None = Field(None, ge=0, le=4096)
    """Nodes given to the engines whole (the recipe: inference and training on separate nodes); the trainer
    starts on the next node. None: the engines take the first launch.num_engines x sglang.tp_size GPUs and the
    trainer the ones right after them, on the same node where there is room."""
    trainer_gpus: int | None = Field(None, ge=1, le=1_000_000)
    """GPUs of the trainer, placed after the engines'; None: every GPU the engines do not take."""
    usable_memory_fraction: float = Field(0.9, gt=0, le=1)
    """Share of a trainer GPU's memory (and of a node's host memory) the plan lets the estimate fill; the rest is
    the CUDA context, NCCL buffers, the allocator's fragmentation and the estimate's error. SGLang engines are
    checked against engine.sglang.mem_fraction_static instead, as SGLang budgets them."""
    host_memory_gib: float | None = Field(None, gt=0, le=1_048_576)
    """Memory of one node's host, in GiB; None: this machine's (MemTotal)."""
    model_config_path: str | None = Field(None, alias="model_config", min_length=1, max_length=4096)
    """The model's architecture for the plan when sft.model_path has no config.json here (a cluster's model folder
    is absent on a laptop): a path to a Hugging Face config.json, or the name of one swerl ships
    (swerl/data/resources/architectures/NAME.json: `qwen3-30b-a3b`). Only architecture numbers are read."""
