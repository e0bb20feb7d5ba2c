"""The asynchronous mode of the GRPO stage: the stage builds the engine, trainer and episode function and hands
them here; this wires the rollout manager, the journal under the stage key and the ledger in every checkpoint, and
keeps what the stage reports of the rollouts (their durations and turns, the resume counts)."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from pathlib import Path

from swerl.config.grpo import GRPOConfig, GRPORolloutConfig, GRPOScheduleConfig
from swerl.data.schema import TaskInstance
from swerl.engine.base import Engine
from swerl.rollout.async_loop import AsyncSettings, train_async
from swerl.rollout.curriculum import Curriculum, CurriculumSettings, GroupPlan
from swerl.rollout.groups import EpisodeFn
from swerl.rollout.journal import Ledger, RolloutJournal
from swerl.rollout.longtail import write_histograms
from swerl.rollout.manager import RolloutManager
from swerl.rollout.staleness import StalenessPolicy
from swerl.rollout.step import DistributedWeights, OutageRule, StepOutcome
from swerl.stages.runner import StageContext
from swerl.train.grpo_step import Trainer


def outage_rule(s: GRPOScheduleConfig) -> OutageRule:
    """How both loops wait out batches emptied by infrastructure errors (grpo.schedule.infra_*)."""
    return OutageRule(s.infra_outage_budget_s, s.infra_backoff_first_s, s.infra_backoff_max_s, s.infra_backoff_factor)


def settings_from_config(g: GRPOConfig) -> AsyncSettings:
    return AsyncSettings(
        steps=g.schedule.steps,
        tasks_per_step=g.schedule.tasks_per_step,
        max_staleness=g.rollout.max_staleness,
        staleness_policy=StalenessPolicy(g.rollout.staleness_policy),
        max_requeues=g.rollout.max_requeues,
        dynamic_sampling=g.rollout.dynamic_sampling,
        max_extra_groups_per_step=g.rollout.max_extra_groups_per_step,
        checkpoint_every=g.schedule.checkpoint_every,
        time_budget_s=g.schedule.time_budget_s,
        max_empty_steps=g.schedule.max_empty_steps,
        outage=outage_rule(g.schedule),
    )


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
        r.attempts_per_task,
        r.probe_attempts,
        r.replay_share,
        r.max_visits,
        stratum_floor=r.stratum_floor if r.stratify_by else 1.0,
        stratum_prior=r.stratum_prior,
        seed=seed,
    )
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
        self.manager: RolloutManager[TaskInstance] | None = None
        self.started = 0.0  # time.monotonic() when the loop started
        self.durations: list[float] = []
        self.turns: list[int] = []
        self.resumed: dict[str, int] = {}

    @property
    def next_seq(self) -> int:
        """The data position: groups opened so far (0 before the loop starts)."""
        return self.manager.next_seq if self.manager is not None else 0

    @property
    def skipped_positions(self) -> int:
        """Data positions this attempt skipped for the phase's task filter."""
        return self.manager.skipped_positions if self.manager is not None else 0

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

    def steps(
        self,
        trainer: Trainer,
        engine: Engine,
        episode: EpisodeFn[TaskInstance],
        infra_counts: dict[str, int],
        export_dir: Path,
        prewarm: Callable[[TaskInstance], Awaitable[Callable[[], None]]] | None = None,
        weights: DistributedWeights | None = None,
    ) -> AsyncGenerator[StepOutcome]:
        """The rollout manager restored from the journal and the ledger, and the async loop over it (each step's
        outcome); prewarm(task) starts the sandboxes of a group grpo.rollout.prewarm_groups ahead of its opening."""
        g, ctx = self.g, self.ctx
        curriculum, plans = self.curriculum()
        manager = RolloutManager(
            engine,
            episode,
            self.task_at,
            n_attempts=g.rollout.attempts_per_task,
            max_in_flight=g.rollout.max_in_flight,
            max_buffered_groups=g.buffered_groups,
            journal=self.journal,
            prewarm=prewarm,
            prewarm_groups=g.rollout.prewarm_groups,
            curriculum=curriculum,
            eligible=self.eligible,
        )
        self.resumed = manager.restore(self.journal.load(self.ledger.consumed), self.ledger, plans, self.start_position)
        self.manager = manager
        ctx.log.info("grpo async: data position %d, resume %s", manager.next_seq, self.resumed)
        self.started = time.monotonic()
        return train_async(
            trainer,
            engine,
            manager,
            settings_from_config(g),
            self.ledger,
            export_dir=export_dir,
            infra_counts=infra_counts,
            weights=weights,
        )

    def record(self, outcome: StepOutcome) -> None:
        """A step's rollouts for the stage's histograms: the duration and turns of every attempt it took."""
        for group in outcome.taken:
            for attempt in group.attempts:
                self.durations.append(attempt.duration_s)
                self.turns.append(attempt.trajectory.num_turns)

    def log_histograms(self) -> None:
        """Trajectory durations and turns of the whole stage as MLflow artifacts."""
        if self.durations:
            for path in write_histograms(self.durations, self.turns, self.ctx.workdir / "histograms"):
                self.ctx.run.log_file(path, "rollouts")
