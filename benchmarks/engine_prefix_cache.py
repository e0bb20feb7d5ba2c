"""Local engine prefix cache: agent-shaped multi-turn trajectories with and without it, side by side.

    .venv/bin/python benchmarks/engine_prefix_cache.py [--trajectories 16] [--turns 6] [--system 150]
        [--observation 60] [--new 48] [--threads 1] [--rounds 2]

Each trajectory is what the agent sends an engine: turn 1 is a `--system`-token prompt; turn k+1's input is turn
k's input, its sampled output and a `--observation`-token tool result. `--trajectories` run concurrently (the
engine's batch holds them all). The same workload runs on two engines over the same tiny model (the CPU demo's
size: hidden 256, 4 layers), prefix cache off (the baseline: every turn prefills the whole conversation) and on
(`prefix_cache_size` = trajectories), alternating `--rounds` times; prints wall time, prefill tokens and the ratio.
Sampling is seeded and identical on both, so both engines generate the same tokens (checked).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import torch
from common import build_demo_model

from swerl.engine.base import GenerateRequest, SamplingParams
from swerl.engine.local import LocalEngine


async def workload(engine: LocalEngine, args: argparse.Namespace) -> tuple[float, list[list[int]]]:
    """Run every trajectory to its last turn; returns the wall time and each trajectory's final token list."""
    params = SamplingParams(max_new_tokens=args.new, temperature=0.7, ignore_eos=True)

    async def trajectory(index: int) -> list[int]:
        generator = torch.Generator().manual_seed(index)

        def tokens(count: int) -> list[int]:
            return torch.randint(10, engine.vocab_size, (count,), generator=generator).tolist()

        conversation = tokens(args.system)
        for _ in range(args.turns):
            request = GenerateRequest(input_ids=conversation, sampling_params=params, rid=f"traj-{index}")
            response = await engine.generate(request)
            conversation = conversation + response.output_ids + tokens(args.observation)
        return conversation

    start = time.perf_counter()
    finals = await asyncio.gather(*(trajectory(i) for i in range(args.trajectories)))
    return time.perf_counter() - start, list(finals)


async def main(args: argparse.Namespace) -> None:
    context = args.system + args.turns * (args.new + args.observation) + 1
    with tempfile.TemporaryDirectory() as tmp:
        path = build_demo_model(Path(tmp))
        engines = {
            cache: LocalEngine(
                path,
                max_batch_size=args.trajectories,
                max_context_tokens=max(context, 64),
                intra_op_threads=args.threads,
                prefix_cache_size=cache,
                seed=0,
            )
            for cache in (0, args.trajectories)
        }
        times: dict[int, list[float]] = {cache: [] for cache in engines}
        finals: dict[int, list[list[int]]] = {}
        for _ in range(args.rounds):
            for cache, engine in engines.items():
                await engine.flush_cache()
                elapsed, finals[cache] = await workload(engine, args)
                times[cache].append(elapsed)
        same = finals[0] == finals[args.trajectories]
        print(
            f"{args.trajectories} trajectories x {args.turns} turns, system {args.system}, observation "
            f"{args.observation}, {args.new} new tokens per turn, intra-op threads {args.threads}"
        )
        for cache, engine in engines.items():
            stats = engine.stats()
            label = "prefix cache on " if cache else "prefix cache off"
            print(
                f"{label}: best {min(times[cache]):6.2f} s of {args.rounds}; prefilled {stats['prefill_tokens']} "
                f"tokens, reused {stats['prefix_cached_tokens']}; prefill {stats['prefill_seconds']:.1f} s, "
                f"decode {stats['decode_seconds']:.1f} s"
            )
            await engine.close()
        speedup = min(times[0]) / min(times[args.trajectories])
        print(f"speed-up with the prefix cache: {speedup:.2f}x (same tokens generated: {same})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trajectories", type=int, default=16)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--system", type=int, default=150, help="first prompt length in tokens")
    parser.add_argument("--observation", type=int, default=60, help="tool result tokens appended per turn")
    parser.add_argument("--new", type=int, default=48, help="tokens sampled per turn")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    asyncio.run(main(parser.parse_args()))
