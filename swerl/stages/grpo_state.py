"""The GRPO stage's state: what a stage is (its checkpoint key: GRPOStage, its phase), what one attempt carries
(GRPORun: the trainer, the failure counts, the time spent, the batches skipped, the rollouts' resume state), what
a checkpoint adds to the trainer's own files (save), and the handover between phases (PhaseStart, handoff)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swerl.config.agent import AgentConfig
from swerl.config.base import StrictModel
from swerl.config.engine import EngineConfig
from swerl.config.grpo import GRPOConfig, GRPOPhaseTasks
from swerl.data.schema import TaskInstance
from swerl.rollout.sync_loop import SyncProgress
from swerl.sandbox.pool import SandboxPool
from swerl.stages.common import DurableCheckpoints, input_manifest, read_input, sandbox_pool
from swerl.stages.grpo_async import AsyncGRPO
from swerl.stages.grpo_eval import CheckpointEvaluator, checkpoint_evaluator
from swerl.stages.runner import StageContext
from swerl.train.checkpoint import CheckpointMirror, StreamPosition
from swerl.train.grpo_step import Trainer

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
            raise ValueError(
                f"grpo phase {ref.name}: the previous phase's manifest {manifest.uri} has no "
                f"{HANDOFF_FILE} (written by an older swerl): rerun it with --force {ref.previous}"
            )
        body = json.loads(read_input(ctx.store, manifest, HANDOFF_FILE))
        return cls(
            ref.previous,
            int(body["step"]),
            int(body["data_position"]),
            str(body["checkpoints"]),
            str(body["checkpoint"]),
            [str(j) for j in body["journals"]],
            dict(body["curve"]),
        )

    def restore(self, ctx: StageContext) -> Path:
        """Download the previous phase's final checkpoint (model, optimizer, RNG, ledger, counts)."""
        return CheckpointMirror(ctx.store, self.checkpoints, ctx.workdir / "phase_start").restore(self.checkpoint)


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
class GRPORun:
    """One attempt of the stage: what its steps, its checkpoints and its report share."""

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
    ended_by_budget: bool = False  # set when the stage ends before its last step

    @property
    def elapsed_s(self) -> float:
        return self.elapsed_before_s + time.monotonic() - self.started

    def save(self) -> Path:
        """A checkpoint of this attempt: the trainer's state with the stage's (save)."""
        return save(
            self.trainer,
            self.durable,
            self.cfg.grpo,
            len(self.order),
            self.counts,
            self.asynchronous,
            skipped_batches=self.progress.skipped_batches,
            elapsed_s=self.elapsed_s,
        )


def open_run(
    cfg: GRPOStage,
    ctx: StageContext,
    trainer: Trainer,
    durable: DurableCheckpoints,
    order: list[TaskInstance],
    resume: Path | None,
    phase: PhaseContext,
    started: float,
) -> GRPORun:
    """This attempt's state: what earlier attempts of the phase spent and skipped (from the resumed checkpoint),
    the failure counts so far, the sandbox pool, and in async mode the rollouts' resume state and the evaluator."""
    g = cfg.grpo
    state = load_schedule_state(resume)  # a phase's time budget is its own: elapsed time only from its own
    skipped = state.get("skipped_batches", load_schedule_state(phase.handoff).get("skipped_batches", 0))
    before_s = float(state.get("elapsed_s", 0.0))
    budget = g.schedule.time_budget_s
    if budget is not None and before_s > 0:
        ctx.log.info("grpo: %.0f s of the %.0f s time budget spent by earlier attempts", before_s, budget)
    # The async loop measures its budget from its own start: it gets what earlier attempts left.
    g_async = (
        g
        if budget is None
        else g.model_copy(
            update={"schedule": g.schedule.model_copy(update={"time_budget_s": max(1e-6, budget - before_s)})}
        )
    )
    asynchronous = None
    if g.mode == "async":
        start = phase.start
        asynchronous = AsyncGRPO(
            ctx,
            g_async,
            order,
            resume or phase.handoff,
            earlier_journals=start.journals if start else (),
            start_position=start.data_position if start else 0,
            eligible=phase.eligible,
        )
    return GRPORun(
        cfg,
        ctx,
        trainer,
        durable,
        order,
        sandbox_pool(cfg.agent.sandbox, git_baseline=True),
        load_failure_counts(resume or phase.handoff),
        asynchronous,
        checkpoint_evaluator(ctx, g, cfg.eval_agent or cfg.agent, cfg.eval_engine or cfg.engine)
        if asynchronous is not None
        else None,
        started=started,
        elapsed_before_s=before_s,
        phase=phase,
        progress=SyncProgress(skipped_batches=int(skipped)),
    )


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
    position = asynchronous.next_seq if asynchronous else (trainer.step + skipped_batches) * g.schedule.tasks_per_step
    stream = StreamPosition(epoch=position // num_tasks, example_index=position % num_tasks, num_examples=num_tasks)
    path = trainer.save(durable.local_root, stream, keep_last=durable.keep)
    save_failure_counts(path, counts)
    (path / SCHEDULE_FILE).write_text(json.dumps({"elapsed_s": elapsed_s, "skipped_batches": skipped_batches}))
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


def handoff(run: GRPORun, curve: dict[str, Any]) -> dict[str, Any]:
    """What the next phase starts from (HANDOFF_FILE): the newest checkpoint in the store (the final state, saved
    at the end of the stage), its step and data position, and every rollout journal so far."""
    names = run.durable.complete()
    if not names:
        raise RuntimeError(f"grpo: no complete checkpoint under {run.durable.prefix} to hand to the next phase")
    journals = list(run.phase.start.journals) if run.phase.start is not None else []
    if run.asynchronous is not None:
        journals.append(run.asynchronous.journal.prefix)
        position = run.asynchronous.next_seq
    else:
        position = (run.trainer.step + run.progress.skipped_batches) * run.cfg.grpo.schedule.tasks_per_step
    return {
        "stage": run.ctx.stage,
        "checkpoints": run.durable.prefix,
        "checkpoint": names[-1],
        "step": run.trainer.step,
        "data_position": position,
        "journals": journals,
        "curve": curve,
    }
