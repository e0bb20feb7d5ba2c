"""The GRPO stage. Synchronous mode (grpo.mode: sync, the baseline): each step samples B training tasks x n attempts with the current policy, runs
the episodes concurrently in sandboxes, and takes one GRPO update; the new weights go to the engine with a
version number before the next step.

The failure rule: an attempt that ends in an infrastructure error is rerun (agent.infra_retries); if it still
fails it is left out of its group's baseline and of the loss, never scored 0. Checkpoints (model, optimizer,
RNG, step, task-stream position, the infrastructure-failure counts) are mirrored to the store under the stage
key; a crashed stage resumes there, its `failures/*` counts continuing from the checkpoint's.

Synchronous mode is swerl.rollout.sync_loop. Asynchronous mode (grpo.mode: async): the same engine, trainer and
episode function are handed to swerl.stages.grpo_async.AsyncGRPO (around swerl.rollout.async_loop), which keeps rollouts running while the trainer steps on finished groups. With
grpo.eval.every, checkpoints are evaluated on the held-out split beside training (swerl.stages.grpo_eval).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swerl.agent.episode import run_episode
from swerl.config import PipelineConfig
from swerl.config.agent import AgentConfig
from swerl.config.base import StrictModel
from swerl.config.engine import EngineConfig
from swerl.config.grpo import GRPOAlgorithmConfig, GRPOConfig, GRPOPhaseTasks
from swerl.data.environments import setup_patch
from swerl.data.schema import TaskInstance
from swerl.engine.base import Engine, SamplingParams, logprob_temperature
from swerl.engine.factory import open_engine
from swerl.eval.report import plot_learning_curve
from swerl.model.loading import context_length, load_model_and_tokenizer, load_tokenizer
from swerl.plots import duration_histogram, grpo_curves, step_time_breakdown, step_time_shares
from swerl.rollout.environments import EnvironmentPlanner, ProviderEnvironments
from swerl.rollout.step import DistributedWeights
from swerl.rollout.sync_loop import SyncProgress, SyncSettings, train_sync
from swerl.sandbox.pool import SandboxPool
from swerl.stages.common import (
    DurableCheckpoints,
    episode_limits,
    episode_with_retries,
    get_dir,
    input_manifest,
    load_tasks,
    put_dir,
    read_input,
    run_async,
    sandbox_pool,
    seeded_sample,
    trainer_processes,
)
from swerl.stages.grpo_async import AsyncGRPO
from swerl.stages.grpo_eval import CheckpointEvaluator, checkpoint_evaluator
from swerl.stages.runner import StageContext, StageResult
from swerl.train.checkpoint import CheckpointMirror, StreamPosition
from swerl.train.distributed import RankContext, device_of, init_rank, load_sharded_model
from swerl.train.grpo_step import Trainer, UpdateSettings
from swerl.train.grpo_trainer import GRPOTrainer
from swerl.train.ranks import DistributedTrainer
from swerl.train.trainer_process import TrainerProcess
from swerl.trajectory import Trajectory

FAILURES_FILE = "failure_counts.json"
"""Infrastructure failures by cause so far, saved inside every trainer checkpoint (a resumed stage continues them)."""
SCHEDULE_FILE = "schedule_state.json"
"""The stage's seconds spent so far and (sync) the batches skipped for having nothing trainable, saved inside every
trainer checkpoint: a resumed stage continues its time budget and data position from there."""


HANDOFF_FILE = "phase_handoff.json"
"""Every GRPO stage's artifact for the phase after it: its final checkpoint in the store, the step and data position
there, the rollout journals so far (unconsumed groups carry on), and the learning curve so far."""


class GRPOPhaseRef(StrictModel):
    """Which phase of grpo.phases a GRPO stage runs (GRPOStage.phase; None: the single default phase)."""

    name: str
    index: int
    previous: str | None = None
    """The stage of the phase before (its manifest is an input), None for the first."""
    reset_optimizer: bool = False
    tasks: GRPOPhaseTasks | None = None


class GRPOStage(StrictModel):
    """What a GRPO stage's checkpoint key covers (one phase's effective settings)."""

    grpo: GRPOConfig
    agent: AgentConfig
    engine: EngineConfig
    phase: GRPOPhaseRef | None = None
    eval_agent: AgentConfig | None = None
    """The agent settings evaluation beside training runs with (grpo.eval): the base ones, when a phase changes
    the rollouts' (so every point of the learning curve is measured alike); None: `agent`."""
    eval_engine: EngineConfig | None = None
    """The engine settings of that evaluation (as eval_agent); None: `engine`."""


def phase_stage(cfg: PipelineConfig, index: int) -> GRPOStage:
    """Phase `index` of the pipeline's GRPO phases as its stage config."""
    phases = cfg.grpo_phases()
    p = phases[index]
    ref = None
    if cfg.grpo.phases is not None:
        ref = GRPOPhaseRef(name=p.name, index=p.index, previous=phases[index - 1].stage if index else None,
                           reset_optimizer=p.reset_optimizer, tasks=p.tasks)  # fmt: skip
    return GRPOStage(grpo=p.grpo, agent=p.agent, engine=p.engine, phase=ref,
                     eval_agent=cfg.agent if p.agent != cfg.agent else None,
                     eval_engine=cfg.engine if p.engine != cfg.engine else None)  # fmt: skip


@dataclass(frozen=True)
class PhaseStart:
    """Where a later GRPO phase starts: the previous phase's handoff (HANDOFF_FILE)."""

    stage: str
    step: int
    data_position: int
    checkpoints: str
    checkpoint: str
    journals: list[str]
    curve: dict[str, Any]

    @classmethod
    def read(cls, ctx: StageContext, ref: GRPOPhaseRef | None) -> PhaseStart | None:
        if ref is None or ref.previous is None:
            return None
        manifest = input_manifest(ctx, ref.previous)
        if HANDOFF_FILE not in manifest.artifacts:
            raise ValueError(f"grpo phase {ref.name}: the previous phase's manifest {manifest.uri} has no "
                             f"{HANDOFF_FILE} (written by an older swerl): rerun it with --force {ref.previous}")  # fmt: skip
        body = json.loads(read_input(ctx.store, manifest, HANDOFF_FILE))
        return cls(ref.previous, int(body["step"]), int(body["data_position"]), str(body["checkpoints"]),
                   str(body["checkpoint"]), [str(j) for j in body["journals"]], dict(body["curve"]))  # fmt: skip

    def restore(self, ctx: StageContext) -> Path:
        """Download the previous phase's final checkpoint (model, optimizer, RNG, ledger, counts)."""
        return CheckpointMirror(ctx.store, self.checkpoints, ctx.workdir / "phase_start").restore(
            self.checkpoint
        )


def task_filter(cfg: GRPOStage, order: list[TaskInstance]) -> Callable[[int], bool] | None:
    """The phase's task filter over the data stream's indices; ValueError naming the phase when it matches none."""
    f = cfg.phase.tasks if cfg.phase is not None else None
    if f is None:
        return None
    allowed = [f.matches(t.difficulty, t.repo, t.modifier) for t in order]
    if not any(allowed):
        present = {"difficulties": sorted({str(t.difficulty) for t in order}),
                   "repos": sorted({t.repo for t in order}), "modifiers": sorted({str(t.modifier) for t in order})}  # fmt: skip
        raise ValueError(
            f"grpo.phases[{cfg.phase.index}] ({cfg.phase.name}): tasks {f.model_dump()} match none of the "  # type: ignore[union-attr]
            f"{len(order)} training tasks; they have {present}"
        )
    return lambda index: allowed[index % len(allowed)]


def check_config(cfg: GRPOStage, context: int) -> None:
    caps = {"agent.max_trajectory_tokens": cfg.agent.max_trajectory_tokens,
            "engine.max_context_tokens": cfg.engine.max_context_tokens}  # fmt: skip
    over = {k: v for k, v in caps.items() if context and v > context}
    if over:
        raise ValueError(f"token caps exceed the model's context of {context} tokens: {over}")
    if cfg.engine.weight_sync.method == "distributed":
        if cfg.grpo.eval.every > 0:
            raise ValueError(
                "grpo.eval.every evaluates the weights exported for the engine, and engine.weight_sync.method "
                "distributed exports none: set one of them back (eval.every 0, or method disk)"
            )
        if cfg.grpo.distributed.backend == "megatron":
            raise ValueError(
                "engine.weight_sync.method distributed is not built for the megatron backend yet: use method disk"
            )
    if cfg.agent.max_trajectory_tokens > cfg.engine.max_context_tokens:
        raise ValueError(
            f"agent.max_trajectory_tokens ({cfg.agent.max_trajectory_tokens}) exceeds engine.max_context_tokens "
            f"({cfg.engine.max_context_tokens}): episodes would be cut by the engine, not by the agent's cap"
        )


def distributed_weights(engine: EngineConfig, g: GRPOConfig) -> DistributedWeights | None:
    """engine.weight_sync as the loops' DistributedWeights (None: through disk, the default)."""
    w = engine.weight_sync
    if w.method != "distributed":
        return None
    backend = (
        w.process_group
        if w.process_group != "auto"
        else ("nccl" if g.distributed.device == "cuda" else "gloo")
    )
    return DistributedWeights(master_addr=w.master_addr, master_port=w.master_port, backend=backend,
                              group_name=w.group_name, bucket_bytes=w.bucket_mb << 20, dtype=engine.local.dtype,
                              timeout_s=w.timeout_s, socket_ifname=w.socket_ifname)  # fmt: skip


def run_grpo(cfg: GRPOStage, ctx: StageContext) -> StageResult:
    g = cfg.grpo
    started = time.monotonic()
    torch.set_num_threads(g.threads)
    sft = input_manifest(ctx, "sft")
    tasks = load_tasks(ctx.store, input_manifest(ctx, "curate"), "train.parquet")
    if not tasks:
        raise ValueError("the curate stage produced no training tasks for GRPO")
    order = seeded_sample(tasks, len(tasks), f"grpo:{ctx.seed}:{g.schedule.task_seed_offset}")
    eligible = task_filter(cfg, order)
    start = PhaseStart.read(ctx, cfg.phase)
    start_dir = get_dir(ctx.store, sft, "model", ctx.workdir / "sft_model")
    durable = DurableCheckpoints(ctx, ctx.workdir / "checkpoints", keep=cfg.grpo.schedule.keep_checkpoints)
    resume = durable.restore_latest()
    # A later phase's first attempt starts from the previous phase's final checkpoint; its crashes resume from its own.
    handoff = start.restore(ctx) if start is not None and resume is None else None
    tokenizer = load_tokenizer(start_dir)
    try:
        check_config(cfg, context_length(start_dir))
    except ValueError as exc:
        if cfg.phase is None:
            raise
        raise ValueError(f"grpo.phases[{cfg.phase.index}] ({cfg.phase.name}): {exc}") from None
    sampling = SamplingParams(max_new_tokens=cfg.agent.max_new_tokens_per_turn, temperature=g.rollout.temperature,
                              top_p=g.rollout.top_p)  # fmt: skip
    trainer: Trainer
    temperature = logprob_temperature(sampling)
    if g.distributed.backend != "torch":
        # N ranks, each loading and sharding while this process opens the engine and the sandboxes.
        ranks = DistributedTrainer(build_rank_trainer, start_dir, g, temperature, ctx.seed,
                                   config=g.distributed, wait=False)  # fmt: skip
        ctx.log.info("grpo: %s trainer, %d ranks on %s (pids %s)", g.distributed.backend, g.distributed.ranks,
                     g.distributed.device, ranks.pids)  # fmt: skip
        trainer = ranks
    elif g.trainer_process:
        # The child imports and loads while this process opens the engine and the sandboxes.
        trainer = TrainerProcess(build_trainer, start_dir, g, temperature, ctx.seed, wait=False)
        ctx.log.info("grpo: trainer in process %s (%d threads)", trainer.pid, g.threads)
    else:
        trainer = build_trainer(start_dir, g, temperature, ctx.seed)
    try:
        return _run_grpo(cfg, ctx, trainer, tokenizer, sampling, start_dir, durable, resume, order, started,
                         PhaseContext(start, handoff, eligible))  # fmt: skip
    finally:
        if isinstance(trainer, TrainerProcess | DistributedTrainer):
            trainer.close()


def build_trainer(
    start_dir: Path, g: GRPOConfig, temperature: float, seed: int, ranks: RankContext | None = None
) -> GRPOTrainer:
    """The stage's trainer, from the SFT model directory (in the stage's process, in a TrainerProcess child, or
    in each FSDP2 rank: a module-level function, so the children can import it)."""
    torch.set_num_threads(g.threads)
    d = g.distributed

    def load() -> PreTrainedModel:
        if ranks is not None:  # no rank but rank 0 ever holds the whole model
            return load_sharded_model(start_dir, ranks, d.attn_implementation)  # type: ignore[no-any-return]
        return load_model_and_tokenizer(start_dir, attn_implementation=d.attn_implementation)[0]

    model, tokenizer = load(), load_tokenizer(start_dir)
    reference = load() if g.algorithm.kl_coef > 0 else None
    if ranks is None and d.device == "cuda":  # one process on one GPU: the parameters move, bf16 autocasts
        torch.nn.Module.to(model, device_of(d))
        if reference is not None:
            torch.nn.Module.to(reference, device_of(d))
    bf16 = ranks is None and d.param_dtype == "bfloat16"  # sharded: FSDP2's mixed-precision policy casts
    return GRPOTrainer(model, update_settings(g.algorithm), ref_model=reference, logprob_temperature=temperature,
                       seed=seed, tokenizer=tokenizer, bf16=bf16, ranks=ranks)  # fmt: skip


def build_rank_trainer(start_dir: Path, g: GRPOConfig, temperature: float, seed: int) -> Any:
    """In each trainer rank: join the group, then the trainer of its backend (fsdp2: GRPOTrainer sharded;
    megatron: swerl.train.megatron_backend, imported only here)."""
    torch.set_num_threads(g.threads)
    if g.distributed.backend == "megatron":
        from swerl.train.megatron_backend import build_megatron_trainer

        return build_megatron_trainer(start_dir, g, temperature, seed)
    return build_trainer(start_dir, g, temperature, seed, ranks=init_rank(g.distributed))


def update_settings(algorithm: GRPOAlgorithmConfig) -> UpdateSettings:
    """grpo.algorithm as the trainer's UpdateSettings (the same fields, so none is mapped by hand)."""
    return UpdateSettings(**algorithm.model_dump())


@dataclass(frozen=True)
class PhaseContext:
    """A stage's place among the GRPO phases: the previous phase's handoff (None for the first or only phase),
    its downloaded checkpoint (None when this phase resumes from its own), the phase's task filter."""

    start: PhaseStart | None = None
    handoff: Path | None = None
    eligible: Callable[[int], bool] | None = None

    @property
    def first_step(self) -> int:
        return self.start.step if self.start is not None else 0


@dataclass
class _GRPORun:
    """One attempt of the stage: what the loop, its per-step callback, the checkpoints and the report share."""

    cfg: GRPOStage
    ctx: StageContext
    trainer: Trainer
    durable: DurableCheckpoints
    order: list[TaskInstance]
    provider: SandboxPool
    counts: dict[str, int]  # infrastructure failures by cause, continued from the checkpoint's
    asynchronous: AsyncGRPO | None
    evaluator: CheckpointEvaluator | None
    started: float = field(default_factory=time.monotonic)
    elapsed_before_s: float = 0.0  # spent by earlier attempts, up to the resumed checkpoint
    phase: PhaseContext = field(default_factory=PhaseContext)
    progress: SyncProgress = field(default_factory=SyncProgress)
    history: list[dict[str, float]] = field(default_factory=list)

    @property
    def elapsed_s(self) -> float:
        return self.elapsed_before_s + time.monotonic() - self.started

    def save(self) -> Path:
        path = save(self.trainer, self.durable, self.cfg.grpo, len(self.order), self.counts, self.asynchronous,
                    skipped_batches=self.progress.skipped_batches, elapsed_s=self.elapsed_s)  # fmt: skip
        return path

    def on_sync_step(self, stats: dict[str, float], groups: list[list[Trajectory]]) -> None:
        g, step = self.cfg.grpo, self.trainer.step
        stats |= {f"failures/{k}": float(v) for k, v in self.counts.items()}
        stats |= episode_stats(groups) | self.provider.step_metrics()
        self.history.append(stats)
        self.ctx.log_metrics({f"train/{k}": v for k, v in stats.items()}, step=step)
        self.ctx.progress(step, g.schedule.steps, f"GRPO step {step} of {g.schedule.steps}")
        with_signal = stats["groups"] - stats["groups_without_signal"] - stats["groups_dropped"]
        self.ctx.log.info("grpo step %d/%d: reward %.3f, %d/%d groups with signal, %.0f s", step, g.schedule.steps,
                          stats["reward_mean"], with_signal, stats["groups"], stats["time_total_s"])  # fmt: skip


def _run_grpo(
    cfg: GRPOStage,
    ctx: StageContext,
    trainer: Trainer,
    tokenizer: PreTrainedTokenizerBase,
    sampling: SamplingParams,
    start_dir: Path,
    durable: DurableCheckpoints,
    resume: Path | None,
    order: list[TaskInstance],
    started: float,
    phase: PhaseContext | None = None,
) -> StageResult:
    """Resume (or start from the previous phase), sample and train (sync or async), publish the model, the report
    and the handoff to the next phase."""
    phase = phase or PhaseContext()
    # The loops count steps from 0: a later phase trains up to its first step + its own steps.
    g = cfg.grpo.model_copy(update={"schedule": cfg.grpo.schedule.model_copy(
        update={"steps": phase.first_step + cfg.grpo.schedule.steps})})  # fmt: skip
    cfg = cfg.model_copy(update={"grpo": g})
    serve_dir = start_dir
    if resume is not None:
        trainer.load(resume)
        serve_dir = resume
        ctx.log.info("grpo: resumed at step %d from %s", trainer.step, resume.name)
    elif phase.handoff is not None and phase.start is not None and cfg.phase is not None:
        reset = cfg.phase.reset_optimizer
        trainer.load(phase.handoff, optimizer=not reset)
        serve_dir = phase.handoff
        ctx.log.info("grpo phase %s: starts at step %d, data position %d, from %s's checkpoint %s (%s)",
                     cfg.phase.name, trainer.step, phase.start.data_position, phase.start.stage, phase.start.checkpoint,
                     "fresh optimizer" if reset else "its optimizer state")  # fmt: skip
    state = load_schedule_state(resume)  # a phase's time budget is its own: elapsed time only from its own
    skipped = state.get("skipped_batches", load_schedule_state(phase.handoff).get("skipped_batches", 0))
    before_s = float(state.get("elapsed_s", 0.0))
    budget = g.schedule.time_budget_s
    if budget is not None and before_s > 0:
        ctx.log.info("grpo: %.0f s of the %.0f s time budget spent by earlier attempts", before_s, budget)
    # The async loop measures its budget from its own start: it gets what earlier attempts left.
    g_async = g if budget is None else g.model_copy(update={"schedule": g.schedule.model_copy(
        update={"time_budget_s": max(1e-6, budget - before_s)})})  # fmt: skip
    asynchronous = None
    if g.mode == "async":
        start = phase.start
        asynchronous = AsyncGRPO(ctx, g_async, order, resume or phase.handoff,
                                 earlier_journals=start.journals if start else (),
                                 start_position=start.data_position if start else 0, eligible=phase.eligible)  # fmt: skip
    run = _GRPORun(
        cfg, ctx, trainer, durable, order, sandbox_pool(cfg.agent.sandbox, git_baseline=True),
        load_failure_counts(resume or phase.handoff), asynchronous,
        checkpoint_evaluator(ctx, g, cfg.eval_agent or cfg.agent, cfg.eval_engine or cfg.engine)
        if asynchronous is not None else None,
        started=started, elapsed_before_s=before_s, phase=phase,
        progress=SyncProgress(skipped_batches=int(skipped)),
    )  # fmt: skip
    run_async(_sample_and_train(run, tokenizer, sampling, serve_dir, started))
    if (
        run.history or resume is None
    ):  # the final state, whatever the checkpoint interval (the next phase's start)
        run.save()
    if asynchronous is not None:
        asynchronous.log_histograms()
    _check_trained(run)
    model_dir = trainer.save_model(ctx.workdir / "model")
    put_dir(ctx, "model", model_dir)
    ctx.log_model(model_dir)  # MLflow: the stage run's output model, registered
    return _result(run, resume, started)


def _check_trained(run: _GRPORun) -> None:
    """Say loudly when the time budget ended the stage early; refuse to publish the SFT weights as GRPO's result
    when no step was trained although some were asked for."""
    g, ctx, step = run.cfg.grpo, run.ctx, run.trainer.step
    steps, first = g.schedule.steps, run.phase.first_step
    if steps == first:
        ctx.log.warning("grpo: %s is 0: the model is the %s model, unchanged", "grpo.schedule.steps"
                        if first == 0 and run.phase.start is None else "this phase's steps",
                        run.phase.start.stage if run.phase.start else "SFT")  # fmt: skip
        return
    if step >= steps:
        return
    run.progress.ended_by_budget = True  # the loops return early only when the budget is spent
    ctx.run.set_tags({"swerl.grpo.ended_by_budget": f"step {step} of {steps}"})
    ctx.log.warning("grpo: the time budget of %s s ended the stage at step %d of %d (%.0f s spent): raise "
                    "grpo.schedule.time_budget_s or lower grpo.schedule.steps", g.schedule.time_budget_s, step,
                    steps, run.elapsed_s)  # fmt: skip
    if step == first:
        raise RuntimeError(
            f"grpo: trained 0 of {steps - first} steps before the time budget of {g.schedule.time_budget_s} s ran out "
            f"({run.elapsed_s:.0f} s spent, {run.elapsed_before_s:.0f} s of them by earlier attempts); the SFT "
            "weights are not published as GRPO's result (set grpo.schedule.steps: 0 to pass them on on purpose)"
        )


async def _sample_and_train(
    run: _GRPORun,
    tokenizer: PreTrainedTokenizerBase,
    sampling: SamplingParams,
    serve_dir: Path,
    started: float,
) -> None:
    """The engine and the sandboxes around the loop of the configured mode."""
    cfg, ctx, g, trainer, provider = run.cfg, run.ctx, run.cfg.grpo, run.trainer, run.provider
    limits = episode_limits(cfg.agent)
    pool_cfg = cfg.agent.sandbox.pool
    planner = EnvironmentPlanner(ProviderEnvironments(provider), pulls_per_minute=pool_cfg.pulls_per_minute,
                                 burst=pool_cfg.pull_burst)  # fmt: skip
    ctx.log.info("grpo: the engine starts from %s at weight version %d", serve_dir, trainer.step)
    async with provider, planner, open_engine(
        cfg.engine, serve_dir, seed=ctx.seed, weight_version=trainer.step,
        concurrency=g.rollout.max_in_flight if run.asynchronous else g.rollout.concurrency,
        log_dir=ctx.workdir / "engines",
    ) as engine:  # fmt: skip

        async def episode(engine: Engine, task: TaskInstance, *, attempt: int, group_id: str) -> Trajectory:
            async def once(retry: int) -> Trajectory:
                return await run_episode(task, engine, provider, tokenizer, limits, sampling, attempt=attempt,
                                         group_id=group_id, rid=f"{group_id}/{attempt}/{retry}")  # fmt: skip

            return await episode_with_retries(once, cfg.agent.infra_retries, run.counts)

        async def prewarm(task: TaskInstance) -> Callable[[], None]:
            """A group's environment (docker: its image) prepared once at the configured pull rate; returns
            the start of its n sandboxes, made if the group has not opened yet (grpo.rollout.prewarm_groups)."""
            env_dir = await planner.environment(task)
            # a probing group starts with its probe's attempts only (prewarm is refused with replays)
            first = g.rollout.probe_attempts or g.rollout.attempts_per_task
            return lambda: provider.warm_ahead(env_dir, setup_patch(task), first)

        weights = distributed_weights(cfg.engine, g)
        if run.asynchronous is None:
            budget = g.schedule.time_budget_s
            deadline = None if budget is None else started + budget - run.elapsed_before_s
            settings = SyncSettings(steps=g.schedule.steps, tasks_per_step=g.schedule.tasks_per_step,
                                    attempts_per_task=g.rollout.attempts_per_task, concurrency=g.rollout.concurrency,
                                    checkpoint_every=g.schedule.checkpoint_every, deadline=deadline,
                                    max_empty_steps=g.schedule.max_empty_steps)  # fmt: skip
            await train_sync(trainer, engine, run.order, episode, settings, export_dir=ctx.workdir / "exports",
                             on_step=run.on_sync_step, save=run.save, progress=run.progress,
                             weights=weights)  # fmt: skip
            return
        trained = False
        if run.evaluator is not None and g.eval.at_start and trainer.step == 0:
            # a private copy of the start weights, evaluated beside step 1
            run.evaluator.after_export(serve_dir, 0)
        try:
            await run.asynchronous.run(trainer, engine, episode, run.counts, run.history, run.save,
                                       lambda groups: episode_stats(groups) | provider.step_metrics(),
                                       on_export=run.evaluator.after_export if run.evaluator else None,
                                       prewarm=prewarm, weights=weights)  # fmt: skip
            trained = True
        finally:  # a crash cancels a running evaluation; a finished stage follows grpo.eval.at_end
            if run.evaluator is not None:
                await run.evaluator.close(cancel=not trained or g.eval.at_end == "cancel")


def _result(run: _GRPORun, resume: Path | None, started: float) -> StageResult:
    """The stage's report (grpo_report.json), metrics and markdown."""
    g, trainer, history, counts = run.cfg.grpo, run.trainer, run.history, run.counts
    rewards = [h["reward_mean"] for h in history]
    report: dict[str, Any] = {
        "steps": trainer.step,
        "steps_this_attempt": len(history),
        "resumed": resume.name if resume else None,
        "trainer": trainer_processes(trainer, g.distributed),
        "reward_by_step": rewards,
        "failures": counts,
        "history": history,
        "wall_s": time.monotonic() - started,
        "mode": g.mode,
        "max_steps": g.schedule.steps,
        "budget": {
            "time_budget_s": g.schedule.time_budget_s,
            "elapsed_s": run.elapsed_s,
            "elapsed_before_s": run.elapsed_before_s,
            "ended_by_budget": run.progress.ended_by_budget,
            "ended_at_step": trainer.step if run.progress.ended_by_budget else None,
        },
        "skipped_batches": run.progress.skipped_batches,
        "skipped_reasons": run.progress.skipped_reasons,
        "sft_passed_on": g.schedule.steps == 0,
        "phase": None if run.cfg.phase is None else {
            "name": run.cfg.phase.name, "index": run.cfg.phase.index, "previous": run.cfg.phase.previous,
            "first_step": run.phase.first_step, "steps": g.schedule.steps - run.phase.first_step,
            "started_from": run.phase.start.checkpoint if run.phase.start else None,
            "reset_optimizer": run.cfg.phase.reset_optimizer,
            "tasks": run.cfg.phase.tasks.model_dump() if run.cfg.phase.tasks else None},
    }  # fmt: skip
    if run.asynchronous is not None:
        ledger = run.asynchronous.ledger
        report |= {"data_position": run.asynchronous.next_seq, "ledger": ledger.entries,
                   "scored_attempts": {str(step): pairs for step, pairs in sorted(ledger.scored.items())},
                   "resume": run.asynchronous.resumed}  # fmt: skip
    if run.asynchronous is not None:
        report["skipped_positions"] = run.asynchronous.skipped_positions
    if run.evaluator is not None:
        report["evaluations"] = run.evaluator.report()
    curve = learning_curve(run, history)
    if curve["evaluations"]:
        phases = curve["phases"]
        title = f"GRPO: held-out pass@1 every {g.eval.every} steps" + (
            f" (phases {', '.join(name for _, name in phases)})" if len(phases) > 1 else "")  # fmt: skip
        png = plot_learning_curve(curve["evaluations"], curve["history"], run.ctx.workdir / "learning_curve.png",
                                  title, boundaries=[(int(step), str(name)) for step, name in phases[1:]])  # fmt: skip
        run.ctx.put_artifact("learning_curve.png", png)
        run.ctx.run.log_file(png)
    run.ctx.write_artifact("grpo_report.json", json.dumps(report, indent=2, sort_keys=True).encode())
    run.ctx.write_artifact(HANDOFF_FILE, json.dumps(handoff(run, curve), indent=2, sort_keys=True).encode())
    metrics = {"steps": float(trainer.step), "wall_s": report["wall_s"], "max_steps": float(g.schedule.steps),
               "ended_by_budget": float(run.progress.ended_by_budget),
               "skipped_batches": float(run.progress.skipped_batches)}  # fmt: skip
    if rewards:
        third = max(1, len(rewards) // 3)
        metrics |= {"reward_first_third": sum(rewards[:third]) / third,
                    "reward_last_third": sum(rewards[-third:]) / third}  # fmt: skip
    lines = ["# GRPO", "", f"- {trainer.step} steps of {g.schedule.tasks_per_step} tasks x {g.rollout.attempts_per_task} attempts",
             f"- reward by step: {', '.join(f'{r:.2f}' for r in rewards) or 'none'}",
             f"- infrastructure failures: {counts or 'none'}"]  # fmt: skip
    if run.progress.ended_by_budget:
        lines.append(f"- **ended by the time budget** at step {trainer.step} of {g.schedule.steps}")
    if run.evaluator is not None:
        lines.append(f"- evaluations beside training: {run.evaluator.summary_line()}")
    shares = step_time_shares(history)
    if shares:
        lines.append("- step time: " + ", ".join(f"{label} {share:.0%}" for label, share in shares.items()))
    return StageResult(metrics=metrics, markdown={"grpo": "\n".join(lines) + "\n"}, images=grpo_images(run),
                       summary=f"{trainer.step} steps, reward {rewards[0] if rewards else 0:.2f} -> "
                       f"{rewards[-1] if rewards else 0:.2f}")  # fmt: skip


def grpo_images(run: _GRPORun) -> dict[str, bytes]:
    """The stage's plots: reward and staleness by step, the step-time breakdown, the long tail of trajectory
    durations (asynchronous mode, which records them), the learning curve when evaluated beside training."""
    plots = {
        "reward_and_staleness": grpo_curves(run.history),
        "step_time_breakdown": step_time_breakdown(run.history),
    }
    if run.asynchronous is not None:
        plots["trajectory_durations"] = duration_histogram(run.asynchronous.durations, run.asynchronous.turns)
    curve = run.ctx.workdir / "learning_curve.png"
    if curve.is_file():
        plots["learning_curve"] = curve.read_bytes()
    return {name: png for name, png in plots.items() if png is not None}


CURVE_KEYS = ("step", "reward_mean", "signal/groups_per_100_episodes")
"""The per-step history a learning curve keeps (handed on from phase to phase)."""


def learning_curve(run: _GRPORun, history: list[dict[str, float]]) -> dict[str, Any]:
    """The learning curve up to this stage: the earlier phases' (from the previous phase's handoff) and this one's
    evaluations beside training and per-step history, with where each phase started (its first step)."""
    before = run.phase.start.curve if run.phase.start is not None else {}
    this = run.cfg.phase.name if run.cfg.phase is not None else "grpo"
    entries = run.evaluator.entries if run.evaluator is not None else []
    return {
        "evaluations": [*before.get("evaluations", []), *entries],
        "history": [*before.get("history", []), *({k: h[k] for k in CURVE_KEYS if k in h} for h in history)],
        "phases": [*before.get("phases", []), [run.phase.first_step, this]],
    }


def handoff(run: _GRPORun, curve: dict[str, Any]) -> dict[str, Any]:
    """What the next phase starts from (HANDOFF_FILE): the newest checkpoint in the store (the final state, saved
    at the end of the stage), its step and data position, and every rollout journal so far."""
    names = run.durable.complete()
    if not names:
        raise RuntimeError(
            f"grpo: no complete checkpoint under {run.durable.prefix} to hand to the next phase"
        )
    journals = list(run.phase.start.journals) if run.phase.start is not None else []
    if run.asynchronous is not None:
        journals.append(run.asynchronous.journal.prefix)
        position = run.asynchronous.next_seq
    else:
        position = (run.trainer.step + run.progress.skipped_batches) * run.cfg.grpo.schedule.tasks_per_step
    return {"stage": run.ctx.stage, "checkpoints": run.durable.prefix, "checkpoint": names[-1],
            "step": run.trainer.step, "data_position": position, "journals": journals, "curve": curve}  # fmt: skip


def save(
    trainer: Trainer,
    durable: DurableCheckpoints,
    g: GRPOConfig,
    num_tasks: int,
    counts: dict[str, int],
    asynchronous: AsyncGRPO | None = None,
    *,
    skipped_batches: int = 0,
    elapsed_s: float = 0.0,
) -> Path:
    # Async: the data position is the manager's (groups opened); the ledger of consumed groups joins the checkpoint.
    # Sync: steps and skipped batches (nothing trainable) both took B tasks.
    position = (
        asynchronous.next_seq
        if asynchronous
        else (trainer.step + skipped_batches) * g.schedule.tasks_per_step
    )
    stream = StreamPosition(
        epoch=position // num_tasks, example_index=position % num_tasks, num_examples=num_tasks
    )
    path = trainer.save(durable.local_root, stream, keep_last=durable.keep)
    save_failure_counts(path, counts)
    (path / SCHEDULE_FILE).write_text(
        json.dumps({"elapsed_s": elapsed_s, "skipped_batches": skipped_batches})
    )
    if asynchronous is not None:
        asynchronous.write_state(path)
    durable.sync()
    return path


def save_failure_counts(checkpoint_dir: Path, counts: dict[str, int]) -> Path:
    """The infrastructure-failure counts so far join the checkpoint (before it is uploaded)."""
    path = checkpoint_dir / FAILURES_FILE
    path.write_text(json.dumps(dict(sorted(counts.items()))))
    return path


def load_schedule_state(checkpoint_dir: Path | None) -> dict[str, Any]:
    """The elapsed time and skipped batches saved in a restored checkpoint; empty without one."""
    if checkpoint_dir is None or not (checkpoint_dir / SCHEDULE_FILE).is_file():
        return {}
    return dict(json.loads((checkpoint_dir / SCHEDULE_FILE).read_text()))


def load_failure_counts(checkpoint_dir: Path | None) -> dict[str, int]:
    """The counts saved in a restored checkpoint; empty without one (or for a checkpoint written before them)."""
    if checkpoint_dir is None or not (checkpoint_dir / FAILURES_FILE).is_file():
        return {}
    return {str(k): int(v) for k, v in json.loads((checkpoint_dir / FAILURES_FILE).read_text()).items()}


def episode_stats(groups: list[list[Trajectory]]) -> dict[str, float]:
    """Per-step episode shape: malformed calls, trajectory tokens, wall time per episode."""
    flat = [t for group in groups for t in group]
    if not flat:
        return {}
    statuses = Counter(t.status.value for t in flat)
    return {
        "malformed_calls_mean": sum(t.malformed_tool_calls for t in flat) / len(flat),
        "trajectory_tokens_mean": sum(len(t.token_ids) for t in flat) / len(flat),
        "episode_seconds_mean": sum(t.timings.total_s for t in flat) / len(flat),
        # per-phase wall clock and sandbox-seconds per trajectory (cost: provider.step_metrics)
        **{
            f"phase_{name}_mean": sum(getattr(t.timings, name) for t in flat) / len(flat)
            for name in ("env_install_s", "sandbox_start_s", "tools_s", "tests_s", "sandbox_s")
        },
        "submitted_rate": (statuses["resolved"] + statuses["unresolved"]) / len(flat),
        # what the grader refused (swerl/grading/grader.py): a policy learning to game it shows here first
        "grader_tampered": float(sum(bool(t.tampered) for t in flat)),
        "grader_incomplete": float(sum(t.grade_status == "INCOMPLETE" for t in flat)),
        "grader_timeout": float(sum(t.grade_status == "TIMEOUT" for t in flat)),
        "grader_test_edits_dropped": float(sum(bool(t.dropped_paths) for t in flat)),
    }
