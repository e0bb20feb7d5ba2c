"""CPU SFT probe: what a tiny model learns on swerl's own task family, end to end in real sandboxes.

Phases (each writes its artifacts under --out and is skipped when they exist, so a later phase can be rerun):
  synth    tasks from the shipped repositories (modifiers whose oracle fix is a short sed substitution),
           split by repository (--eval-repos held out)
  oracle   oracle traces on the train tasks (one direct and, optionally, one recovery trace per task)
  train    a byte-level BPE tokenizer and a tiny Qwen3, SFT for a fixed wall-clock budget (fp32)
  eval     held-out pass@1 (greedy, sampled), train-task pass@1 and the untrained model, with real episodes

The result (counts, token lengths, SFT curve, pass@1, failure breakdown, wall time per phase) goes to
--out/result.json. Run under `nice -n 19` on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import re
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from swerl.agent.episode import EpisodeLimits, run_episode
from swerl.agent.oracle import OracleSkip, solve_task
from swerl.agent.traces import oracle_rows, trace_to_example, write_traces
from swerl.config.sandbox import SandboxLimits
from swerl.data.repos import builtin_repo, builtin_repo_names
from swerl.data.schema import TaskInstance
from swerl.data.synth import synthesize_repo
from swerl.data.taskio import tasks_from_parquet, tasks_to_parquet
from swerl.engine.base import SamplingParams
from swerl.engine.local import LocalEngine
from swerl.errors import InfraError
from swerl.model.loading import build_tiny_model, load_model_and_tokenizer, save_model_and_tokenizer
from swerl.model.tokenizer import train_tokenizer
from swerl.sandbox import LocalSandboxProvider
from swerl.stages.common import sandbox_provider
from swerl.stages.curate import split_by_repo
from swerl.train.sft import StepMetrics, train_sft
from swerl.trajectory import Trajectory

log = logging.getLogger("cpu_sft_probe")

SED_MODIFIERS = ("flip_comparison", "swap_binop", "negate_condition", "off_by_one", "swap_call_args")
SHORT_TEST_COMMAND = "python -m pytest -q -x --tb=short 2>&1 | tail -n 8"
"""Shorter than the oracle's default (tail -n 15): the failing assertion and the summary line."""


# ------------------------------------------------------------------------------------------------------------------
# Helpers


def provider() -> LocalSandboxProvider:
    made = sandbox_provider(SandboxLimits(), git_baseline=True)
    assert isinstance(made, LocalSandboxProvider)
    return made


def short_statement(statement: str) -> str:
    """The synthesized problem statement cut to its first failing test (the statement's head and tail kept)."""
    lines = statement.splitlines()
    listed = [i for i, line in enumerate(lines) if line.startswith("- ")]
    if len(listed) <= 1:
        return statement
    return "\n".join(lines[: listed[0] + 1] + lines[listed[-1] + 1 :])


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "n": len(values),
        "mean": round(statistics.fmean(values), 1),
        "p50": ordered[(len(ordered) - 1) // 2],
        "p90": ordered[int(0.9 * (len(ordered) - 1))],
        "max": ordered[-1],
    }


# ------------------------------------------------------------------------------------------------------------------
# Phase 1: tasks


async def synthesize(args: argparse.Namespace) -> tuple[list[TaskInstance], dict[str, Any]]:
    sandboxes = provider()
    tasks: list[TaskInstance] = []
    reports = {}
    for name in builtin_repo_names():
        repo_tasks, report = await synthesize_repo(
            builtin_repo(name),
            sandboxes,
            modifiers=list(SED_MODIFIERS),
            max_candidates=args.candidates_per_repo,
            max_tasks=10_000,
            seed=args.seed,
            workers=2,
            test_timeout_s=60,
            clean_runs=1,
            bugged_timeout_factor=5.0,
            min_bugged_timeout_s=10.0,
        )
        log.info("synth %s: %s valid in %.0fs", name, report.valid, report.duration_s)
        tasks += repo_tasks
        reports[name] = report.to_dict()
    return tasks, reports


def phase_synth(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    train_path, eval_path = out / "train.parquet", out / "eval.parquet"
    if train_path.exists() and eval_path.exists():
        return json.loads((out / "synth.json").read_text())
    started = time.monotonic()
    tasks, reports = asyncio.run(synthesize(args))
    if args.short_statement:
        tasks = [t.model_copy(update={"problem_statement": short_statement(t.problem_statement)}) for t in tasks]
    train, held_out, _ = split_by_repo(tasks, args.eval_repos)
    train_path.write_bytes(tasks_to_parquet(train))
    eval_path.write_bytes(tasks_to_parquet(held_out))
    result = {
        "train_tasks": len(train),
        "eval_tasks": len(held_out),
        "train_by_modifier": dict(Counter(t.modifier for t in train)),
        "eval_by_modifier": dict(Counter(t.modifier for t in held_out)),
        "by_repo": {name: sum(r["valid"].values()) for name, r in reports.items()},
        "rejections": dict(sum((Counter(r["rejections"]) for r in reports.values()), Counter())),
        "statement_chars": summary([len(t.problem_statement) for t in tasks]),
        "wall_s": round(time.monotonic() - started, 1),
    }
    write_json(out / "synth.json", result)
    return result


def load_tasks(out: Path) -> tuple[list[TaskInstance], list[TaskInstance]]:
    return (
        tasks_from_parquet((out / "train.parquet").read_bytes()),
        tasks_from_parquet((out / "eval.parquet").read_bytes()),
    )


# ------------------------------------------------------------------------------------------------------------------
# Phase 2: oracle traces


async def oracle_traces(
    tasks: list[TaskInstance], limits: EpisodeLimits, args: argparse.Namespace
) -> tuple[list[Any], Counter[str]]:
    """Trace k of a task: k == 0 solves it directly, k > 0 makes (another) wrong edit first and recovers.

    solve_task is called directly (not generate_oracle_traces) because only it takes the test command.
    """
    sandboxes = provider()
    gate = asyncio.Semaphore(args.oracle_workers)
    deadline = time.monotonic() + args.oracle_budget_s
    outcomes: Counter[str] = Counter()

    async def one(task: TaskInstance, k: int) -> Any:
        async with gate:
            if time.monotonic() > deadline:
                outcomes["skipped:time_budget"] += 1
                return None
            rng = random.Random(f"{args.seed}:{task.instance_id}:{k}")
            try:
                trace = await solve_task(
                    task,
                    sandboxes,
                    limits,
                    rng,
                    recovery=k > 0,
                    context_lines=3,
                    view_whole_file_lines=0,
                    view_function_lines=0,
                    test_command=args.test_command,
                )
            except OracleSkip as exc:
                outcomes[f"skipped:{exc.reason}"] += 1
                return None
            except InfraError as exc:
                outcomes[f"infra_error:{exc.cause}"] += 1
                return None
            outcomes["traced_recovery" if trace.recovery else "traced_direct"] += 1
            return trace

    # Direct traces of every task first, then recovery traces, so a time budget cuts the recovery ones.
    jobs = [(task, k) for k in range(args.traces_per_task) for task in tasks]
    traces = await asyncio.gather(*(one(task, k) for task, k in jobs))
    unique: dict[str, Any] = {}
    for trace in traces:
        if trace is not None:
            key = json.dumps(trace.messages)
            if key in unique:
                outcomes["duplicate"] += 1
            unique.setdefault(key, trace)
    return list(unique.values()), outcomes


def phase_oracle(args: argparse.Namespace, out: Path, limits: EpisodeLimits) -> dict[str, Any]:
    path = out / "traces.jsonl"
    if path.exists():
        return json.loads((out / "oracle.json").read_text())
    started = time.monotonic()
    train, _ = load_tasks(out)
    traces, outcomes = asyncio.run(oracle_traces(train, limits, args))
    rows = oracle_rows(traces)
    write_traces(rows, path)
    result = {
        "traces": len(rows),
        "tasks_with_trace": len({r["instance_id"] for r in rows}),
        "recovery_traces": sum(r["recovery"] for r in rows),
        "edit_kinds": dict(Counter(r["edit_kind"] for r in rows)),
        "outcomes": dict(outcomes),
        "test_command": args.test_command,
        "wall_s": round(time.monotonic() - started, 1),
    }
    write_json(out / "oracle.json", result)
    return result


def load_rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "traces.jsonl").read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------------------------------
# Phase 3: tokenizer + SFT


def tokenizer_corpus(rows: list[dict[str, Any]], eval_repos: list[str]) -> list[str]:
    """Trace texts plus the Python sources of the training repositories (never the held-out ones)."""
    texts = ["\n".join(m["content"] for m in row["messages"]) for row in rows]
    for name in builtin_repo_names():
        if name not in eval_repos:
            texts += [p.read_text() for p in sorted(builtin_repo(name).path.rglob("*.py"))]
    return texts


class _OutOfTime(Exception):
    """Raised from the SFT step hook when the wall-clock budget is spent."""


def phase_train(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    model_dir = out / "model"
    if (model_dir / "config.json").exists():
        return json.loads((out / "train.json").read_text())
    started = time.monotonic()
    rows = load_rows(out)
    tokenizer = train_tokenizer(tokenizer_corpus(rows, args.eval_repos), args.vocab_size, out / "tokenizer")
    examples = [trace_to_example(tokenizer, row, i) for i, row in enumerate(rows)]
    lengths = [len(ids) for ids, _ in examples]
    targets = [sum(mask) for _, mask in examples]
    tokenizer_s = time.monotonic() - started

    def new_model() -> Any:
        return build_tiny_model(
            tokenizer,
            args.hidden,
            args.layers,
            args.heads,
            args.kv_heads,
            args.ffn,
            args.max_positions,
            seed=args.seed,
        )

    sft_kwargs = dict(
        seq_len=args.seq_len,
        rows_per_micro_batch=args.rows,
        lr=args.lr,
        warmup_steps=args.warmup,
        seed=args.seed,
        pad_token_id=tokenizer.pad_token_id,
    )
    # Calibrate: seconds per step on a throwaway model, so the cosine schedule ends when the budget does.
    times: list[float] = []
    calibration = sft_kwargs | {"warmup_steps": 0}
    train_sft(new_model(), examples, max_steps=4, **calibration, on_step=lambda m: times.append(m.seconds))
    seconds_per_step = statistics.fmean(times[1:])
    max_steps = max(args.warmup + 1, int(args.sft_budget_s / seconds_per_step))
    log.info("SFT: %.2fs/step measured -> %d steps for %ds", seconds_per_step, max_steps, args.sft_budget_s)

    model = new_model()
    curve: list[StepMetrics] = []
    sft_started = time.monotonic()

    def on_step(metrics: StepMetrics) -> None:
        curve.append(metrics)
        if metrics.step % 25 == 0:
            log.info(
                "SFT step %d/%d loss %.3f %.0f tok/s", metrics.step, max_steps, metrics.loss, metrics.tokens_per_second
            )
        if time.monotonic() - sft_started > 1.15 * args.sft_budget_s:
            raise _OutOfTime()

    stopped_early = False
    try:
        train_sft(model, examples, max_steps=max_steps, **sft_kwargs, on_step=on_step)
    except _OutOfTime:
        stopped_early = True
    sft_s = time.monotonic() - sft_started
    save_model_and_tokenizer(model, tokenizer, model_dir)
    save_model_and_tokenizer(new_model(), tokenizer, out / "base_model")
    every = max(1, len(curve) // 20)
    result = {
        "vocab_size": len(tokenizer),
        "parameters": sum(p.numel() for p in model.parameters()),
        "examples": len(examples),
        "tokens_per_trace": summary([float(n) for n in lengths]),
        "assistant_tokens_per_trace": summary([float(n) for n in targets]),
        "planned_steps": max_steps,
        "steps": len(curve),
        "stopped_early": stopped_early,
        "tokens": sum(m.num_tokens for m in curve),
        "target_tokens": sum(m.num_targets for m in curve),
        "epochs": round(sum(m.num_tokens for m in curve) / max(1, sum(lengths)), 2),
        "tokens_per_second": round(sum(m.num_tokens for m in curve) / sft_s),
        "loss_curve": [[m.step, round(m.loss, 4)] for m in curve[::every]]
        + [[curve[-1].step, round(curve[-1].loss, 4)]],
        "final_loss_last10": round(statistics.fmean(m.loss for m in curve[-10:]), 4),
        "tokenizer_and_examples_s": round(tokenizer_s, 1),
        "sft_s": round(sft_s, 1),
        "wall_s": round(time.monotonic() - started, 1),
    }
    write_json(out / "train.json", result)
    return result


# ------------------------------------------------------------------------------------------------------------------
# Phase 4: episodes with the real engine in real sandboxes


_SED_LINE = re.compile(r"sed -i '(\d+)s/")


def fix_line(task: TaskInstance) -> int | None:
    """The broken line (1-based) the bug diff changed, as the oracle addresses it."""
    match = re.search(r"^@@ -\d+(?:,\d+)? \+(\d+)", task.patch, re.MULTILINE)
    if match is None:
        return None
    start = int(match.group(1))
    body = task.patch[match.end() :].splitlines()[1:]
    before = 0
    for line in body:
        if line.startswith(("+", "-")):
            return start + before
        before += line.startswith(" ") or line == ""
    return None


def diagnose(trajectory: Trajectory, task: TaskInstance) -> str:
    """Why an unresolved episode failed, from its messages: the first matching reason."""
    if trajectory.status.value == "infra_error":
        return "infra_error"
    calls = [m["content"] for m in trajectory.messages if m["role"] == "assistant"]
    edits = [c for c in calls if "sed -i" in c or '"str_replace"' in c]
    lines = [int(m.group(1)) for c in edits if (m := _SED_LINE.search(c))]
    target = fix_line(task)
    if trajectory.malformed_tool_calls and not edits:
        return "malformed_calls_no_edit"
    if not edits:
        return "no_edit"
    if len(edits) != len(set(edits)) and trajectory.status.value != "unresolved":
        return "repeated_edit_until_cap"
    bug_file = re.search(r"^\+\+\+ b/(\S+)", task.patch, re.MULTILINE)
    if bug_file and not any(bug_file.group(1) in c for c in edits):
        return "wrong_file"
    if lines and target not in lines:
        near = target is not None and min(abs(n - target) for n in lines) <= 3
        return "wrong_line_near" if near else "wrong_line_far"
    if lines:
        return "right_line_wrong_substitution"
    return "str_replace_edit_failed"


async def episodes(
    model_dir: Path,
    jobs: list[tuple[TaskInstance, SamplingParams, int]],
    limits: EpisodeLimits,
    args: argparse.Namespace,
) -> list[Trajectory]:
    _, tokenizer = load_model_and_tokenizer(model_dir)
    sandboxes = provider()
    gate = asyncio.Semaphore(args.episode_concurrency)
    async with LocalEngine(
        model_dir,
        max_batch_size=args.episode_concurrency,
        max_context_tokens=limits.max_trajectory_tokens,
        seed=args.seed,
        intra_op_threads=1,
        prefix_cache_size=0,
    ) as engine:

        async def one(task: TaskInstance, sampling: SamplingParams, attempt: int) -> Trajectory:
            async with gate:
                return await run_episode(task, engine, sandboxes, tokenizer, limits, sampling, attempt=attempt)

        return await asyncio.gather(*(one(*job) for job in jobs))


def score(name: str, tasks: list[TaskInstance], trajectories: list[Trajectory], wall_s: float) -> dict[str, Any]:
    by_id = {t.instance_id: t for t in tasks}
    scored = [t for t in trajectories if t.reward is not None]
    resolved = sum(t.reward == 1.0 for t in scored)
    per_task: dict[str, list[float]] = {}
    for t in scored:
        per_task.setdefault(t.task_id, []).append(float(t.reward or 0.0))
    by_modifier: dict[str, list[int]] = {}
    for t in scored:
        counts = by_modifier.setdefault(by_id[t.task_id].modifier or "", [0, 0])
        counts[0] += t.reward == 1.0
        counts[1] += 1
    return {
        "name": name,
        "episodes": len(trajectories),
        "scored": len(scored),
        "resolved": resolved,
        "pass@1": round(resolved / max(1, len(scored)), 3),
        "tasks": len(per_task),
        "tasks_any_resolved": sum(max(v) == 1.0 for v in per_task.values()),
        "tasks_mixed": sum(0 < sum(v) < len(v) for v in per_task.values()),
        "by_modifier": {m: f"{c[0]}/{c[1]}" for m, c in sorted(by_modifier.items())},
        "status": dict(Counter(t.status.value for t in trajectories)),
        "failure_why": dict(Counter(diagnose(t, by_id[t.task_id]) for t in trajectories if t.reward != 1.0)),
        "malformed_calls": sum(t.malformed_tool_calls for t in trajectories),
        "turns": summary([float(t.num_turns) for t in trajectories]),
        "tokens": summary([float(len(t.token_ids)) for t in trajectories]),
        "wall_s": round(wall_s, 1),
    }


def phase_eval(args: argparse.Namespace, out: Path, limits: EpisodeLimits) -> dict[str, Any]:
    train, held_out = load_tasks(out)
    rng = random.Random(args.seed)
    eval_tasks = rng.sample(held_out, min(args.eval_tasks, len(held_out)))
    train_tasks = rng.sample(train, min(args.train_eval_tasks, len(train)))
    greedy = SamplingParams(max_new_tokens=limits.max_new_tokens_per_turn, temperature=0.0)
    sampled = SamplingParams(max_new_tokens=limits.max_new_tokens_per_turn, temperature=args.temperature)
    suites = {
        "heldout_greedy": (out / "model", [(t, greedy, 0) for t in eval_tasks]),
        "heldout_sampled": (
            out / "model",
            [(t, sampled, k) for t in eval_tasks for k in range(args.samples)],
        ),
        "train_greedy": (out / "model", [(t, greedy, 0) for t in train_tasks]),
        "base_greedy": (out / "base_model", [(t, greedy, 0) for t in eval_tasks[: args.base_tasks]]),
    }
    results = {}
    examples_dir = out / "episodes"
    examples_dir.mkdir(exist_ok=True)
    for name in args.eval_suites.split(","):
        model_dir, jobs = suites[name]
        started = time.monotonic()
        trajectories = asyncio.run(episodes(model_dir, jobs, limits, args))
        results[name] = score(name, [job[0] for job in jobs], trajectories, time.monotonic() - started)
        log.info("eval %s: %s", name, {k: results[name][k] for k in ("pass@1", "resolved", "scored", "status")})
        write_json(
            examples_dir / f"{name}.json",
            [
                {
                    "task_id": t.task_id,
                    "attempt": t.attempt,
                    "status": t.status.value,
                    "reward": t.reward,
                    "why": None if t.reward == 1.0 else diagnose(t, {x.instance_id: x for x, _, _ in jobs}[t.task_id]),
                    "fix_line": fix_line({x.instance_id: x for x, _, _ in jobs}[t.task_id]),
                    "messages": t.messages[2:],
                }
                for t in trajectories
            ],
        )
        write_json(out / "eval.json", results)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/experiments/cpu_sft_probe"))
    parser.add_argument("--phases", default="synth,oracle,train,eval", help="comma-separated phases to run")
    parser.add_argument("--seed", type=int, default=0)
    # synth
    parser.add_argument("--candidates-per-repo", type=int, default=40)
    parser.add_argument("--eval-repos", nargs="+", default=["intervals", "money"])
    parser.add_argument("--short-statement", action=argparse.BooleanOptionalAction, default=True)
    # oracle
    parser.add_argument("--test-command", default=SHORT_TEST_COMMAND)
    parser.add_argument("--traces-per-task", type=int, default=3, help="1 direct + N-1 recovery traces")
    parser.add_argument("--oracle-workers", type=int, default=3)
    parser.add_argument("--oracle-budget-s", type=float, default=420)
    # model + SFT
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--ffn", type=int, default=768)
    parser.add_argument("--max-positions", type=int, default=2048)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=4, help="rows of seq-len tokens per optimizer step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--sft-budget-s", type=int, default=720)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for SFT")
    # eval
    parser.add_argument("--eval-suites", default="base_greedy,heldout_greedy,train_greedy,heldout_sampled")
    parser.add_argument("--eval-tasks", type=int, default=40)
    parser.add_argument("--train-eval-tasks", type=int, default=20)
    parser.add_argument("--base-tasks", type=int, default=5)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--episode-concurrency", type=int, default=6)
    parser.add_argument("--max-turns", type=int, default=10)
    parser.add_argument("--max-trajectory-tokens", type=int, default=2048)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    limits = EpisodeLimits(
        max_turns=args.max_turns,
        max_trajectory_tokens=args.max_trajectory_tokens,
        max_new_tokens_per_turn=160,
        command_timeout_s=30,
        max_observation_chars=2000,
        test_timeout_s=60,
        episode_timeout_s=600,
        max_malformed_calls=1_000_000,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    result_path = args.out / "result.json"
    results: dict[str, Any] = json.loads(result_path.read_text()) if result_path.exists() else {}
    results["args"] = {k: str(v) for k, v in vars(args).items()}
    phases = {
        "synth": lambda: phase_synth(args, args.out),
        "oracle": lambda: phase_oracle(args, args.out, limits),
        "train": lambda: phase_train(args, args.out),
        "eval": lambda: phase_eval(args, args.out, limits),
    }
    for name in args.phases.split(","):
        results[name] = phases[name]()
        write_json(result_path, results)


if __name__ == "__main__":
    main()
