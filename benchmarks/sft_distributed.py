"""SFT throughput of the FSDP2 trainer on CPU: 2 gloo ranks (1 torch thread each) against one process (2 threads),
side by side in one run, with the ratio and the largest weight difference after the same steps.

The model is the CPU demo's tiny Qwen3 (hidden 256, 4 layers, ~4.5M parameters); examples are random token ids of
conversation-like lengths with the assistant mask on their second half. Rounds alternate the two so that load
from other processes hits both alike; each measures `--steps` optimizer steps after one warm-up step (the ranks'
start-up, the model load and sharding, is reported apart). Both train the same steps on the same rows: the
weights must agree (FSDP2's reduction order only).

    .venv/bin/python benchmarks/sft_distributed.py [--steps 6] [--rounds 2] [--grad-accum 4]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import build_demo_model
from sft_throughput import random_examples

from swerl.config.train import DistributedConfig
from swerl.model.loading import load_model_and_tokenizer, load_tokenizer
from swerl.train.distributed import init_rank, load_sharded_model
from swerl.train.ranks import SFTRanks
from swerl.train.sft import SFTTrainer


def rank_trainer(
    model_dir: Path, examples: list[Any], options: dict[str, Any], config: DistributedConfig
) -> SFTTrainer:
    torch.set_num_threads(1)
    ranks = init_rank(config)
    model = load_sharded_model(model_dir, ranks)
    return SFTTrainer(model, examples, tokenizer=load_tokenizer(model_dir), ranks=ranks, **options)


def timed_steps(trainer: Any, steps: int) -> tuple[float, int]:
    trainer.train_step()  # warm-up
    started, tokens = time.perf_counter(), 0
    for _ in range(steps):
        tokens += trainer.train_step().num_tokens
    return time.perf_counter() - started, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=768)
    parser.add_argument("--grad-accum", type=int, default=4)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="swerl-bench-"))
    model_dir = build_demo_model(work / "model", max_positions=args.seq_len)
    tokenizer = load_tokenizer(model_dir)
    examples = random_examples(len(tokenizer), 200, 300, 760, seed=0)
    options = dict(
        seq_len=args.seq_len,
        max_steps=args.steps + 1,
        rows_per_micro_batch=1,
        grad_accum_steps=args.grad_accum,
        lr=1e-3,
        warmup_steps=0,
        seed=0,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = DistributedConfig(backend="fsdp2", ranks=2)
    one_rates, two_rates, starts, worst = [], [], [], 0.0
    for round_ in range(args.rounds):
        torch.set_num_threads(2)
        model, _ = load_model_and_tokenizer(model_dir)
        one = SFTTrainer(model, examples, **options)
        seconds, tokens = timed_steps(one, args.steps)
        one_rates.append(tokens / seconds)
        started = time.perf_counter()
        with SFTRanks(rank_trainer, model_dir, examples, options, config, config=config) as two:
            starts.append(time.perf_counter() - started)
            seconds, tokens = timed_steps(two, args.steps)
            two_rates.append(tokens / seconds)
            final = two.save_model(work / f"two-{round_}")
        theirs = load_model_and_tokenizer(final)[0].state_dict()
        worst = max(worst, max(float((t - theirs[n]).abs().max()) for n, t in one.model.state_dict().items()))
        print(
            f"round {round_}: one process {one_rates[-1]:.0f} tok/s, 2 ranks {two_rates[-1]:.0f} tok/s "
            f"(start-up {starts[-1]:.1f} s)"
        )
    one_rate, two_rate = statistics.median(one_rates), statistics.median(two_rates)
    print(f"one process (2 threads): {one_rate:.0f} tokens/s")
    print(f"2 FSDP2 gloo ranks (1 thread each): {two_rate:.0f} tokens/s; start-up {statistics.median(starts):.1f} s")
    print(f"ratio 2 ranks / one process: {two_rate / one_rate:.2f}x; largest weight difference {worst:.1e}")


if __name__ == "__main__":
    main()
