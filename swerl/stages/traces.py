"""The traces stage: agent traces for SFT, in the SWE-smith-trajectories format.

source=oracle: the oracle agent solves the curated training tasks through the agent's own tools in real
sandboxes (swerl.agent.oracle) and its traces are written as SWE-smith-trajectories rows; source=dataset: rows
are loaded from a published trace dataset (hub id or local files) and checked. Either way the SFT stage reads
traces.jsonl through the same `datasets` path.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from swerl.agent.oracle import generate_oracle_traces
from swerl.agent.traces import load_trace_rows, normalize_messages, oracle_rows, write_traces
from swerl.config import AgentConfig, StrictModel, TracesConfig
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
    """Raise on rows SFT cannot use (no messages, no assistant turn); returns counts by role."""
    roles: Counter[str] = Counter()
    for index, row in enumerate(rows):
        name = f"trace row {index} (traj_id={row.get('traj_id')!r})"
        try:
            messages = normalize_messages(row["messages"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{name}: unreadable messages ({exc})") from exc
        if not any(m["role"] == "assistant" for m in messages):
            raise ValueError(f"{name} has no assistant turn: nothing to train on")
        roles.update(m["role"] for m in messages)
    return roles


def run_traces(cfg: TracesStage, ctx: StageContext) -> StageResult:
    started = time.monotonic()
    report: dict[str, Any] = {"source": cfg.traces.source}
    if cfg.traces.source == "dataset":
        if not cfg.traces.dataset:
            raise ValueError("traces.dataset must name a trace dataset when traces.source is 'dataset'")
        rows = load_trace_rows(cfg.traces.dataset, cfg.traces.dataset_split)[: cfg.traces.max_traces]
        report["dataset"] = cfg.traces.dataset
    else:
        curate = input_manifest(ctx, "curate")
        tasks = load_tasks(ctx.store, curate, "train.parquet")
        if not tasks:
            raise ValueError(f"the curate stage ({curate.uri}) produced no training tasks to trace")
        chosen = seeded_sample(tasks, cfg.traces.max_traces, f"traces:{ctx.seed}")
        limits = episode_limits(cfg.agent)
        provider = sandbox_pool(cfg.agent.sandbox, git_baseline=True)
        ctx.log.info("traces: oracle on %d of %d training tasks, %d workers", len(chosen), len(tasks),
                     cfg.traces.workers)  # fmt: skip
        traces, oracle_report = run_async(
            closing(
                provider,
                generate_oracle_traces(
                    chosen,
                    provider,
                    limits,
                    recovery_prob=cfg.traces.recovery_prob,
                    seed=ctx.seed,
                    workers=cfg.traces.workers,
                    context_lines=cfg.traces.context_lines,
                    view_whole_file_lines=cfg.traces.view_whole_file_lines,
                    test_command=cfg.traces.test_command,
                    view_function_lines=cfg.traces.view_function_lines,
                ),
            )
        )
        rows = oracle_rows(traces)
        report["oracle"] = oracle_report.to_dict()
    if not rows:
        raise ValueError(f"no traces: {json.dumps(report, default=str)[:500]}")
    roles = check_rows(rows)
    path = ctx.workdir / "traces.jsonl"
    write_traces(rows, path)
    ctx.put_artifact("traces.jsonl", path)
    report |= {
        "traces": len(rows),
        "messages_by_role": dict(roles),
        "wall_s": round(time.monotonic() - started, 1),
    }
    ctx.write_artifact(
        "traces_report.json", json.dumps(report, indent=2, sort_keys=True, default=str).encode()
    )
    metrics = {
        "traces": float(len(rows)),
        "assistant_turns_per_trace": roles["assistant"] / len(rows),
        "recovery_traces": float(sum(bool(r.get("recovery")) for r in rows)),
    }
    skipped = report.get("oracle", {}).get("skipped", {})
    for reason, count in skipped.items():
        metrics[f"oracle_skipped.{reason}"] = float(count)
    markdown = "\n".join(
        [
            "# Traces",
            "",
            f"- source: {cfg.traces.source}, traces: {len(rows)}",
            f"- oracle skipped: {skipped or 'none'}",
            f"- wall time: {report['wall_s']} s",
        ]
    )
    return StageResult(metrics=metrics, markdown={"traces": markdown + "\n"}, summary=f"{len(rows)} traces")
