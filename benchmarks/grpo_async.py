"""Benchmarks of fully asynchronous GRPO against the synchronous baseline, in one run.

1. sync vs async on the recipe's long-tail profile: a latency-emulating engine (swerl.engine.emulated; 84% of
   trajectories to the turn cap, successful ones a median of 8 turns, ~2.5x spread within a group) drives the real
   agent loop, real local (bubblewrap) sandboxes, real grading and a real GRPOTrainer on a tiny model. Reports the
   step time of each mode, their ratio (target >= 3x) and the async trainer's waiting share (target <= 10%).
2. rollout throughput at 384 and 1024 concurrent trajectories (the manager alone, the trainer not in the way)
   against the Little's-law bound concurrency / mean trajectory time (target >= 90%), and orchestrator CPU per
   LLM call (this process's CPU time; sandbox processes are children and counted apart).

Latencies are scaled down so the whole run takes a few minutes on 2 cores:
    nice -n 19 .venv/bin/python benchmarks/grpo_async.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from swerl.agent.episode import EpisodeLimits, run_episode
from swerl.agent.tools import system_prompt
from swerl.config.grpo import GRPOAlgorithmConfig
from swerl.config.sandbox import SandboxLimits
from swerl.data.environments import resolve_environment
from swerl.data.micro import TEST_CMD
from swerl.data.repos import tree_hash
from swerl.data.schema import TaskInstance
from swerl.engine.base import Engine, GenerateRequest, SamplingParams
from swerl.engine.emulated import EmulatedEngine, EpisodeProfile
from swerl.model.loading import build_tiny_model
from swerl.model.tokenizer import train_tokenizer
from swerl.model.toolcall import format_tool_call
from swerl.rollout.async_loop import AsyncSettings, train_async
from swerl.rollout.groups import EpisodeFn, rollout_groups
from swerl.rollout.journal import Ledger, RolloutJournal
from swerl.rollout.manager import RolloutManager
from swerl.rollout.staleness import StalenessPolicy
from swerl.sandbox.base import SandboxProvider
from swerl.stages.common import episode_with_retries, sandbox_provider
from swerl.stages.grpo import update_settings
from swerl.train.grpo_step import Trainer
from swerl.train.grpo_trainer import GRPOTrainer
from swerl.train.trainer_process import TrainerProcess
from swerl.trajectory import EpisodeStatus, Trajectory

TEST_COMMAND = TEST_CMD  # the micro repositories' harness (pytest -rA summary lines)


# ----------------------------------------------------------------------------------------------------------------
# Building blocks (also used by the tests)


def clean_micro_tasks(count: int, split: str = "train", seed: int = 0) -> list[TaskInstance]:
    """Tasks on unmodified micro repositories: every test passes at the start, so a trajectory that submits
    without touching the code is graded 1 and one that breaks mod.py is graded 0 (real grading decides)."""
    tasks = []
    for index in range(count):
        image = f"micro://{split}/{seed}/{index}"
        path = resolve_environment(image)
        tests = re.findall(r"^def (test_\w+)\(", (path / "tests" / "test_mod.py").read_text(), re.M)
        ids = [f"tests/test_mod.py::{name}" for name in tests]
        tasks.append(
            TaskInstance(
                instance_id=f"clean-{split}-{seed}-{index}",
                repo=f"micro/{split}-{index}",
                base_commit=tree_hash(path),
                problem_statement="Run the tests and submit.",
                patch="(none: the repository is clean)",
                patch_kind="fix",
                FAIL_TO_PASS=ids[:1],
                PASS_TO_PASS=ids[1:],
                image=image,
                test_cmd=TEST_COMMAND,
                source="benchmark",
            )
        )
    return tasks


def emulation_tokenizer(out_dir: Path) -> PreTrainedTokenizerBase:
    """A small byte-level BPE that knows the tool calls and observations the emulated engine produces."""
    calls = [format_tool_call("bash", {"command": c}) for c in ("true", "rm -f mod.py", TEST_COMMAND)]
    corpus = [system_prompt(), *calls, format_tool_call("submit", {}), "Run the tests and submit.\n"]
    return train_tokenizer(corpus * 20, vocab_size=500, out_dir=out_dir)


def agent_episode(
    provider: SandboxProvider,
    tokenizer: PreTrainedTokenizerBase,
    limits: EpisodeLimits,
    retries: int,
    counts: dict[str, int],
) -> EpisodeFn[TaskInstance]:
    """The GRPO stage's episode function: the real agent loop with infrastructure retries."""
    sampling = SamplingParams(max_new_tokens=limits.max_new_tokens_per_turn, temperature=1.0)

    async def episode(engine: Engine, task: TaskInstance, *, attempt: int, group_id: str) -> Trajectory:
        async def once(retry: int) -> Trajectory:
            return await run_episode(
                task,
                engine,
                provider,
                tokenizer,
                limits,
                sampling,
                attempt=attempt,
                group_id=group_id,
                rid=f"{group_id}/{attempt}/{retry}",
            )

        return await episode_with_retries(once, retries, counts)

    return episode


def cpu_seconds() -> tuple[float, float]:
    """(this process, its children) user + system CPU seconds."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


# ----------------------------------------------------------------------------------------------------------------
# Benchmark 1: sync vs async GRPO steps


def tiny_trainer(
    tokenizer: PreTrainedTokenizerBase, positions: int, ppo_epochs: int = 1, num_minibatches: int = 1
) -> GRPOTrainer:
    model = build_tiny_model(
        tokenizer,
        hidden_size=32,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=64,
        max_position_embeddings=positions,
        seed=0,
    )
    algorithm = GRPOAlgorithmConfig(
        lr=1e-4, micro_batch_tokens=16384, ppo_epochs=ppo_epochs, num_minibatches=num_minibatches
    )
    return GRPOTrainer(model, update_settings(algorithm), seed=0, tokenizer=tokenizer)


def tiny_trainer_in_child(
    tokenizer_dir: str, positions: int, ppo_epochs: int = 1, num_minibatches: int = 1
) -> GRPOTrainer:
    """tiny_trainer for a TrainerProcess child (one torch thread, as this process)."""
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    return tiny_trainer(tokenizer, positions, ppo_epochs, num_minibatches)


async def sync_steps(
    trainer: GRPOTrainer,
    engine: EmulatedEngine,
    episode: EpisodeFn[TaskInstance],
    tasks: list[TaskInstance],
    b: int,
    n: int,
    steps: int,
    export: Path,
) -> list[dict[str, float]]:
    """The synchronous baseline (the stage's sync loop): sample B x n, train, sync."""
    history = []
    for step in range(steps):
        started, cpu, calls = time.monotonic(), cpu_seconds()[0], engine.calls
        batch = [tasks[(step * b + i) % len(tasks)] for i in range(b)]
        groups = await rollout_groups(engine, batch, n, episode, b * n, group_prefix=f"sync{step}-")
        waited = time.monotonic() - started
        rollout_cpu_ms = 1000 * (cpu_seconds()[0] - cpu) / max(1, engine.calls - calls)
        stats = await asyncio.to_thread(trainer.train_step, groups)
        sync = time.monotonic()
        await engine.update_weights_from_disk(str(trainer.export_weights(export)), trainer.step)
        total = time.monotonic() - started
        history.append(
            stats
            | {
                "time_wait_rollouts_s": waited,
                "time_weight_sync_s": time.monotonic() - sync,
                "time_total_s": total,
                "share_wait_rollouts": waited / total,
                "agent_cpu_ms_per_llm_call": rollout_cpu_ms,
            }
        )
    return history


async def async_steps(
    trainer: Trainer,
    engine: EmulatedEngine,
    episode: EpisodeFn[TaskInstance],
    tasks: list[TaskInstance],
    b: int,
    n: int,
    steps: int,
    in_flight: int,
    export: Path,
) -> list[dict[str, float]]:
    history: list[dict[str, float]] = []
    manager = RolloutManager(
        engine,
        episode,
        lambda seq: tasks[seq % len(tasks)],
        n_attempts=n,
        max_in_flight=in_flight,
        max_buffered_groups=2 * b,
        journal=RolloutJournal(None, "bench"),
    )
    settings = AsyncSettings(
        steps=trainer.step + steps,
        tasks_per_step=b,
        max_staleness=4,
        staleness_policy=StalenessPolicy.DROP,
        max_requeues=1,
        dynamic_sampling=False,
        max_extra_groups_per_step=32,
        checkpoint_every=0,
        time_budget_s=None,
        max_empty_steps=3,
    )
    async for step in train_async(trainer, engine, manager, settings, Ledger(), export_dir=export):
        history.append(step.stats)
    return history


def benchmark_steps(
    work: Path,
    quick: bool,
    in_flight: int | None = None,
    trainer_process: bool = True,
    ppo_epochs: int = 1,
    num_minibatches: int = 1,
) -> dict[str, Any]:
    """Sync vs async steps; ppo_epochs x num_minibatches optimizer updates per step in every arm."""
    tokenizer = emulation_tokenizer(work / "tokenizer")
    profile = EpisodeProfile(max_turns=12, turn_latency_s=1.0, weight_sync_s=0.05)
    limits = EpisodeLimits(
        max_turns=profile.max_turns,
        max_trajectory_tokens=2048,
        max_new_tokens_per_turn=64,
        command_timeout_s=20,
        test_timeout_s=30,
        max_observation_chars=4000,
        episode_timeout_s=1800.0,
        max_malformed_calls=1_000_000,
    )
    b, n = 4, 4
    in_flight = in_flight or 4 * b * n
    sync_count, async_count = (2, 4) if quick else (3, 8)
    tasks = clean_micro_tasks(16)
    provider = sandbox_provider(SandboxLimits(), git_baseline=True)
    counts: dict[str, int] = {}
    episode = agent_episode(provider, tokenizer, limits, 1, counts)
    schedule = (ppo_epochs, num_minibatches)

    async def run() -> tuple[list[dict[str, float]], list[dict[str, float]]]:
        engine = EmulatedEngine(tokenizer, profile, seed=1)
        sync = await sync_steps(
            tiny_trainer(tokenizer, 2048, *schedule), engine, episode, tasks, b, n, sync_count, work / "sync"
        )
        engine = EmulatedEngine(tokenizer, profile, seed=2)
        in_thread = await async_steps(
            tiny_trainer(tokenizer, 2048, *schedule),
            engine,
            episode,
            tasks,
            b,
            n,
            async_count,
            in_flight,
            work / "async",
        )
        in_process = None
        if trainer_process:
            # The same async loop with the trainer in a process of its own (grpo.trainer_process).
            engine = EmulatedEngine(tokenizer, profile, seed=3)
            with TrainerProcess(tiny_trainer_in_child, str(work / "tokenizer"), 2048, *schedule) as child:
                in_process = await async_steps(
                    child, engine, episode, tasks, b, n, async_count, in_flight, work / "async-process"
                )
        return sync, in_thread, in_process

    sync, in_thread, in_process = asyncio.run(run())
    sync_step = sum(s["time_total_s"] for s in sync) / len(sync)

    def summary(history: list[dict[str, float]]) -> dict[str, Any]:
        steady = history[1:]  # the first async step includes filling the pipeline from empty
        step = sum(s["time_total_s"] for s in steady) / len(steady)
        turn_cap = [s.get("longtail/turn_cap_rate", 0.0) for s in steady]
        return {
            "async_steps_measured": len(steady),
            "async_step_s": step,
            "speedup": sync_step / step,
            "async_wait_share": sum(s["time_wait_rollouts_s"] for s in steady) / sum(s["time_total_s"] for s in steady),
            "update_s_mean": sum(s["time_update_s"] for s in steady) / len(steady),
            "turn_cap_rate": sum(turn_cap) / len(turn_cap),
            "tail_share_after_p90": sum(s.get("longtail/tail_share_after_p90", 0.0) for s in steady) / len(steady),
            "staleness_mean": sum(s.get("staleness/mean", 0.0) for s in steady) / len(steady),
        }

    return {
        "profile": vars(profile),
        "tasks_per_step": b,
        "attempts_per_task": n,
        "sync_concurrency": b * n,
        "async_max_in_flight": in_flight,
        "ppo_epochs": ppo_epochs,
        "num_minibatches": num_minibatches,
        "sync_steps": len(sync),
        "sync_step_s": sync_step,
        "sync_wait_share": sum(s["time_wait_rollouts_s"] for s in sync) / sum(s["time_total_s"] for s in sync),
        **summary(in_thread),
        "trainer_process": summary(in_process) if in_process else None,
        "agent_cpu_ms_per_llm_call": sum(s["agent_cpu_ms_per_llm_call"] for s in sync) / len(sync),
        "infra_failures": counts,
    }


# ----------------------------------------------------------------------------------------------------------------
# Benchmark 2: throughput against Little's law


def lean_episode(provider: SandboxProvider) -> EpisodeFn[TaskInstance]:
    """A rollout-system episode: a real sandbox per trajectory (start, one command, close) and the plan's LLM calls
    to the emulated engine, without the agent's chat-template bookkeeping and grading (their CPU per turn, measured
    in benchmark 1, would cap a 2-core machine far below 1024 concurrent trajectories)."""
    sampling = SamplingParams(max_new_tokens=64)

    async def episode(engine: Engine, task: TaskInstance, *, attempt: int, group_id: str) -> Trajectory:
        assert isinstance(engine, EmulatedEngine)
        rid = f"{group_id}/{attempt}/0"
        sandbox = await provider.start(resolve_environment(task.image), None)
        ids, mask, logprobs, versions = [1], [0], [0.0], [-1]
        try:
            await sandbox.exec("true", timeout=60)
            for _ in range(engine.plan(engine.trajectory_key(rid)).turns):
                response = await engine.generate(GenerateRequest(input_ids=ids, sampling_params=sampling, rid=rid))
                ids += response.output_ids
                mask += [1] * len(response.output_ids)
                logprobs += response.output_token_logprobs
                versions += response.output_token_weight_versions or []
        finally:
            await sandbox.close()
        return Trajectory(
            task_id=task.instance_id,
            attempt=attempt,
            group_id=group_id,
            status=EpisodeStatus.TURN_CAP,
            reward=0.0,
            prompt_tokens=1,
            token_ids=ids,
            loss_mask=mask,
            behaviour_logprobs=logprobs,
            token_weight_versions=versions,
        )

    return episode


def benchmark_throughput(work: Path, concurrency: int, duration_s: float, profile: EpisodeProfile) -> dict[str, Any]:
    tokenizer = emulation_tokenizer(work / "tokenizer")
    tasks = clean_micro_tasks(16)
    counts: dict[str, int] = {}
    episode = lean_episode(sandbox_provider(SandboxLimits(), git_baseline=False))

    async def run() -> dict[str, Any]:
        engine = EmulatedEngine(tokenizer, profile, seed=concurrency)
        manager = RolloutManager(
            engine,
            episode,
            lambda seq: tasks[seq % len(tasks)],
            n_attempts=4,
            max_in_flight=concurrency,
            max_buffered_groups=1_000_000,
            journal=RolloutJournal(None, "bench"),
        )
        finished: list[tuple[float, float, float]] = []  # (start, finish, planned LLM seconds) per trajectory
        manager.start()
        # Warm-up: all start at once, so completions come in waves at first; after 1.5 waves (the slowness factors
        # spread them) the window sees a steady state.
        warmup_deadline = time.time() + 900
        while manager.finished < 1.5 * concurrency and time.time() < warmup_deadline:
            await asyncio.sleep(0.5)
        cpu0, calls0, window0 = cpu_seconds(), engine.calls, time.time()
        in_flight_samples = []
        while time.time() - window0 < duration_s:
            await asyncio.sleep(0.5)
            in_flight_samples.append(manager.in_flight)
        window1, cpu1, calls1 = time.time(), cpu_seconds(), engine.calls
        while manager.buffer:
            group = manager.buffer.popleft()
            finished += [
                (
                    a.started_at,
                    a.finished_at,
                    engine.planned_llm_seconds(f"{a.trajectory.group_id}/{a.trajectory.attempt}"),
                )
                for a in group.attempts
            ]
        await manager.close()
        done = [(s, f, p) for s, f, p in finished if window0 <= f <= window1]
        if not done:
            return {
                "concurrency": concurrency,
                "trajectories_in_window": 0,
                "note": "none finished in the window",
            }
        mean_t = sum(f - s for s, f, _ in done) / len(done)
        planned_t = sum(p for _, _, p in done) / len(done)
        rate = len(done) / (window1 - window0)
        return {
            "concurrency": concurrency,
            "window_s": window1 - window0,
            "trajectories_in_window": len(done),
            "trajectories_per_hour": rate * 3600,
            "mean_trajectory_s": mean_t,
            "littles_bound_per_hour": concurrency / mean_t * 3600,
            "share_of_bound": rate * mean_t / concurrency,
            "planned_llm_s_mean": planned_t,
            "share_of_llm_only_bound": rate * planned_t / concurrency,
            "mean_in_flight": sum(in_flight_samples) / max(1, len(in_flight_samples)),
            "llm_calls": calls1 - calls0,
            "orchestrator_cpu_ms_per_llm_call": 1000 * (cpu1[0] - cpu0[0]) / max(1, calls1 - calls0),
            "sandbox_cpu_ms_per_llm_call": 1000 * (cpu1[1] - cpu0[1]) / max(1, calls1 - calls0),
            "infra_failures": dict(counts),
        }

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, shorter windows (a smoke run)")
    parser.add_argument("--skip", choices=["steps", "throughput"], action="append", default=[])
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument(
        "--in-flight", type=int, default=None, help="benchmark 1: async trajectories in flight (default 4 x B x n = 64)"
    )
    parser.add_argument(
        "--no-trainer-process",
        action="store_true",
        help="benchmark 1: skip the async arm with the trainer in a process of its own",
    )
    parser.add_argument(
        "--ppo-epochs", type=int, default=1, help="benchmark 1: passes over each batch per step (configs/local.yaml: 4)"
    )
    parser.add_argument(
        "--num-minibatches", type=int, default=1, help="benchmark 1: optimizer updates per pass (configs/local.yaml: 2)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="swerl-bench-grpo-async-") as tmp:
        work = Path(tmp)
        if "steps" not in args.skip:
            results["steps"] = steps = benchmark_steps(
                work,
                args.quick,
                args.in_flight,
                not args.no_trainer_process,
                args.ppo_epochs,
                args.num_minibatches,
            )
            for label, arm in (
                ("trainer in a thread", steps),
                ("trainer in a process", steps["trainer_process"]),
            ):
                if arm is None:
                    continue
                print(
                    f"[1] step time sync {steps['sync_step_s']:.1f} s, async ({label}) {arm['async_step_s']:.1f} s: "
                    f"{arm['speedup']:.2f}x (target >= 3x); async trainer waiting {100 * arm['async_wait_share']:.0f}% "
                    f"(target <= 10%; sync {100 * steps['sync_wait_share']:.0f}%), update {arm['update_s_mean']:.1f} s",
                    flush=True,
                )
        if "throughput" not in args.skip:
            results["throughput"] = []
            for concurrency, turn_latency in ((384, 1.0), (1024, 2.5)):
                profile = EpisodeProfile(max_turns=12, turn_latency_s=turn_latency)
                duration = 20.0 if args.quick else 60.0 * concurrency / 384  # the window after warm-up
                row = benchmark_throughput(work, concurrency, duration, profile)
                results["throughput"].append(row)
                if not row["trajectories_in_window"]:
                    print(f"[2] {concurrency} concurrent: no trajectory finished in the window", flush=True)
                    continue
                print(
                    f"[2] {concurrency} concurrent: {row['trajectories_per_hour']:.0f} trajectories/h, "
                    f"{100 * row['share_of_bound']:.0f}% of the Little's-law bound "
                    f"({row['littles_bound_per_hour']:.0f}/h, mean trajectory {row['mean_trajectory_s']:.1f} s); "
                    f"orchestrator CPU {row['orchestrator_cpu_ms_per_llm_call']:.2f} ms per LLM call",
                    flush=True,
                )
    print(json.dumps(results, indent=2, default=str))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
