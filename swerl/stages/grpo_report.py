"""What the GRPO stage reports: each step's metrics (MLflow train/*), progress and log line; at its end the report
(grpo_report.json), the handoff to the next phase, the stage's metrics, markdown and plots, the learning curve."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from swerl.eval.report import plot_learning_curve
from swerl.plots import duration_histogram, grpo_curves, step_time_breakdown, step_time_shares
from swerl.rollout.step import StepOutcome
from swerl.stages.common import trainer_processes
from swerl.stages.grpo_state import HANDOFF_FILE, GRPORun, handoff
from swerl.stages.runner import StageResult
from swerl.trajectory import Trajectory


def record_step(run: GRPORun, outcome: StepOutcome) -> None:
    """A trained step's metrics (the loop's, the episodes', the sandbox pool's) into the history and MLflow
    (train/*), the stage's progress, and its log line."""
    g, ctx, step = run.cfg.grpo, run.ctx, outcome.step
    stats = outcome.stats | episode_stats(outcome.groups) | run.provider.step_metrics()
    run.history.append(stats)
    ctx.log_metrics({f"train/{k}": v for k, v in stats.items()}, step=step)
    ctx.progress(step, g.schedule.steps, f"GRPO step {step} of {g.schedule.steps}")
    if run.asynchronous is not None:
        run.asynchronous.record(outcome)
    ctx.log.info(step_line(run, outcome, stats))


def step_line(run: GRPORun, outcome: StepOutcome, stats: dict[str, float]) -> str:
    """A step's log line: sync, its groups with signal; async, its groups trained and discarded, the share of the
    step spent waiting for rollouts, and the time since the loop started."""
    head = f"step {outcome.step}/{run.cfg.grpo.schedule.steps}: reward {stats['reward_mean']:.3f}, "
    total = f"{stats['time_total_s']:.0f} s"
    if run.asynchronous is None:
        signal = int(stats["groups"] - stats["groups_without_signal"] - stats["groups_dropped"])
        return f"grpo {head}{signal}/{int(stats['groups'])} groups with signal, {total}"
    wait = f"wait {100 * stats['share_wait_rollouts']:.0f}%"
    since = f"{time.monotonic() - run.asynchronous.started:.0f} s since start"
    groups = f"{len(outcome.groups)} groups trained, {outcome.discarded} discarded"
    return f"grpo async {head}{groups}, {wait}, {total} ({since})"


def stage_result(run: GRPORun, resume: Path | None) -> StageResult:
    """The stage's report (grpo_report.json), its handoff to the next phase, metrics, markdown and plots."""
    g, trainer, history = run.cfg.grpo, run.trainer, run.history
    rewards = [h["reward_mean"] for h in history]
    report = stage_report(run, resume, rewards)
    curve = learning_curve(run, history)
    if curve["evaluations"]:
        phases = curve["phases"]
        title = f"GRPO: held-out pass@1 every {g.eval.every} steps" + (
            f" (phases {', '.join(name for _, name in phases)})" if len(phases) > 1 else ""
        )
        png = plot_learning_curve(
            curve["evaluations"],
            curve["history"],
            run.ctx.workdir / "learning_curve.png",
            title,
            boundaries=[(int(step), str(name)) for step, name in phases[1:]],
        )
        run.ctx.put_artifact("learning_curve.png", png)
        run.ctx.run.log_file(png)
    run.ctx.write_artifact("grpo_report.json", json.dumps(report, indent=2, sort_keys=True).encode())
    run.ctx.write_artifact(HANDOFF_FILE, json.dumps(handoff(run, curve), indent=2, sort_keys=True).encode())
    metrics = {
        "steps": float(trainer.step),
        "wall_s": report["wall_s"],
        "max_steps": float(g.schedule.steps),
        "ended_by_budget": float(run.ended_by_budget),
        "skipped_batches": float(run.progress.skipped_batches),
    }
    if rewards:
        third = max(1, len(rewards) // 3)
        metrics |= {
            "reward_first_third": sum(rewards[:third]) / third,
            "reward_last_third": sum(rewards[-third:]) / third,
        }
    return StageResult(
        metrics=metrics,
        markdown={"grpo": markdown(run, rewards)},
        images=grpo_images(run),
        summary=f"{trainer.step} steps, reward {rewards[0] if rewards else 0:.2f} -> "
        f"{rewards[-1] if rewards else 0:.2f}",
    )


def stage_report(run: GRPORun, resume: Path | None, rewards: list[float]) -> dict[str, Any]:
    """grpo_report.json: steps, resume, trainer, rewards, failures, the history, the budget, skipped batches, the
    phase; in async mode the data position, ledger, scored attempts and resume counts; the evaluations."""
    g, trainer, history, counts = run.cfg.grpo, run.trainer, run.history, run.counts
    report: dict[str, Any] = {
        "steps": trainer.step,
        "steps_this_attempt": len(history),
        "resumed": resume.name if resume else None,
        "trainer": trainer_processes(trainer, g.distributed),
        "reward_by_step": rewards,
        "failures": counts,
        "history": history,
        "wall_s": time.monotonic() - run.started,
        "mode": g.mode,
        "max_steps": g.schedule.steps,
        "budget": {
            "time_budget_s": g.schedule.time_budget_s,
            "elapsed_s": run.elapsed_s,
            "elapsed_before_s": run.elapsed_before_s,
            "ended_by_budget": run.ended_by_budget,
            "ended_at_step": trainer.step if run.ended_by_budget else None,
        },
        "skipped_batches": run.progress.skipped_batches,
        "skipped_reasons": run.progress.skipped_reasons,
        "sft_passed_on": g.schedule.steps == 0,
        "phase": None
        if run.cfg.phase is None
        else {
            "name": run.cfg.phase.name,
            "index": run.cfg.phase.index,
            "previous": run.cfg.phase.previous,
            "first_step": run.phase.first_step,
            "steps": g.schedule.steps - run.phase.first_step,
            "started_from": run.phase.start.checkpoint if run.phase.start else None,
            "reset_optimizer": run.cfg.phase.reset_optimizer,
            "tasks": run.cfg.phase.tasks.model_dump() if run.cfg.phase.tasks else None,
        },
    }
    if run.asynchronous is not None:
        ledger = run.asynchronous.ledger
        report |= {
            "data_position": run.asynchronous.next_seq,
            "ledger": ledger.entries,
            "scored_attempts": {str(step): pairs for step, pairs in sorted(ledger.scored.items())},
            "resume": run.asynchronous.resumed,
            "skipped_positions": run.asynchronous.skipped_positions,
        }
    if run.evaluator is not None:
        report["evaluations"] = run.evaluator.report()
    return report


def markdown(run: GRPORun, rewards: list[float]) -> str:
    """The stage's markdown: steps, rewards, failures, the budget's end, the evaluations, where step time went."""
    g, trainer, history, counts = run.cfg.grpo, run.trainer, run.history, run.counts
    lines = [
        "# GRPO",
        "",
        f"- {trainer.step} steps of {g.schedule.tasks_per_step} tasks x {g.rollout.attempts_per_task} attempts",
        f"- reward by step: {', '.join(f'{r:.2f}' for r in rewards) or 'none'}",
        f"- infrastructure failures: {counts or 'none'}",
    ]
    if run.ended_by_budget:
        lines.append(f"- **ended by the time budget** at step {trainer.step} of {g.schedule.steps}")
    if run.evaluator is not None:
        lines.append(f"- evaluations beside training: {run.evaluator.summary_line()}")
    shares = step_time_shares(history)
    if shares:
        lines.append("- step time: " + ", ".join(f"{label} {share:.0%}" for label, share in shares.items()))
    return "\n".join(lines) + "\n"


def grpo_images(run: GRPORun) -> dict[str, bytes]:
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


def learning_curve(run: GRPORun, history: list[dict[str, float]]) -> dict[str, Any]:
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
