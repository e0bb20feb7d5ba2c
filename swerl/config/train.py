"""Training: the model built from scratch, SFT, and where a trainer runs (one process, FSDP2 ranks, Megatron)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from swerl.config.base import StrictModel


class MegatronConfig(StrictModel):
    """Parallelism of the `megatron` trainer backend (megatron-core through megatron-bridge; the `megatron` extra,
    Python >= 3.12, GPUs). The product of tensor, pipeline and context parallel sizes divides the ranks; the data
    parallel size is what remains; expert parallel splits the MoE experts across data-parallel ranks."""

    tensor_parallel: int = Field(1, ge=1, le=1024)
    """Tensor-parallel size (splits each layer's matrices)."""
    pipeline_parallel: int = Field(1, ge=1, le=1024)
    """Pipeline-parallel size (splits the layers into stages)."""
    context_parallel: int = Field(1, ge=1, le=1024)
    """Context-parallel size (splits long sequences)."""
    expert_parallel: int = Field(1, ge=1, le=1024)
    """Expert-parallel size (splits the MoE experts)."""
    expert_tensor_parallel: int = Field(1, ge=1, le=1024)
    """Tensor-parallel size inside each expert."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (needs tensor_parallel > 1)."""
    distributed_optimizer: bool = True
    """Optimizer state sharded across data-parallel ranks (Megatron's distributed optimizer)."""
    recompute: Literal["none", "selective", "full"] = "none"
    """Activation recomputation granularity."""

    @model_validator(mode="after")
    def _consistent(self) -> MegatronConfig:
        if self.sequence_parallel and self.tensor_parallel == 1:
            raise ValueError("sequence_parallel needs tensor_parallel > 1")
        return self

    @property
    def model_parallel(self) -> int:
        """Ranks one model replica spans (tensor x pipeline x context)."""
        return self.tensor_parallel * self.pipeline_parallel * self.context_parallel


class DistributedConfig(StrictModel):
    """Where and how a stage's trainer runs: one process (torch, today's default), N FSDP2 ranks (gloo on CPU,
    NCCL on GPUs), or Megatron. Part of the stage's inputs: changing it retrains (results differ in the last bits)."""

    backend: Literal["torch", "fsdp2", "megatron"] = "torch"
    """torch: one process, the model unsharded; fsdp2: `ranks` processes, parameters, gradients and optimizer state
    sharded with torch's fully_shard; megatron: megatron-core through megatron-bridge (the `megatron` extra)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """cpu: gloo ranks; cuda: one rank per GPU (local rank i on GPU i), NCCL."""
    ranks: int = Field(1, ge=1, le=100_000)
    """Trainer processes in all (world size); launched by the stage on this node."""
    process_group: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend of the trainer ranks; auto: nccl on cuda, gloo on cpu."""
    master_addr: str = Field("127.0.0.1", min_length=1, max_length=255)
    """Rendezvous address of the trainer ranks (MASTER_ADDR)."""
    master_port: int = Field(0, ge=0, le=65535)
    """Rendezvous port (MASTER_PORT); 0: a free port picked at launch."""
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of the forward and backward (FSDP2 MixedPrecisionPolicy param_dtype; sharded master weights and the
    optimizer state stay float32)."""
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype gradients are reduced in across ranks."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward instead of keeping them."""
    reshard_after_forward: bool = True
    """FSDP2: free the gathered parameters of a layer after its forward (ZeRO-3); False keeps them (ZeRO-2)."""
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2", "flex_attention"] = "sdpa"
    """transformers attention for packed rows (position ids restart per example, never a 2D mask). On GPUs
    flash_attention_2 reads the restarts as varlen sequences (no T x T mask); sdpa builds a block mask."""
    start_timeout_s: float = Field(600.0, gt=0, le=86_400)
    """How long the ranks may take to start and build the model."""
    collective_timeout_s: float = Field(1800.0, gt=0, le=86_400)
    """torch.distributed timeout of one collective (a rank that never answers fails the step after it)."""
    socket_ifname: str | None = Field(None, max_length=64)
    """Network interface the ranks talk over (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME); None: the library picks."""
    megatron: MegatronConfig = Field(default_factory=MegatronConfig)
    """Parallel sizes of the megatron backend."""

    @model_validator(mode="after")
    def _consistent(self) -> DistributedConfig:
        if self.backend == "torch" and self.ranks != 1:
            raise ValueError(f"backend torch runs one process; ranks {self.ranks} needs backend fsdp2 or megatron")
        if self.process_group == "nccl" and self.device != "cuda":
            raise ValueError("process_group nccl needs device cuda")
        if self.backend == "megatron":
            if self.device != "cuda":
                raise ValueError("backend megatron runs on GPUs only (device cuda): megatron-core needs CUDA")
            if self.ranks % self.megatron.model_parallel:
                raise ValueError(
                    f"megatron: tensor x pipeline x context parallel ({self.megatron.model_parallel}) must divide "
                    f"ranks ({self.ranks})"
                )
            m = self.megatron
            experts = m.expert_tensor_parallel * m.expert_parallel * m.pipeline_parallel
            # megatron-core's expert grid: PP x ETP x EP x expert-data-parallel ranks
            if self.ranks % experts:
                raise ValueError(
                    f"megatron: expert_tensor_parallel x expert_parallel x pipeline_parallel ({experts}) must "
                    f"divide ranks ({self.ranks})"
                )
        return self

    @property
    def group_backend(self) -> Literal["gloo", "nccl"]:
        """The torch.distributed backend the ranks use."""
        if self.process_group != "auto":
            return self.process_group
        return "nccl" if self.device == "cuda" else "gloo"


class TinyModelConfig(StrictModel):
    """A Qwen3-architecture model built from scratch, with a byte-level BPE tokenizer trained on project data."""

    vocab_size: int = Field(4096, ge=300, le=1_000_000)
    """Target tokenizer vocabulary (the corpus may yield fewer)."""
    hidden_size: int = Field(256, ge=8, le=65_536)
    """Model width (the residual stream)."""
    num_layers: int = Field(4, ge=1, le=1000)
    """Decoder layers."""
    num_heads: int = Field(4, ge=1, le=1024)
    """Attention query heads (head size = hidden_size / num_heads)."""
    num_kv_heads: int = Field(2, ge=1, le=1024)
    """Key/value heads (grouped-query attention; divides num_heads)."""
    ffn_size: int = Field(768, ge=8, le=1_000_000)
    """MLP width (each expert's, for MoE)."""
    max_positions: int = Field(2048, ge=64, le=1_048_576)
    """Longest sequence the model accepts; every token cap must fit in it."""
    moe: bool = False
    """Qwen3-MoE instead of dense."""
    num_experts: int = Field(4, ge=1, le=1024)
    """Experts per MoE layer (moe: true)."""
    experts_per_token: int = Field(2, ge=1, le=1024)
    """Experts each token is routed to (moe: true)."""


class SFTConfig(StrictModel):
    """Supervised fine-tuning on the traces (torch backend): packing, assistant-only loss, AdamW + cosine."""

    form_first = ("max_steps", "time_budget_s", "model_path", "tiny")

    model_path: str | None = None
    """A Hugging Face causal-LM checkpoint directory (model + tokenizer) to start from; None: build `tiny`."""
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    """The model built from scratch when model_path is None (the CPU default)."""
    seq_len: int = Field(1024, ge=16, le=1_048_576)
    """Packed row length: traces are packed next-fit into rows of at most this many tokens; a trace longer than
    this is an error unless truncate_overlong."""
    truncate_overlong: bool = False
    """Cut traces longer than seq_len instead of refusing them."""
    rows_per_micro_batch: int = Field(2, ge=1, le=100_000)
    """Packed rows per micro-batch (its token budget is rows_per_micro_batch x seq_len). A micro-batch is computed
    as one padding-free row of its traces' real tokens (swerl.train.packing): the rows' empty slots cost nothing."""
    grad_accum_steps: int = Field(1, ge=1, le=100_000)
    """Micro-batches per optimizer step: a step is rows_per_micro_batch x grad_accum_steps rows, and its loss the
    mean NLL over all of their assistant tokens."""
    max_steps: int = Field(300, ge=1, le=10_000_000)
    """Optimizer steps (the cosine schedule ends here)."""
    time_budget_s: float | None = Field(None, gt=0)
    """Wall-clock guard only (max_steps decides what is trained): a run past it ends early, with a warning, the
    report's `budget` and an MLflow tag; the time of earlier attempts counts (saved in each checkpoint)."""
    lr: float = Field(1e-3, gt=0, le=10)
    """Peak learning rate (AdamW), after warm-up."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    """The cosine decay ends at lr x min_lr_ratio on the last step."""
    warmup_steps: int = Field(20, ge=0, le=10_000_000)
    """Linear warm-up steps before the cosine decay."""
    weight_decay: float = Field(0.1, ge=0, le=10)
    """AdamW weight decay, on matrices only (norms and biases are not decayed)."""
    max_grad_norm: float | None = Field(1.0, gt=0)
    """Clip the gradient's total norm to this; None: measured, not clipped."""
    bf16: bool = False
    """bf16 autocast (slower than fp32 on CPUs without bf16 units: see docs/benchmarks.md)."""
    checkpoint_every: int = Field(100, ge=0, le=10_000_000)
    """Steps between checkpoints (model, optimizer, RNG, step, data position); 0: only at the end."""
    keep_checkpoints: int = Field(2, ge=1, le=1000)
    """Checkpoints kept, locally and in the store (the newest N; older ones are removed as new ones land)."""
    threads: int = Field(2, ge=1, le=1024)
    """torch intra-op threads for training."""
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    """Trainer processes, devices, sharding (the default: one CPU process)."""

    @model_validator(mode="after")
    def _trainer(self) -> SFTConfig:
        if self.distributed.backend == "megatron":
            raise ValueError(
                "distributed.backend megatron trains GRPO only (swerl/train/megatron_backend.py): SFT runs on torch "
                "or fsdp2 ranks (sft.distributed.backend fsdp2)"
            )
        return self
