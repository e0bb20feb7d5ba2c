"""SFT training throughput on CPU: float32 vs bfloat16 autocast, side by side in one run, with the ratio.

The model is the tiny Qwen3 of TINY-MODEL-NOTES: hidden 256, 4 layers, FFN 768, vocab ~4096 (a byte-level BPE
trained here on the local Python standard library). Examples are random token ids of conversation-like lengths
with an assistant mask on their second half: throughput does not depend on what the tokens say.
Rounds alternate fp32 and bf16 so that load from other processes hits both alike; the first step of each round is
a warm-up and is not timed.

bf16 only pays on CPUs with native bfloat16 matrix units (AVX512-BF16, AMX): on an AVX2-only CPU torch runs bf16
matmuls through a slow fallback and bf16 is many times slower than fp32 (measured ~10x on an AVX2 AMD EPYC).

    .venv/bin/python benchmarks/sft_throughput.py [--threads 2] [--steps 6] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import numpy as np
import torch
from common import demo_model, stdlib_texts

from swerl.model.tokenizer import train_tokenizer
from swerl.train.sft import StepMetrics, train_sft


def random_examples(
    vocab_size: int, count: int, min_len: int, max_len: int, seed: int
) -> list[tuple[list[int], list[int]]]:
    rng = np.random.default_rng(seed)
    examples = []
    for length in rng.integers(min_len, max_len + 1, size=count):
        ids = rng.integers(7, vocab_size, size=int(length)).tolist()  # 0..6 are the special tokens
        mask = [0] * (length // 2) + [1] * (length - length // 2)
        examples.append((ids, mask))
    return examples


def measure(tokenizer, examples, bf16: bool, args: argparse.Namespace) -> float:
    """Tokens per second over the timed steps of one run (non-padding tokens / step wall time)."""
    model = demo_model(tokenizer, max_positions=args.seq_len)
    metrics: list[StepMetrics] = []
    train_sft(
        model,
        examples,
        seq_len=args.seq_len,
        max_steps=args.steps + 1,
        rows_per_micro_batch=args.rows,
        lr=3e-4,
        warmup_steps=0,
        bf16=bf16,
        on_step=metrics.append,
    )
    timed = metrics[1:]
    return sum(m.num_tokens for m in timed) / sum(m.seconds for m in timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--rows", type=int, default=2, help="rows of seq_len tokens per step")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round (after one warm-up step)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = train_tokenizer(stdlib_texts(3_000_000), vocab_size=4096, out_dir=scratch)
    examples = random_examples(len(tokenizer), 400, min(250, args.seq_len // 2), min(550, args.seq_len), seed=0)
    print(
        f"tiny Qwen3 (hidden 256, 4 layers, vocab {len(tokenizer)}), seq_len {args.seq_len} x {args.rows} rows "
        f"per step, {args.steps} timed steps x {args.rounds} rounds, {args.threads} threads, "
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}"
    )
    results: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for _ in range(args.rounds):
        for name in results:
            results[name].append(measure(tokenizer, examples, bf16=name == "bf16", args=args))
            print(f"  {name}: {results[name][-1]:8.0f} tokens/s")
    fp32, bf16 = (statistics.median(results[name]) for name in results)
    print(f"{'mode':<6}{'tokens/s (median)':>20}")
    for name, value in zip(results, (fp32, bf16), strict=True):
        print(f"{name:<6}{value:>20.0f}")
    print(f"bf16 / fp32 = {bf16 / fp32:.2f}x")


if __name__ == "__main__":
    main()
