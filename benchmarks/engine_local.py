"""Local engine throughput on agent-shaped traffic, against another commit's engine side by side.

    .venv/bin/python benchmarks/engine_local.py [--clients 16] [--requests 4] [--prompt-min 150] [--prompt-max 600]
        [--new-min 48] [--new-max 64] [--threads 1] [--rounds 2] [--baseline-ref d7efde6]

Builds the CPU demo's tiny Qwen3 (common.build_demo_model: byte-level BPE of 4096 tokens on the standard library's
source, hidden 256, 4 layers, FFN 768: ~4.5M parameters) in a temporary directory. `--clients` agents run
concurrently, each sending `--requests` requests one after another (an agent's turns): a prompt of
`--prompt-min`..`--prompt-max` random tokens and `--new-min`..`--new-max` new tokens, drawn per request (seeded),
greedy unless `--temperature`; the engine's batch holds every client (max_batch_size = clients), so requests join
and leave the running batch at different times. Prints generated tokens/s over the whole run and the engine's
decode-step and prefill rates (from its stats).

With `--baseline-ref COMMIT`, that commit's `swerl` (extracted with git archive into a temporary folder) runs the
same workload: each round runs this checkout's engine then the baseline's, each in a fresh interpreter, so both
see the same machine; prints each side's best round and the ratio, and checks that both generated the same
tokens (greedy, or seeded sampling: the samplers agree token for token).
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


def workload(args: argparse.Namespace, vocab: int) -> list[list[tuple[list[int], int]]]:
    """Per client, its requests: (prompt, max_new_tokens), the same on every run."""
    generator = torch.Generator().manual_seed(0)

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=generator))

    return [
        [
            (
                torch.randint(
                    10, vocab, (draw(args.prompt_min, args.prompt_max),), generator=generator
                ).tolist(),
                draw(args.new_min, args.new_max),
            )
            for _ in range(args.requests)
        ]
        for _ in range(args.clients)
    ]


async def run_workload(args: argparse.Namespace) -> dict[str, Any]:
    """One run on this interpreter's swerl: tokens/s, the engine's step rates and every output."""
    torch.manual_seed(0)
    engine = LocalEngine(
        args.model_dir,
        max_batch_size=args.clients,
        max_context_tokens=args.context,
        intra_op_threads=args.threads,
        prefix_cache_size=0,
        seed=0,
    )
    clients = workload(args, engine.vocab_size)
    warm = SamplingParams(max_new_tokens=4, temperature=0, ignore_eos=True)
    await engine.generate(GenerateRequest(input_ids=clients[0][0][0], sampling_params=warm))
    before = engine.stats()

    async def client(requests: list[tuple[list[int], int]]) -> list[list[int]]:
        outputs = []
        for prompt, new in requests:
            params = SamplingParams(max_new_tokens=new, temperature=args.temperature, ignore_eos=True)
            response = await engine.generate(GenerateRequest(input_ids=prompt, sampling_params=params))
            outputs.append(response.output_ids)
        return outputs

    start = time.perf_counter()
    outputs = await asyncio.gather(*(client(requests) for requests in clients))
    wall = time.perf_counter() - start
    after = engine.stats()
    await engine.close()

    def rate(tokens: str, seconds: str) -> float:
        return (after[tokens] - before[tokens]) / max(after[seconds] - before[seconds], 1e-9)

    return {
        "wall_s": wall,
        "tokens_per_s": sum(len(o) for out in outputs for o in out) / wall,
        "decode_tokens_per_s": rate("decode_tokens", "decode_seconds"),
        "prefill_tokens_per_s": rate("prefill_tokens", "prefill_seconds"),
        "decode_steps": after["decode_steps"] - before["decode_steps"],
        "outputs": outputs,
    }


def worker_arguments(args: argparse.Namespace, model_dir: Path) -> list[str]:
    names = ("clients", "requests", "prompt_min", "prompt_max", "new_min", "new_max", "threads", "context")
    options = [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in names]
    return [*options, f"--temperature={args.temperature}", f"--model-dir={model_dir}"]


def main(args: argparse.Namespace) -> None:
    script = Path(__file__).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_demo_model(Path(tmp) / "model")
        sides: dict[str, Path | None] = {"this checkout": None}
        if args.baseline_ref:
            sides[f"baseline {args.baseline_ref}"] = materialise_ref(
                args.baseline_ref, Path(tmp) / "baseline"
            )
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, root in sides.items():
                runs[side].append(run_worker(script, root, worker_arguments(args, model_dir)))
        print(
            f"{args.clients} clients x {args.requests} requests, prompts {args.prompt_min}-{args.prompt_max} tokens, "
            f"{args.new_min}-{args.new_max} new tokens, temperature {args.temperature}, "
            f"intra-op threads {args.threads}, best of {args.rounds} rounds"
        )
        best = {side: max(results, key=lambda r: r["tokens_per_s"]) for side, results in runs.items()}
        for side, result in best.items():
            print(
                f"{side:>26}: {result['tokens_per_s']:7.1f} tokens/s ({result['wall_s']:.2f} s); decode steps "
                f"{result['decode_tokens_per_s']:7.1f} tokens/s, prefill {result['prefill_tokens_per_s']:7.1f} "
                f"prompt tokens/s; per round {[round(r['tokens_per_s'], 1) for r in runs[side]]}"
            )
        if args.baseline_ref:
            new, old = best.values()
            same = all(
                r["outputs"] == runs["this checkout"][0]["outputs"] for rs in runs.values() for r in rs
            )
            print(
                f"ratio: {new['tokens_per_s'] / old['tokens_per_s']:.2f}x tokens/s, "
                f"{new['decode_tokens_per_s'] / old['decode_tokens_per_s']:.2f}x decode steps, "
                f"{new['prefill_tokens_per_s'] / old['prefill_tokens_per_s']:.2f}x prefill; same tokens: {same}"
            )
            if not same:
                raise SystemExit("the two engines generated different tokens")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=16, help="concurrent agents (and max_batch_size)")
    parser.add_argument("--requests", type=int, default=4, help="requests per client, one after another")
    parser.add_argument("--prompt-min", type=int, default=150)
    parser.add_argument("--prompt-max", type=int, default=600)
    parser.add_argument("--new-min", type=int, default=48)
    parser.add_argument("--new-max", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
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
