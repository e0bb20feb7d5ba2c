"""Local engine prefix cache: agent-shaped multi-turn trajectories with and without it, side by side.

    .venv/bin/python benchmarks/engine_prefix_cache.py [--trajectories 16] [--turns 6] [--system 150]
        [--observation 60] [--new 48] [--threads 1] [--rounds 2] [--baseline-ref d7efde6]

Each trajectory is what the agent sends an engine: turn 1 is a `--system`-token prompt; turn k+1's input is turn
k's input, its sampled output and a `--observation`-token tool result. `--trajectories` run concurrently (the
engine's batch holds them all). The same workload runs on two engines over the same tiny model (the CPU demo's
size: hidden 256, 4 layers), prefix cache off (the baseline: every turn prefills the whole conversation) and on
(`prefix_cache_size` = trajectories), alternating `--rounds` times, each run in a fresh interpreter; prints wall
time, tokens per CPU-second, prefill tokens and the ratio. Sampling is seeded and identical on both, so both
engines generate the same tokens (checked).

With `--baseline-ref COMMIT`, that commit's `swerl` (extracted with git archive) runs both configurations too, in
the same rounds, and the ratios of this checkout against it are printed; the sampled tokens must be the same.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import build_demo_model, materialise_ref, run_worker

from swerl.engine.base import GenerateRequest, SamplingParams
from swerl.engine.local import LocalEngine


async def workload(engine: LocalEngine, args: argparse.Namespace) -> list[list[int]]:
    """Run every trajectory to its last turn; returns each trajectory's final token list."""
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

    return list(await asyncio.gather(*(trajectory(i) for i in range(args.trajectories))))


async def run_once(args: argparse.Namespace) -> dict[str, Any]:
    """One run in this interpreter (a worker): wall and CPU time, the engine's stats and the trajectories."""
    context = args.system + args.turns * (args.new + args.observation) + 1
    engine = LocalEngine(
        args.model_dir,
        max_batch_size=args.trajectories,
        max_context_tokens=max(context, 64),
        intra_op_threads=args.threads,
        prefix_cache_size=args.cache,
        seed=0,
    )
    start, cpu_start = time.perf_counter(), time.process_time()
    finals = await workload(engine, args)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    stats = engine.stats()
    await engine.close()
    return {"wall_s": wall, "cpu_s": cpu, "stats": stats, "finals": finals}


def main(args: argparse.Namespace) -> None:
    script = Path(__file__).resolve()
    shape = [f"--{name}={getattr(args, name)}" for name in ("trajectories", "turns", "system", "observation", "new")]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_demo_model(Path(tmp) / "model")
        sides: dict[str, Path | None] = {"this checkout": None}
        if args.baseline_ref:
            sides[f"baseline {args.baseline_ref}"] = materialise_ref(args.baseline_ref, Path(tmp) / "baseline")
        runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for _ in range(args.rounds):
            for side, root in sides.items():
                for cache in (0, args.trajectories):
                    worker = [
                        *shape,
                        f"--threads={args.threads}",
                        f"--cache={cache}",
                        f"--model-dir={model_dir}",
                    ]
                    runs.setdefault((side, cache), []).append(run_worker(script, root, worker))
    print(
        f"{args.trajectories} trajectories x {args.turns} turns, system {args.system}, observation "
        f"{args.observation}, {args.new} new tokens per turn, intra-op threads {args.threads}, best of {args.rounds}"
    )
    best = {key: min(results, key=lambda r: r["wall_s"]) for key, results in runs.items()}
    for (side, cache), result in best.items():
        stats = result["stats"]
        label = "prefix cache on " if cache else "prefix cache off"
        tokens_per_cpu_s = stats["generated_tokens"] / min(r["cpu_s"] for r in runs[side, cache])
        print(
            f"{side:>18}, {label}: {result['wall_s']:6.2f} s, {tokens_per_cpu_s:6.1f} tokens per CPU-s; prefilled "
            f"{stats['prefill_tokens']} tokens, reused {stats['prefix_cached_tokens']}; prefill "
            f"{stats['prefill_seconds']:.1f} s, decode {stats['decode_seconds']:.1f} s"
        )
    finals = [r["finals"] for results in runs.values() for r in results]
    same = all(final == finals[0] for final in finals)
    for side in sides:
        speedup = best[side, 0]["wall_s"] / best[side, args.trajectories]["wall_s"]
        print(f"{side}: speed-up with the prefix cache {speedup:.2f}x")
    if args.baseline_ref:
        new, old = sides
        for cache in (0, args.trajectories):
            wall = best[old, cache]["wall_s"] / best[new, cache]["wall_s"]
            cpu = min(r["cpu_s"] for r in runs[old, cache]) / min(r["cpu_s"] for r in runs[new, cache])
            print(
                f"this checkout against the baseline, prefix cache {'on' if cache else 'off'}: {wall:.2f}x wall, "
                f"{cpu:.2f}x CPU"
            )
    print(f"same tokens generated everywhere: {same}")
    if not same:
        raise SystemExit("the runs generated different tokens")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int, default=16)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--system", type=int, default=150, help="first prompt length in tokens")
    parser.add_argument("--observation", type=int, default=60, help="tool result tokens appended per turn")
    parser.add_argument("--new", type=int, default=48, help="tokens sampled per turn")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline-ref", default=None, help="git commit whose engine runs beside this one")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, default=None, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.worker:
        print(json.dumps(asyncio.run(run_once(arguments))))
    else:
        main(arguments)
