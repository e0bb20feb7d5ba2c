"""The GRPO stage: the trainer, the engine, the sandboxes and the loop of grpo.mode, with the stage's side of every
step in one `for` body (_sample_and_train): the step's metrics and log line (grpo_report.record_step), the
evaluation of its export beside training (grpo.eval, async: swerl.stages.grpo_eval), its checkpoint when due.

Synchronous mode (grpo.mode: sync, the baseline, swerl.rollout.sync_loop): each step samples B training tasks x n
attempts with the current policy, runs the episodes concurrently in sandboxes, and takes one GRPO update; the new
weights go to the engine with a version number before the next step. Asynchronous mode (grpo.mode: async,
swerl.rollout.async_loop through swerl.stages.grpo_async.AsyncGRPO) keeps rollouts running while the trainer steps
on finished groups.

The failure rule: an attempt that ends in an infrastructure error is rerun (agent.infra_retries); if it still
fails it is left out of its group's baseline and of the loss, never scored 0. Checkpoints (model, optimizer,
RNG, step, task-stream position, the infrastructure-failure counts) are mirrored to the store under the stage
key; a crashed stage resumes there, its `failures/*` counts continuing from the checkpoint's
(swerl.stages.grpo_state). The report and the handoff to the next phase: swerl.stages.grpo_report.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swerl.agent.episode import run_episode
from swerl.config import PipelineConfig
from swerl.config.engine import EngineConfig
from swerl.config.grpo import GRPOAlgorithmConfig, GRPOConfig
from swerl.config.phases import ResolvedPhase
from swerl.data.environments import setup_patch
from swerl.data.schema import TaskInstance
from swerl.engine.base import Engine, SamplingParams, logprob_temperature
from swerl.engine.factory import open_engine
from swerl.model.loading import context_length, load_model_and_tokenizer, load_tokenizer
from swerl.rollout.environments import EnvironmentPlanner, ProviderEnvironments
from swerl.rollout.groups import EpisodeFn
from swerl.rollout.step import DistributedWeights, StepOutcome
from swerl.rollout.sync_loop import SyncSettings, train_sync
from swerl.stages.common import (
    DurableCheckpoints,
    episode_limits,
    episode_with_retries,
    get_dir,
    input_manifest,
    load_tasks,
    put_dir,
    run_async,
    seeded_sample,
)
from swerl.stages.grpo_async import outage_rule
from swerl.stages.grpo_report import record_step, stage_result
from swerl.stages.grpo_state import GRPOPhaseRef, GRPORun, GRPOStage, PhaseContext, PhaseStart, open_run
from swerl.stages.runner import StageContext, StageResult
from swerl.train.distributed import RankContext, device_of, init_rank, load_sharded_model
from swerl.train.grpo_step import Trainer, UpdateSettings
from swerl.train.grpo_trainer import GRPOTrainer
from swerl.train.ranks import DistributedTrainer
from swerl.train.trainer_process import TrainerProcess
from swerl.trajectory import Trajectory


def phase_stage(cfg: PipelineConfig, index: int, phases: Sequence[ResolvedPhase] | None = None) -> GRPOStage:
    """Phase `index` of the pipeline's GRPO phases as its stage config; `phases`: cfg's phases where the run has
    resolved them already (the pipeline session's), else they are resolved here."""
    phases = phases if phases is not None else cfg.grpo_phases()
    p = phases[index]
    ref = None
    if cfg.grpo.phases is not None:
        ref = GRPOPhaseRef(
            name=p.name,
            index=p.index,
            previous=phases[index - 1].stage if index else None,
            reset_optimizer=p.reset_optimizer,
            tasks=p.tasks,
        )
    return GRPOStage(
        grpo=p.grpo,
        agent=p.agent,
        engine=p.engine,
        phase=ref,
        eval_agent=cfg.agent if p.agent != cfg.agent else None,
        eval_engine=cfg.engine if p.engine != cfg.engine else None,
    )


def task_filter(cfg: GRPOStage, order: list[TaskInstance]) -> Callable[[int], bool] | None:
    """The phase's task filter over the data stream's indices; ValueError naming the phase when it matches none."""
    f = cfg.phase.tasks if cfg.phase is not None else None
    if f is None:
        return None
    allowed = [f.matches(t.difficulty, t.repo, t.modifier) for t in order]
    if not any(allowed):
        present = {
            "difficulties": sorted({str(t.difficulty) for t in order}),
            "repos": sorted({t.repo for t in order}),
            "modifiers": sorted({str(t.modifier) for t in order}),
        }
        raise ValueError(
            f"grpo.phases[{cfg.phase.index}] ({cfg.phase.name}): tasks {f.model_dump()} match none of the "  # type: ignore[union-attr]
            f"{len(order)} training tasks; they have {present}"
        )
    return lambda index: allowed[index % len(allowed)]


def check_config(cfg: GRPOStage, context: int) -> None:
    caps = {
        "agent.max_trajectory_tokens": cfg.agent.max_trajectory_tokens,
        "engine.max_context_tokens": cfg.engine.max_context_tokens,
    }
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
    backend = w.process_group if w.process_group != "auto" else ("nccl" if g.distributed.device == "cuda" else "gloo")
    return DistributedWeights(
        master_addr=w.master_addr,
        master_port=w.master_port,
        backend=backend,
        group_name=w.group_name,
        bucket_bytes=w.bucket_mb << 20,
        dtype=engine.local.dtype,
        timeout_s=w.timeout_s,
        socket_ifname=w.socket_ifname,
    )


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
    sampling = SamplingParams(
        max_new_tokens=cfg.agent.max_new_tokens_per_turn, temperature=g.rollout.temperature, top_p=g.rollout.top_p
    )
    trainer = _start_trainer(g, start_dir, logprob_temperature(sampling), ctx)
    try:
        return _run_grpo(
            cfg,
            ctx,
            trainer,
            tokenizer,
            sampling,
            start_dir,
            durable,
            resume,
            order,
            started,
            PhaseContext(start, handoff, eligible),
        )
    finally:
        if isinstance(trainer, TrainerProcess | DistributedTrainer):
            trainer.close()


def _start_trainer(g: GRPOConfig, start_dir: Path, temperature: float, ctx: StageContext) -> Trainer:
    """The GRPO trainer (grpo.distributed.backend, grpo.trainer_process): N rank processes or one child started
    without waiting for them to load, or the trainer in this process."""
    if g.distributed.backend != "torch":
        # N ranks, each loading and sharding while this process opens the engine and the sandboxes.
        ranks = DistributedTrainer(
            build_rank_trainer, start_dir, g, temperature, ctx.seed, config=g.distributed, wait=False
        )
        ctx.log.info(
            "grpo: %s trainer, %d ranks on %s (pids %s)",
            g.distributed.backend,
            g.distributed.ranks,
            g.distributed.device,
            ranks.pids,
        )
        return ranks
    if g.trainer_process:
        # The child imports and loads while this process opens the engine and the sandboxes.
        child = TrainerProcess(build_trainer, start_dir, g, temperature, ctx.seed, wait=False)
        ctx.log.info("grpo: trainer in process %s (%d threads)", child.pid, g.threads)
        return child
    return build_trainer(start_dir, g, temperature, ctx.seed)


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
    return GRPOTrainer(
        model,
        update_settings(g.algorithm),
        ref_model=reference,
        logprob_temperature=temperature,
        seed=seed,
        tokenizer=tokenizer,
        bf16=bf16,
        ranks=ranks,
    )


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
    g = cfg.grpo.model_copy(
        update={"schedule": cfg.grpo.schedule.model_copy(update={"steps": phase.first_step + cfg.grpo.schedule.steps})}
    )
    cfg = cfg.model_copy(update={"grpo": g})
    serve_dir = _load_start(cfg, ctx, trainer, start_dir, resume, phase)
    run = open_run(cfg, ctx, trainer, durable, order, resume, phase, started)
    run_async(_sample_and_train(run, tokenizer, sampling, serve_dir))
    if run.history or resume is None:  # the final state, whatever the checkpoint interval (the next phase's start)
        run.save()
    if run.asynchronous is not None:
        run.asynchronous.log_histograms()
    _check_trained(run)
    model_dir = trainer.save_model(ctx.workdir / "model")
    put_dir(ctx, "model", model_dir)
    ctx.log_model(model_dir)  # MLflow: the stage run's output model, registered
    return stage_result(run, resume)


def _load_start(
    cfg: GRPOStage,
    ctx: StageContext,
    trainer: Trainer,
    start_dir: Path,
    resume: Path | None,
    phase: PhaseContext,
) -> Path:
    """The trainer's starting state: the stage's own checkpoint (a resumed attempt), the previous phase's (a later
    phase's first attempt) or the SFT model's; returns the weights the engine starts from."""
    if resume is not None:
        trainer.load(resume)
        ctx.log.info("grpo: resumed at step %d from %s", trainer.step, resume.name)
        return resume
    if phase.handoff is not None and phase.start is not None and cfg.phase is not None:
        reset = cfg.phase.reset_optimizer
        trainer.load(phase.handoff, optimizer=not reset)
        ctx.log.info(
            "grpo phase %s: starts at step %d, data position %d, from %s's checkpoint %s (%s)",
            cfg.phase.name,
            trainer.step,
            phase.start.data_position,
            phase.start.stage,
            phase.start.checkpoint,
            "fresh optimizer" if reset else "its optimizer state",
        )
        return phase.handoff
    return start_dir


def _check_trained(run: GRPORun) -> None:
    """Say loudly when the time budget ended the stage early; refuse to publish the SFT weights as GRPO's result
    when no step was trained although some were asked for."""
    g, ctx, step = run.cfg.grpo, run.ctx, run.trainer.step
    steps, first = g.schedule.steps, run.phase.first_step
    if steps == first:
        ctx.log.warning(
            "grpo: %s is 0: the model is the %s model, unchanged",
            "grpo.schedule.steps" if first == 0 and run.phase.start is None else "this phase's steps",
            run.phase.start.stage if run.phase.start else "SFT",
        )
        return
    if step >= steps:
        return
    run.ended_by_budget = True  # the loops return early only when the budget is spent
    ctx.run.set_tags({"swerl.grpo.ended_by_budget": f"step {step} of {steps}"})
    ctx.log.warning(
        "grpo: the time budget of %s s ended the stage at step %d of %d (%.0f s spent): raise "
        "grpo.schedule.time_budget_s or lower grpo.schedule.steps",
        g.schedule.time_budget_s,
        step,
        steps,
        run.elapsed_s,
    )
    if step == first:
        raise RuntimeError(
            f"grpo: trained 0 of {steps - first} steps before the time budget of {g.schedule.time_budget_s} s ran out "
            f"({run.elapsed_s:.0f} s spent, {run.elapsed_before_s:.0f} s of them by earlier attempts); the SFT "
            "weights are not published as GRPO's result (set grpo.schedule.steps: 0 to pass them on on purpose)"
        )


async def _sample_and_train(
    run: GRPORun, tokenizer: PreTrainedTokenizerBase, sampling: SamplingParams, serve_dir: Path
) -> None:
    """The engine and the sandboxes around the loop of the configured mode, and the stage's side of every step in
    one body for both modes: its metrics and log line, the evaluation of its export, its checkpoint when due."""
    cfg, ctx, g, trainer, provider = run.cfg, run.ctx, run.cfg.grpo, run.trainer, run.provider
    pool_cfg = cfg.agent.sandbox.pool
    planner = EnvironmentPlanner(
        ProviderEnvironments(provider), pulls_per_minute=pool_cfg.pulls_per_minute, burst=pool_cfg.pull_burst
    )
    ctx.log.info("grpo: the engine starts from %s at weight version %d", serve_dir, trainer.step)
    async with (
        provider,
        planner,
        open_engine(
            cfg.engine,
            serve_dir,
            seed=ctx.seed,
            weight_version=trainer.step,
            concurrency=g.rollout.max_in_flight if run.asynchronous else g.rollout.concurrency,
            log_dir=ctx.workdir / "engines",
        ) as engine,
    ):
        episode = _episode_fn(run, tokenizer, sampling)
        if run.evaluator is not None and g.eval.at_start and trainer.step == 0:
            # a private copy of the start weights, evaluated beside step 1
            run.evaluator.after_export(serve_dir, 0)
        trained = False
        try:
            async with contextlib.aclosing(_steps(run, engine, episode, planner)) as steps:
                async for outcome in steps:
                    if run.evaluator is not None and outcome.export is not None:
                        run.evaluator.after_export(outcome.export, outcome.step)
                    record_step(run, outcome)
                    if outcome.checkpoint_due:
                        run.save()
            trained = True
        finally:  # a crash cancels a running evaluation; a finished stage follows grpo.eval.at_end
            if run.evaluator is not None:
                await run.evaluator.close(cancel=not trained or g.eval.at_end == "cancel")


def _steps(
    run: GRPORun, engine: Engine, episode: EpisodeFn[TaskInstance], planner: EnvironmentPlanner
) -> AsyncGenerator[StepOutcome]:
    """The configured mode's loop over the engine: synchronous, or asynchronous with groups warmed ahead."""
    g, trainer, exports = run.cfg.grpo, run.trainer, run.ctx.workdir / "exports"
    weights = distributed_weights(run.cfg.engine, g)
    if run.asynchronous is not None:
        prewarm = _prewarm_fn(run, planner)
        return run.asynchronous.steps(trainer, engine, episode, run.counts, exports, prewarm, weights)
    budget = g.schedule.time_budget_s
    deadline = None if budget is None else run.started + budget - run.elapsed_before_s
    settings = SyncSettings(
        steps=g.schedule.steps,
        tasks_per_step=g.schedule.tasks_per_step,
        attempts_per_task=g.rollout.attempts_per_task,
        concurrency=g.rollout.concurrency,
        checkpoint_every=g.schedule.checkpoint_every,
        deadline=deadline,
        max_empty_steps=g.schedule.max_empty_steps,
        outage=outage_rule(g.schedule),
    )
    return train_sync(
        trainer,
        engine,
        run.order,
        episode,
        settings,
        export_dir=exports,
        progress=run.progress,
        infra_counts=run.counts,
        weights=weights,
    )


def _episode_fn(run: GRPORun, tokenizer: PreTrainedTokenizerBase, sampling: SamplingParams) -> EpisodeFn[TaskInstance]:
    """One attempt at a task in the stage's sandboxes, rerun on infrastructure errors (agent.infra_retries),
    its failures counted by cause into run.counts."""
    cfg, provider = run.cfg, run.provider
    limits = episode_limits(cfg.agent)

    async def episode(engine: Engine, task: TaskInstance, *, attempt: int, group_id: str) -> Trajectory:
        async def once(retry: int) -> Trajectory:
            return await run_episode(
                task,
                engine,
                provider,
                tokenizer,
                limits,
                sampling,
                attempt=attempt,
                group_id=group_id,
                rid=f"{group_id}/{attempt}/{retry}",
            )

        return await episode_with_retries(once, cfg.agent.infra_retries, run.counts)

    return episode


def _prewarm_fn(run: GRPORun, planner: EnvironmentPlanner) -> Callable[[TaskInstance], Awaitable[Callable[[], None]]]:
    """grpo.rollout.prewarm_groups: prepare a group's environment ahead of its opening."""
    g, provider = run.cfg.grpo, run.provider

    async def prewarm(task: TaskInstance) -> Callable[[], None]:
        """A group's environment (docker: its image) prepared once at the configured pull rate; returns
        the start of its n sandboxes, made if the group has not opened yet (grpo.rollout.prewarm_groups)."""
        env_dir = await planner.environment(task)
        # a probing group starts with its probe's attempts only (prewarm is refused with replays)
        first = g.rollout.probe_attempts or g.rollout.attempts_per_task
        return lambda: provider.warm_ahead(env_dir, setup_patch(task), first)

    return prewarm
