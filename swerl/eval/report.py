"""Evaluation reports: the markdown report, the pass@1-by-stratum plot, and one MLflow run per evaluated checkpoint.

Every checkpoint's eval run carries the same metric names (pass_at_1, pass_at_1_ci_low, ...), so MLflow's compare
view puts base, SFT and GRPO side by side; its tags link it to the checkpoint's own MLflow run and manifest, and
its `per_task.json` artifact is what `swerl compare` reads.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from swerl.eval.metrics import PairedComparison, describe_comparison, paired_comparison

PER_TASK_ARTIFACT = "per_task.json"
EVAL_RUN_TAG = "swerl.eval.checkpoint"
MLFLOW_PARAMS_PER_BATCH = 100  # MLflow's limit of params in one log_batch


def _fmt(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def metric_name(text: str) -> str:
    """A stratum name as an MLflow metric key (letters, digits, _-./ and spaces only)."""
    return re.sub(r"[^A-Za-z0-9_\-./ ]+", "_", text.replace("<", "lt").replace(">", "gt")).strip("_ ")


def eval_metrics(summary: Mapping[str, Any]) -> dict[str, float]:
    """The metrics of one checkpoint's eval run: the same names for every checkpoint."""
    out = {
        "pass_at_1": summary["pass@1"],
        "pass_at_1_ci_low": summary["ci_low"],
        "pass_at_1_ci_high": summary["ci_high"],
        "tasks": summary["tasks"],
        "missing": summary["missing"],
        "attempts_scored": summary["attempts"],
    }
    for row in summary["pass@k"]:
        out[f"pass_at_{row['k']}"] = row["value"]
    for row in summary["by_stratum"]:
        out[f"stratum/{metric_name(row['stratum'])}/pass_at_1"] = row["pass@1"]
    return {k: float(v) for k, v in out.items()}


def markdown_report(
    results: Mapping[str, Mapping[str, Any]],
    comparisons: list[dict[str, Any]],
    *,
    attempts: int,
    temperature: float,
    confidence: float,
    samples: int,
    subset_note: str,
    subset_uri: str,
    by_difficulty: bool,
    source: str = "",
    training_split: bool = False,
) -> str:
    pct = int(round(confidence * 100))
    tasks = max((int(r["tasks"] + r["missing"]) for r in results.values()), default=0)
    strata = "repository x difficulty" if by_difficulty else "repository only"
    title = "# Evaluation on training tasks (fit, not generalisation)" if training_split else "# Held-out evaluation"
    lines = [
        title,
        "",
        *([f"Tasks from {source}.", ""] if source else []),
        f"{tasks} tasks (stratified: {strata}; ids in `{subset_uri}`) x {attempts} attempt(s), temperature "
        f"{temperature}. pass@1 = mean per-task success rate; {pct}% percentile bootstrap CIs over tasks "
        f"({samples} resamples). A task whose every attempt hit an infrastructure error is *missing*: it leaves "
        "the denominator and is never scored 0.",
    ]
    if subset_note:
        lines += ["", f"**Note:** {subset_note}."]
    lines += [
        "",
        f"| model | pass@1 | {pct}% CI | denominator (tasks) | missing | pass@k | statuses |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        at_k = ", ".join(f"@{row['k']} {_fmt(row['value'])} (n={row['tasks']})" for row in r["pass@k"])
        lines.append(
            f"| {name} | {_fmt(r['pass@1'])} | [{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}] | "
            f"{int(r['tasks'])} | {int(r['missing'])} | {at_k} | {r['statuses']} |"
        )
    if comparisons:
        lines += ["", "## Paired comparisons (same tasks)", ""]
        for c in comparisons:
            lines += ["```", c["text"], "```"]
    for name, r in results.items():
        lines += [
            "",
            f"## {name}: pass@1 by stratum",
            "",
            "| stratum | pass@1 | CI | tasks | missing | in dataset |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for row in r["by_stratum"]:
            lines.append(
                f"| {row['stratum']} | {_fmt(row['pass@1'])} | [{_fmt(row['ci_low'])}, "
                f"{_fmt(row['ci_high'])}] | {row['tasks']} | {row['missing']} | {row['population']} |"
            )
        if r.get("grading"):
            lines += ["", f"Grading: {r['grading']}"]
    return "\n".join(lines) + "\n"


def compare_consecutive(
    per_task: Mapping[str, Mapping[str, list[float | None]]], samples: int, confidence: float, seed: int
) -> list[dict[str, Any]]:
    """Paired comparisons of each model with the one before it (base -> sft -> grpo)."""
    names = list(per_task)
    out = []
    for a, b in zip(names, names[1:], strict=False):
        c: PairedComparison = paired_comparison(per_task[a], per_task[b], samples, confidence, seed)
        out.append({"a": a, "b": b, **c.to_dict(), "text": describe_comparison(a, b, c)})
    return out


def plot_strata(results: Mapping[str, Mapping[str, Any]], path: Path, confidence: float) -> Path:
    """pass@1 by stratum with CI error bars, one colour per model; a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strata = sorted({row["stratum"] for r in results.values() for row in r["by_stratum"]})
    height = max(2.5, 0.45 * len(strata) * max(1, len(results)) + 1.2)
    fig, ax = plt.subplots(figsize=(8, height))
    width = 0.8 / max(1, len(results))
    for i, (name, r) in enumerate(results.items()):
        rows = {row["stratum"]: row for row in r["by_stratum"]}
        ys, xs, lo, hi = [], [], [], []
        for j, stratum in enumerate(strata):
            row = rows.get(stratum)
            if row is None or math.isnan(row["pass@1"]):
                continue
            ys.append(j + i * width)
            xs.append(row["pass@1"])
            lo.append(row["pass@1"] - row["ci_low"])
            hi.append(row["ci_high"] - row["pass@1"])
        ax.errorbar(xs, ys, xerr=[lo, hi], fmt="o", capsize=3, label=f"{name} (pass@1 {_fmt(r['pass@1'])})")
    ax.set_yticks([j + width * (len(results) - 1) / 2 for j in range(len(strata))], strata, fontsize=8)
    ax.set_xlim(-0.02, 1.02)
    ax.set_xlabel(f"pass@1 ({int(round(confidence * 100))}% bootstrap CI over tasks)")
    ax.invert_yaxis()
    ax.legend(loc="best", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_learning_curve(
    evaluations: Sequence[Mapping[str, Any]],
    history: Sequence[Mapping[str, float]],
    path: Path,
    title: str = "",
    boundaries: Sequence[tuple[int, str]] = (),
) -> Path:
    """GRPO's learning curve, a PNG at `path`: held-out pass@1 with its CI at each evaluated step (above), and per
    trainer step the training reward and groups with signal per 100 rolled episodes (below). boundaries: (first
    step, name) of each GRPO phase after the first, drawn as a dashed line where it starts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    points = sorted(evaluations, key=lambda e: int(e["step"]))
    if points:
        steps = [int(e["step"]) for e in points]
        ys = [float(e["pass@1"]) for e in points]
        err = [
            [y - float(e["ci_low"]) for y, e in zip(ys, points, strict=True)],
            [float(e["ci_high"]) - y for y, e in zip(ys, points, strict=True)],
        ]
        tasks = int(points[0].get("tasks", 0))
        top.errorbar(steps, ys, yerr=err, fmt="o-", capsize=3, label=f"held-out pass@1 ({tasks} tasks, 95% CI)")
        top.legend(loc="best", fontsize=8)
    top.set_ylabel("held-out pass@1")
    top.set_ylim(-0.02, 1.02)
    top.grid(alpha=0.3)
    if title:
        top.set_title(title, fontsize=9)
    rows = [h for h in history if "step" in h]
    if rows:
        steps = [int(h["step"]) for h in rows]
        bottom.plot(steps, [h.get("reward_mean", math.nan) for h in rows], "o-", label="training reward")
        bottom.set_ylabel("training reward")
        bottom.set_ylim(-0.02, 1.02)
        signal = [h.get("signal/groups_per_100_episodes", math.nan) for h in rows]
        if any(not math.isnan(v) for v in signal):
            twin = bottom.twinx()
            twin.plot(steps, signal, "s--", color="tab:green", label="groups with signal / 100 episodes")
            twin.set_ylabel("signal groups per 100 episodes")
            twin.legend(loc="upper right", fontsize=8)
        bottom.legend(loc="upper left", fontsize=8)
    bottom.set_xlabel("GRPO step")
    bottom.grid(alpha=0.3)
    for step, name in boundaries:
        for axis in (top, bottom):
            axis.axvline(step + 0.5, color="grey", linestyle=":", linewidth=1)
        top.annotate(f"phase {name}", (step + 0.5, 0.97), fontsize=7, color="grey", ha="left", va="top")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def log_eval_runs(
    client: Any,
    parent_run_id: str,
    results: Mapping[str, Mapping[str, Any]],
    per_task: Mapping[str, Mapping[str, list[float | None]]],
    links: Mapping[str, Mapping[str, str]],
    shared_tags: Mapping[str, str],
    plot: Path | None,
    report: str,
    params: Mapping[str, Any] | None = None,
    dataset: Any = None,
) -> dict[str, str]:
    """One finished MLflow run per checkpoint under the evaluate stage's run; returns name -> run id.

    Called only once every checkpoint is evaluated, so a failed evaluation leaves no eval run behind. Each run
    carries `params` (the evaluation's settings, secret-safe, plus the checkpoint), its metrics at the time they
    were logged (not the epoch), and `dataset` (an mlflow DatasetInput: the evaluated subset) as its input.
    """
    from mlflow.entities import Metric, Param, RunTag

    from swerl.tracking import KIND_TAG, safe_params

    experiment_id = client.get_run(parent_run_id).info.experiment_id
    run_ids = {}
    for name, summary in results.items():
        tags = {
            "mlflow.runName": f"eval-{name}",
            "mlflow.parentRunId": parent_run_id,
            EVAL_RUN_TAG: name,
            KIND_TAG: "eval",
            **shared_tags,
            **links.get(name, {}),
        }
        run = client.create_run(experiment_id, tags=tags, run_name=f"eval-{name}")
        run_id = run.info.run_id
        try:
            now = int(time.time() * 1000)
            metrics = [Metric(k, v, now, 0) for k, v in eval_metrics(summary).items()]
            flat = safe_params({**(params or {}), "checkpoint": name})
            items = [Param(k, v) for k, v in flat.items()]
            for i in range(0, len(items), MLFLOW_PARAMS_PER_BATCH):
                client.log_batch(run_id, params=items[i : i + MLFLOW_PARAMS_PER_BATCH])
            client.log_batch(run_id, metrics=metrics, tags=[RunTag("swerl.eval.denominator", str(summary["tasks"]))])
            if dataset is not None:
                client.log_inputs(run_id, datasets=[dataset])
            with tempfile.TemporaryDirectory() as tmp:
                body = {"checkpoint": name, "per_task": per_task[name], "summary": summary}
                (Path(tmp) / PER_TASK_ARTIFACT).write_text(json.dumps(body, indent=1, sort_keys=True))
                (Path(tmp) / "report.md").write_text(report)
                client.log_artifact(run_id, str(Path(tmp) / PER_TASK_ARTIFACT))
                client.log_artifact(run_id, str(Path(tmp) / "report.md"))
            if plot is not None:
                client.log_artifact(run_id, str(plot))
            client.set_terminated(run_id, "FINISHED")
        except BaseException:
            client.set_terminated(run_id, "FAILED")
            raise
        run_ids[name] = run_id
    return run_ids


def load_eval_run(client: Any, run_id: str) -> tuple[str, dict[str, list[float | None]], dict[str, Any]]:
    """(checkpoint name, per-task rewards, tags) of an eval run logged by log_eval_runs."""
    run = client.get_run(run_id)
    if EVAL_RUN_TAG not in run.data.tags:
        raise ValueError(f"MLflow run {run_id} is not a swerl eval run (no {EVAL_RUN_TAG} tag)")
    with tempfile.TemporaryDirectory() as tmp:
        local = client.download_artifacts(run_id, PER_TASK_ARTIFACT, tmp)
        body = json.loads(Path(local).read_text())
    return str(run.data.tags[EVAL_RUN_TAG]), body["per_task"], dict(run.data.tags)


def compare_runs(client: Any, run_a: str, run_b: str, samples: int = 10_000, confidence: float = 0.95) -> str:
    """The paired comparison of two eval runs' saved per-task results, as text."""
    name_a, tasks_a, tags_a = load_eval_run(client, run_a)
    name_b, tasks_b, tags_b = load_eval_run(client, run_b)
    label_a, label_b = f"{name_a}[{run_a[:8]}]", f"{name_b}[{run_b[:8]}]"
    lines = []
    subset_a, subset_b = tags_a.get("swerl.eval.subset"), tags_b.get("swerl.eval.subset")
    if subset_a != subset_b:
        lines.append(
            f"warning: the runs used different task subsets ({subset_a} vs {subset_b}); only the "
            "tasks both scored are compared"
        )
    from swerl.eval.metrics import pass_at_1

    for label, tasks in ((label_a, tasks_a), (label_b, tasks_b)):
        s = pass_at_1(tasks, samples=2000, confidence=confidence)
        lines.append(
            f"{label}: pass@1 {_fmt(s.value)} [{_fmt(s.ci_low)}, {_fmt(s.ci_high)}] over {s.tasks} tasks "
            f"({s.missing} missing)"
        )
    comparison = paired_comparison(tasks_a, tasks_b, samples, confidence)
    lines.append(describe_comparison(label_a, label_b, comparison))
    return "\n".join(lines)
