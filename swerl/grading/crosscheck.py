"""SWE-bench's own harness as the referee of swerl's grader: the same predictions graded by both, compared.

For SWE-bench-style tasks whose instance images are on the Docker engine (named as swebench names them; rows with
swebench 5's `eval_script`), every prediction (an instance id and a patch: gold, empty, a wrong fix, or a model's
attempts) is graded twice:

- by swerl's one grader (`swerl.grading.verdict.grade_attempt`: a fresh sandbox from the task's image, test files
  from the task, swerl's runner), in the sandbox provider the caller gives;
- by swebench's `run_evaluation`, unchanged, in a process of its own (swerl/grading/swebench_referee.py: containers
  forced onto network "none", empty patches run through swebench's own no-patch mode) on a dataset file written
  from the tasks (`swebench_row`: the task's image, eval_script, FAIL_TO_PASS/PASS_TO_PASS, log parser).

Agreement is on "resolved" (RESOLVED_FULL). A prediction either side could not grade (an infrastructure error,
swebench's environment failures, an absent image) has no verdict and is counted apart: not an agreement. swebench
grades one prediction per instance per run, so predictions are dealt into rounds, each its own run.
`swerl crosscheck` (swerl/cli.py) runs this for a user's tasks and predictions; docs/operations.md documents it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from swerl.data.schema import TaskInstance
from swerl.errors import InfraError
from swerl.grading.harness import log_parser_for
from swerl.grading.verdict import grade_attempt
from swerl.sandbox.base import SandboxProvider

AGREE, DISAGREE, NO_VERDICT = "agree", "disagree", "no verdict"


@dataclass(frozen=True)
class Prediction:
    """One patch to grade for one task; `label` names it (gold, empty, wrong, MODEL/attempt-K) and is swebench's
    model_name_or_path. `recorded`: a verdict an earlier run already gave it (an evaluate stage's grade)."""

    instance_id: str
    patch: str
    label: str
    recorded: bool | None = None


@dataclass(frozen=True)
class Verdict:
    """One grader's verdict: resolved (None when it gave none), its status name, what else it said."""

    resolved: bool | None
    status: str
    detail: str = ""


@dataclass(frozen=True)
class Comparison:
    instance_id: str
    label: str
    swerl: Verdict
    swebench: Verdict
    recorded: bool | None = None

    @property
    def outcome(self) -> str:
        verdicts = [self.swerl.resolved, self.swebench.resolved]
        if self.recorded is not None:
            verdicts.append(self.recorded)
        if any(v is None for v in verdicts):
            return NO_VERDICT
        return AGREE if len(set(verdicts)) == 1 else DISAGREE


@dataclass(frozen=True)
class CrosscheckReport:
    comparisons: list[Comparison]
    workdir: str
    networks: list[str]
    """The network mode of every container swebench's harness created (the referee forces "none")."""

    @property
    def counts(self) -> dict[str, int]:
        found = Counter(c.outcome for c in self.comparisons)
        return {key: found.get(key, 0) for key in (AGREE, DISAGREE, NO_VERDICT)}

    @property
    def ok(self) -> bool:
        """Every prediction has both verdicts and they agree."""
        return bool(self.comparisons) and self.counts[AGREE] == len(self.comparisons)

    @property
    def instances(self) -> int:
        return len({c.instance_id for c in self.comparisons})

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "counts": self.counts,
            "instances": self.instances,
            "workdir": self.workdir,
            "networks": self.networks,
            "comparisons": [asdict(c) | {"outcome": c.outcome} for c in self.comparisons],
        }

    def table(self) -> str:
        """A markdown table, one row per prediction, then the counts."""
        lines = ["| instance | prediction | swerl | swebench | outcome |", "| --- | --- | --- | --- | --- |"]
        for c in self.comparisons:
            recorded = "" if c.recorded is None else f" (recorded {'resolved' if c.recorded else 'unresolved'})"
            lines.append(
                f"| {c.instance_id} | {c.label}{recorded} | {_cell(c.swerl)} | {_cell(c.swebench)} | {c.outcome} |"
            )
        counts = ", ".join(f"{n} {k}" for k, n in self.counts.items())
        lines += [
            "",
            f"{len(self.comparisons)} predictions on {self.instances} instances: {counts}; swebench's "
            f"containers ran on network {', '.join(self.networks) or '(none created)'}",
        ]
        return "\n".join(lines) + "\n"


def _cell(verdict: Verdict) -> str:
    said = {True: "resolved", False: "unresolved", None: "no verdict"}[verdict.resolved]
    detail = f": {verdict.detail[:80]}" if verdict.detail and verdict.resolved is None else ""
    return f"{said} ({verdict.status}{detail})".replace("|", "/").replace("\n", " ")


def swebench_row(task: TaskInstance) -> dict[str, Any]:
    """The dataset row swebench 5's harness reads for `task` (make_test_spec's fields), on the task's own image."""
    from swebench.harness.constants import FAIL_ONLY_REPOS, EvalType

    if task.patch_kind != "fix" or not task.eval_script:
        raise ValueError(
            f"{task.instance_id}: swebench's harness needs a SWE-bench-style task (the fix as `patch`) with an "
            f"eval_script; this one is {task.patch_kind}-kind{'' if task.eval_script else ' without eval_script'}"
        )
    fail_only = task.repo in FAIL_ONLY_REPOS
    return {
        "instance_id": task.instance_id,
        "repo": task.repo,
        "base_commit": task.base_commit,
        "patch": task.patch,
        "test_patch": task.test_patch,
        "problem_statement": task.problem_statement,
        "version": task.version or "",
        "FAIL_TO_PASS": json.dumps(task.FAIL_TO_PASS),
        "PASS_TO_PASS": json.dumps(task.PASS_TO_PASS),
        "image": task.image,
        "log_parser": log_parser_for(task),
        "eval_type": (EvalType.FAIL_ONLY if fail_only else EvalType.PASS_AND_FAIL).value,
        "eval_script": task.eval_script,
    }


def standard_predictions(tasks: Sequence[TaskInstance], gold: bool = True, empty: bool = True) -> list[Prediction]:
    """The reference fix ('gold') and the empty patch ('empty') of every task."""
    out = [Prediction(t.instance_id, t.patch, "gold") for t in tasks if gold]
    return out + [Prediction(t.instance_id, "", "empty") for t in tasks if empty]


def round_numbers(predictions: Sequence[Prediction]) -> list[int]:
    """Each prediction's round: the first that holds no other prediction of its instance."""
    taken: list[set[str]] = []
    numbers = []
    for prediction in predictions:
        number = next((n for n, ids in enumerate(taken) if prediction.instance_id not in ids), len(taken))
        if number == len(taken):
            taken.append(set())
        taken[number].add(prediction.instance_id)
        numbers.append(number)
    return numbers


def rounds(predictions: Sequence[Prediction]) -> list[list[Prediction]]:
    """The predictions dealt into rounds holding at most one prediction per instance, in order."""
    numbers = round_numbers(predictions)
    return [
        [p for p, n in zip(predictions, numbers, strict=True) if n == k] for k in range(max(numbers, default=-1) + 1)
    ]


async def swerl_verdicts(
    provider: SandboxProvider,
    tasks: dict[str, TaskInstance],
    predictions: Sequence[Prediction],
    test_timeout_s: float,
    concurrency: int = 2,
) -> list[Verdict]:
    """swerl's grader on every prediction; an InfraError is no verdict, named by its cause."""
    gate = asyncio.Semaphore(concurrency)

    async def one(prediction: Prediction) -> Verdict:
        async with gate:
            try:
                graded = await grade_attempt(provider, tasks[prediction.instance_id], prediction.patch, test_timeout_s)
            except InfraError as exc:
                return Verdict(None, f"INFRA_ERROR:{exc.cause}", exc.message[-300:])
        grade = graded.grade
        return Verdict(grade.resolved, grade.status, graded.detail)

    return list(await asyncio.gather(*(one(p) for p in predictions)))


def swebench_verdicts(
    tasks: dict[str, TaskInstance],
    predictions: Sequence[Prediction],
    workdir: Path,
    test_timeout_s: float,
    workers: int = 2,
    python: str = sys.executable,
) -> tuple[list[Verdict], list[str]]:
    """swebench's run_evaluation on every prediction, one run per round, each in workdir/round-N; and the network
    modes of the containers it created."""
    by_key: dict[tuple[int, str, str], Verdict] = {}
    networks: set[str] = set()
    for number, dealt in enumerate(rounds(predictions)):
        where = workdir / f"round-{number}"
        where.mkdir(parents=True, exist_ok=True)
        rows = [swebench_row(tasks[p.instance_id]) for p in dealt]
        (where / "dataset.json").write_text(json.dumps(rows, indent=1))
        preds = [{"instance_id": p.instance_id, "model_patch": p.patch, "model_name_or_path": p.label} for p in dealt]
        (where / "predictions.jsonl").write_text("".join(json.dumps(p) + "\n" for p in preds))
        command = [
            python,
            "-m",
            "swerl.grading.swebench_referee",
            "--dataset",
            "dataset.json",
            "--predictions",
            "predictions.jsonl",
            "--run-id",
            f"crosscheck-{number}",
            "--out",
            "verdicts.json",
            "--workers",
            str(workers),
            "--timeout",
            str(int(test_timeout_s)),
            "--report-dir",
            "reports",
        ]
        # No timeout of ours: swebench bounds each instance's eval script by --timeout.
        done = subprocess.run(command, cwd=where, capture_output=True, text=True)
        (where / "referee.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            raise RuntimeError(
                f"swebench's harness failed (exit {done.returncode}, log {where / 'referee.log'}): "
                f"{done.stderr.strip()[-800:]}"
            )
        result = json.loads((where / "verdicts.json").read_text())
        networks.update(result["container_networks"])
        for v in result["verdicts"]:
            by_key[(number, v["instance_id"], v["model"])] = Verdict(v["resolved"], v["status"], v.get("detail", ""))
    missing = Verdict(None, "NOT_REPORTED", "swebench's harness wrote no verdict for it")
    numbers = round_numbers(predictions)
    verdicts = [by_key.get((n, p.instance_id, p.label), missing) for p, n in zip(predictions, numbers, strict=True)]
    return verdicts, sorted(networks)


def crosscheck(
    provider: SandboxProvider,
    tasks: Sequence[TaskInstance],
    predictions: Sequence[Prediction],
    workdir: Path,
    test_timeout_s: float = 600.0,
    workers: int = 2,
) -> CrosscheckReport:
    """Grade `predictions` with swerl's grader and with swebench's harness and compare (see the module docstring).
    Raises ValueError for a prediction of an unknown task or a task swebench's harness cannot run."""
    by_id = {t.instance_id: t for t in tasks}
    unknown = sorted({p.instance_id for p in predictions} - set(by_id))
    if unknown:
        raise ValueError(f"predictions for tasks not given: {unknown[:5]}")
    for instance_id in {p.instance_id for p in predictions}:
        swebench_row(by_id[instance_id])  # refuses a task swebench cannot run before anything starts
    workdir.mkdir(parents=True, exist_ok=True)

    # The two graders share nothing: they run at once.
    async def both() -> tuple[list[Verdict], tuple[list[Verdict], list[str]]]:
        return await asyncio.gather(
            swerl_verdicts(provider, by_id, predictions, test_timeout_s, workers),
            asyncio.to_thread(swebench_verdicts, by_id, predictions, workdir, test_timeout_s, workers),
        )

    ours, (theirs, networks) = asyncio.run(both())
    comparisons = [
        Comparison(p.instance_id, p.label, a, b, p.recorded) for p, a, b in zip(predictions, ours, theirs, strict=True)
    ]
    report = CrosscheckReport(comparisons, str(workdir), networks)
    (workdir / "crosscheck.json").write_text(json.dumps(report.to_dict(), indent=1))
    (workdir / "crosscheck.md").write_text(report.table())
    return report


def read_predictions(path: Path) -> list[Prediction]:
    """Predictions from a file: SWE-bench's (JSONL or JSON rows of instance_id, model_patch, model_name_or_path)
    or an evaluate stage's episodes_MODEL.jsonl (task_id, attempt, patch, and the reward it was graded)."""
    from swerl.data.loaders import read_json_rows

    out = []
    for line, row in read_json_rows(path):
        where = f"{path}:{line}" if line else str(path)
        if "task_id" in row and "patch" in row:
            label = f"{path.stem.removeprefix('episodes_')}/attempt-{row.get('attempt', 0)}"
            reward = row.get("reward")
            recorded = None if reward is None else float(reward) >= 1.0
            out.append(Prediction(str(row["task_id"]), row["patch"] or "", label, recorded))
        elif "instance_id" in row and "model_patch" in row:
            out.append(
                Prediction(
                    str(row["instance_id"]),
                    row["model_patch"] or "",
                    str(row.get("model_name_or_path") or "predictions"),
                )
            )
        else:
            raise ValueError(
                f"{where}: neither a SWE-bench prediction (instance_id, model_patch) nor an "
                "evaluate episode (task_id, patch)"
            )
    return out


def read_tasks(path: Path) -> list[TaskInstance]:
    """SWE-bench-style tasks from rows (parquet/jsonl/json) or swerl's own task parquet, keeping each row's
    version and eval_script (which swebench's harness needs) where the loader does not carry them."""
    from swerl.data.loaders import read_rows, row_to_task
    from swerl.data.taskio import TASK_SCHEMA, tasks_from_parquet

    if path.suffix.lower() == ".parquet":
        import pyarrow.parquet as pq

        if set(TASK_SCHEMA.names) <= set(pq.read_schema(path).names):
            return tasks_from_parquet(path.read_bytes())
    tasks = []
    for index, row in enumerate(read_rows(str(path))):
        task = row_to_task(row, "swebench", str(path), None, index)
        extra = {k: row[k] for k in ("version", "eval_script") if row.get(k) and not getattr(task, k)}
        tasks.append(task.model_copy(update=extra) if extra else task)
    return tasks
