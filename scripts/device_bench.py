"""Device benchmark: swerl's FSDP2 trainer (SFT and GRPO steps), a weight sync into the local engine, and a
Megatron step, on one GPU; the numbers scripts/device_check.sh reports.

Parts (`--parts`, comma-separated; default sft,grpo,sync):
- sft: SFTTrainer (swerl.train.sft) on one FSDP2 rank (swerl.train.distributed.init_rank + shard_model, bf16
  MixedPrecisionPolicy, fp32 master weights), packed rows of random tokens with the assistant mask on half.
- grpo: GRPOTrainer (swerl.train.grpo_trainer) on the same rank: synthetic groups (random tokens, sampled runs and
  observations, random behaviour log-probs, rewards 0/1), one optimizer update per step.
- sync: the GRPO trainer's weights into a local engine (on the GPU, bf16; on CPU, float32), two ways side by side:
  through disk (export_weights to an HF folder, LocalEngine.update_weights_from_disk) and over a process group
  (swerl.rollout.step.DistributedWeights, the GRPO loops' engine.weight_sync.method distributed: the trainer's
  broadcast_weights to the engine's update_weights_from_distributed, buckets of weight_sync.bucket_mb): a warm-up
  sync that forms the group, then --syncs timed ones; seconds per sync, GB per sync, seconds per GB and GB/s. The
  backend: gloo on CPU; on GPUs NCCL with the engine on a second GPU, and on a machine with one GPU whatever a
  child process finds NCCL does with two ranks on that one device (NCCL >= 2.5 refuses: "Duplicate GPU
  detected"), gloo carrying the CUDA tensors when it refuses (group_placement; --sync-backend forces one). Then a
  check that the engine holds the trainer's weights: it starts from zeroed weights, and after the syncs its state
  dict equals the trainer's cast to the engine dtype, bit for bit, and its greedy tokens equal those of an engine
  built from an export of the same weights; a failed check fails the part.
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
Prints a summary table; writes JSON to --out, or to $OUT/device_bench.json when OUT is set (after every part, so a
part cut off by the device check's time limit leaves the earlier figures): "sync" (disk) and "sync_group" (the
process group, with its "weights_check").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
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

FULL = dict(
    hidden_size=1024,
    num_layers=28,
    num_heads=16,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=3072,
    vocab_size=151936,
    seq_len=2048,
)
TINY = dict(
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=512,
    seq_len=128,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on CPU (gloo), no MFU")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and few steps (smoke test)")
    parser.add_argument("--parts", default="sft,grpo,sync", help="sft,grpo,sync,megatron")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per part (after one warm-up)")
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--peak-tflops", type=float, default=H200_BF16_DENSE_TFLOPS)
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default $OUT/device_bench.json)")
    parser.add_argument("--syncs", type=int, default=3, help="timed syncs over the process group (after a warm-up)")
    parser.add_argument(
        "--sync-backend",
        choices=("auto", "nccl", "gloo"),
        default="auto",
        help="the process group's backend (auto: gloo on CPU; nccl on GPUs, see group_placement)",
    )
    parser.add_argument("--nccl-probe", action="store_true", help=argparse.SUPPRESS)  # the child of probe_nccl_one_gpu
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------------------------------------------
# Model, data, FLOPs


def qwen3_config(shape: dict[str, int], pad_token_id: int) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=shape["vocab_size"],
        hidden_size=shape["hidden_size"],
        num_hidden_layers=shape["num_layers"],
        num_attention_heads=shape["num_heads"],
        num_key_value_heads=shape["num_kv_heads"],
        head_dim=shape["head_dim"],
        intermediate_size=shape["intermediate_size"],
        max_position_embeddings=max(4096, shape["seq_len"]),
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        eos_token_id=pad_token_id,
        bos_token_id=None,
    )


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
    return 6.0 * matmul_parameters(model) + 12.0 * c.num_hidden_layers * c.num_attention_heads * head_dim * seq_len


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
            rows.append(
                Trajectory(
                    task_id=f"g{group}",
                    attempt=attempt,
                    group_id=f"g{group}",
                    status=EpisodeStatus.RESOLVED if reward else EpisodeStatus.UNRESOLVED,
                    reward=reward,
                    prompt_tokens=prompt,
                    token_ids=ids,
                    loss_mask=mask,
                    behaviour_logprobs=behaviour,
                    token_weight_versions=[0 if m else -1 for m in mask],
                    num_turns=1,
                )
            )
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
    from swerl.config.train import DistributedConfig
    from swerl.services import free_port
    from swerl.train.distributed import init_rank
    from swerl.train.ranks import rank_env

    port = int(os.environ.get("MASTER_PORT") or free_port("127.0.0.1"))
    for name, value in rank_env(0, 1, "127.0.0.1", port).items():
        os.environ.setdefault(name, value)  # torchrun's, when it set them
    config = DistributedConfig(
        backend="fsdp2",
        device="cpu" if cpu else "cuda",
        ranks=1,
        param_dtype="bfloat16",
        reduce_dtype="float32",
        attn_implementation="sdpa",
    )
    return init_rank(config)


def bench_sft(args: argparse.Namespace, shape: dict[str, int], ctx: Any, steps: int) -> dict[str, Any]:
    from swerl.train.sft import SFTTrainer

    seq_len = shape["seq_len"]
    model = build_model(shape, ctx.device)
    flops = flops_per_token(model, seq_len)
    parameters = sum(parameter.numel() for parameter in model.parameters())
    rows, accum = (2, 2) if args.tiny else (4, 2)
    examples = sft_examples(shape["vocab_size"], 8 * rows * accum * (steps + 1), seq_len)
    trainer = SFTTrainer(
        model,
        examples,
        seq_len=seq_len,
        max_steps=steps + 1,
        rows_per_micro_batch=rows,
        grad_accum_steps=accum,
        lr=1e-5,
        warmup_steps=0,
        seed=0,
        pad_token_id=0,
        ranks=ctx,
    )
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
    result.update(
        parameters=parameters,
        seq_len=seq_len,
        rows_per_micro_batch=rows,
        grad_accum_steps=accum,
        steps=steps,
        loss_last=losses[-1],
        peak_memory_gb=peak_memory_gb(ctx.device),
    )
    del trainer, model
    free_memory(ctx.device)
    return result


def bench_grpo(
    args: argparse.Namespace, shape: dict[str, int], ctx: Any, steps: int, work: Path
) -> tuple[dict[str, Any], Any]:
    from swerl.config.grpo import GRPOAlgorithmConfig
    from swerl.model.tokenizer import train_tokenizer
    from swerl.train.grpo_step import UpdateSettings
    from swerl.train.grpo_trainer import GRPOTrainer

    seq_len = shape["seq_len"]
    model = build_model(shape, ctx.device)
    flops = flops_per_token(model, seq_len)
    tokenizer = train_tokenizer(["def add(a, b):\n    return a + b\n"] * 50, vocab_size=300, out_dir=work / "tok")
    settings = UpdateSettings(**GRPOAlgorithmConfig(micro_batch_tokens=4 * seq_len, grad_clip=1.0).model_dump())
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
    result.update(
        seq_len=seq_len,
        groups=groups,
        attempts=attempts,
        steps=steps,
        loss_last=last.get("loss"),
        grad_norm_last=last.get("grad_norm"),
        peak_memory_gb=peak_memory_gb(ctx.device),
    )
    return result, trainer


def engine_options(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """LocalEngine arguments as swerl.engine.factory.open_engine maps them: the model on `device` in the engine dtype
    (float32 on CPU, bfloat16 on the GPU), a small batch and context (the checks generate a few tokens)."""
    from swerl.config.engine import WeightSyncConfig
    from swerl.engine.factory import DTYPES

    return dict(
        max_batch_size=1,
        max_context_tokens=64,
        prefix_cache_size=0,
        device=device,
        dtype=DTYPES[engine_dtype(args)],
        weight_sync_timeout_s=min(WeightSyncConfig().timeout_s, 120.0),
    )


def engine_dtype(args: argparse.Namespace) -> str:
    return "float32" if args.cpu else "bfloat16"


def bench_sync(args: argparse.Namespace, trainer: Any, work: Path) -> tuple[dict[str, Any], Path]:
    """Export the GRPO trainer's weights (HF folder) and load them into the local engine; seconds per GB. Returns the
    figures and the second export (the trainer's current weights)."""
    from swerl.engine.local import LocalEngine

    first = trainer.export_weights(work / "exports", version=1)
    size_gb = sum(path.stat().st_size for path in first.glob("*.safetensors")) / 1e9
    started = time.perf_counter()
    second = trainer.export_weights(work / "exports", version=2)
    export_s = time.perf_counter() - started
    engine_device = "cpu" if args.cpu else "cuda"

    async def load() -> float:
        async with LocalEngine(first, **engine_options(args, engine_device)) as engine:
            began = time.perf_counter()
            await engine.update_weights_from_disk(str(second), 2)
            return time.perf_counter() - began

    load_s = asyncio.run(load())
    seconds = export_s + load_s
    return {
        "weights_gb": size_gb,
        "export_s": export_s,
        "load_s": load_s,
        "export_s_per_gb": export_s / size_gb if size_gb else None,
        "load_s_per_gb": load_s / size_gb if size_gb else None,
        "seconds_per_sync": seconds,
        "s_per_gb": seconds / size_gb if size_gb else None,
        "gb_per_s": size_gb / seconds if seconds > 0 else None,
        "engine_device": engine_device,
        "method": "disk (export_weights -> LocalEngine.update_weights_from_disk)",
    }, second


def group_placement(args: argparse.Namespace, trainer_device: torch.device) -> tuple[str, str, dict[str, Any]]:
    """Where the engine of the process-group sync runs and over which backend: (engine device, backend, notes).

    CPU: gloo. GPUs: with two visible the engine takes the second and NCCL carries the weights; with one, the
    engine shares the trainer's GPU, where NCCL (from 2.5) refuses a communicator with two ranks on one device
    ("Duplicate GPU detected"): a child process asks this machine's NCCL (--nccl-probe), and gloo (CUDA tensors
    through host memory) carries the weights when NCCL says no. --sync-backend forces a backend.
    """
    notes: dict[str, Any] = {}
    if args.cpu:
        return "cpu", "nccl" if args.sync_backend == "nccl" else "gloo", notes
    if torch.cuda.device_count() >= 2:
        other = 1 if (trainer_device.index or 0) == 0 else 0
        return f"cuda:{other}", "gloo" if args.sync_backend == "gloo" else "nccl", notes
    device = f"cuda:{trainer_device.index or 0}"
    if args.sync_backend != "auto":
        return device, args.sync_backend, notes
    probe = probe_nccl_one_gpu()
    notes["nccl_same_gpu"] = probe
    if probe.get("ok"):
        return device, "nccl", notes
    notes["backend_reason"] = (
        "one GPU: the trainer and the engine share it, and NCCL did not form a group of two ranks on one device "
        "(nccl_same_gpu); gloo carried the CUDA tensors through host memory"
    )
    return device, "gloo", notes


def probe_nccl_one_gpu(timeout_s: float = 60.0) -> dict[str, Any]:
    """Run `device_bench.py --nccl-probe` in a child process (an NCCL failure must not take this one down)."""
    began = time.perf_counter()
    try:
        run = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--nccl-probe"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"no answer within {timeout_s:g} s", "seconds": timeout_s}
    answer = next((line for line in reversed(run.stdout.splitlines()) if line.startswith("{")), None)
    result = json.loads(answer) if answer else {"ok": False, "error": (run.stderr.strip() or "no output")[-600:]}
    result.update(exit=run.returncode, seconds=time.perf_counter() - began)
    return result


def nccl_probe() -> dict[str, Any]:
    """Can NCCL form a weight group of two ranks on GPU 0 of one process (swerl.engine.weight_sync, as the
    process-group sync forms it)? Rank 0 sends [0, 1, 2, 3], rank 1 receives it."""
    import threading

    from swerl.engine.weight_sync import TensorSpec, open_group, receive_list, send_tensors
    from swerl.services import free_port

    port, outcome = free_port(), dict[str, Any]()

    def member(rank: int) -> None:
        try:
            device = torch.device("cuda", 0)
            group = open_group("127.0.0.1", port, rank, 2, "nccl", 30.0, device, group_name="nccl-probe")
            try:
                if rank == 0:
                    send_tensors(group, [torch.arange(4, dtype=torch.float32, device=device)])
                else:
                    received = receive_list(group, [TensorSpec("x", "float32", (4,))], device)[0]
                    outcome["received"] = received.cpu().tolist()
            finally:
                group.close()
        except Exception as error:  # noqa: BLE001 - the answer is the error
            outcome.setdefault("error", f"rank {rank}: {type(error).__name__}: {error}"[-600:])

    threads = [threading.Thread(target=member, args=(rank,), daemon=True) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 40.0
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    if any(thread.is_alive() for thread in threads) and "error" not in outcome:
        outcome["error"] = "the group did not form or the broadcast did not complete within 40 s"
    return {"ok": outcome.get("received") == [0.0, 1.0, 2.0, 3.0] and "error" not in outcome, **outcome}


def bench_group_sync(
    args: argparse.Namespace, trainer: Any, work: Path, export: Path | None, syncs: int
) -> dict[str, Any]:
    """The GRPO trainer's weights to a local engine over a process group (swerl.rollout.step.DistributedWeights,
    the GRPO loops' engine.weight_sync.method distributed): one warm-up sync (it forms the group), then `syncs`
    timed ones. Then the check that the engine holds the trainer's weights: its state dict equals the trainer's
    (cast to the engine dtype), and greedy generation equals that of a second engine built from an export of the
    same weights. The engine starts from zeroed weights, so a sync that moves nothing fails the check."""
    from swerl.config.engine import WeightSyncConfig
    from swerl.engine.local import LocalEngine
    from swerl.rollout.step import DistributedWeights

    if export is None:
        export = trainer.export_weights(work / "exports", version=2)
    engine_device, backend, notes = group_placement(args, trainer.device)
    defaults = WeightSyncConfig()
    weights = DistributedWeights(
        master_addr=defaults.master_addr,
        master_port=0,
        backend=backend,
        group_name=defaults.group_name,
        bucket_bytes=defaults.bucket_mb << 20,
        dtype=engine_dtype(args),
        timeout_s=min(defaults.timeout_s, 120.0),
    )
    options = engine_options(args, engine_device)

    async def run() -> dict[str, Any]:
        async with LocalEngine(export, **options) as engine, LocalEngine(export, **options) as reference:
            with torch.no_grad():
                for parameter in engine.model.parameters():
                    parameter.zero_()
            before = compare_weights(trainer, engine)
            warmup = await weights.sync(trainer, engine, version=1)
            sync_cuda(engine.device)
            timed = []
            for version in range(2, syncs + 2):
                timed.append(await weights.sync(trainer, engine, version=version))
            sync_cuda(engine.device)
            after = compare_weights(trainer, engine)
            prompt = [random.Random(1).randrange(3, engine.vocab_size) for _ in range(16)]
            synced, loaded = await greedy(engine, prompt, 8), await greedy(reference, prompt, 8)
            served_version = engine.weight_version
        seconds = [stats.seconds for stats in timed]
        per_sync = sum(seconds) / len(seconds)
        gigabytes = timed[-1].bytes / 1e9
        check = {
            "state_dict_equal": after["equal"],
            "state_dict": after,
            "differed_before": not before["equal"],
            "greedy_tokens": len(synced),
            "greedy_equal": synced == loaded and len(synced) == 8,
            "greedy_synced": synced,
            "greedy_from_export": loaded,
            "engine_version": served_version,
            "expected_version": syncs + 1,
        }
        check["ok"] = bool(
            check["state_dict_equal"]
            and check["differed_before"]
            and check["greedy_equal"]
            and served_version == syncs + 1
        )
        result = {
            "backend": backend,
            "engine_device": engine_device,
            "trainer_device": str(trainer.device),
            "dtype": engine_dtype(args),
            "syncs": syncs,
            "gb_per_sync": gigabytes,
            "bytes_per_sync": timed[-1].bytes,
            "buckets": timed[-1].buckets,
            "tensors": timed[-1].tensors,
            "bucket_mb": defaults.bucket_mb,
            "first_sync_s": warmup.seconds,
            "seconds_per_sync": per_sync,
            "seconds_min": min(seconds),
            "seconds_max": max(seconds),
            "s_per_gb": per_sync / gigabytes if gigabytes else None,
            "gb_per_s": gigabytes / per_sync if per_sync > 0 else None,
            "weights_check": check,
            "method": "process group (DistributedWeights.sync: GRPOTrainer.broadcast_weights -> "
            "LocalEngine.update_weights_from_distributed)",
            **notes,
        }
        if not check["ok"]:
            result["error"] = (
                f"weights check failed: state dict equal {after['equal']} (differing {after['differing']}, "
                f"unmatched {after['unmatched']}), differed before {check['differed_before']}, greedy equal "
                f"{check['greedy_equal']}, version {served_version} (expected {syncs + 1})"
            )
        return result

    return asyncio.run(run())


@torch.no_grad()
def compare_weights(trainer: Any, engine: Any) -> dict[str, Any]:
    """The engine model's state dict against the trainer's, each tensor gathered in full and cast to the engine's
    dtype (as the sync sends it): bitwise equal or not."""
    served = engine.model.state_dict()
    own = trainer.model.state_dict()
    unmatched = sorted(set(served) ^ set(own))
    differing, max_abs = [], 0.0
    for name, tensor in served.items():
        if name not in own:
            continue
        full = getattr(own[name], "full_tensor", None)
        expected = (full() if full is not None else own[name]).detach().to(device=tensor.device, dtype=tensor.dtype)
        if expected.shape != tensor.shape:
            differing.append(name)
        elif not torch.equal(expected, tensor):
            differing.append(name)
            max_abs = max(max_abs, (expected.float() - tensor.float()).abs().max().item())
    return {
        "tensors": len(served),
        "unmatched": unmatched[:8],
        "differing": differing[:8],
        "differing_count": len(differing),
        "max_abs_diff": max_abs,
        "equal": not unmatched and not differing,
    }


async def greedy(engine: Any, prompt: list[int], tokens: int) -> list[int]:
    from swerl.engine.base import GenerateRequest, SamplingParams

    request = GenerateRequest(
        input_ids=prompt,
        sampling_params=SamplingParams(max_new_tokens=tokens, temperature=0.0, ignore_eos=True),
    )
    return (await engine.generate(request)).output_ids


def bench_megatron(args: argparse.Namespace, work: Path, steps: int) -> dict[str, Any]:
    """A tiny Qwen3-MoE (from config) through swerl.train.megatron_backend: forward, backward, optimizer step."""
    from swerl.config.grpo import GRPOAlgorithmConfig
    from swerl.config.train import DistributedConfig
    from swerl.model.loading import build_tiny_model, save_model_and_tokenizer
    from swerl.model.tokenizer import train_tokenizer
    from swerl.train import megatron_backend, megatron_settings
    from swerl.train.grpo_step import UpdateSettings

    missing = megatron_settings.missing_pieces()
    if missing:
        return {"skipped": "; ".join(missing)}
    tokenizer = train_tokenizer(["def add(a, b):\n    return a + b\n"] * 50, vocab_size=300, out_dir=work / "mtok")
    model = build_tiny_model(
        tokenizer,
        hidden_size=256,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=256,
        max_position_embeddings=1024,
        moe=True,
        num_experts=8,
        num_experts_per_tok=2,
    )
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
    return {
        "build_s": build_s,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "loss_last": last.get("loss"),
        "grad_norm_last": last.get("grad_norm"),
        "transformer_engine": megatron_settings.has_transformer_engine(),
    }


def rank_context_env() -> None:
    from swerl.services import free_port
    from swerl.train.ranks import rank_env

    port = int(os.environ.get("MASTER_PORT") or free_port("127.0.0.1"))
    for name, value in rank_env(0, 1, "127.0.0.1", port).items():
        os.environ.setdefault(name, value)  # torchrun's, when it set them


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
            lines.append(f"{part:<10} {'-':>12} {'-':>9} {'-':>7}  {entry.get('skipped') or entry.get('error')}")
            continue
        mfu = entry.get("mfu")
        notes = f"loss {fmt(entry.get('loss_last'), '{:.4f}')}"
        if entry.get("peak_memory_gb") is not None:
            notes += f", peak {entry['peak_memory_gb']:.1f} GB"
        lines.append(
            f"{part:<10} {fmt(entry.get('tokens_per_s'), '{:.0f}'):>12} {fmt(entry.get('tflops'), '{:.1f}'):>9} "
            f"{fmt(None if mfu is None else 100 * mfu, '{:.1f}%'):>7}  {notes}"
        )
    lines += sync_table(results, fmt)
    return "\n".join(lines)


def sync_table(results: dict[str, Any], fmt: Any) -> list[str]:
    """The weight syncs, through disk and over the process group, side by side."""
    disk, group = results.get("sync"), results.get("sync_group")
    if disk is None and group is None:
        return []
    lines = ["", f"{'weight sync':<16} {'GB/sync':>9} {'s/sync':>8} {'s/GB':>8} {'GB/s':>8}  notes"]
    if disk is not None:
        if "error" in disk:
            lines.append(f"{'disk':<16} error: {disk['error']}")
        else:
            lines.append(
                f"{'disk':<16} {fmt(disk.get('weights_gb'), '{:.4f}'):>9} "
                f"{fmt(disk.get('seconds_per_sync'), '{:.3f}'):>8} "
                f"{fmt(disk.get('s_per_gb'), '{:.2f}'):>8} {fmt(disk.get('gb_per_s'), '{:.3f}'):>8}  export "
                f"{fmt(disk.get('export_s'), '{:.3f}')} s + load {fmt(disk.get('load_s'), '{:.3f}')} s (trainer's "
                f"dtype on disk; engine on {disk.get('engine_device')})"
            )
    if group is not None:
        name = f"group ({group.get('backend', '?')})"
        if "seconds_per_sync" not in group:
            lines.append(f"{name:<16} error: {group.get('error')}")
        else:
            check = group["weights_check"]
            verdict = "weights check ok" if check["ok"] else f"WEIGHTS CHECK FAILED: {group.get('error')}"
            lines.append(
                f"{name:<16} {fmt(group['gb_per_sync'], '{:.4f}'):>9} {fmt(group['seconds_per_sync'], '{:.3f}'):>8} "
                f"{fmt(group['s_per_gb'], '{:.2f}'):>8} {fmt(group['gb_per_s'], '{:.3f}'):>8}  {group['syncs']} syncs "
                f"after a warm-up of {group['first_sync_s']:.2f} s, {group['buckets']} buckets, {group['tensors']} "
                f"tensors, {group['dtype']}; engine on {group['engine_device']}; {verdict} (state dict "
                f"{'equal' if check['state_dict_equal'] else 'differs'}, greedy {check['greedy_tokens']} tokens "
                f"{'equal' if check['greedy_equal'] else 'differ'})"
            )
            if group.get("backend_reason"):
                lines.append(f"{'':<16} {group['backend_reason']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.nccl_probe:
        print(json.dumps(nccl_probe()), flush=True)
        os._exit(0)  # NCCL's threads must not hold the exit up
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = set(parts) - {"sft", "grpo", "sync", "megatron"}
    if unknown:
        raise SystemExit(f"unknown parts {sorted(unknown)}; known: sft, grpo, sync, megatron")
    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --cpu (and --tiny for a smoke test)")
    if args.syncs < 1:
        raise SystemExit("--syncs must be >= 1")
    shape = dict(TINY if args.tiny else FULL)
    if args.seq_len:
        shape["seq_len"] = args.seq_len
    steps = args.steps or (2 if args.tiny else 5)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    work = Path(tempfile.mkdtemp(prefix="swerl-device-bench-"))
    out = args.out or (Path(os.environ["OUT"]) / "device_bench.json" if os.environ.get("OUT") else None)
    results: dict[str, Any] = {
        "environment": environment(args.cpu),
        "shape": shape,
        "steps": steps,
        "peak_tflops": None if args.cpu else args.peak_tflops,
        "flops_formula": "6 N + 12 L H D S per token",
    }
    started = time.perf_counter()
    ctx = rank_context(args.cpu) if {"sft", "grpo", "sync"} & set(parts) else None
    trainer = None

    def attempt(name: str, measure: Any, *arguments: Any) -> Any:
        """measure(*arguments); on an exception, None and results[name] = the error (one part failing must not hide
        the others' numbers)."""
        try:
            return measure(*arguments)
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            return None

    for part in parts:
        began = time.perf_counter()
        if part == "sft":
            measured = attempt("sft", bench_sft, args, shape, ctx, steps)
            if measured is not None:
                results["sft"] = measured
        elif part == "grpo" or (part == "sync" and trainer is None):
            name = "grpo" if part == "grpo" else "grpo_for_sync"  # sync alone: one GRPO step makes a trainer
            made = attempt(name, bench_grpo, args, shape, ctx, steps if part == "grpo" else 1, work)
            if made is not None:
                results[name], trainer = made
        if part == "sync":
            if trainer is None:
                results["sync"] = results["sync_group"] = {"error": "no GRPO trainer to sync from"}
            else:
                disk = attempt("sync", bench_sync, args, trainer, work)
                export = None
                if disk is not None:
                    results["sync"], export = disk
                write(out, results)  # the disk figures stay if the group sync runs past the part's limit
                group = attempt("sync_group", bench_group_sync, args, trainer, work, export, args.syncs)
                if group is not None:
                    results["sync_group"] = group
        elif part == "megatron":
            measured = attempt("megatron", bench_megatron, args, work, steps)
            if measured is not None:
                results["megatron"] = measured
        print(f"[{part}] {time.perf_counter() - began:.1f} s", flush=True)
        write(out, results)  # after each part: a later part running out of time keeps the earlier figures
    results["wall_s"] = time.perf_counter() - started
    print(summary(results), flush=True)
    if write(out, results):
        print(f"wrote {out}")
    failed = [name for name, entry in results.items() if isinstance(entry, dict) and "error" in entry]
    return 1 if failed else 0


def write(out: Path | None, results: dict[str, Any]) -> bool:
    if out is None:
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return True


if __name__ == "__main__":
    sys.exit(main())
