"""The traces stage: agent traces for SFT, in the SWE-smith-trajectories format.

source=oracle: the oracle agent solves the curated training tasks through the agent's own tools in real
sandboxes (swerl.agent.oracle) and its traces are written as SWE-smith-trajectories rows; source=dataset: rows
are loaded from a published trace dataset (hub id or local files; swerl.agent.traces.load_trace_rows checks every
row, naming the file, row and message of one SFT would refuse). Either way the rows are written as they came to
traces.jsonl (one JSON object a line), which the SFT stage reads through the same load_trace_rows.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from swerl.agent.oracle import generate_oracle_traces
from swerl.agent.traces import (
    TraceRowError,
    check_trace_row,
    load_trace_rows,
    oracle_rows,
    trace_row_name,
    write_traces,
)
from swerl.config.agent import AgentConfig
from swerl.config.base import StrictModel
from swerl.config.data import TracesConfig
from swerl.stages.common import (
    closing,
    episode_limits,
    input_manifest,
    load_tasks,
    run_async,
    sandbox_pool,
    seeded_sample,
)
from swerl.stages.runner import StageContext, StageResult


class TracesStage(StrictModel):
    """What the traces stage's checkpoint key covers."""

    traces: TracesConfig
    agent: AgentConfig


def check_rows(rows: list[dict[str, Any]]) -> Counter[str]:
    """Raise on rows SFT cannot use (check_trace_row: no messages, a message the chat template cannot render, no
    assistant turn), naming the row and the message; returns counts by role."""
    roles: Counter[str] = Counter()
    for index, row in enumerate(rows):
        try:
            messages = check_trace_row(row)
        except TraceRowError as exc:
            raise ValueError(exc.named(trace_row_name(row, index))) from None
        roles.update(m["role"] for m in messages)
    return roles


def run_traces(cfg: TracesStage, ctx: StageContext) -> StageResult:
    """Traces from the oracle or a dataset, checked and written as traces.jsonl with a report."""
    started = time.monotonic()
    report: dict[str, Any] = {"source": cfg.traces.source}
    if cfg.traces.source == "dataset":
        rows = _dataset_rows(cfg.traces)
        report["dataset"] = cfg.traces.dataset
    else:
        rows, report["oracle"] = _oracle_rows(cfg, ctx)
    if not rows:
        raise ValueError(no_traces_message(cfg.traces, report))
    roles = check_rows(rows)
    path = ctx.workdir / "traces.jsonl"
    write_traces(rows, path)
    ctx.put_artifact("traces.jsonl", path)
    report |= {
        "traces": len(rows),
        "messages_by_role": dict(roles),
        "wall_s": round(time.monotonic() - started, 1),
    }
    ctx.write_artifact("traces_report.json", json.dumps(report, indent=2, sort_keys=True, default=str).encode())
    skipped = report.get("oracle", {}).get("skipped", {})
    return StageResult(
        metrics=_metrics(rows, roles, skipped),
        markdown={"traces": _markdown(cfg.traces.source, len(rows), skipped, report["wall_s"])},
        summary=f"{len(rows)} traces",
    )


def no_traces_message(traces: TracesConfig, report: dict[str, Any]) -> str:
    """Why the stage has no trace: when a set traces.test_command never showed a fix passing, that command."""
    message = f"no traces: {json.dumps(report, default=str)[:500]}"
    skipped = report.get("oracle", {}).get("skipped", {})
    judged = {why: skipped[why] for why in ("retest_fails", "tests_pass_at_start") if why in skipped}
    if traces.test_command is None or not judged:
        return message
    return (
        f"no traces: traces.test_command {traces.test_command!r} never showed a reference fix passing ({judged}). "
        "The oracle tests every task with that command; configs/local.yaml's `python run_tests.py -q` is the "
        "harness of swerl's micro repositories, and no other repository has a run_tests.py. Set "
        "traces.test_command to null (delete the line, or --set traces.test_command=null) so each task runs its "
        "own test command, or to a command that runs these repositories' tests and ends with pytest's summary "
        f"line. {message}"
    )


def _dataset_rows(traces: TracesConfig) -> list[dict[str, Any]]:
    if not traces.dataset:
        raise ValueError("traces.dataset must name a trace dataset when traces.source is 'dataset'")
    return load_trace_rows(traces.dataset, traces.dataset_split)[: traces.max_traces]


def _oracle_rows(cfg: TracesStage, ctx: StageContext) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The oracle's traces of a seeded sample of the curated training tasks, and its report."""
    curate = input_manifest(ctx, "curate")
    tasks = load_tasks(ctx.store, curate, "train.parquet")
    if not tasks:
        raise ValueError(f"the curate stage ({curate.uri}) produced no training tasks to trace")
    t = cfg.traces
    chosen = seeded_sample(tasks, t.max_traces, f"traces:{ctx.seed}")
    provider = sandbox_pool(cfg.agent.sandbox, git_baseline=True)
    ctx.log.info("traces: oracle on %d of %d training tasks, %d workers", len(chosen), len(tasks), t.workers)
    oracle = generate_oracle_traces(
        chosen,
        provider,
        episode_limits(cfg.agent),
        recovery_prob=t.recovery_prob,
        workers=t.workers,
        context_lines=t.context_lines,
        view_whole_file_lines=t.view_whole_file_lines,
        view_function_lines=t.view_function_lines,
        test_command=t.test_command,
        seed=ctx.seed,
    )
    traces, oracle_report = run_async(closing(provider, oracle))
    return oracle_rows(traces), oracle_report.to_dict()


def _metrics(rows: list[dict[str, Any]], roles: Counter[str], skipped: dict[str, int]) -> dict[str, float]:
    metrics = {
        "traces": float(len(rows)),
        "assistant_turns_per_trace": roles["assistant"] / len(rows),
        "recovery_traces": float(sum(bool(r.get("recovery")) for r in rows)),
    }
    for reason, count in skipped.items():
        metrics[f"oracle_skipped.{reason}"] = float(count)
    return metrics


def _markdown(source: str, traces: int, skipped: dict[str, int], wall_s: float) -> str:
    lines = [
        "# Traces",
        "",
        f"- source: {source}, traces: {traces}",
        f"- oracle skipped: {skipped or 'none'}",
        f"- wall time: {wall_s} s",
    ]
    return "\n".join(lines) + "\n"
