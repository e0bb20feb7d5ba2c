"""The synchronous GRPO trainer: infra errors stay out of the loss, trainer and engine log-probs agree, reward rises
with the real local engine in the loop, exact resume, and gradient accumulation that does not change the gradient.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swerl.engine.base import Engine, GenerateRequest, SamplingParams, logprob_temperature
from swerl.engine.local import LocalEngine
from swerl.model.loading import save_model_and_tokenizer
from swerl.rollout.groups import EpisodeFn, rollout_groups
from swerl.train.checkpoint import StreamPosition
from swerl.train.grpo import gather_logprobs, token_entropy
from swerl.train.grpo_step import collate, plan_micro_batches, score_groups
from swerl.train.grpo_trainer import GRPOTrainer
from swerl.trajectory import EpisodeStatus, Trajectory
from tests.tiny_models import TRAINER_CORPUS, tiny_qwen3
from tests.trainer_helpers import grpo_trainer, settings

CORPUS = TRAINER_CORPUS  # what the tokenizer (tests/train/conftest.py) is trained on
CONTEXT = 128  # the tiny model's positions and the engine's context
# fp32, same weights: the engine's incremental decode vs the trainer's one padded forward differ by float
# rounding only (~2e-7 measured).
FP32_LOGPROB_TOLERANCE = 1e-4
# bf16 autocast in the trainer vs the fp32 engine: a real mismatch that TIS corrects.
BF16_LOGPROB_TOLERANCE = 1e-2  # ~8e-4 measured


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_model(tokenizer: PreTrainedTokenizerBase, seed: int = 0) -> PreTrainedModel:
    return tiny_qwen3(tokenizer, CONTEXT, seed)


def synthetic_trajectory(
    rng: random.Random,
    reward: float | None,
    prompt_tokens: int,
    turns: list[tuple[int, int]],
    vocab: int,
    group_id: str = "g",
    attempt: int = 0,
) -> Trajectory:
    """A trajectory with random ids: a prompt, then (sampled, observation) token runs; infra_error if reward None."""
    ids = [rng.randrange(7, vocab) for _ in range(prompt_tokens)]
    mask, logprobs, versions = [0] * prompt_tokens, [0.0] * prompt_tokens, [-1] * prompt_tokens
    for sampled, observation in turns:
        ids += [rng.randrange(7, vocab) for _ in range(sampled + observation)]
        mask += [1] * sampled + [0] * observation
        logprobs += [-rng.uniform(0.5, 8.0) for _ in range(sampled)] + [0.0] * observation
        versions += [0] * sampled + [-1] * observation
    infra = reward is None
    status = EpisodeStatus.INFRA_ERROR if infra else EpisodeStatus.RESOLVED if reward else EpisodeStatus.UNRESOLVED
    return Trajectory(
        task_id=group_id,
        attempt=attempt,
        group_id=group_id,
        status=status,
        reward=reward,
        prompt_tokens=prompt_tokens,
        token_ids=ids,
        loss_mask=mask,
        behaviour_logprobs=logprobs,
        token_weight_versions=versions,
        num_turns=len(turns),
        infra_cause="sandbox_died" if infra else None,
    )


def synthetic_groups(seed: int, vocab: int, num_groups: int = 3, attempts: int = 4) -> list[list[Trajectory]]:
    rng = random.Random(seed)
    return [
        [
            synthetic_trajectory(
                rng,
                float(rng.random() < 0.5),
                rng.randint(3, 8),
                [(rng.randint(1, 6), rng.randint(0, 4)) for _ in range(rng.randint(1, 2))],
                vocab,
                f"g{group}",
                attempt,
            )
            for attempt in range(attempts)
        ]
        for group in range(num_groups)
    ]


# ----------------------------------------------------------------------------------------------------------------
# Pure pieces


def test_score_groups_leaves_infra_errors_out_of_the_baseline_and_drops_groups_without_one() -> None:
    rng = random.Random(0)

    def attempt(reward: float | None) -> Trajectory:
        return synthetic_trajectory(rng, reward, 3, [(2, 0)], 100)

    groups = [
        [attempt(1.0), attempt(0.0), attempt(None), attempt(0.0)],  # baseline over the 3 valid: 1/3
        [attempt(1.0), attempt(None)],  # one valid attempt: dropped
        [attempt(0.0), attempt(0.0)],  # kept, no signal
    ]
    scored = score_groups(groups, scale_by_std=False)
    assert scored.trajectories == [groups[0][0], groups[0][1], groups[0][3], groups[2][0], groups[2][1]]
    assert scored.advantages == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0])
    assert (scored.groups_dropped, scored.groups_without_signal) == (1, 1)


def test_collate_right_pads_and_puts_the_advantage_on_sampled_tokens_only() -> None:
    rng = random.Random(1)
    long = synthetic_trajectory(rng, 1.0, 3, [(2, 2), (1, 0)], 100)  # 8 tokens
    short = synthetic_trajectory(rng, 0.0, 2, [(2, 0)], 100)  # 4 tokens
    batch = collate([long, short], [0.5, -0.5], pad_token_id=0)
    assert batch.input_ids.shape == (2, 8)
    assert batch.input_ids[1].tolist() == short.token_ids + [0] * 4
    assert batch.loss_mask[0].tolist() == [0, 0, 0, 1, 1, 0, 0, 1]
    assert batch.advantages[0].tolist() == [0, 0, 0, 0.5, 0.5, 0, 0, 0.5]
    assert batch.advantages[1].tolist() == [0, 0, -0.5, -0.5, 0, 0, 0, 0]
    assert batch.behaviour_logprobs[0].tolist() == pytest.approx(long.behaviour_logprobs)
    assert batch.num_loss_tokens == 5


def test_plan_micro_batches_bounds_padded_tokens() -> None:
    lengths = [5, 20, 7, 3, 40, 8]
    plan = plan_micro_batches(lengths, micro_batch_tokens=24)
    assert sorted(index for rows in plan for index in rows) == list(range(6))
    assert plan[0] == [4]  # longer than the budget: alone
    for rows in plan[1:]:
        assert len(rows) * max(lengths[index] for index in rows) <= 24


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_logprobs_and_entropy_equal_the_full_padded_forward(
    tokenizer: PreTrainedTokenizerBase, temperature: float
) -> None:
    """The trainer's forward (rows packed padding-free, LM head at scored tokens only) gives the log-probs and the
    entropy that full logits over the right-padded batch give at every scored token, with the same gradient, and
    0 at every unscored position."""
    model = tiny_model(tokenizer)
    trainer = grpo_trainer(model, logprob_temperature=temperature)
    scored = score_groups(synthetic_groups(5, len(tokenizer), num_groups=2), scale_by_std=False)
    micro = collate(scored.trajectories, scored.advantages, pad_token_id=0)
    assert int((micro.lengths < micro.input_ids.shape[1]).sum()) > 0  # some rows are padded
    mask = micro.loss_mask[:, 1:].bool()

    model.zero_grad(set_to_none=True)
    logprobs, logits = trainer._logprobs(model, micro, grad=True)
    (logprobs * torch.linspace(0.5, 1.5, logprobs.numel()).view_as(logprobs)).sum().backward()
    ours = [parameter.grad.clone() for parameter in model.parameters()]
    model.zero_grad(set_to_none=True)
    full = model(input_ids=micro.input_ids, use_cache=False).logits  # right padding, causal: no mask needed
    expected = gather_logprobs(full, micro.input_ids, temperature) * mask
    (expected * torch.linspace(0.5, 1.5, expected.numel()).view_as(expected)).sum().backward()

    assert logits.shape == (int(mask.sum()), model.config.vocab_size)
    torch.testing.assert_close(logprobs, expected, rtol=0, atol=2e-6)
    assert bool((logprobs[~mask] == 0).all())
    entropy = token_entropy(full[:, :-1].float() / temperature)[mask]
    torch.testing.assert_close(token_entropy(logits.float() / temperature), entropy, rtol=1e-5, atol=1e-5)
    for mine, theirs in zip(ours, [parameter.grad for parameter in model.parameters()], strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-6)


def test_a_micro_batch_without_a_scored_token_still_reaches_every_parameter(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """No scored token (a sampled token only at position 0, which is never scored): log-probs 0, no logits, and a
    backward that still reaches every parameter (sharded ranks must run the same collectives)."""
    model = tiny_model(tokenizer)
    trainer = grpo_trainer(model)
    rng = random.Random(3)
    trajectory = synthetic_trajectory(rng, 1.0, 0, [(1, 5)], len(tokenizer))
    assert trajectory.loss_mask[0] == 1 and sum(trajectory.loss_mask[1:]) == 0
    micro = collate([trajectory, trajectory], [0.5, -0.5], pad_token_id=0)
    logprobs, logits = trainer._logprobs(model, micro, grad=True)
    assert logits.shape == (0, model.config.vocab_size) and bool((logprobs == 0).all())
    (logprobs.sum() * 0.0).backward()
    assert all(parameter.grad is not None for parameter in model.parameters())


def test_rollout_groups_keeps_order_and_respects_concurrency() -> None:
    in_flight = peak = 0

    async def episode(engine: Engine, task: int, *, attempt: int, group_id: str) -> Trajectory:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001 * ((task * 7 + attempt * 3) % 5))  # finish out of order
        in_flight -= 1
        reward = float(attempt % 2)
        status = EpisodeStatus.RESOLVED if reward else EpisodeStatus.UNRESOLVED
        return Trajectory(task_id=str(task), attempt=attempt, group_id=group_id, status=status, reward=reward)

    groups = asyncio.run(rollout_groups(None, [10, 11, 12], 4, episode, concurrency=5, group_prefix="s3/"))  # type: ignore[arg-type]
    assert [[(t.task_id, t.attempt, t.group_id) for t in group] for group in groups] == [
        [(str(task), attempt, f"s3/{index}") for attempt in range(4)] for index, task in enumerate([10, 11, 12])
    ]
    assert peak == 5


# ----------------------------------------------------------------------------------------------------------------
# (a) infra errors never reach the loss


def test_infra_error_attempt_never_reaches_the_loss(tokenizer: PreTrainedTokenizerBase) -> None:
    vocab = len(tokenizer)
    groups = synthetic_groups(seed=2, vocab=vocab)
    rng = random.Random(99)
    garbage = synthetic_trajectory(rng, None, 5, [(60, 3), (40, 0)], vocab, "g1", attempt=4)  # long: would
    with_infra = [list(group) for group in groups]  # change the micro-batching if it got in
    with_infra[1].append(garbage)

    results = []
    for batch in (groups, with_infra):
        model = tiny_model(tokenizer)
        trainer = grpo_trainer(model, lr=1e-3, micro_batch_tokens=64, seed=0)
        stats = trainer.train_step(batch)
        gradients = [parameter.grad.clone() for parameter in model.parameters() if parameter.grad is not None]
        results.append((stats, gradients, [parameter.detach().clone() for parameter in model.parameters()]))
        # The trainer's own account (kept in the async ledger, audited by benchmarks/chaos.py): every valid
        # attempt, the infra_error one not among them.
        assert trainer.scored_attempts() == [(f"g{g}", a) for g in range(3) for a in range(4)]

    (clean_stats, clean_grads, clean_params), (infra_stats, infra_grads, infra_params) = results
    assert len(clean_grads) == len(infra_grads) > 0
    for clean, infra in zip(clean_grads, infra_grads, strict=True):
        assert torch.equal(clean, infra)
    for clean, infra in zip(clean_params, infra_params, strict=True):
        assert torch.equal(clean, infra)
    assert clean_stats["loss"] == infra_stats["loss"] and clean_stats["loss_tokens"] == infra_stats["loss_tokens"]
    assert infra_stats["infra_error/sandbox_died"] == 1 and infra_stats["status/infra_error"] == 1
    assert clean_stats["reward_mean"] == infra_stats["reward_mean"]
    # The group's baseline is unchanged: same advantages for its valid attempts.
    assert score_groups(groups, False).advantages == score_groups(with_infra, False).advantages


# ----------------------------------------------------------------------------------------------------------------
# Gradient accumulation and multi-update steps


def test_micro_batching_does_not_change_the_gradient(tokenizer: PreTrainedTokenizerBase) -> None:
    groups = synthetic_groups(seed=3, vocab=len(tokenizer), num_groups=4)
    gradients = []
    for micro_batch_tokens in (4096, 2):  # one micro-batch vs one trajectory per micro-batch
        model = tiny_model(tokenizer)
        stats = grpo_trainer(model, lr=1e-3, micro_batch_tokens=micro_batch_tokens).train_step(groups)
        gradients.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        assert stats["clip_fraction"] == 0.0  # one update: old == current, ratio exactly 1
    assert stats["micro_batches"] == stats["trajectories_trained"] == 16
    torch.testing.assert_close(gradients[0], gradients[1], atol=1e-6, rtol=1e-5)


def test_kl_penalty_against_a_reference_is_zero_at_the_start_then_grows(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    groups = synthetic_groups(seed=4, vocab=len(tokenizer))
    trainer = grpo_trainer(tiny_model(tokenizer), lr=1e-2, kl_coef=0.1, ref_model=tiny_model(tokenizer))
    first, second = trainer.train_step(groups), trainer.train_step(groups)
    assert first["kl"] == 0.0 and second["kl"] > 0.0
    assert not any(parameter.requires_grad for parameter in trainer.ref_model.parameters())  # type: ignore[union-attr]


def test_a_step_with_every_group_dropped_makes_no_update(tokenizer: PreTrainedTokenizerBase) -> None:
    rng = random.Random(5)
    groups = [[synthetic_trajectory(rng, 1.0, 3, [(2, 0)], 100), synthetic_trajectory(rng, None, 3, [(2, 0)], 100)]]
    model = tiny_model(tokenizer)
    before = [parameter.detach().clone() for parameter in model.parameters()]
    trainer = grpo_trainer(model, lr=1e-2)
    stats = trainer.train_step(groups)
    assert (stats["groups_dropped"], stats["optimizer_updates"], stats["reward_mean"], trainer.step) == (
        1,
        0,
        1.0,
        1,
    )
    assert trainer.scored_attempts() == []  # a dropped group's valid attempt is in no baseline and no loss
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


# ----------------------------------------------------------------------------------------------------------------
# (d) exact resume


def test_resume_continues_exactly(tokenizer: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    """K steps + save + load into a fresh trainer + (N - K) steps == N steps, bitwise in fp32 on CPU."""
    total, resume_at = 4, 2
    batches = [synthetic_groups(seed=10 + step, vocab=len(tokenizer)) for step in range(total)]
    options: dict[str, Any] = dict(lr=3e-3, ppo_epochs=2, num_minibatches=2, micro_batch_tokens=32, seed=5)

    straight = grpo_trainer(tiny_model(tokenizer), **options)
    straight_stats = [straight.train_step(batch) for batch in batches]

    first = grpo_trainer(tiny_model(tokenizer), **options)
    for batch in batches[:resume_at]:
        first.train_step(batch)
    checkpoint = first.save(tmp_path / "checkpoints", StreamPosition(epoch=1, example_index=7, num_examples=12))
    torch.manual_seed(1234)  # the resumed process starts from another global RNG state
    resumed = grpo_trainer(tiny_model(tokenizer, seed=1), **options)  # other initial weights too
    state = resumed.load(checkpoint)
    assert (state.step, state.epoch, state.example_index, resumed.step) == (resume_at, 1, 7, resume_at)
    resumed_stats = [resumed.train_step(batch) for batch in batches[resume_at:]]

    assert straight_stats[-1]["optimizer_updates"] == 4 and straight_stats[-1]["clip_fraction"] > 0
    for expected, actual in zip(straight_stats[resume_at:], resumed_stats, strict=True):
        assert actual["loss"] == expected["loss"] and actual["grad_norm"] == expected["grad_norm"]
    for expected, actual in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(expected, actual)


# ----------------------------------------------------------------------------------------------------------------
# The real engine in the loop


def make_episode(sampling: SamplingParams, target: frozenset[int]) -> EpisodeFn[list[int]]:
    """A single-turn, sandbox-free episode: reward 1 iff the first sampled token is in `target`."""

    async def episode(engine: Engine, task: list[int], *, attempt: int, group_id: str) -> Trajectory:
        response = await engine.generate(GenerateRequest(input_ids=task, sampling_params=sampling))
        reward = float(response.output_ids[0] in target)
        versions = response.output_token_weight_versions or [response.weight_version] * len(response.output_ids)
        return Trajectory(
            task_id=group_id,
            attempt=attempt,
            group_id=group_id,
            status=EpisodeStatus.RESOLVED if reward else EpisodeStatus.UNRESOLVED,
            reward=reward,
            prompt_tokens=len(task),
            token_ids=task + response.output_ids,
            loss_mask=[0] * len(task) + [1] * len(response.output_ids),
            behaviour_logprobs=[0.0] * len(task) + [min(0.0, lp) for lp in response.output_token_logprobs],
            token_weight_versions=[-1] * len(task) + versions,
            num_turns=1,
        )

    return episode


async def two_turn_episode(
    engine: Engine, task: list[int], *, attempt: int, group_id: str, sampling: SamplingParams
) -> Trajectory:
    """Sample, append a fixed observation (mask 0), sample again: sampled runs in the middle of a trajectory."""
    ids, mask, logprobs, versions = list(task), [0] * len(task), [0.0] * len(task), [-1] * len(task)
    for observation in ([], [20, 21, 22, 23, 24]):
        ids += observation
        mask += [0] * len(observation)
        logprobs += [0.0] * len(observation)
        versions += [-1] * len(observation)
        response = await engine.generate(GenerateRequest(input_ids=ids, sampling_params=sampling))
        ids += response.output_ids
        mask += [1] * len(response.output_ids)
        logprobs += [min(0.0, lp) for lp in response.output_token_logprobs]
        versions += response.output_token_weight_versions or []
    reward = float(attempt % 2)
    return Trajectory(
        task_id=group_id,
        attempt=attempt,
        group_id=group_id,
        status=EpisodeStatus.RESOLVED if reward else EpisodeStatus.UNRESOLVED,
        reward=reward,
        prompt_tokens=len(task),
        token_ids=ids,
        loss_mask=mask,
        behaviour_logprobs=logprobs,
        token_weight_versions=versions,
        num_turns=2,
    )


@pytest.mark.parametrize(("bf16", "tolerance"), [(False, FP32_LOGPROB_TOLERANCE), (True, BF16_LOGPROB_TOLERANCE)])
def test_trainer_logprobs_match_the_engines(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path, bf16: bool, tolerance: float
) -> None:
    """(b) On the same weights, the trainer's recomputed log-probs equal the engine's behaviour log-probs."""
    model = tiny_model(tokenizer)
    model_dir = save_model_and_tokenizer(model, tokenizer, tmp_path / "policy")
    sampling = SamplingParams(max_new_tokens=12, temperature=0.7, top_p=0.9, ignore_eos=True)
    tasks = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in CORPUS]  # various lengths

    async def rollout() -> list[list[Trajectory]]:
        async with LocalEngine(
            model_dir, max_batch_size=16, max_context_tokens=CONTEXT, prefix_cache_size=0, seed=0
        ) as engine:

            async def episode(engine: Engine, task: list[int], *, attempt: int, group_id: str) -> Trajectory:
                return await two_turn_episode(engine, task, attempt=attempt, group_id=group_id, sampling=sampling)

            return await rollout_groups(engine, tasks, 4, episode, concurrency=16)

    groups = asyncio.run(rollout())
    temperature = logprob_temperature(sampling)
    stats = grpo_trainer(model, logprob_temperature=temperature, bf16=bf16, micro_batch_tokens=128).train_step(groups)
    assert stats["loss_tokens"] == 4 * 4 * 24 and stats["micro_batches"] > 1
    print(f"bf16={bf16}: logprob_diff_mean={stats['logprob_diff_mean']:.2e} ess_ratio={stats['ess_ratio']:.6f}")
    assert stats["logprob_diff_mean"] < tolerance
    assert stats["ess_ratio"] > 1 - tolerance
    if not bf16:
        assert stats["tis_clip_fraction"] == 0.0
        # The check has teeth: the same log-probs read at the wrong temperature are far off.
        wrong = grpo_trainer(tiny_model(tokenizer), logprob_temperature=1.0).train_step(groups)
        assert wrong["logprob_diff_mean"] > 100 * tolerance


def test_grpo_with_the_local_engine_raises_reward(tokenizer: PreTrainedTokenizerBase, tmp_path: Path) -> None:
    """(c) Seeded GRPO on a toy task, weights pushed to the real engine every step: reward rises."""
    started = time.perf_counter()
    steps, num_tasks, attempts = 20, 8, 8
    model = tiny_model(tokenizer)
    model_dir = save_model_and_tokenizer(model, tokenizer, tmp_path / "init")
    letters = frozenset(
        tokenizer(letter, add_special_tokens=False)["input_ids"][0] for letter in "abcdefghijklmnopqrstuvwxyz"
    )
    tasks = [tokenizer(f"task {index}: name a letter\n", add_special_tokens=False)["input_ids"] for index in range(8)]
    sampling = SamplingParams(max_new_tokens=3, temperature=1.0)
    episode = make_episode(sampling, letters)
    trainer = grpo_trainer(model, lr=1e-2, betas=(0.9, 0.99), tokenizer=tokenizer, seed=0)
    exports = tmp_path / "exports"

    async def train() -> list[dict[str, float]]:
        history = []
        async with LocalEngine(
            model_dir, max_batch_size=64, max_context_tokens=CONTEXT, prefix_cache_size=0, seed=0
        ) as engine:
            for step in range(steps):
                groups = await rollout_groups(engine, tasks[:num_tasks], attempts, episode, 64, f"step{step}/")
                sampled_versions = {v for g in groups for t in g for v in t.token_weight_versions if v >= 0}
                assert sampled_versions == {step}  # synchronous: every token from the latest weights
                history.append(trainer.train_step(groups))
                path = trainer.export_weights(exports)
                await engine.update_weights_from_disk(str(path), trainer.step)
                assert engine.weight_version == step + 1 and path.name.endswith(f"{step + 1:08d}")
        return history

    history = asyncio.run(train())
    rewards = [stats["reward_mean"] for stats in history]
    print("reward curve:", " ".join(f"{reward:.2f}" for reward in rewards))
    early, late = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert early < 0.3 and late > 0.7, rewards
    assert history[-1]["entropy_mean"] < history[0]["entropy_mean"]
    assert all(stats["logprob_diff_mean"] < FP32_LOGPROB_TOLERANCE for stats in history)
    assert sorted(path.name for path in exports.iterdir()) == [
        f"weights_v{steps - 1:08d}",
        f"weights_v{steps:08d}",
    ]
    assert time.perf_counter() - started < 60


def test_sequence_mean_aggregation_reweights_trajectories_of_unequal_length(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """loss_aggregation reaches the update: with trajectories of equal scored length both aggregations are the
    same update (every factor is 1); with unequal lengths they differ."""
    vocab = len(tokenizer)

    def groups(unequal: bool) -> list[list[Trajectory]]:
        rng = random.Random(3)
        return [
            [
                synthetic_trajectory(
                    rng, float(attempt % 2), 4, [(6 + 8 * attempt * unequal, 2)], vocab, f"g{group}", attempt
                )
                for attempt in range(4)
            ]
            for group in range(2)
        ]

    def params_after(aggregation: str, batch: list[list[Trajectory]]) -> list[torch.Tensor]:
        trainer = grpo_trainer(tiny_model(tokenizer), lr=1e-2, seed=0, loss_aggregation=aggregation)  # type: ignore[arg-type]
        trainer.train_step(batch)
        return [p.detach().clone() for p in trainer.model.parameters()]

    equal = groups(unequal=False)
    for a, b in zip(params_after("token_mean", equal), params_after("sequence_mean", equal), strict=True):
        assert torch.allclose(a, b, atol=1e-7)
    unequal = groups(unequal=True)
    moved = [
        not torch.allclose(a, b, atol=1e-7)
        for a, b in zip(params_after("token_mean", unequal), params_after("sequence_mean", unequal), strict=True)
    ]
    assert any(moved)
    with pytest.raises(ValueError, match="loss_aggregation"):
        GRPOTrainer(tiny_model(tokenizer), dataclasses.replace(settings(), loss_aggregation="per_row"))  # type: ignore[arg-type]
