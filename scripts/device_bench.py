"""Device benchmark: swerl's FSDP2 trainer (SFT and GRPO steps), a weight sync into the local engine, and a
Megatron step, on one GPU; the numbers scripts/device_check.sh reports.

Parts (`--parts`, comma-separated; default sft,grpo,sync):
- sft: SFTTrainer (swerl.train.sft) on one FSDP2 rank (swerl.train.distributed.init_rank + shard_model, bf16
  MixedPrecisionPolicy, fp32 master weights), packed rows of random tokens with the assistant mask on half.
- grpo: GRPOTrainer (swerl.train.grpo_trainer) on the same rank: synthetic groups (random tokens, sampled runs and
  observations, random behaviour log-probs, rewards 0/1), one optimizer update per step.
- sync: the GRPO trainer's export (HF folder) and the local engine loading it (update_weights_from_disk), seconds
  per GB of weights, on the GPU where the engine takes a device.
- megatron: swerl.train.megatron_backend on a tiny Qwen3-MoE built from config (forward, backward, optimizer
  step); skipped with the reason where the megatron extra is not installed.
The model is a Qwen3 built from config (random weights; nothing downloaded): Qwen3-0.6B's shape by default
(hidden 1024, 28 layers, 16 heads, 8 KV heads, FFN 3072, vocab 151936, tied: ~0.6 B parameters).

Throughput and MFU. tokens/s counts the tokens a step trains on (SFT: non-padding tokens; GRPO: the trajectories'
tokens), timed after a warm-up step. FLOPs per token = 6 N + 12 L H D S (PaLM's appendix B: N the parameters that
take part in matmuls, i.e. all of them with tied embeddings, else all but the input embedding; L layers, H heads of
D dims, S the sequence length; attention counted without halving for the causal mask). MFU = FLOPs/s over the
GPU's dense bf16 peak (--peak-tflops, H200: 989). On CPU there is no MFU.

    python scripts/device_bench.py                       # on the GPU (scripts/device_check.sh runs it)
    python scripts/device_bench.py --cpu --tiny          # smoke test on CPU: a few seconds
Prints a summary table; writes JSON to --out, or to $OUT/device_bench.json when OUT is set.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import platform
import random
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from the checkout, swerl installed or not

import torch  # noqa: E402

H200_BF16_DENSE_TFLOPS = 989.0

FULL = dict(hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128, intermediate_size=3072,
            vocab_size=151936, seq_len=2048)  # fmt: skip
TINY = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
            vocab_size=512, seq_len=128)  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on CPU (gloo), no MFU")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and few steps (smoke test)")
    parser.add_argument("--parts", default="sft,grpo,sync", help="sft,grpo,sync,megatron")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per part (after one warm-up)")
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_DENSE_TFLOPS)
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default $OUT/device_bench.json)")
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------------------------------------------
# Model, data, FLOPs


def qwen3_config(shape: dict[str, int], pad_token_id: int) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"], num_hidden_layers=shape["num_layers"],
        num_attention_heads=shape["num_heads"], num_key_value_heads=shape["num_kv_heads"],
        head_dim=shape["head_dim"], intermediate_size=shape["intermediate_size"],
        max_position_embeddings=max(4096, shape["seq_len"]), tie_word_embeddings=True, pad_token_id=pad_token_id,
        eos_token_id=pad_token_id, bos_token_id=None,
    )  # fmt: skip


def build_model(shape: dict[str, int], device: torch.device, seed: int = 0) -> Any:
    """A Qwen3 from config with random weights, fp32 (FSDP2 keeps fp32 master weights and computes in bf16)."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(qwen3_config(shape, pad_token_id=0))
    return model


def matmul_parameters(model: Any) -> int:
    """Parameters that take part in matmuls: all with tied embeddings (the output layer reuses the embedding), else
    all but the input embedding (a lookup)."""
    total = sum(parameter.numel() for parameter in model.parameters())
    if getattr(model.config, "tie_word_embeddings", False):
        return total
    return total - model.get_input_embeddings().weight.numel()


def flops_per_token(model: Any, seq_len: int) -> float:
    """Training FLOPs per token: 6 N + 12 L H D S (forward + backward; PaLM, appendix B)."""
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return (
        6.0 * matmul_parameters(model)
        + 12.0 * c.num_hidden_layers * c.num_attention_heads * head_dim * seq_len
    )


def sft_examples(vocab: int, count: int, seq_len: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Examples of seq_len/4 .. seq_len tokens, the second half marked as the assistant's."""
    rng = random.Random(seed)
    examples = []
    for _ in range(count):
        length = rng.randint(max(8, seq_len // 4), seq_len)
        ids = [rng.randrange(3, vocab) for _ in range(length)]
        examples.append((ids, [0] * (length // 2) + [1] * (length - length // 2)))
    return examples


def grpo_groups(vocab: int, groups: int, attempts: int, seq_len: int, seed: int) -> list[list[Any]]:
    """Groups of trajectories of seq_len/2 .. seq_len tokens: a prompt, then sampled and observation runs."""
    from swerl.trajectory import EpisodeStatus, Trajectory

    rng = random.Random(seed)
    out = []
    for group in range(groups):
        rows = []
        for attempt in range(attempts):
            length = rng.randint(seq_len // 2, seq_len)
            prompt = max(2, length // 5)
            ids = [rng.randrange(3, vocab) for _ in range(length)]
            mask = [0] * prompt
            while len(mask) < length:
                sampled, observation = rng.randint(8, 64), rng.randint(8, 64)
                mask += [1] * sampled + [0] * observation
            mask = mask[:length]
            behaviour = [-rng.uniform(0.1, 4.0) if m else 0.0 for m in mask]
            reward = float(rng.random() < 0.5)
            rows.append(Trajectory(
                task_id=f"g{group}", attempt=attempt, group_id=f"g{group}",
                status=EpisodeStatus.RESOLVED if reward else EpisodeStatus.UNRESOLVED, reward=reward,
                prompt_tokens=prompt, token_ids=ids, loss_mask=mask, behaviour_logprobs=behaviour,
                token_weight_versions=[0 if m else -1 for m in mask], num_turns=1,
            ))  # fmt: skip
        rows[0] = rows[0].model_copy(update={"reward": 1.0, "status": EpisodeStatus.RESOLVED})  # a signal
        rows[1] = rows[1].model_copy(update={"reward": 0.0, "status": EpisodeStatus.UNRESOLVED})
        out.append(rows)
    return out


def sync_cuda(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rate(tokens: float, seconds: float, flops_token: float, peak_tflops: float | None) -> dict[str, Any]:
    tokens_per_s = tokens / seconds if seconds > 0 else 0.0
    achieved = tokens_per_s * flops_token
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens_per_s,
        "tflops": achieved / 1e12,
        "mfu": achieved / (peak_tflops * 1e12) if peak_tflops else None,
    }


# ----------------------------------------------------------------------------------------------------------------
# Parts


def rank_context(cpu: bool) -> Any:
    """One FSDP2 rank (swerl.train.distributed.init_rank) from a torchrun environment set here if absent."""
    from swerl.config import DistributedConfig
    from swerl.train.distributed import init_rank

    if "MASTER_PORT" not in os.environ:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(probe.getsockname()[1])
    for name, value in (
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_RANK", "0"),
        ("MASTER_ADDR", "127.0.0.1"),
    ):
        os.environ.setdefault(name, value)
    config = DistributedConfig(
        backend="fsdp2", device="cpu" if cpu else "cuda", ranks=1, param_dtype="bfloat16", reduce_dtype="float32",
        attn_implementation="sdpa",
    )  # fmt: skip
    return init_rank(config)


def bench_sft(args: argparse.Namespace, shape: dict[str, int], ctx: Any, steps: int) -> dict[str, Any]:
    from swerl.train.sft import SFTTrainer

    seq_len = shape["seq_len"]
    model = build_model(shape, ctx.device)
    flops = flops_per_token(model, seq_len)
    parameters = sum(parameter.numel() for parameter in model.parameters())
    rows, accum = (2, 2) if args.tiny else (4, 2)
    examples = sft_examples(shape["vocab_size"], 8 * rows * accum * (steps + 1), seq_len)
    trainer = SFTTrainer(model, examples, seq_len=seq_len, max_steps=steps + 1, rows_per_micro_batch=rows,
                         grad_accum_steps=accum, lr=1e-5, warmup_steps=0, seed=0, pad_token_id=0,
                         ranks=ctx)  # fmt: skip
    trainer.train_step()  # warm-up: allocation, kernels
    sync_cuda(ctx.device)
    started, tokens, losses = time.perf_counter(), 0, []
    for _ in range(steps):
        metrics = trainer.train_step()
        tokens += metrics.num_tokens
        losses.append(metrics.loss)
    sync_cuda(ctx.device)
    seconds = time.perf_counter() - started
    result = rate(tokens, seconds, flops, None if args.cpu else args.peak_tflops)
    result.update(parameters=parameters, seq_len=seq_len, rows_per_micro_batch=rows, grad_accum_steps=accum,
                  steps=steps, loss_last=losses[-1], peak_memory_gb=peak_memory_gb(ctx.device))  # fmt: skip
    del trainer, model
    free_memory(ctx.device)
    return result


def bench_grpo(
    args: argparse.Namespace, shape: dict[str, int], ctx: Any, steps: int, work: Path
) -> tuple[dict[str, Any], Any]:
    from swerl.config import GRPOAlgorithmConfig
    from swerl.model.tokenizer import train_tokenizer
    from swerl.train.grpo_trainer import GRPOTrainer, UpdateSettings

    seq_len = shape["seq_len"]
    model = build_model(shape, ctx.device)
    flops = flops_per_token(model, seq_len)
    tokenizer = train_tokenizer(
        ["def add(a, b):\n    return a + b\n"] * 50, vocab_size=300, out_dir=work / "tok"
    )
    settings = UpdateSettings(
        **GRPOAlgorithmConfig(micro_batch_tokens=4 * seq_len, grad_clip=1.0).model_dump()
    )
    trainer = GRPOTrainer(model, settings, seed=0, tokenizer=tokenizer, pad_token_id=0, ranks=ctx)
    groups, attempts = (2, 4) if args.tiny else (4, 8)
    batches = [grpo_groups(shape["vocab_size"], groups, attempts, seq_len, seed) for seed in range(steps + 1)]
    trainer.train_step(batches[0])  # warm-up
    sync_cuda(ctx.device)
    started, tokens, last = time.perf_counter(), 0, {}
    for batch in batches[1:]:
        last = trainer.train_step(batch)
        tokens += sum(len(t.token_ids) for group in batch for t in group)
    sync_cuda(ctx.device)
    seconds = time.perf_counter() - started
    result = rate(tokens, seconds, flops, None if args.cpu else args.peak_tflops)
    result.update(seq_len=seq_len, groups=groups, attempts=attempts, steps=steps, loss_last=last.get("loss"),
                  grad_norm_last=last.get("grad_norm"), peak_memory_gb=peak_memory_gb(ctx.device))  # fmt: skip
    return result, trainer


def bench_sync(args: argparse.Namespace, trainer: Any, work: Path) -> dict[str, Any]:
    """Export the GRPO trainer's weights (HF folder) and load them into the local engine; seconds per GB."""
    from swerl.engine.local import LocalEngine

    first = trainer.export_weights(work / "exports", version=1)
    size_gb = sum(path.stat().st_size for path in first.glob("*.safetensors")) / 1e9
    started = time.perf_counter()
    second = trainer.export_weights(work / "exports", version=2)
    export_s = time.perf_counter() - started
    options: dict[str, Any] = dict(max_batch_size=1, max_context_tokens=64, prefix_cache_size=0)
    parameters = inspect.signature(LocalEngine).parameters
    engine_device = "cpu"
    if "device" in parameters and not args.cpu:
        options["device"] = engine_device = "cuda"
    if "dtype" in parameters:
        options["dtype"] = torch.float32 if args.cpu else torch.bfloat16

    async def load() -> float:
        engine = LocalEngine(first, **options)
        try:
            began = time.perf_counter()
            await engine.update_weights_from_disk(str(second), 2)
            return time.perf_counter() - began
        finally:
            await engine.close()

    load_s = asyncio.run(load())
    return {
        "weights_gb": size_gb,
        "export_s": export_s,
        "load_s": load_s,
        "export_s_per_gb": export_s / size_gb if size_gb else None,
        "load_s_per_gb": load_s / size_gb if size_gb else None,
        "engine_device": engine_device,
        "method": "disk (export_weights -> LocalEngine.update_weights_from_disk)",
    }


def bench_megatron(args: argparse.Namespace, work: Path, steps: int) -> dict[str, Any]:
    """A tiny Qwen3-MoE (from config) through swerl.train.megatron_backend: forward, backward, optimizer step."""
    from swerl.config import DistributedConfig, GRPOAlgorithmConfig
    from swerl.model.loading import build_tiny_model, save_model_and_tokenizer
    from swerl.model.tokenizer import train_tokenizer
    from swerl.train import megatron_backend
    from swerl.train.grpo_trainer import UpdateSettings

    missing = megatron_backend.missing_pieces()
    if missing:
        return {"skipped": "; ".join(missing)}
    tokenizer = train_tokenizer(
        ["def add(a, b):\n    return a + b\n"] * 50, vocab_size=300, out_dir=work / "mtok"
    )
    model = build_tiny_model(tokenizer, hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                             intermediate_size=256, max_position_embeddings=1024, moe=True, num_experts=8,
                             num_experts_per_tok=2)  # fmt: skip
    model_dir = save_model_and_tokenizer(model, tokenizer, work / "moe")
    rank_context_env()
    config = DistributedConfig(backend="megatron", device="cuda", ranks=1, param_dtype="bfloat16")
    settings = UpdateSettings(**GRPOAlgorithmConfig(micro_batch_tokens=2048).model_dump())
    started = time.perf_counter()
    trainer = megatron_backend.MegatronGRPOTrainer(model_dir, config, settings, seed=0)
    build_s = time.perf_counter() - started
    batches = [grpo_groups(len(tokenizer), 4, 4, 512, seed) for seed in range(steps + 1)]
    trainer.train_step(batches[0])
    torch.cuda.synchronize()
    started, tokens, last = time.perf_counter(), 0, {}
    for batch in batches[1:]:
        last = trainer.train_step(batch)
        tokens += sum(len(t.token_ids) for group in batch for t in group)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    return {"build_s": build_s, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "loss_last": last.get("loss"), "grad_norm_last": last.get("grad_norm"),
            "transformer_engine": megatron_backend.has_transformer_engine()}  # fmt: skip


def rank_context_env() -> None:
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(probe.getsockname()[1])
    for name, value in (
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_RANK", "0"),
        ("MASTER_ADDR", "127.0.0.1"),
    ):
        os.environ.setdefault(name, value)


def peak_memory_gb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None


def free_memory(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


# ----------------------------------------------------------------------------------------------------------------


def environment(cpu: bool) -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "cpu_only": cpu}
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def summary(results: dict[str, Any]) -> str:
    """The table printed at the end."""
    lines = [f"{'part':<10} {'tokens/s':>12} {'TFLOP/s':>9} {'MFU':>7}  notes"]

    def fmt(value: Any, pattern: str) -> str:
        return pattern.format(value) if isinstance(value, int | float) else "-"

    for part in ("sft", "grpo", "megatron"):
        entry = results.get(part)
        if entry is None:
            continue
        if "skipped" in entry or "error" in entry:
            lines.append(
                f"{part:<10} {'-':>12} {'-':>9} {'-':>7}  {entry.get('skipped') or entry.get('error')}"
            )
            continue
        mfu = entry.get("mfu")
        notes = f"loss {fmt(entry.get('loss_last'), '{:.4f}')}"
        if entry.get("peak_memory_gb") is not None:
            notes += f", peak {entry['peak_memory_gb']:.1f} GB"
        lines.append(
            f"{part:<10} {fmt(entry.get('tokens_per_s'), '{:.0f}'):>12} {fmt(entry.get('tflops'), '{:.1f}'):>9} "
            f"{fmt(None if mfu is None else 100 * mfu, '{:.1f}%'):>7}  {notes}"
        )
    sync = results.get("sync")
    if sync is not None:
        if "error" in sync:
            lines.append(f"{'sync':<10} error: {sync['error']}")
        else:
            lines.append(
                f"{'sync':<10} {1000 * sync['weights_gb']:.1f} MB: export {fmt(sync['export_s_per_gb'], '{:.2f}')} s/GB, "
                f"engine load {fmt(sync['load_s_per_gb'], '{:.2f}')} s/GB (engine on {sync['engine_device']})"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = set(parts) - {"sft", "grpo", "sync", "megatron"}
    if unknown:
        raise SystemExit(f"unknown parts {sorted(unknown)}; known: sft, grpo, sync, megatron")
    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --cpu (and --tiny for a smoke test)")
    shape = dict(TINY if args.tiny else FULL)
    if args.seq_len:
        shape["seq_len"] = args.seq_len
    steps = args.steps or (2 if args.tiny else 5)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    work = Path(tempfile.mkdtemp(prefix="swerl-device-bench-"))
    results: dict[str, Any] = {"environment": environment(args.cpu), "shape": shape, "steps": steps,
                               "peak_tflops": None if args.cpu else args.peak_tflops,
                               "flops_formula": "6 N + 12 L H D S per token"}  # fmt: skip
    started = time.perf_counter()
    ctx = rank_context(args.cpu) if {"sft", "grpo", "sync"} & set(parts) else None
    trainer = None
    for part in parts:
        began = time.perf_counter()
        try:
            if part == "sft":
                results["sft"] = bench_sft(args, shape, ctx, steps)
            elif part == "grpo":
                results["grpo"], trainer = bench_grpo(args, shape, ctx, steps, work)
            elif part == "sync":
                if trainer is None:
                    results["grpo_for_sync"], trainer = bench_grpo(args, shape, ctx, 1, work)
                results["sync"] = bench_sync(args, trainer, work)
            elif part == "megatron":
                results["megatron"] = bench_megatron(args, work, steps)
        except Exception as exc:  # noqa: BLE001 - one part failing must not hide the others' numbers
            traceback.print_exc()
            results[part] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"[{part}] {time.perf_counter() - began:.1f} s", flush=True)
    results["wall_s"] = time.perf_counter() - started
    print(summary(results), flush=True)
    out = args.out or (Path(os.environ["OUT"]) / "device_bench.json" if os.environ.get("OUT") else None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"wrote {out}")
    failed = [part for part in parts if isinstance(results.get(part), dict) and "error" in results[part]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
