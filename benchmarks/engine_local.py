"""Local engine throughput: tokens/s of one request vs a batch of concurrent requests, against HF generate.

    .venv/bin/python benchmarks/engine_local.py [--batch 8] [--prompt 512] [--new 128] [--threads 1]

Builds the CPU demo's tiny Qwen3 (common.build_demo_model: byte-level BPE of 4096 tokens on the standard library's
source, hidden 256, 4 layers, FFN 768: ~4.5M parameters) in a temporary directory, then times greedy generation of
`--new` tokens after `--prompt`-token prompts: Hugging Face `generate` on one request (the baseline), the engine
on one request, and the engine on `--batch` concurrent requests. Prints tokens/s and each ratio to the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import build_demo_model

from swerl.engine.base import GenerateRequest, SamplingParams
from swerl.engine.local import LocalEngine


def prompts(count: int, length: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(10, vocab, (length,), generator=generator).tolist() for _ in range(count)]


@torch.inference_mode()
def hf_generate_tokens_per_second(
    engine: LocalEngine, prompt: list[int], new_tokens: int, threads: int
) -> float:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        start = time.perf_counter()
        model: Any = engine.model  # generate() is untyped through nn.Module's __getattr__
        model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
        )
        return new_tokens / (time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)


async def engine_tokens_per_second(engine: LocalEngine, batch: list[list[int]], new_tokens: int) -> float:
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    responses = await asyncio.gather(
        *(engine.generate(GenerateRequest(input_ids=p, sampling_params=params)) for p in batch)
    )
    elapsed = time.perf_counter() - start
    return sum(len(r.output_ids) for r in responses) / elapsed


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = build_demo_model(Path(tmp))
        engine = LocalEngine(
            path,
            max_batch_size=args.batch,
            max_context_tokens=args.prompt + args.new + 1,
            intra_op_threads=args.threads,
            prefix_cache_size=0,
        )
        batch = prompts(args.batch, args.prompt, engine.vocab_size)
        await engine_tokens_per_second(engine, batch[:1], 8)  # warm-up
        baseline = hf_generate_tokens_per_second(engine, batch[0], args.new, args.threads)
        single = await engine_tokens_per_second(engine, batch[:1], args.new)
        before = engine.stats()
        batched = await engine_tokens_per_second(engine, batch, args.new)
        after = engine.stats()
        decode_rate = (after["decode_tokens"] - before["decode_tokens"]) / (
            after["decode_seconds"] - before["decode_seconds"]
        )
        prefill_rate = (after["prefill_tokens"] - before["prefill_tokens"]) / (
            after["prefill_seconds"] - before["prefill_seconds"]
        )
        print(f"prompt {args.prompt} tokens, {args.new} new tokens, intra-op threads {args.threads}")
        print(f"HF generate, 1 request (baseline): {baseline:8.1f} tokens/s")
        print(
            f"engine, 1 request:                 {single:8.1f} tokens/s  ({single / baseline:.2f}x baseline)"
        )
        print(
            f"engine, {args.batch} concurrent requests:     {batched:8.1f} tokens/s  "
            f"({batched / baseline:.2f}x baseline, {batched / single:.2f}x one request)"
        )
        print(
            f"  of which decode steps: {decode_rate:8.1f} tokens/s; prefill: {prefill_rate:8.1f} prompt tokens/s"
        )
        print(f"engine stats: {engine.stats()}")
        await engine.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=8, help="concurrent requests (and max_batch_size)")
    parser.add_argument("--prompt", type=int, default=512, help="prompt length in tokens")
    parser.add_argument("--new", type=int, default=128, help="tokens generated per request")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (engine and baseline)")
    asyncio.run(main(parser.parse_args()))
