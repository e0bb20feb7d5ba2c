"""GRPO: its schedule, rollouts, algorithm, evaluation beside training, and its phases' own settings."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from swerl.config.base import StrictModel
from swerl.config.train import DistributedConfig


class GRPOScheduleConfig(StrictModel):
    """How much GRPO trains: steps of B groups, checkpoints, the time budget that only guards."""

    steps: int = Field(10, ge=0, le=10_000_000)
    """Optimizer steps (0 skips RL: the SFT checkpoint is passed on)."""
    tasks_per_step: int = Field(8, ge=1, le=1_000_000)
    """B: tasks (groups) per step."""
    time_budget_s: float | None = Field(None, gt=0)
    """Wall-clock budget for training. async: no step starts after it, a batch still being collected when it runs
    out is given back untrained (its groups stay journaled), and an update the previous one's duration says would
    end past it is not started; sync: stops after the step during which it ran out. A guard only (steps decide
    what is trained): ending early is a warning and a report field; earlier attempts' time counts (checkpointed)."""
    checkpoint_every: int = Field(5, ge=0, le=10_000_000)
    """Steps between checkpoints; 0: only at the end."""
    keep_checkpoints: int = Field(2, ge=1, le=1000)
    """Checkpoints kept, locally and in the store (the newest N; older ones are removed as new ones land)."""
    max_empty_steps: int = Field(3, ge=1, le=1_000_000)
    """Consecutive batches with nothing trainable (every group dropped: fewer than two valid attempts) on the
    policy's side before the stage fails; such a batch is never counted as a step. A batch in which some group was
    emptied by infrastructure errors is an outage instead (infra_outage_budget_s) and is not counted here."""
    task_seed_offset: int = Field(0, ge=0, le=2**31 - 1)
    """Shifts the seeded task order (the data position resumes exactly from a checkpoint)."""
    infra_outage_budget_s: float = Field(900.0, gt=0, le=7 * 86_400)
    """Longest infrastructure outage a stage waits out: batches with nothing trainable because infrastructure
    errors emptied their groups (an engine restarting: infra_error(engine_unreachable)) are not counted by
    max_empty_steps; the loop waits (infra_backoff_*) and samples the same data again, and fails, naming the
    infra_error causes counted, once the outage (from its first such batch) has lasted this long."""
    infra_backoff_first_s: float = Field(1.0, gt=0, le=3600)
    """The first wait after a batch emptied by infrastructure errors."""
    infra_backoff_max_s: float = Field(60.0, gt=0, le=3600)
    """The longest wait between batches emptied by infrastructure errors (the waits grow up to it)."""
    infra_backoff_factor: float = Field(2.0, ge=1, le=10)
    """Each wait of an outage is the previous one times this (1: constant waits)."""

    @model_validator(mode="after")
    def _backoff_ordered(self) -> GRPOScheduleConfig:
        if self.infra_backoff_max_s < self.infra_backoff_first_s:
            raise ValueError(
                f"infra_backoff_max_s ({self.infra_backoff_max_s}) must be >= infra_backoff_first_s "
                f"({self.infra_backoff_first_s})"
            )
        return self


class GRPORolloutConfig(StrictModel):
    """How GRPO samples: groups of n attempts, sampling parameters, and (async) what is in flight and how stale."""

    attempts_per_task: int = Field(4, ge=2, le=10_000)
    """n: attempts per task (the group)."""
    temperature: float = Field(1.0, gt=0, le=10)
    """Sampling temperature of the rollouts (the trainer's log-probs are taken at the same temperature)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling of the rollouts."""
    concurrency: int = Field(8, ge=1, le=1_000_000)
    """sync: episodes running at once."""
    max_in_flight: int = Field(32, ge=1, le=1_000_000)
    """async: trajectories kept running at all times (a finished one is replaced at once)."""
    max_staleness: int = Field(2, ge=0, le=1_000_000)
    """async: most versions a trajectory's oldest sampled token may lag the trainer before staleness_policy acts."""
    staleness_policy: Literal["drop", "requeue", "keep"] = "drop"
    """async: a stale attempt is left out (drop), its group is rerun (requeue), or trained with IS correction (keep)."""
    max_requeues: int = Field(1, ge=0, le=1000)
    """async, requeue: reruns of one group; a group still stale after them is dropped."""
    max_buffered_groups: int | None = Field(None, ge=1, le=1_000_000)
    """async: finished, untrained groups held before no new group is started (None: B x (max_staleness + 1))."""
    dynamic_sampling: bool = True
    """async: a group whose valid attempts all got the same reward (no gradient) does not fill one of the B slots."""
    max_extra_groups_per_step: int = Field(32, ge=0, le=1_000_000)
    """async: groups without gradient discarded per step at most; past it they fill slots (and teach nothing)."""
    prewarm_groups: int = Field(0, ge=0, le=1_000_000)
    """async: groups past the newest open one whose n sandboxes are started ahead (SandboxPool.warm_ahead), so an
    attempt's start is a hand-out, not a sandbox start; warming uses only sandbox slots no attempt waits for, so
    agent.sandbox.pool.max_concurrent should hold max_in_flight + prewarm_groups x attempts_per_task (doctor
    counts them); 0: every attempt starts its sandbox itself."""
    probe_attempts: int = Field(0, ge=0, le=10_000)
    """async: a fresh task's group opens with this many attempts; if they all fail (reward 0) the group stops there
    (discarded as probe_stopped), else its other attempts run and it is trained whole (swerl.rollout.curriculum:
    per task the expected update keeps its direction; tasks are reweighted towards the policy's frontier). 0: off;
    below attempts_per_task."""
    replay_share: float = Field(0.0, ge=0, lt=1)
    """async: share of the groups opened that rerun a task whose earlier group had signal (FIFO), instead of the next
    fresh task; 0: off (every group a fresh task in the seeded order)."""
    max_visits: int = Field(1, ge=1, le=1_000_000)
    """async, replay: most groups one task runs in all (its first included)."""
    stratify_by: Literal["modifier", "difficulty", "repo"] | None = None
    """async: the task attribute whose strata the curriculum estimates success rates for; a fresh task of a stratum
    far from the policy's frontier (never or always solved so far) is passed over with a seeded draw, keeping at
    least stratum_floor of its stratum's tasks (swerl.rollout.curriculum: tasks reweighted by stratum, each
    task's update keeps its direction). None: off (every fresh task in the seeded order)."""
    stratum_floor: float = Field(0.2, gt=0, le=1)
    """async, stratify_by: least chance that a fresh task of the least promising stratum is taken."""
    stratum_prior: float = Field(2.0, gt=0, le=1_000_000)
    """async, stratify_by: pseudo-attempts at success rate 1/2 in each stratum's estimate (how soon outcomes
    move it)."""


class GRPOAlgorithmConfig(StrictModel):
    """How one GRPO step updates the policy: optimizer, clipped token-level loss, TIS/MIS, KL, batching.

    Its fields are exactly those of swerl.train.grpo_trainer.UpdateSettings (a test keeps them equal)."""

    lr: float = Field(1e-4, gt=0, le=10)
    """AdamW learning rate (constant)."""
    weight_decay: float = Field(0.0, ge=0, le=10)
    """AdamW weight decay (matrices only)."""
    grad_clip: float | None = Field(1.0, gt=0)
    """Max total gradient norm (None: measured, not clipped)."""
    clip_eps_low: float = Field(0.2, ge=0, le=10)
    """PPO ratio clip below: 1 - clip_eps_low."""
    clip_eps_high: float = Field(0.28, ge=0, le=10)
    """PPO ratio clip above: 1 + clip_eps_high (DAPO's clip-higher when above clip_eps_low)."""
    tis_cap: float = Field(2.0, ge=1, le=1e6)
    """Truncation of the importance weight against the engine's behaviour log-probs."""
    tis_level: Literal["token", "sequence"] = "token"
    """Truncated importance sampling per token, or per trajectory (product of its token weights)."""
    mis_low: float = Field(0.0, ge=0, le=1)
    """Masked importance sampling: tokens (or trajectories) with weight below this get no loss (with mis_high)."""
    mis_high: float | None = Field(None, ge=1, le=1e6)
    """Masked importance sampling upper bound (None: MIS off)."""
    mis_level: Literal["token", "sequence"] = "token"
    """Masked importance sampling per token or per trajectory."""
    kl_coef: float = Field(0.0, ge=0, le=100)
    """k3 KL penalty to the SFT checkpoint (0: no reference model is kept)."""
    scale_adv_by_std: bool = False
    """Divide advantages by the group's reward std (GRPO) or not (Dr. GRPO)."""
    loss_aggregation: Literal["token_mean", "sequence_mean"] = "token_mean"
    """token_mean: every scored token of a minibatch weighs the same (DAPO; long trajectories weigh more);
    sequence_mean: every trajectory weighs the same (the original GRPO)."""
    micro_batch_tokens: int = Field(8192, ge=2, le=100_000_000)
    """Most tokens in one forward/backward, counted padded (rows x longest row). The torch backend computes only
    the real ones (the rows packed into one, the LM head at scored tokens); megatron the padded rows."""
    ppo_epochs: int = Field(1, ge=1, le=100)
    """Passes over each step's batch (optimizer updates per step = ppo_epochs x num_minibatches)."""
    num_minibatches: int = Field(1, ge=1, le=10_000)
    """Parts each pass splits the batch into, one optimizer update each."""

    @model_validator(mode="after")
    def _consistent(self) -> GRPOAlgorithmConfig:
        if self.mis_high is not None and self.mis_low >= self.mis_high:
            raise ValueError(f"mis_low ({self.mis_low}) must be below mis_high ({self.mis_high})")
        if self.mis_high is not None and self.tis_cap <= self.mis_low:
            raise ValueError(f"tis_cap ({self.tis_cap}) <= mis_low ({self.mis_low}): every kept weight is truncated")
        return self


class GRPOEvalConfig(StrictModel):
    """async: evaluation of exported checkpoints beside training (swerl.stages.grpo_eval)."""

    every: int = Field(0, ge=0, le=10_000_000)
    """Every this many trainer steps, the weights just exported are evaluated on the held-out split beside training
    (its own engine and sandbox pool; neither trainer nor rollouts wait for it); 0: off."""
    tasks: int = Field(16, ge=1, le=10_000_000)
    """Held-out tasks per evaluation (the evaluate stage's stratified subset of this size)."""
    attempts: int = Field(1, ge=1, le=10_000)
    """Attempts per held-out task."""
    concurrency: int = Field(4, ge=1, le=1_000_000)
    """An evaluation's episodes at once: its engine's concurrency and the most sandboxes of its own pool (apart
    from grpo.rollout.max_in_flight and agent.sandbox.pool, which stay the rollouts')."""
    temperature: float = Field(0.7, ge=0, le=10)
    """Sampling temperature of the evaluation (0: greedy)."""
    grader: Literal["swebench", "episode"] = "episode"
    """The episode's in-workspace grade (the training reward), or swebench log grading of each patch in a fresh
    sandbox (as the evaluate stage; extra `swebench`)."""
    at_end: Literal["wait", "cancel"] = "wait"
    """An evaluation still running when training ends is awaited (and logged), or cancelled."""
    at_start: bool = False
    """Also evaluate the starting weights (step 0: the SFT model) beside the first steps, on the same tasks, so the
    learning curve starts where GRPO started (not on a resumed run: its step 0 was evaluated before)."""


_GRPO_SECTIONS: dict[str, type[StrictModel]] = {
    "schedule": GRPOScheduleConfig,
    "rollout": GRPORolloutConfig,
    "algorithm": GRPOAlgorithmConfig,
}
GRPO_MOVED_KEYS: dict[str, str] = {
    **{key: f"{section}.{key}" for section, model in _GRPO_SECTIONS.items() for key in model.model_fields},
    "rollout_concurrency": "rollout.concurrency",
    **{f"eval_{key}": f"eval.{key}" for key in GRPOEvalConfig.model_fields},
}
"""Flat grpo keys of earlier swerl versions and where each lives now (an old key is an error naming the new one)."""


class GRPOPhaseTasks(StrictModel):
    """Which training tasks a phase's groups run: a task passes when it matches every list given (an empty list
    matches all). The data stream stays the one seeded order over the training split; a phase skips the positions
    whose task it excludes (so phases hand over the data position, and a later phase without a filter continues
    the stream where the earlier one stopped)."""

    difficulties: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(default_factory=list)
    """Task difficulty labels (the curate stage's: e.g. easy, medium, hard)."""
    repos: list[Annotated[str, Field(min_length=1, max_length=300)]] = Field(default_factory=list)
    """Repository names (a task's `repo`)."""
    modifiers: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(default_factory=list)
    """Bug modifiers that made the task (synthesized tasks)."""

    def matches(self, difficulty: str | None, repo: str, modifier: str | None) -> bool:
        return (
            (not self.difficulties or difficulty in self.difficulties)
            and (not self.repos or repo in self.repos)
            and (not self.modifiers or modifier in self.modifiers)
        )


class GRPOPhaseConfig(StrictModel):
    """One GRPO phase: its own stage (stage name grpo-NAME), trained from the previous phase's checkpoint (the SFT
    model for the first), with what it changes against the base grpo/agent/engine settings."""

    name: str = Field(min_length=1, max_length=40, pattern=r"^[a-z0-9][a-z0-9_]*$")
    """The phase's name: its stage is `grpo-NAME` (manifest, MLflow run, Prefect task, evaluate.checkpoints)."""
    steps: int = Field(ge=0, le=10_000_000)
    """GRPO steps this phase trains; the step axis continues from the previous phase's last step."""
    reset_optimizer: bool = False
    """Start with a fresh optimizer (the weights, step, data position and RNG still come from the previous
    phase); False: the previous phase's optimizer state (AdamW moments) carries on, at this phase's settings."""
    tasks: GRPOPhaseTasks | None = None
    """Which training tasks this phase's groups run (async mode); None: every task."""
    grpo: dict[str, Any] = Field(default_factory=dict)
    """Changes to the base grpo settings, as nested keys (e.g. {algorithm: {lr: 5.0e-5}})."""
    agent: dict[str, Any] = Field(default_factory=dict)
    """Changes to the base agent settings (e.g. {max_trajectory_tokens: 1536, max_turns: 8})."""
    engine: dict[str, Any] = Field(default_factory=dict)
    """Changes to the base engine settings (e.g. {max_context_tokens: 2048})."""


class GRPOConfig(StrictModel):
    """GRPO on the SFT checkpoint: B groups of n attempts per step, token-level clipped loss, TIS/MIS; sync or
    fully asynchronous (swerl.rollout)."""

    form_first = ("schedule", "phases")

    mode: Literal["sync", "async"] = "sync"
    """sync: sample B x n, then train (the baseline); async: rollouts never stop, the trainer takes finished groups."""
    threads: int = Field(2, ge=1, le=1024)
    """torch intra-op threads for the update."""
    trainer_process: bool = False
    """Run the trainer in a spawned process of its own (swerl.train.trainer_process): its update does not hold the
    rollouts' interpreter (GIL) while the async loop keeps sampling. False: a thread of the stage's process."""
    schedule: GRPOScheduleConfig = Field(default_factory=GRPOScheduleConfig)
    """Steps, batch size, checkpoints, time budget."""
    rollout: GRPORolloutConfig = Field(default_factory=GRPORolloutConfig)
    """Group size, sampling, in-flight and staleness bounds."""
    algorithm: GRPOAlgorithmConfig = Field(default_factory=GRPOAlgorithmConfig)
    """Optimizer and loss of each update."""
    eval: GRPOEvalConfig = Field(default_factory=GRPOEvalConfig)
    """Evaluation beside training (async)."""
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    """Trainer processes, devices, sharding (the default: one CPU process; fsdp2 and megatron always run their ranks
    in processes of their own, whatever trainer_process says)."""
    phases: list[GRPOPhaseConfig] | None = None
    """GRPO in phases, each its own checkpointed stage (grpo-NAME) started from the previous one's checkpoint and
    changing what it names against these base settings (e.g. a tighter trajectory cap, a learning-rate drop, easier
    tasks first). None: one phase with these settings, the stage `grpo`."""

    @model_validator(mode="before")
    @classmethod
    def _no_moved_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            moved = {key: GRPO_MOVED_KEYS[key] for key in data if key in GRPO_MOVED_KEYS}
            if moved:
                where = ", ".join(f"grpo.{old} is now grpo.{new}" for old, new in moved.items())
                raise ValueError(f"renamed keys: {where}")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> GRPOConfig:
        if self.eval.every > 0 and self.mode != "async":
            raise ValueError(
                f"eval.every ({self.eval.every}) needs mode async: sync mode evaluates after training only "
                "(the evaluate stage)"
            )
        r = self.rollout
        adaptive = {"probe_attempts": r.probe_attempts, "replay_share": r.replay_share, "stratify_by": r.stratify_by}
        if self.mode != "async" and any(adaptive.values()):
            raise ValueError(f"grpo.rollout {adaptive} need mode async (the sync loop rolls whole groups in order)")
        if r.probe_attempts >= r.attempts_per_task:
            raise ValueError(
                f"grpo.rollout.probe_attempts ({r.probe_attempts}) must be below attempts_per_task "
                f"({r.attempts_per_task}): the probe is the first part of a group"
            )
        if r.replay_share > 0 and r.prewarm_groups > 0:
            raise ValueError(
                "grpo.rollout.prewarm_groups needs each group's task before it opens: set it to 0 with "
                f"replay_share ({r.replay_share}) > 0, whose tasks come from outcomes"
            )
        if r.stratify_by is not None and r.prewarm_groups > 0:
            raise ValueError(
                "grpo.rollout.prewarm_groups needs each group's task before it opens: set it to 0 with "
                f"stratify_by ({r.stratify_by!r}), whose fresh picks depend on outcomes"
            )
        if r.replay_share > 0 and r.max_visits < 2:
            raise ValueError(
                f"grpo.rollout.replay_share ({r.replay_share}) > 0 needs max_visits >= 2 (a task's "
                f"replay is its second visit), got {r.max_visits}"
            )
        if self.mode == "async" and self.buffered_groups < self.schedule.tasks_per_step:
            raise ValueError(
                f"schedule.tasks_per_step (B = {self.schedule.tasks_per_step}) exceeds rollout.max_buffered_groups "
                f"({self.buffered_groups}): the trainer would wait for more finished groups than rollouts may "
                "ever hold"
            )
        return self

    @property
    def buffered_groups(self) -> int:
        """Finished, untrained groups held at most (async)."""
        if self.rollout.max_buffered_groups is not None:
            return self.rollout.max_buffered_groups
        return self.schedule.tasks_per_step * (self.rollout.max_staleness + 1)
