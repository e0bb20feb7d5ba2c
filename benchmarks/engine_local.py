"""Local engine throughput on agent-shaped traffic, against another commit's engine side by side.

    .venv/bin/python benchmarks/engine_local.py [--clients 16] [--turns 4] [--prompt-min 150] [--prompt-max 400]
        [--observation-min 40] [--observation-max 80] [--new-min 48] [--new-max 64] [--no-prefix-cache]
        [--temperature 0] [--threads 1] [--rounds 2] [--baseline-ref d7efde6]

Builds the CPU demo's tiny Qwen3 (common.build_demo_model: byte-level BPE of 4096 tokens on the standard library's
source, hidden 256, 4 layers, FFN 768: ~4.5M parameters) in a temporary directory. `--clients` agents run
concurrently, each for `--turns` requests one after another, as an agent's turns: the first prompt is
`--prompt-min`..`--prompt-max` random tokens; each next prompt is the previous prompt, its output and an
observation of `--observation-min`..`--observation-max` tokens; each request asks for `--new-min`..`--new-max`
tokens (all drawn per request, seeded), greedy unless `--temperature`. The engine's batch holds every client
(max_batch_size = clients) and its prefix cache one trajectory per client (unless `--no-prefix-cache`), so
requests join and leave the running batch at different times and a turn prefills only its new tokens, as in the
GRPO stage. Prints generated tokens/s (wall clock, and per CPU-second of the engine's process) over the whole run,
the engine's decode-step and prefill rates (from its stats: wall clock inside the worker thread) and the decode
steps' rate per CPU-second of the worker thread (LocalEngine._decode timed with time.thread_time, the same
method in both engines: on a shared machine the wall-clock rates also count the time other processes held the
core).

With `--baseline-ref COMMIT`, that commit's `swerl` (extracted with git archive into a temporary folder) runs the
same workload: each round runs this checkout's engine then the baseline's, each in a fresh interpreter, so both
see the same machine; prints each side's best round, the ratios (best against best, and each round's), and checks
that both generated the same tokens (greedy, or seeded sampling: the samplers agree token for token).
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

Turn = tuple[list[int], int]  # tokens the turn adds to the prompt (first prompt or observation), max_new_tokens


def workload(args: argparse.Namespace, vocab: int) -> list[list[Turn]]:
    """Per client, its turns; the same on every run."""
    generator = torch.Generator().manual_seed(0)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=generator))

    def tokens(low: int, high: int) -> list[int]:
        return torch.randint(10, vocab, (draw(low, high),), generator=generator).tolist()

    return [
        [
            (
                tokens(args.prompt_min, args.prompt_max)
                if turn == 0
                else tokens(args.observation_min, args.observation_max),
                draw(args.new_min, args.new_max),
            )
            for turn in range(args.turns)
        ]
        for _ in range(args.clients)
    ]


async def run_workload(args: argparse.Namespace) -> dict[str, Any]:
    """One run on this interpreter's swerl: tokens/s, the engine's step rates and every output."""
    engine = LocalEngine(
        args.model_dir,
        max_batch_size=args.clients,
        max_context_tokens=args.context,
        intra_op_threads=args.threads,
        prefix_cache_size=0 if args.no_prefix_cache else args.clients,
        seed=0,
    )
    decode_cpu = [0.0]  # the worker thread's CPU-seconds in decode steps
    decode = LocalEngine._decode

    def timed_decode(self: LocalEngine, version: int) -> None:
        started = time.thread_time()
        try:
            decode(self, version)
        finally:
            decode_cpu[0] += time.thread_time() - started

    LocalEngine._decode = timed_decode  # type: ignore[method-assign]
    clients = workload(args, engine.vocab_size)
    warm = SamplingParams(max_new_tokens=4, temperature=0, ignore_eos=True)
    await engine.generate(GenerateRequest(input_ids=clients[0][0][0], sampling_params=warm))
    before = engine.stats()
    decode_cpu[0] = 0.0

    async def client(index: int, turns: list[Turn]) -> list[list[int]]:
        outputs: list[list[int]] = []
        conversation: list[int] = []
        for added, new in turns:
            conversation = conversation + (outputs[-1] if outputs else []) + added
            params = SamplingParams(max_new_tokens=new, temperature=args.temperature, ignore_eos=True)
            request = GenerateRequest(input_ids=conversation, sampling_params=params, rid=f"client-{index}")
            outputs.append((await engine.generate(request)).output_ids)
        return outputs

    start, cpu_start = time.perf_counter(), time.process_time()
    outputs = await asyncio.gather(*(client(index, turns) for index, turns in enumerate(clients)))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    after = engine.stats()
    await engine.close()

    def rate(tokens: str, seconds: str) -> float:
        return (after[tokens] - before[tokens]) / max(after[seconds] - before[seconds], 1e-9)

    generated = sum(len(output) for turns in outputs for output in turns)
    decoded = after["decode_tokens"] - before["decode_tokens"]
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "tokens_per_s": generated / wall,
        "tokens_per_cpu_s": generated / cpu,
        "decode_tokens_per_s": rate("decode_tokens", "decode_seconds"),
        "decode_tokens_per_cpu_s": decoded / max(decode_cpu[0], 1e-9),
        "prefill_tokens_per_s": rate("prefill_tokens", "prefill_seconds"),
        "prefill_tokens": after["prefill_tokens"] - before["prefill_tokens"],
        "generated_tokens": generated,
        "outputs": outputs,
    }


def worker_arguments(args: argparse.Namespace, model_dir: Path) -> list[str]:
    names = (
        "clients",
        "turns",
        "prompt_min",
        "prompt_max",
        "observation_min",
        "observation_max",
        "new_min",
        "new_max",
        "temperature",
        "threads",
        "context",
    )
    options = [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in names]
    return [*options, *(["--no-prefix-cache"] if args.no_prefix_cache else []), f"--model-dir={model_dir}"]


def main(args: argparse.Namespace) -> None:
    script = Path(__file__).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_demo_model(Path(tmp) / "model")
        sides: dict[str, Path | None] = {"this checkout": None}
        if args.baseline_ref:
            sides[f"baseline {args.baseline_ref}"] = materialise_ref(args.baseline_ref, Path(tmp) / "baseline")
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, root in sides.items():
                runs[side].append(run_worker(script, root, worker_arguments(args, model_dir)))
    first = runs["this checkout"][0]
    print(
        f"{args.clients} clients x {args.turns} turns: first prompt {args.prompt_min}-{args.prompt_max} tokens, "
        f"observations {args.observation_min}-{args.observation_max}, {args.new_min}-{args.new_max} new tokens, "
        f"prefix cache {'off' if args.no_prefix_cache else 'on'}, temperature {args.temperature}, intra-op threads "
        f"{args.threads}; {first['generated_tokens']} tokens generated, {first['prefill_tokens']} prefilled; "
        f"best of {args.rounds} rounds"
    )
    keys = (
        "tokens_per_s",
        "tokens_per_cpu_s",
        "decode_tokens_per_s",
        "decode_tokens_per_cpu_s",
        "prefill_tokens_per_s",
    )
    best = {side: {key: max(r[key] for r in results) for key in keys} for side, results in runs.items()}
    for side, result in best.items():
        print(
            f"{side:>18}: {result['tokens_per_s']:6.1f} tokens/s, {result['tokens_per_cpu_s']:6.1f} tokens per "
            f"CPU-s; decode steps {result['decode_tokens_per_s']:6.1f} tokens/s "
            f"({result['decode_tokens_per_cpu_s']:6.1f} per worker CPU-s), prefill "
            f"{result['prefill_tokens_per_s']:6.1f} tokens/s; tokens/s per round "
            f"{[round(r['tokens_per_s'], 1) for r in runs[side]]}"
        )
    if args.baseline_ref:
        new, old = best.values()
        same = all(r["outputs"] == first["outputs"] for results in runs.values() for r in results)

        def paired(key: str) -> list[float]:
            return [round(n[key] / o[key], 2) for n, o in zip(*runs.values(), strict=True)]

        print(
            f"ratio (best round against best round): {new['tokens_per_s'] / old['tokens_per_s']:.2f}x tokens/s, "
            f"{new['tokens_per_cpu_s'] / old['tokens_per_cpu_s']:.2f}x tokens per CPU-s, "
            f"{new['decode_tokens_per_s'] / old['decode_tokens_per_s']:.2f}x decode steps, "
            f"{new['decode_tokens_per_cpu_s'] / old['decode_tokens_per_cpu_s']:.2f}x decode steps per worker "
            f"CPU-s, {new['prefill_tokens_per_s'] / old['prefill_tokens_per_s']:.2f}x prefill; each round's "
            f"ratios: tokens/s {paired('tokens_per_s')}, decode steps {paired('decode_tokens_per_s')}, decode "
            f"steps per worker CPU-s {paired('decode_tokens_per_cpu_s')}; same tokens: {same}"
        )
        if not same:
            raise SystemExit("the two engines generated different tokens")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16, help="concurrent agents (and max_batch_size)")
    parser.add_argument("--turns", type=int, default=4, help="requests per client, one after another")
    parser.add_argument("--prompt-min", type=int, default=150, help="first prompt length")
    parser.add_argument("--prompt-max", type=int, default=400)
    parser.add_argument("--observation-min", type=int, default=40, help="tokens a turn adds to the prompt")
    parser.add_argument("--observation-max", type=int, default=80)
    parser.add_argument("--new-min", type=int, default=48)
    parser.add_argument("--new-max", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--no-prefix-cache", action="store_true", help="each turn prefills its whole prompt")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of the engine")
    parser.add_argument("--context", type=int, default=1024, help="max_context_tokens (configs/local.yaml's)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline-ref", default=None, help="git commit whose engine runs beside this one")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, default=None, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.worker:
        print(json.dumps(asyncio.run(run_workload(arguments))))
    else:
        main(arguments)
