"""The megatron trainer backend (swerl.train.megatron_backend, its pure parts in swerl.train.megatron_settings).

On a CPU machine (and on Python 3.11): the import guard names every missing piece and the install command, for the
backend selected directly, through the GRPO config and through the stage's rank factory; the module loads without
importing megatron; the config -> megatron mapping, the parallel-size rules, the data-parallel share, the
context-parallel split; and the layout the megatron step computes its loss on (each position carrying its next
token's target, padded, split over context-parallel ranks) gives the torch backend's loss exactly, on a real model.

gpu-marked (skipped without CUDA and the `megatron` extra; they run in scripts/device_check.sh where a GPU is): a
forward/backward step of a tiny Qwen3-MoE built from config through megatron-bridge; the GRPO step's loss, gradient
norm and entropy against the torch backend's GRPOTrainer on the same groups, within the bf16 tolerance stated
below; export -> HF folder -> reload equals the weights.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from swerl.config.grpo import GRPOAlgorithmConfig, GRPOConfig
from swerl.config.train import DistributedConfig, MegatronConfig
from swerl.model.loading import save_model_and_tokenizer
from swerl.train import megatron_backend as mb
from swerl.train import megatron_settings as ms
from swerl.train.grpo import LossSettings, policy_loss, token_entropy
from swerl.train.grpo_step import UpdateSettings, collate, score_groups
from swerl.trajectory import EpisodeStatus, Trajectory
from tests.tiny_models import MOE, TinyModels, tiny_qwen3

ROOT = Path(__file__).resolve().parents[2]

# GRPO step, megatron bf16 vs the torch backend's bf16 autocast on the same groups and start weights. The two
# round differently (megatron keeps bf16 weights and casts the norms' math its own way; autocast keeps fp32 weights
# and casts per op), so their log-probs differ by ~1e-2 nats per token; a step's loss is a mean over hundreds of
# tokens, so it agrees far closer than one token does.
BF16_LOSS_RTOL, BF16_LOSS_ATOL = 0.05, 2e-3
BF16_GRAD_NORM_RTOL = 0.10
BF16_ENTROPY_ATOL = 0.05


# Self-contained (no test helper that imports the stages; tests/tiny_models.py imports only swerl.model): the GPU
# machine runs this file with swerl's trainer dependencies only (scripts/device_check.sh), not prefect, mlflow or
# the sandboxes.
CORPUS = [
    "name a digit: 0 1 2 3 4 5 6 7 8 9\n",
    "the quick brown fox jumps over the lazy dog\n",
    "def add(left, right):\n    return left + right\n",
]
POSITIONS = 128  # the tiny model's


@pytest.fixture(scope="module")
def tokenizer(tiny_models: TinyModels) -> PreTrainedTokenizerBase:
    return tiny_models.tokenizer(CORPUS * 20, vocab_size=300)


def settings(**overrides: Any) -> UpdateSettings:
    """grpo.algorithm's defaults with these fields changed, as the stage hands them to a trainer."""
    return UpdateSettings(**GRPOAlgorithmConfig(**overrides).model_dump())


def synthetic_groups(seed: int, vocab: int, num_groups: int = 3, attempts: int = 4) -> list[list[Trajectory]]:
    """Groups of random trajectories: a prompt, then sampled and observation runs; behaviour log-probs random (so
    the TIS weights, and with them the loss, depend on the trainer's log-probs); rewards 0 or 1."""
    rng = random.Random(seed)
    groups = []
    for group in range(num_groups):
        rows = []
        for attempt in range(attempts):
            prompt = rng.randint(3, 8)
            ids, mask, behaviour = (
                [rng.randrange(7, vocab) for _ in range(prompt)],
                [0] * prompt,
                [0.0] * prompt,
            )
            turns = rng.randint(1, 2)
            for _ in range(turns):
                sampled, observation = rng.randint(1, 6), rng.randint(0, 4)
                ids += [rng.randrange(7, vocab) for _ in range(sampled + observation)]
                mask += [1] * sampled + [0] * observation
                behaviour += [-rng.uniform(0.5, 8.0) for _ in range(sampled)] + [0.0] * observation
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
                    num_turns=turns,
                )
            )
        groups.append(rows)
    return groups


def megatron_config(**megatron: Any) -> DistributedConfig:
    return DistributedConfig(
        backend="megatron",
        device="cuda",
        ranks=1,
        param_dtype="bfloat16",
        megatron=MegatronConfig(**megatron),
    )


# ----------------------------------------------------------------------------------------------------------------
# The import guard


def test_guard_names_every_missing_piece_and_the_install_command() -> None:
    with pytest.raises(ms.MegatronUnavailable) as caught:
        ms.require_megatron(python=(3, 11), has_module=lambda name: False, cuda_available=lambda: False)
    message = str(caught.value)
    for piece in (
        "Python 3.11",
        "Python >= 3.12",
        "megatron-core is not installed",
        "megatron-bridge is not installed",
        "no CUDA device",
        "uv pip install -e '.[megatron]'",
        "docs/gpu.md",
    ):
        assert piece in message, (piece, message)


def test_guard_names_only_what_is_missing() -> None:
    ms.require_megatron(python=(3, 12), has_module=lambda name: True, cuda_available=lambda: True)
    with pytest.raises(ms.MegatronUnavailable) as caught:
        ms.require_megatron(
            python=(3, 12), has_module=lambda name: name != "megatron.bridge", cuda_available=lambda: True
        )
    message = str(caught.value)
    assert "megatron-bridge is not installed" in message
    assert "megatron-core" not in message.split(". Install")[0]
    assert "Python 3.12:" not in message and "CUDA" not in message.split(". Install")[0]


def test_guard_on_this_machine_matches_what_it_has() -> None:
    """Here (CPU, Python 3.11, no extra): the real probes fail and say why."""
    missing = ms.missing_pieces()
    if not missing:
        pytest.skip("this machine can run the megatron backend")
    if sys.version_info < (3, 12):
        assert any("Python 3." in piece for piece in missing)
    if not torch.cuda.is_available():
        assert any("CUDA" in piece for piece in missing)


@pytest.mark.skipif(not ms.missing_pieces(), reason="this machine can run the megatron backend")
def test_selecting_megatron_without_the_extra_fails_clearly(tmp_path: Path) -> None:
    """The trainer itself, the GRPO config's builder and the stage's rank factory all stop at the guard, before
    touching the model folder (which does not exist here)."""
    config = megatron_config()
    with pytest.raises(ms.MegatronUnavailable, match="cannot run here"):
        mb.MegatronGRPOTrainer(tmp_path / "absent", config, settings(), seed=0)
    grpo = GRPOConfig(distributed=config)
    with pytest.raises(ms.MegatronUnavailable, match="pip install"):
        mb.build_megatron_trainer(tmp_path / "absent", grpo, 1.0, 0)
    try:  # the stages need the whole project's dependencies (absent on a lean GPU machine)
        from swerl.stages.grpo import build_rank_trainer
    except ImportError as exc:
        pytest.skip(f"swerl.stages does not import here: {exc}")
    with pytest.raises(ms.MegatronUnavailable, match="megatron"):
        build_rank_trainer(tmp_path / "absent", grpo, 1.0, 0)


def test_module_loads_without_megatron() -> None:
    """Only a selected megatron backend imports megatron: importing the module (as the stage's import graph does)
    loads none of it."""
    code = (
        "import sys, swerl.train.megatron_backend\n"
        "loaded = [m for m in sys.modules if m == 'megatron' or m.startswith(('megatron.', 'transformer_engine'))]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_megatron_extra_is_pinned_for_python_312_only() -> None:
    """`pip install -e .[dev,e2b]` on 3.11 is unaffected: every megatron requirement is an exact pin behind a
    python_version >= '3.12' marker."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    requirements = extras["megatron"]
    names = {requirement.split("==")[0] for requirement in requirements}
    assert {"megatron-core", "megatron-bridge"} <= names
    for requirement in requirements:
        assert "==" in requirement and "python_version >= '3.12'" in requirement, requirement


# ----------------------------------------------------------------------------------------------------------------
# Config -> megatron


def test_parallel_sizes_follow_megatron_rules() -> None:
    sizes = ms.parallel_sizes(16, MegatronConfig(tensor_parallel=2, pipeline_parallel=2, expert_parallel=4))
    assert (sizes.data, sizes.expert_data) == (4, 2)
    sizes = ms.parallel_sizes(8, MegatronConfig(tensor_parallel=4, expert_parallel=8, expert_tensor_parallel=1))
    assert (sizes.data, sizes.expert_data) == (2, 1)
    with pytest.raises(ValueError, match="tensor x pipeline x context parallel \\(6\\)"):
        ms.parallel_sizes(8, MegatronConfig(tensor_parallel=2, pipeline_parallel=3))
    with pytest.raises(ValueError, match="expert_tensor x expert x pipeline parallel \\(16\\)"):
        ms.parallel_sizes(8, MegatronConfig(expert_parallel=8, expert_tensor_parallel=2))


def test_parallel_state_kwargs() -> None:
    m = MegatronConfig(
        tensor_parallel=2, pipeline_parallel=4, context_parallel=2, expert_parallel=8, expert_tensor_parallel=1
    )
    assert ms.parallel_state_kwargs(m) == {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 4,
        "context_parallel_size": 2,
        "expert_model_parallel_size": 8,
        "expert_tensor_parallel_size": 1,
    }


def test_provider_overrides() -> None:
    config = DistributedConfig(
        backend="megatron",
        device="cuda",
        ranks=8,
        param_dtype="bfloat16",
        reduce_dtype="float32",
        megatron=MegatronConfig(
            tensor_parallel=2, pipeline_parallel=2, sequence_parallel=True, expert_parallel=2, recompute="full"
        ),
    )
    fields = ms.provider_overrides(config, transformer_engine=False)
    assert fields["tensor_model_parallel_size"] == 2 and fields["pipeline_model_parallel_size"] == 2
    assert fields["expert_model_parallel_size"] == 2 and fields["sequence_parallel"] is True
    assert fields["bf16"] is True and fields["params_dtype"] is torch.bfloat16
    assert fields["variable_seq_lengths"] is True  # pipeline sends of micro-batches of different shapes
    assert (fields["recompute_granularity"], fields["recompute_method"], fields["recompute_num_layers"]) == (
        "full",
        "uniform",
        1,
    )
    # the torch backend's objective: no dropout, no MoE auxiliary loss
    assert fields["moe_aux_loss_coeff"] == 0.0 and fields["moe_router_load_balancing_type"] == "none"
    assert fields["attention_dropout"] == fields["hidden_dropout"] == 0.0
    # without transformer-engine: the local layers (sequential experts, no TE/apex fusions)
    assert fields["moe_grouped_gemm"] is False and fields["moe_permute_fusion"] is False
    assert fields["gradient_accumulation_fusion"] is False
    with_te = ms.provider_overrides(config, transformer_engine=True)
    assert "moe_grouped_gemm" not in with_te and "gradient_accumulation_fusion" not in with_te
    fp32 = ms.provider_overrides(DistributedConfig(backend="megatron", device="cuda"), transformer_engine=False)
    assert fp32["bf16"] is False and fp32["params_dtype"] is torch.float32
    assert fp32["recompute_granularity"] is None and fp32["variable_seq_lengths"] is False
    assert ms.recompute_fields("selective")["recompute_granularity"] == "selective"


def test_ddp_and_optimizer_configs() -> None:
    config = DistributedConfig(
        backend="megatron",
        device="cuda",
        ranks=2,
        param_dtype="bfloat16",
        reduce_dtype="bfloat16",
        megatron=MegatronConfig(distributed_optimizer=False),
    )
    ddp = ms.ddp_config_kwargs(config)
    assert ddp["grad_reduce_in_fp32"] is False and ddp["use_distributed_optimizer"] is False
    assert ddp["overlap_grad_reduce"] is False and ddp["average_in_collective"] is False
    update = settings(lr=3e-6, weight_decay=0.1, grad_clip=None)
    optimizer = ms.optimizer_config_kwargs(update, config, (0.9, 0.98), 1e-8)
    assert optimizer["optimizer"] == "adam" and optimizer["decoupled_weight_decay"] is True  # AdamW
    assert optimizer["lr"] == optimizer["min_lr"] == 3e-6 and optimizer["weight_decay"] == 0.1
    assert (optimizer["adam_beta1"], optimizer["adam_beta2"], optimizer["adam_eps"]) == (0.9, 0.98, 1e-8)
    assert optimizer["clip_grad"] == 0.0  # measured, not clipped
    assert optimizer["bf16"] is True and optimizer["use_distributed_optimizer"] is False
    assert ms.optimizer_config_kwargs(settings(grad_clip=1.0), config, (0.9, 0.999), 1e-8)["clip_grad"] == 1.0


def test_lr_and_weight_decay_on_parameter_groups() -> None:
    """Megatron marks 1-D parameters and biases wd_mult 0: decay on matrices only, as the torch backend."""
    groups: list[dict[str, Any]] = [{"wd_mult": 1.0, "lr_mult": 1.0}, {"wd_mult": 0.0}, {}]
    ms.set_lr_and_weight_decay(groups, 1e-5, 0.1)
    assert [(g["lr"], g["weight_decay"]) for g in groups] == [(1e-5, 0.1), (1e-5, 0.0), (1e-5, 0.1)]


def test_unsupported_settings_are_refused_with_the_reason() -> None:
    with pytest.raises(NotImplementedError, match="kl_coef > 0"):
        ms.check_supported(megatron_config(), settings(kl_coef=0.1), transformer_engine=True)
    config = DistributedConfig(backend="megatron", device="cuda", ranks=2, megatron=MegatronConfig(context_parallel=2))
    with pytest.raises(NotImplementedError, match="transformer-engine"):
        ms.check_supported(config, settings(), transformer_engine=False)
    with pytest.raises(NotImplementedError, match="sequence-level"):
        ms.check_supported(config, settings(tis_level="sequence"), transformer_engine=True)
    ms.check_supported(config, settings(), transformer_engine=True)
    with pytest.raises(ValueError, match="backend megatron"):
        ms.check_supported(DistributedConfig(), settings(), transformer_engine=True)


def test_data_parallel_share_evens_the_passes() -> None:
    assert ms.data_parallel_share(5, 2, 0) == ([0, 2, 4], 0)
    assert ms.data_parallel_share(5, 2, 1) == ([1, 3], 1)
    assert ms.data_parallel_share(1, 4, 3) == ([], 1)
    assert ms.data_parallel_share(6, 1, 0) == ([0, 1, 2, 3, 4, 5], 0)


def test_context_parallel_split() -> None:
    """2 x CP chunks, rank r holds r and 2 CP - 1 - r; the ranks together hold every position once."""
    assert ms.context_parallel_positions(8, 2, 0) == [0, 1, 6, 7]
    assert ms.context_parallel_positions(8, 2, 1) == [2, 3, 4, 5]
    held = sorted(p for rank in range(4) for p in ms.context_parallel_positions(24, 4, rank))
    assert held == list(range(24))
    with pytest.raises(ValueError, match="multiple of 2 x context_parallel"):
        ms.context_parallel_positions(10, 4, 0)
    assert ms.sequence_multiple(MegatronConfig()) == 1
    assert ms.sequence_multiple(MegatronConfig(context_parallel=2)) == 4
    assert ms.sequence_multiple(MegatronConfig(tensor_parallel=3, sequence_parallel=True, context_parallel=2)) == 12


# ----------------------------------------------------------------------------------------------------------------
# The megatron step's loss layout against the torch backend's, on a real model (CPU, fp32)


def _first_micro(tokenizer: PreTrainedTokenizerBase) -> Any:
    groups = synthetic_groups(seed=3, vocab=len(tokenizer))
    scored = score_groups(groups, scale_by_std=False)
    return collate(scored.trajectories, scored.advantages, tokenizer.pad_token_id)


@pytest.mark.parametrize("tis_level", ["token", "sequence"])
def test_token_arrays_give_the_torch_backends_loss(tokenizer: PreTrainedTokenizerBase, tis_level: str) -> None:
    """GRPOTrainer scores out[:, t] = log p(token t + 1) against the arrays shifted by [:, 1:]; the megatron step
    computes log p(targets[:, t]) at every position of the shifted, padded layout. Same loss, same gradient."""
    torch.manual_seed(0)
    model = tiny_qwen3(tokenizer, POSITIONS)
    micro = _first_micro(tokenizer)
    knobs = dict(
        settings=LossSettings(clip_eps_low=0.2, clip_eps_high=0.28, tis_cap=2.0, tis_level=tis_level),
        normalizer=float(micro.num_loss_tokens),
    )

    from swerl.train.grpo import gather_logprobs

    logits = model(input_ids=micro.input_ids, use_cache=False).logits
    torch_logprobs = gather_logprobs(logits, micro.input_ids)
    torch_loss, torch_stats = policy_loss(
        torch_logprobs,
        torch_logprobs.detach(),
        micro.behaviour_logprobs[:, 1:],
        micro.advantages[:, 1:],
        micro.loss_mask[:, 1:],
        **knobs,
    )
    torch_grad = torch.autograd.grad(torch_loss, model.model.embed_tokens.weight)[0]

    arrays = ms.token_arrays(micro, tokenizer.pad_token_id, multiple=8)
    assert arrays.input_ids.shape[1] % 8 == 0 and arrays.input_ids.shape[1] >= micro.input_ids.shape[1]
    assert torch.equal(arrays.targets[:, : micro.input_ids.shape[1] - 1], micro.input_ids[:, 1:])
    assert float(arrays.loss_mask[:, micro.input_ids.shape[1] - 1 :].sum()) == 0.0  # nothing predicted there
    logits = model(input_ids=arrays.input_ids, use_cache=False).logits
    logprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, arrays.targets.unsqueeze(-1)).squeeze(-1)
    loss, stats = policy_loss(
        logprobs, logprobs.detach(), arrays.behaviour_logprobs, arrays.advantages, arrays.loss_mask, **knobs
    )
    grad = torch.autograd.grad(loss, model.model.embed_tokens.weight)[0]

    assert stats.num_tokens == torch_stats.num_tokens == micro.num_loss_tokens
    assert abs(float(loss.detach()) - float(torch_loss.detach())) <= 1e-6 * max(1.0, abs(float(torch_loss.detach())))
    assert torch.allclose(grad, torch_grad, rtol=1e-4, atol=1e-7)
    assert abs(stats.tis_mean - torch_stats.tis_mean) < 1e-6


def test_context_parallel_ranks_sum_to_the_whole_loss(tokenizer: PreTrainedTokenizerBase) -> None:
    """Split over 2 context-parallel ranks (token-level TIS), the ranks' losses add up to the unsplit loss: each
    normalises by the minibatch's token count, megatron's DDP sums their gradients."""
    model = tiny_qwen3(tokenizer, POSITIONS, seed=1)
    micro = _first_micro(tokenizer)
    multiple = ms.sequence_multiple(MegatronConfig(context_parallel=2))
    knobs = dict(
        settings=LossSettings(clip_eps_low=0.2, clip_eps_high=0.28, tis_cap=2.0),
        normalizer=float(micro.num_loss_tokens),
    )
    whole = ms.token_arrays(micro, tokenizer.pad_token_id, multiple)
    with torch.no_grad():
        logits = model(input_ids=whole.input_ids, use_cache=False).logits
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, whole.targets.unsqueeze(-1)).squeeze(-1)
    total = float(
        policy_loss(logprobs, logprobs, whole.behaviour_logprobs, whole.advantages, whole.loss_mask, **knobs)[0]
    )
    parts = 0.0
    for rank in range(2):
        local = ms.token_arrays(micro, tokenizer.pad_token_id, multiple, context_parallel=2, cp_rank=rank)
        index = torch.tensor(ms.context_parallel_positions(whole.input_ids.shape[1], 2, rank))
        assert torch.equal(local.targets, whole.targets[:, index])
        mine = logprobs[:, index]
        parts += float(policy_loss(mine, mine, local.behaviour_logprobs, local.advantages, local.loss_mask, **knobs)[0])
    assert abs(parts - total) <= 1e-6 * max(1.0, abs(total))


def test_vocab_parallel_entropy_without_a_group_is_token_entropy() -> None:
    logits = torch.randn(2, 5, 37) * 3
    assert torch.allclose(ms.vocab_parallel_entropy(logits), token_entropy(logits), atol=1e-5)


def _entropy_rank(rank: int, port: int, logits: torch.Tensor, expected: torch.Tensor) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        shard = logits.chunk(2, dim=-1)[rank]  # this rank's half of the vocabulary
        got = ms.vocab_parallel_entropy(shard, dist.group.WORLD)
        assert torch.allclose(got, expected, atol=1e-5), (got, expected)
    finally:
        dist.destroy_process_group()


def test_vocab_parallel_entropy_over_two_vocabulary_shards() -> None:
    """Two gloo processes, each with half of the vocabulary's logits: both get the whole distribution's entropy."""
    logits = torch.randn(2, 4, 30) * 4
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    torch.multiprocessing.spawn(_entropy_rank, args=(port, logits, token_entropy(logits)), nprocs=2, join=True)


# ----------------------------------------------------------------------------------------------------------------
# On a GPU with the megatron extra


def _needs_megatron() -> None:
    pytest.importorskip("megatron.core", reason="needs the megatron extra (docs/gpu.md)")
    pytest.importorskip("megatron.bridge", reason="needs the megatron extra (docs/gpu.md)")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")


@pytest.fixture(scope="module")
def megatron_rank() -> Any:
    """One-rank torchrun environment for the trainers built in this process."""
    _needs_megatron()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    saved = {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def tiny_moe_dir(tokenizer: PreTrainedTokenizerBase, out: Path) -> Path:
    """A tiny Qwen3-MoE (4 experts, 2 active) built from config, saved as an HF folder with its tokenizer."""
    model = tiny_qwen3(tokenizer, POSITIONS, **MOE)
    return save_model_and_tokenizer(model, tokenizer, out)


@pytest.mark.gpu
def test_gpu_forward_backward_tiny_qwen3_moe(
    megatron_rank: Any, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    model_dir = tiny_moe_dir(tokenizer, tmp_path / "moe")
    trainer = mb.MegatronGRPOTrainer(model_dir, megatron_config(), settings(lr=1e-3), seed=0)
    before = {name: p.detach().clone() for name, p in trainer.model[0].named_parameters()}
    stats = trainer.train_step(synthetic_groups(seed=1, vocab=len(tokenizer)))
    assert trainer.step == 1 and stats["optimizer_updates"] == 1.0
    assert torch.isfinite(torch.tensor([stats["loss"], stats["grad_norm"], stats["entropy_mean"]])).all()
    assert stats["grad_norm"] > 0 and stats["loss_tokens"] > 0
    changed = [name for name, p in trainer.model[0].named_parameters() if not torch.equal(p, before[name])]
    assert any("experts" in name for name in changed), changed  # the MoE experts trained


@pytest.mark.gpu
def test_gpu_grpo_step_matches_the_torch_backend(
    megatron_rank: Any, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    """The same groups, start weights and settings: megatron (bf16) and GRPOTrainer (bf16 autocast on the GPU)
    report the same loss, gradient norm and entropy within the bf16 tolerances at the top of this file."""
    from swerl.model.loading import load_model_and_tokenizer
    from swerl.train.grpo_trainer import GRPOTrainer

    model_dir = tiny_moe_dir(tokenizer, tmp_path / "moe")
    groups = synthetic_groups(seed=2, vocab=len(tokenizer))
    update = settings(lr=1e-4, micro_batch_tokens=256, grad_clip=None)
    model, _ = load_model_and_tokenizer(model_dir)
    reference = GRPOTrainer(model.to("cuda"), update, bf16=True, seed=0).train_step(groups)
    ours = mb.MegatronGRPOTrainer(model_dir, megatron_config(), update, seed=0).train_step(groups)
    assert ours["loss_tokens"] == reference["loss_tokens"] and ours["micro_batches"] == reference["micro_batches"]
    assert abs(ours["loss"] - reference["loss"]) <= BF16_LOSS_ATOL + BF16_LOSS_RTOL * abs(reference["loss"]), (
        ours["loss"],
        reference["loss"],
    )
    assert abs(ours["grad_norm"] - reference["grad_norm"]) <= BF16_GRAD_NORM_RTOL * reference["grad_norm"]
    assert abs(ours["entropy_mean"] - reference["entropy_mean"]) <= BF16_ENTROPY_ATOL


@pytest.mark.gpu
def test_gpu_export_reload_equals_weights(
    megatron_rank: Any, tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    """fp32 parameters: the export of the untrained model reloads to exactly the start weights (HF -> megatron ->
    HF is lossless), and after a step the export reloads to the trained weights (it differs from the start)."""
    from transformers import AutoModelForCausalLM

    model_dir = tiny_moe_dir(tokenizer, tmp_path / "moe")
    start = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).state_dict()
    config = DistributedConfig(backend="megatron", device="cuda", ranks=1, param_dtype="float32")
    trainer = mb.MegatronGRPOTrainer(model_dir, config, settings(lr=1e-3), seed=0)
    exported = trainer.export_weights(tmp_path / "exports")
    assert exported.name == "weights_v00000000" and (exported / "tokenizer.json").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(exported, local_files_only=True).state_dict()
    assert reloaded.keys() == start.keys()
    for name, tensor in start.items():
        assert torch.equal(reloaded[name], tensor), name
    trainer.train_step(synthetic_groups(seed=4, vocab=len(tokenizer)))
    trained = AutoModelForCausalLM.from_pretrained(
        trainer.export_weights(tmp_path / "exports"), local_files_only=True
    ).state_dict()
    assert any(not torch.equal(trained[name], start[name]) for name in start)
    again = AutoModelForCausalLM.from_pretrained(trainer.save_model(tmp_path / "final"), local_files_only=True)
    for name, tensor in again.state_dict().items():
        assert torch.equal(tensor, trained[name]), name
