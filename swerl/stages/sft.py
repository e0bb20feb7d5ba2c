"""The SFT stage: the base model (loaded from a checkpoint, or built tiny with a locally trained tokenizer), then
supervised fine-tuning on the traces with packing and assistant-only loss.

Artifacts: base/ (the starting model and tokenizer, evaluated as "base"), model/ (the fine-tuned one), and
sft_report.json. Checkpoints are mirrored to the store under the stage key: a crashed stage resumes from the
newest one and loses at most `checkpoint_every` steps. sft.max_steps decides what is trained; sft.time_budget_s
only guards (it ends the stage early with a warning, the report's `budget` and an MLflow tag, and counts the
time of earlier attempts, saved in each checkpoint).
"""

from __future__ import annotations

import json
import statistics
import sysconfig
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swerl.agent.traces import load_trace_rows, normalize_messages, traces_to_examples
from swerl.config.agent import AgentConfig
from swerl.config.base import StrictModel
from swerl.config.engine import EngineConfig
from swerl.config.train import SFTConfig
from swerl.data.environments import resolve_environment
from swerl.data.repos import iter_files
from swerl.model.loading import (
    build_tiny_model,
    load_model_and_tokenizer,
    load_tokenizer,
    save_model_and_tokenizer,
)
from swerl.model.tokenizer import train_tokenizer
from swerl.stages.common import (
    DurableCheckpoints,
    input_manifest,
    load_tasks,
    put_dir,
    read_input,
    trainer_processes,
)
from swerl.stages.runner import StageContext, StageResult
from swerl.train.checkpoint import TrainerState, latest_checkpoint
from swerl.train.distributed import device_of, init_rank, load_sharded_model
from swerl.train.ranks import SFTRanks
from swerl.train.sft import SFTTrainer, StepMetrics, run_sft_steps, train_sft

STDLIB_FILES = (
    "textwrap.py",
    "string.py",
    "bisect.py",
    "heapq.py",
    "fractions.py",
    "statistics.py",
    "calendar.py",
)
"""Standard-library modules added to the tokenizer corpus: general Python text, so that identifiers the training
tasks never use still split into sensible pieces (never the held-out tasks' own text)."""


class SFTStage(StrictModel):
    """What the SFT stage's checkpoint key covers: its own section and the two caps it checks against the model's
    context (not the rest of the agent and engine sections: switching engines or sandboxes retrains nothing)."""

    sft: SFTConfig
    max_trajectory_tokens: int
    """agent.max_trajectory_tokens"""
    max_context_tokens: int
    """engine.max_context_tokens"""

    @classmethod
    def build(cls, sft: SFTConfig, agent: AgentConfig, engine: EngineConfig) -> SFTStage:
        return cls(
            sft=sft,
            max_trajectory_tokens=agent.max_trajectory_tokens,
            max_context_tokens=engine.max_context_tokens,
        )


def model_context(model: PreTrainedModel) -> int:
    return int(getattr(model.config, "max_position_embeddings", 0) or 0)


def check_caps(cfg: SFTStage, context: int) -> None:
    """Token caps must fit the model's context: a clear error before any training."""
    caps = {
        "sft.seq_len": cfg.sft.seq_len,
        "agent.max_trajectory_tokens": cfg.max_trajectory_tokens,
        "engine.max_context_tokens": cfg.max_context_tokens,
    }
    over = {k: v for k, v in caps.items() if context and v > context}
    if over:
        raise ValueError(f"token caps exceed the model's context of {context} tokens: {over}")


def tokenizer_corpus(rows: list[dict[str, Any]], repo_dirs: list[Path]) -> Iterator[str]:
    """Trace texts, the training repositories' Python sources and a few standard-library modules."""
    for row in rows:
        yield "\n".join(m["content"] for m in normalize_messages(row["messages"]))
    for root in repo_dirs:
        for rel in iter_files(root):
            if rel.suffix == ".py":
                yield (root / rel).read_text(errors="replace")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in STDLIB_FILES:
        if (stdlib / name).is_file():
            yield (stdlib / name).read_text(errors="replace")


def base_model(
    cfg: SFTStage, ctx: StageContext, rows: list[dict[str, Any]], out: Path
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the configured checkpoint, or build the tiny model and train its tokenizer; saved to `out`."""
    if cfg.sft.model_path:
        model, tokenizer = load_model_and_tokenizer(cfg.sft.model_path)
    else:
        tiny = cfg.sft.tiny
        repo_dirs: list[Path] = []
        if "curate" in ctx.inputs:
            images = sorted({t.image for t in load_tasks(ctx.store, ctx.inputs["curate"], "train.parquet")})
            repo_dirs = [
                resolve_environment(image) for image in images if image.startswith(("local://", "micro://", "venv://"))
            ]
        tokenizer = train_tokenizer(tokenizer_corpus(rows, repo_dirs), tiny.vocab_size, ctx.workdir / "tokenizer")
        model = build_tiny_model(
            tokenizer,
            tiny.hidden_size,
            tiny.num_layers,
            tiny.num_heads,
            tiny.num_kv_heads,
            tiny.ffn_size,
            tiny.max_positions,
            moe=tiny.moe,
            num_experts=tiny.num_experts,
            num_experts_per_tok=tiny.experts_per_token,
            seed=ctx.seed,
        )
    check_caps(cfg, model_context(model))
    save_model_and_tokenizer(model, tokenizer, out)
    return model, tokenizer


def run_sft(cfg: SFTStage, ctx: StageContext) -> StageResult:
    """Fine-tune the base model on the traces (resuming from the newest durable checkpoint); store both models."""
    started = time.monotonic()
    torch.set_num_threads(cfg.sft.threads)
    rows = _trace_rows(ctx)
    durable = DurableCheckpoints(ctx, ctx.workdir / "checkpoints", keep=cfg.sft.keep_checkpoints)
    resume = durable.restore_latest()
    model, tokenizer = _starting_model(cfg, ctx, rows, resume)
    examples = traces_to_examples(tokenizer, rows)
    if not examples:
        raise ValueError("no resolved traces to train on")
    lengths = [len(ids) for ids, _ in examples]
    targets = [sum(mask) for _, mask in examples]
    s = cfg.sft
    budget = _Budget(ctx, s, durable.local_root, resume)
    guard = "" if s.time_budget_s is None else f" (time budget {s.time_budget_s:.0f} s as a guard)"
    ctx.log.info(
        "sft: %d examples (mean %.0f tokens, %.0f trained), %d steps%s",
        len(examples),
        statistics.fmean(lengths),
        statistics.fmean(targets),
        s.max_steps,
        guard,
    )

    curve: list[StepMetrics] = []
    on_step = _step_logger(ctx, durable, budget, s.max_steps, curve)
    resume_from = latest_checkpoint(durable.local_root) if resume else None
    out = ctx.workdir / "model"
    if s.distributed.backend == "torch":
        trained = _train_here(model, tokenizer, examples, s, ctx, durable, budget, resume_from, on_step, out)
    else:
        start_dir = resume if resume is not None else ctx.workdir / "base"
        trained = _train_ranks(start_dir, examples, s, ctx, durable, budget, resume_from, on_step, out)
    state, train_s, trainer = trained
    if budget.ended_at is not None:
        ctx.run.set_tags({"swerl.sft.ended_by_budget": f"step {budget.ended_at} of {s.max_steps}"})
    put_dir(ctx, "model", out)
    ctx.log_model(out)  # MLflow: the stage run's output model, registered
    tokens = sum(m.num_tokens for m in curve)
    report: dict[str, Any] = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "examples": len(examples),
        "tokens_per_example": statistics.fmean(lengths),
        "targets_per_example": statistics.fmean(targets),
        "steps": state.step,
        "trainer": trainer,
        "steps_this_attempt": len(curve),
        "resumed_from": resume.name if resume else None,
        "tokens_this_attempt": tokens,
        "epochs": state.epoch,
        "final_loss": curve[-1].loss if curve else None,
        "tokens_per_second": tokens / train_s if train_s > 0 else 0.0,
        "train_s": train_s,
        "wall_s": time.monotonic() - started,
        "budget": budget.report(),
    }
    ctx.write_artifact("sft_report.json", json.dumps(report, indent=2, sort_keys=True).encode())
    return _stage_result(cfg, report, curve)


_Trained = tuple[TrainerState, float, dict[str, Any]]
"""What a trainer leaves the stage: its state, the training seconds and where it ran (trainer_processes)."""


def _train_here(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: list[tuple[list[int], list[int]]],
    s: SFTConfig,
    ctx: StageContext,
    durable: DurableCheckpoints,
    budget: _Budget,
    resume_from: Path | None,
    on_step: Callable[[StepMetrics], None],
    out: Path,
) -> _Trained:
    """The torch trainer in this process; the model saved to `out`."""
    if s.distributed.device == "cuda":
        torch.nn.Module.to(model, device_of(s.distributed))
    result = train_sft(
        model,
        examples,
        **sft_arguments(s, ctx.seed, tokenizer),
        checkpoint_dir=durable.local_root,
        checkpoint_every=s.checkpoint_every,
        keep_last=s.keep_checkpoints,
        resume_from=resume_from,
        on_step=on_step,
        stop=budget.stop,
    )
    train_s = _synced(budget, durable)
    save_model_and_tokenizer(model, tokenizer, out)  # after the final checkpoint is in the store
    return result.state, train_s, trainer_processes(None, s.distributed)


def _train_ranks(
    start_dir: Path,
    examples: list[tuple[list[int], list[int]]],
    s: SFTConfig,
    ctx: StageContext,
    durable: DurableCheckpoints,
    budget: _Budget,
    resume_from: Path | None,
    on_step: Callable[[StepMetrics], None],
    out: Path,
) -> _Trained:
    """sft.distributed's rank processes, loading from `start_dir`; the model saved to `out`."""
    ranks = SFTRanks(build_sft_rank, start_dir, examples, s, ctx.seed, resume_from, config=s.distributed)
    try:
        ctx.log.info(
            "sft: %s trainer, %d ranks on %s (pids %s)",
            s.distributed.backend,
            s.distributed.ranks,
            s.distributed.device,
            ranks.pids,
        )
        run_sft_steps(
            ranks,
            s.max_steps,
            checkpoint_dir=durable.local_root,
            checkpoint_every=s.checkpoint_every,
            keep_last=s.keep_checkpoints,
            on_step=on_step,
            stop=budget.stop,
        )
        state = ranks.trainer_state()
        train_s = _synced(budget, durable)
        ranks.save_model(out)  # after the final checkpoint is in the store
        return state, train_s, trainer_processes(ranks, s.distributed)
    finally:
        ranks.close()


def _synced(budget: _Budget, durable: DurableCheckpoints) -> float:
    """The run's checkpoints stamped with the time spent and in the store; returns the seconds spent training."""
    budget.stamp()
    durable.sync()
    return time.monotonic() - budget.train_started


def sft_arguments(s: SFTConfig, seed: int, tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """sft.* as the SFT trainer's keyword arguments (the same in one process and in every rank)."""
    return dict(
        seq_len=s.seq_len,
        max_steps=s.max_steps,
        rows_per_micro_batch=s.rows_per_micro_batch,
        grad_accum_steps=s.grad_accum_steps,
        lr=s.lr,
        min_lr_ratio=s.min_lr_ratio,
        warmup_steps=_warmup(s),
        weight_decay=s.weight_decay,
        max_grad_norm=s.max_grad_norm,
        bf16=s.bf16 or (s.distributed.backend == "torch" and s.distributed.param_dtype == "bfloat16"),
        seed=seed,
        truncate_overlong=s.truncate_overlong,
        pad_token_id=tokenizer.pad_token_id,
        tokenizer=tokenizer,
    )


def build_sft_rank(
    start_dir: Path,
    examples: list[tuple[list[int], list[int]]],
    s: SFTConfig,
    seed: int,
    resume_from: Path | None,
) -> SFTTrainer:
    """In each FSDP2 rank (module level: spawned children import it): join the group, load, shard, build."""
    torch.set_num_threads(s.threads)
    ranks = init_rank(s.distributed)
    model = load_sharded_model(start_dir, ranks, s.distributed.attn_implementation)
    tokenizer = load_tokenizer(start_dir)
    return SFTTrainer(model, examples, **sft_arguments(s, seed, tokenizer), resume_from=resume_from, ranks=ranks)


def _trace_rows(ctx: StageContext) -> list[dict[str, Any]]:
    """The traces stage's rows, copied into the work directory first."""
    traces = input_manifest(ctx, "traces")
    local_traces = ctx.workdir / "traces.jsonl"
    local_traces.write_bytes(read_input(ctx.store, traces, "traces.jsonl"))
    rows = load_trace_rows(local_traces)
    if not rows:
        raise ValueError(f"the traces stage ({traces.uri}) wrote no traces")
    return rows


def _starting_model(
    cfg: SFTStage, ctx: StageContext, rows: list[dict[str, Any]], resume: Path | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model to train: the resumed checkpoint's, else the base model; base/ goes to the store either way."""
    base_dir = ctx.workdir / "base"
    if resume is not None:
        # The base model of a resumed run is the one the first attempt built: same seed, same data.
        model, tokenizer = load_model_and_tokenizer(resume)
        ctx.log.info("sft: resuming from checkpoint %s", resume.name)
        base_model(cfg, ctx, rows, base_dir)  # rebuilt only to be stored as base/
    else:
        model, tokenizer = base_model(cfg, ctx, rows, base_dir)
    put_dir(ctx, "base", base_dir)
    return model, tokenizer


BUDGET_FILE = "budget.json"
"""The stage's wall-clock seconds spent training up to a checkpoint, saved inside it: a resumed stage continues the
time budget from there instead of starting it afresh."""


class _Budget:
    """sft.time_budget_s as an upper guard only: max_steps decides what is trained (the same steps, the same
    weights, on an idle or a loaded machine); the budget ends a run early, loudly, and counts across resumes."""

    def __init__(self, ctx: StageContext, sft: SFTConfig, local_root: Path, resume: Path | None) -> None:
        self.ctx, self.sft, self.local_root = ctx, sft, local_root
        self.before_s = 0.0  # spent by earlier attempts, up to the resumed checkpoint
        if resume is not None and (resume / BUDGET_FILE).is_file():
            self.before_s = float(json.loads((resume / BUDGET_FILE).read_text())["elapsed_s"])
        self.train_started = time.monotonic()
        self.ended_at: int | None = None

    @property
    def elapsed_s(self) -> float:
        return self.before_s + time.monotonic() - self.train_started

    def stop(self, step: int) -> bool:
        """train_sft's stop hook: True once the budget is spent (said in the log and, by the stage, in MLflow)."""
        budget = self.sft.time_budget_s
        if budget is None or self.elapsed_s < budget:
            return False
        self.ended_at = step
        self.ctx.log.warning(
            "sft: the time budget of %.0f s ended the stage at step %d of %d (%.0f s spent, %.0f s of them before "
            "this attempt): the model is NOT the configured one; raise sft.time_budget_s or lower sft.max_steps",
            budget,
            step,
            self.sft.max_steps,
            self.elapsed_s,
            self.before_s,
        )
        return True

    def stamp(self) -> None:
        """Write the elapsed time into every local checkpoint that has none yet (before it is uploaded)."""
        for folder in self.local_root.glob("step_*"):
            if folder.is_dir() and not (folder / BUDGET_FILE).exists():
                (folder / BUDGET_FILE).write_text(json.dumps({"elapsed_s": self.elapsed_s}))

    def report(self) -> dict[str, Any]:
        return {
            "time_budget_s": self.sft.time_budget_s,
            "elapsed_s": self.elapsed_s,
            "elapsed_before_s": self.before_s,
            "ended_by_budget": self.ended_at is not None,
            "ended_at_step": self.ended_at,
            "max_steps": self.sft.max_steps,
        }


SFT_DENSE_LOG_STEPS = 100
"""SFT logs its train/* metrics at every one of its first steps (a short run's whole curve)."""
SFT_METRIC_POINTS = 100
"""...and about this many points over a longer run."""


def _step_logger(
    ctx: StageContext, durable: DurableCheckpoints, budget: _Budget, max_steps: int, curve: list[StepMetrics]
) -> Callable[[StepMetrics], None]:
    """train_sft's on_step hook: keep the curve, log metric points (every step of the first SFT_DENSE_LOG_STEPS,
    then ~SFT_METRIC_POINTS over the run, so a run short or ended early by its budget still has a curve) and ~10
    lines, sync checkpoints."""
    every = max(1, max_steps // SFT_METRIC_POINTS)

    def on_step(metrics: StepMetrics) -> None:
        curve.append(metrics)
        if metrics.step <= SFT_DENSE_LOG_STEPS or metrics.step % every == 0 or metrics.step == max_steps:
            ctx.log_metrics(
                {
                    "train/loss": metrics.loss,
                    "train/lr": metrics.lr,
                    "train/grad_norm": metrics.grad_norm,
                    "train/tokens_per_second": metrics.tokens_per_second,
                    "train/epoch": metrics.epoch,
                    "train/padding_fraction": metrics.padding_fraction,
                },
                step=metrics.step,
            )
        if metrics.step % max(1, max_steps // 10) == 0:
            ctx.log.info(
                "sft step %d/%d loss %.3f %.0f tok/s", metrics.step, max_steps, metrics.loss, metrics.tokens_per_second
            )
        ctx.progress(metrics.step, max_steps, f"SFT step {metrics.step} of {max_steps}, loss {metrics.loss:.3f}")
        budget.stamp()
        durable.sync()  # checkpoints written after the previous step reach the store now

    return on_step


def _warmup(s: SFTConfig) -> int:
    return min(s.warmup_steps, s.max_steps - 1)


def _stage_result(cfg: SFTStage, report: dict[str, Any], curve: list[StepMetrics]) -> StageResult:
    metrics = {
        "parameters": float(report["parameters"]),
        "examples": float(report["examples"]),
        "steps": float(report["steps"]),
        "tokens_per_second": float(report["tokens_per_second"]),
        "final_loss": float(statistics.fmean(m.loss for m in curve[-10:])) if curve else float("nan"),
        "max_steps": float(cfg.sft.max_steps),
        "ended_by_budget": float(report["budget"]["ended_by_budget"]),
    }
    markdown = "\n".join(
        [
            "# SFT",
            "",
            f"- model: {cfg.sft.model_path or 'tiny Qwen3 built from config'}, {report['parameters']:,} parameters,"
            f" vocab {report['vocab_size']}",
            f"- {report['examples']} traces, mean {report['tokens_per_example']:.0f} tokens "
            f"({report['targets_per_example']:.0f} trained)",
            f"- {report['steps']} steps, {report['epochs']} epochs, final loss {metrics['final_loss']:.3f}, "
            f"{report['tokens_per_second']:.0f} tokens/s",
            *(
                [f"- **ended by the time budget** at step {report['steps']} of {cfg.sft.max_steps}"]
                if report["budget"]["ended_by_budget"]
                else []
            ),
        ]
    )
    return StageResult(
        metrics=metrics,
        markdown={"sft": markdown + "\n"},
        summary=f"{report['steps']} steps, loss {metrics['final_loss']:.3f}",
    )
