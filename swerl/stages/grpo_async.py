"""The asynchronous mode of the GRPO stage: the stage builds the engine, trainer and episode function and hands
them here; this wires the rollout manager, the journal under the stage key, the ledger in every checkpoint, and
the per-step metrics (MLflow) and log line."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from swerl.config.grpo import GRPOConfig, GRPORolloutConfig
from swerl.data.schema import TaskInstance
from swerl.engine.base import Engine
from swerl.rollout.async_loop import AsyncSettings, Batch, train_async
from swerl.rollout.curriculum import Curriculum, CurriculumSettings, GroupPlan
from swerl.rollout.groups import EpisodeFn
from swerl.rollout.journal import Ledger, RolloutJournal
from swerl.rollout.longtail import write_histograms
from swerl.rollout.manager import RolloutManager
from swerl.rollout.staleness import StalenessPolicy
from swerl.rollout.step import DistributedWeights
from swerl.stages.runner import StageContext
from swerl.train.grpo_step import Trainer
from swerl.trajectory import Trajectory


def settings_from_config(g: GRPOConfig) -> AsyncSettings:
    return AsyncSettings(
        steps=g.schedule.steps, tasks_per_step=g.schedule.tasks_per_step, max_staleness=g.rollout.max_staleness,
        staleness_policy=StalenessPolicy(g.rollout.staleness_policy), max_requeues=g.rollout.max_requeues,
        dynamic_sampling=g.rollout.dynamic_sampling, max_extra_groups_per_step=g.rollout.max_extra_groups_per_step,
        checkpoint_every=g.schedule.checkpoint_every, time_budget_s=g.schedule.time_budget_s,
        max_empty_steps=g.schedule.max_empty_steps,
    )  # fmt: skip


def task_stratum(task: TaskInstance, attribute: str) -> str:
    """A task's stratum label for the curriculum's strata rule ("none" where the task has no such label)."""
    value = getattr(task, attribute) if attribute != "repo" else task.repo_key
    return str(value) if value else "none"


def curriculum_for(
    r: GRPORolloutConfig,
    order: Sequence[TaskInstance],
    seed: int,
    eligible: Callable[[int], bool] | None = None,
) -> Curriculum | None:
    """The curriculum grpo.rollout asks for over the seeded task order (None: no probe, replay or strata)."""
    settings = CurriculumSettings(
        r.attempts_per_task, r.probe_attempts, r.replay_share, r.max_visits,
        stratum_floor=r.stratum_floor if r.stratify_by else 1.0, stratum_prior=r.stratum_prior, seed=seed,
    )  # fmt: skip
    if not (settings.probe_attempts or settings.adaptive):
        return None
    strata = [task_stratum(task, r.stratify_by) for task in order] if r.stratify_by else None
    return Curriculum(len(order), settings, eligible, strata)


class AsyncGRPO:
    """Asynchronous GRPO inside the stage: resume state, the loop, what a checkpoint adds (the ledger).

    The journal lives under the stage key (`stages/grpo/KEY/rollouts/`; a forced run's in its force epoch's
    `stages/grpo/KEY/forced/EPOCH/rollouts/`), next to the durable checkpoints, so a rerun of a crashed stage finds
    both.
    """

    def __init__(
        self,
        ctx: StageContext,
        g: GRPOConfig,
        order: Sequence[TaskInstance],
        resume: Path | None,
        *,
        earlier_journals: Sequence[str] = (),
        start_position: int = 0,
        eligible: Callable[[int], bool] | None = None,
    ):
        """resume: the checkpoint the trainer restored (its ledger); earlier_journals, start_position: a later GRPO
        phase's view of the phases before it (their journals, read-only, and the data position where it starts);
        eligible(index): the phase's task filter over the data stream (None: every task)."""
        self.ctx, self.g, self.order = ctx, g, list(order)
        self.ledger = Ledger.load(resume)
        self.journal = RolloutJournal(ctx.store, ctx.durable("rollouts"), earlier_journals)
        self.start_position = start_position
        self.eligible = eligible
        self.next_seq = 0
        self.skipped_positions = 0  # data positions this attempt skipped for the phase's task filter
        self.durations: list[float] = []
        self.turns: list[int] = []
        self.resumed: dict[str, int] = {}

    def task_at(self, seq: int) -> TaskInstance:
        return self.order[seq % len(self.order)]

    def curriculum(self) -> tuple[Curriculum | None, list[GroupPlan]]:
        """The probe/replay/strata curriculum (None when all are off), rebuilt from the journal's plans and outcomes."""
        curriculum = curriculum_for(self.g.rollout, self.order, self.ctx.seed, self.eligible)
        if not (curriculum or self.journal.earlier):
            return None, []
        # Plans count without a curriculum too: a group an earlier phase planned runs the task its plan names.
        plans, finishes = self.journal.load_curriculum()
        if curriculum is None:
            return None, plans
        planned = {plan.seq for plan in plans}
        # Groups an earlier phase opened without a curriculum ran order[seq]: as fresh picks, so the fresh
        # position continues where the data stream stands.
        plans += [GroupPlan(seq, seq, "fresh", 0) for seq in range(self.start_position) if seq not in planned]
        curriculum.restore(plans, finishes)
        return curriculum, plans

    def write_state(self, checkpoint_dir: Path) -> None:
        """Called after trainer.save, before the checkpoint is uploaded: the ledger joins the checkpoint (the
        stage's save adds the infrastructure-failure counts, in both modes)."""
        self.ledger.save(checkpoint_dir)

    async def run(
        self,
        trainer: Trainer,
        engine: Engine,
        episode: EpisodeFn[TaskInstance],
        infra_counts: dict[str, int],
        history: list[dict[str, float]],
        save: Callable[[], Any],
        step_metrics: Callable[[list[list[Trajectory]]], dict[str, float]] | None = None,
        on_export: Callable[[Path, int], None] | None = None,
        prewarm: Callable[[TaskInstance], Awaitable[Callable[[], None]]] | None = None,
        weights: DistributedWeights | None = None,
    ) -> None:
        """Run the async loop; step_metrics(trained groups) adds the stage's own per-step metrics; on_export(path,
        step) sees each exported checkpoint (the stage's evaluation beside training); prewarm(task) starts the
        sandboxes of a group grpo.rollout.prewarm_groups ahead of its opening."""
        g, ctx = self.g, self.ctx
        curriculum, plans = self.curriculum()
        manager = RolloutManager(engine, episode, self.task_at, n_attempts=g.rollout.attempts_per_task,
                                 max_in_flight=g.rollout.max_in_flight, max_buffered_groups=g.buffered_groups,
                                 journal=self.journal, prewarm=prewarm,
                                 prewarm_groups=g.rollout.prewarm_groups, curriculum=curriculum,
                                 eligible=self.eligible)  # fmt: skip
        self.resumed = manager.restore(self.journal.load(self.ledger.consumed), self.ledger, plans,
                                       self.start_position)  # fmt: skip
        ctx.log.info("grpo async: data position %d, resume %s", manager.next_seq, self.resumed)
        started = time.monotonic()

        def on_step(stats: dict[str, float], batch: Batch) -> None:
            self.next_seq = manager.next_seq
            for group in batch.taken:
                for attempt in group.attempts:
                    self.durations.append(attempt.duration_s)
                    self.turns.append(attempt.trajectory.num_turns)
            if step_metrics is not None:
                stats |= step_metrics(batch.groups)
            history.append(stats)
            ctx.log_metrics({f"train/{k}": v for k, v in stats.items()}, step=trainer.step)
            ctx.progress(trainer.step, g.schedule.steps, f"GRPO step {trainer.step} of {g.schedule.steps}")
            ctx.log.info(
                "grpo async step %d/%d: reward %.3f, %d groups trained, %d discarded, wait %.0f%%, %.0f s "
                "(%.0f s since start)", trainer.step, g.schedule.steps, stats["reward_mean"], len(batch.groups),
                sum(batch.discarded.values()), 100 * stats["share_wait_rollouts"], stats["time_total_s"],
                time.monotonic() - started,
            )  # fmt: skip

        def checkpoint(ledger: Ledger) -> None:
            self.next_seq = manager.next_seq
            save()

        await train_async(trainer, engine, manager, settings_from_config(g), self.ledger,
                          export_dir=ctx.workdir / "exports", on_step=on_step, save=checkpoint,
                          infra_counts=infra_counts, on_export=on_export, weights=weights)  # fmt: skip
        self.next_seq = manager.next_seq
        self.skipped_positions = manager.skipped_positions

    def log_histograms(self) -> None:
        """Trajectory durations and turns of the whole stage as MLflow artifacts."""
        if self.durations:
            for path in write_histograms(self.durations, self.turns, self.ctx.workdir / "histograms"):
                self.ctx.run.log_file(path, "rollouts")
