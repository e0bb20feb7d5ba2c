"""The local CPU engine: log-prob alignment with the trainer, padding invariance, sampling, caps, hot weights."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch

from swerl.engine import slots
from swerl.engine.base import (
    ContextLengthError,
    Engine,
    GenerateRequest,
    GenerateResponse,
    InvalidRequestError,
    SamplingParams,
    WeightUpdateError,
    logprob_temperature,
)
from swerl.engine.batching import sample_rows, sample_token
from swerl.engine.local import LocalEngine
from swerl.errors import InfraError
from swerl.model.loading import load_model_and_tokenizer, save_model_and_tokenizer
from swerl.train.grpo import gather_logprobs
from tests.tiny_models import MOE, TinyModels

CORPUS = [
    "def add(left, right):\n    return left + right\n",
    "for index in range(10):\n    total += index * 2  # 3.14 != 2.71\n",
    "sed -n 12,14p mod.py && sed -i '13s/ <= / < /' mod.py\n",
    "FAILED tests/test_mod.py::test_clamp - assert 5 == 4\n1 failed, 2 passed in 0.03s\n",
]
CONTEXT = 512  # the engine's and the tiny models' positions
ALIGNMENT_TOLERANCE = 1e-4  # fp32: incremental decode vs one full forward differ by float rounding only
PADDING_TOLERANCE = 1e-5  # the same request alone vs left-padded in a batch
T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


@pytest.fixture(scope="module")
def model_dirs(tiny_models: TinyModels) -> dict[str, Path]:
    """Two same-architecture tiny models (policy versions), one of another architecture and a tiny Qwen3-MoE."""
    tokenizer = tiny_models.tokenizer(CORPUS * 20, vocab_size=300)
    dirs = {
        name: tiny_models.saved(tokenizer, CONTEXT, seed, hidden_size=hidden)
        for name, seed, hidden in (("v0", 0, 64), ("v1", 1, 64), ("wide", 2, 96))
    }
    dirs["moe"] = tiny_models.saved(tokenizer, CONTEXT, 3, **MOE)
    return dirs


def engine(path: Path, max_batch_size: int = 8, **kwargs: Any) -> LocalEngine:
    """A LocalEngine without a prefix cache (the tests' default) unless kwargs say otherwise."""
    kwargs = {"prefix_cache_size": 0} | kwargs
    return LocalEngine(path, max_batch_size=max_batch_size, max_context_tokens=CONTEXT, **kwargs)


def request(prompt: list[int], max_new_tokens: int = 12, temperature: float = 0.0, **params: Any) -> GenerateRequest:
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, ignore_eos=True, **params)
    return GenerateRequest(input_ids=prompt, sampling_params=sampling)


def prompt_of(length: int, offset: int = 0) -> list[int]:
    return [10 + (offset + 7 * index) % 250 for index in range(length)]


def trainer_logprobs(
    model_dir: Path, prompt: list[int], response: GenerateResponse, temperature: float
) -> torch.Tensor:
    """What the trainer recomputes: one forward over prompt + completion, then gather_logprobs."""
    model, _ = load_model_and_tokenizer(model_dir)
    tokens = torch.tensor([prompt + response.output_ids])  # (1, P + N)
    with torch.no_grad():
        logits = model(tokens).logits  # (1, P + N, V)
    return gather_logprobs(logits, tokens, temperature=temperature)[0, len(prompt) - 1 :]  # (N,)


def test_engine_satisfies_the_protocol(model_dirs: dict[str, Path]) -> None:
    assert isinstance(engine(model_dirs["v0"]), Engine)


@pytest.mark.parametrize(
    ("temperature", "top_p", "original"),
    [(0.0, 1.0, False), (0.7, 0.9, False), (1.3, 1.0, False), (0.7, 1.0, True)],
)
def test_logprobs_align_with_trainer_recompute(
    model_dirs: dict[str, Path], temperature: float, top_p: float, original: bool
) -> None:
    prompts = [prompt_of(length, offset) for length, offset in ((5, 0), (23, 3), (11, 9))]

    async def generate_all() -> list[GenerateResponse]:
        async with engine(model_dirs["v0"], return_original_logprob=original) as local:
            requests = [request(p, max_new_tokens=24, temperature=temperature, top_p=top_p) for p in prompts]
            return await asyncio.gather(*(local.generate(r) for r in requests))

    responses = run(generate_all())
    for prompt, response in zip(prompts, responses, strict=True):
        trainer_temperature = logprob_temperature(request(prompt, temperature=temperature).sampling_params, original)
        expected = trainer_logprobs(model_dirs["v0"], prompt, response, trainer_temperature)
        actual = torch.tensor(response.output_token_logprobs)
        assert len(response.output_ids) == 24 and response.finish_reason == "length"
        torch.testing.assert_close(actual, expected, atol=ALIGNMENT_TOLERANCE, rtol=0)
    if temperature > 0:  # sampled, not greedy: some token is not the argmax
        assert any(lp < -1e-3 for r in responses for lp in r.output_token_logprobs)


def test_batched_equals_alone_under_greedy_and_seeded_sampling(model_dirs: dict[str, Path]) -> None:
    """A request's tokens and log-probs do not depend on what it is batched with (padding, sampling order)."""
    prompts = [prompt_of(length, length) for length in (3, 40, 17, 1, 64, 9)]
    requests = [request(p, max_new_tokens=10 + 3 * i, temperature=0.8 * (i % 2)) for i, p in enumerate(prompts)]

    async def alone() -> list[GenerateResponse]:
        async with engine(model_dirs["v0"], seed=7) as local:  # one at a time, in the same arrival order
            return [await local.generate(req) for req in requests]

    async def batched() -> tuple[list[GenerateResponse], dict[str, Any]]:
        async with engine(model_dirs["v0"], max_batch_size=4, seed=7) as local:
            results = await asyncio.gather(*(local.generate(r) for r in requests))
            return results, local.stats()

    singles = run(alone())
    together, stats = run(batched())
    assert max(stats["batch_size_histogram"]) == 4
    for single, batch in zip(singles, together, strict=True):
        assert single.output_ids == batch.output_ids
        torch.testing.assert_close(
            torch.tensor(batch.output_token_logprobs),
            torch.tensor(single.output_token_logprobs),
            atol=PADDING_TOLERANCE,
            rtol=0,
        )


def test_same_seed_same_samples_other_seed_differs(model_dirs: dict[str, Path]) -> None:
    async def sample(seed: int) -> list[list[int]]:
        async with engine(model_dirs["v0"], seed=seed) as local:
            responses = await asyncio.gather(
                *(local.generate(request(prompt_of(8, i), 16, temperature=1.0)) for i in range(3))
            )
            return [r.output_ids for r in responses]

    assert run(sample(3)) == run(sample(3))
    assert run(sample(3)) != run(sample(4))


def test_top_p_keeps_only_the_nucleus() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    generator = torch.Generator().manual_seed(0)
    drawn = {sample_token(logits, 1.0, 0.7, generator)[0] for _ in range(200)}
    assert drawn == {0, 1}  # mass before token 2 is 0.8 > 0.7
    token, logprob = sample_token(logits, 1.0, 0.7, generator)
    assert logprob == pytest.approx(float(torch.log(torch.tensor([0.5, 0.3])[token])), abs=1e-6)  # unfiltered


def test_stop_token_ends_generation_and_is_kept(model_dirs: dict[str, Path]) -> None:
    prompt = prompt_of(6)

    async def go() -> tuple[GenerateResponse, GenerateResponse]:
        async with engine(model_dirs["v0"]) as local:
            free = await local.generate(request(prompt, max_new_tokens=20))
            stop = free.output_ids[4]
            stopped = await local.generate(request(prompt, max_new_tokens=20, stop_token_ids=[stop]))
            return free, stopped

    free, stopped = run(go())
    cut = free.output_ids.index(free.output_ids[4]) + 1
    assert stopped.finish_reason == "stop"
    assert stopped.output_ids == free.output_ids[:cut]  # the stop token is included, as SGLang does
    assert stopped.output_token_logprobs == pytest.approx(free.output_token_logprobs[:cut], abs=1e-6)
    assert stopped.completion_tokens == cut and stopped.prompt_tokens == len(prompt)


def test_eos_stops_unless_ignored(model_dirs: dict[str, Path]) -> None:
    local = engine(model_dirs["v0"])
    _, tokenizer = load_model_and_tokenizer(model_dirs["v0"])
    assert tokenizer.eos_token_id in local.eos_token_ids

    async def go() -> tuple[GenerateResponse, GenerateResponse]:
        free = await local.generate(request(prompt_of(6), max_new_tokens=20))
        local.eos_token_ids = {free.output_ids[2]}  # pretend the third token is the model's eos
        with_eos = GenerateRequest(
            input_ids=prompt_of(6), sampling_params=SamplingParams(max_new_tokens=20, temperature=0)
        )
        stopped = await local.generate(with_eos)
        await local.close()
        return free, stopped

    free, stopped = run(go())
    assert stopped.finish_reason == "stop"
    assert stopped.output_ids[-1] == free.output_ids[2] and len(stopped.output_ids) <= 3
    assert free.finish_reason == "length" and len(free.output_ids) == 20


def test_context_cap_rejects_long_prompts_and_stops_generation(model_dirs: dict[str, Path]) -> None:
    async def go() -> GenerateResponse:
        async with LocalEngine(model_dirs["v0"], max_batch_size=2, max_context_tokens=64, prefix_cache_size=0) as local:
            for length in (64, 100):
                with pytest.raises(ContextLengthError, match="context length"):
                    await local.generate(request(prompt_of(length), max_new_tokens=1))
            capped = await local.generate(request(prompt_of(60), max_new_tokens=10))
            assert local.stats()["requests_rejected"] == 2
            return capped

    capped = run(go())
    assert capped.finish_reason == "length" and len(capped.output_ids) == 4  # 60 + 4 = the cap
    assert not issubclass(ContextLengthError, InfraError) and issubclass(ContextLengthError, ValueError)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        LocalEngine(model_dirs["v0"], max_batch_size=1, max_context_tokens=CONTEXT + 1, prefix_cache_size=0)


def test_out_of_vocabulary_id_is_rejected_and_others_keep_being_served(model_dirs: dict[str, Path]) -> None:
    async def go() -> list[GenerateResponse | BaseException]:
        async with engine(model_dirs["v0"]) as local:
            bad = request([5, local.vocab_size, 7])
            negative = request([5, -1])
            return await asyncio.gather(  # type: ignore[return-value]
                local.generate(request(prompt_of(5))),
                local.generate(bad),
                local.generate(negative),
                local.generate(request(prompt_of(9))),
                return_exceptions=True,
            )

    results = run(go())
    assert isinstance(results[1], InvalidRequestError) and "vocabulary" in str(results[1])
    assert isinstance(results[2], InvalidRequestError)
    for good in (results[0], results[3]):
        assert isinstance(good, GenerateResponse) and len(good.output_ids) == 12


def test_weight_update_changes_outputs_and_versions(model_dirs: dict[str, Path]) -> None:
    prompt = prompt_of(12)

    async def go() -> tuple[GenerateResponse, GenerateResponse, GenerateResponse]:
        async with engine(model_dirs["v0"]) as local:
            before = await local.generate(request(prompt, max_new_tokens=16))
            await local.update_weights_from_disk(str(model_dirs["v1"]), weight_version=1)
            after = await local.generate(request(prompt, max_new_tokens=16))
            with pytest.raises(WeightUpdateError, match="config.json"):
                await local.update_weights_from_disk(str(model_dirs["v0"] / "missing"), weight_version=2)
            with pytest.raises(WeightUpdateError, match="architecture"):
                await local.update_weights_from_disk(str(model_dirs["wide"]), weight_version=3)
            still = await local.generate(request(prompt, max_new_tokens=16))
            assert local.weight_version == 1 and await local.health()
            return before, after, still

    before, after, still = run(go())
    assert before.weight_version == 0 and set(before.output_token_weight_versions or []) == {0}
    assert after.weight_version == 1 and set(after.output_token_weight_versions or []) == {1}
    assert (torch.tensor(before.output_token_logprobs) - torch.tensor(after.output_token_logprobs)).abs().max() > 1e-3
    expected = trainer_logprobs(model_dirs["v1"], prompt, after, temperature=1.0)  # the new policy sampled it
    torch.testing.assert_close(torch.tensor(after.output_token_logprobs), expected, atol=ALIGNMENT_TOLERANCE, rtol=0)
    assert still.output_ids == after.output_ids and still.weight_version == 1  # failed updates changed nothing


def test_in_flight_request_spans_a_weight_update(model_dirs: dict[str, Path]) -> None:
    async def go() -> GenerateResponse:
        async with engine(model_dirs["v0"]) as local:
            long = asyncio.ensure_future(local.generate(request(prompt_of(4), max_new_tokens=500)))
            while local.stats()["generated_tokens"] < 5:
                await asyncio.sleep(0.001)
            await local.update_weights_from_disk(str(model_dirs["v1"]), weight_version=1)
            return await long

    response = run(go())
    versions = response.output_token_weight_versions or []
    assert len(versions) == len(response.output_ids) == 500
    assert versions[0] == 0 and versions[-1] == 1 and versions == sorted(versions)
    assert response.weight_version == 1  # the version at the end
    assert response.to_sglang()["meta_info"]["output_token_weight_versions"] == versions
    assert GenerateResponse.from_sglang(response.to_sglang()) == response


def test_concurrent_requests_all_complete_in_batches(model_dirs: dict[str, Path]) -> None:
    async def go() -> tuple[list[GenerateResponse], dict[str, Any]]:
        async with engine(model_dirs["v0"], max_batch_size=6) as local:
            requests = [request(prompt_of(3 + i, i), max_new_tokens=8 + i) for i in range(16)]
            responses = await asyncio.gather(*(local.generate(r) for r in requests))
            return responses, local.stats()

    responses, stats = run(go())
    assert [len(r.output_ids) for r in responses] == [8 + i for i in range(16)]
    histogram = stats["batch_size_histogram"]
    assert max(histogram) == 6 and all(size <= 6 for size in histogram)
    assert stats["requests"] == stats["requests_completed"] == 16
    assert stats["generated_tokens"] == sum(8 + i for i in range(16))
    assert stats["running"] == stats["waiting"] == 0


def test_cancelled_request_frees_its_slot_and_close_fails_the_rest(model_dirs: dict[str, Path]) -> None:
    async def go() -> None:
        local = engine(model_dirs["v0"], max_batch_size=1)
        first = asyncio.ensure_future(local.generate(request(prompt_of(4), max_new_tokens=400)))
        while local.stats()["generated_tokens"] < 3:
            await asyncio.sleep(0.001)
        first.cancel()
        second = await local.generate(request(prompt_of(5), max_new_tokens=4))  # gets the only slot
        assert len(second.output_ids) == 4 and local.stats()["requests_aborted"] == 1
        pending = asyncio.ensure_future(local.generate(request(prompt_of(4), max_new_tokens=400)))
        while local.stats()["generated_tokens"] < 10:
            await asyncio.sleep(0.001)
        await local.close()
        with pytest.raises(InfraError):
            await pending
        with pytest.raises(InfraError):
            await local.generate(request(prompt_of(4)))
        assert not await local.health()

    run(go())


def test_a_failed_step_fails_its_requests_and_the_engine_keeps_serving(
    model_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> tuple[list[GenerateResponse | BaseException], GenerateResponse, dict[str, Any]]:
        async with engine(model_dirs["v0"]) as local:
            real_decode, calls = local._decode, []

            def failing_third_step(version: int) -> None:
                calls.append(version)
                if len(calls) == 3:
                    raise RuntimeError("injected fault")
                real_decode(version)

            monkeypatch.setattr(local, "_decode", failing_third_step)
            in_flight = await asyncio.gather(
                local.generate(request(prompt_of(5), max_new_tokens=10)),
                local.generate(request(prompt_of(6), max_new_tokens=10)),
                return_exceptions=True,
            )
            after = await local.generate(request(prompt_of(5), max_new_tokens=10))
            assert await local.health()
            return list(in_flight), after, local.stats()

    in_flight, after, stats = run(go())
    for result in in_flight:
        assert isinstance(result, InfraError) and result.cause == "engine_http" and "injected" in str(result)
    assert len(after.output_ids) == 10 and after.finish_reason == "length"
    assert stats["requests_failed"] == 2 and stats["requests_completed"] == 1


def test_prefix_cache_reuses_a_trajectory_turns_and_matches_a_full_prefill(
    model_dirs: dict[str, Path],
) -> None:
    """The next turn of a trajectory (same rid, input = previous input + output + new tokens) prefills only the new
    tokens, samples what a full prefill samples and reports the same log-probs; other rids, a flush and a weight
    update reuse nothing."""

    def turn(rid: str | None, prompt: list[int]) -> GenerateRequest:
        return request(prompt, max_new_tokens=8, temperature=0.8).model_copy(update={"rid": rid})

    async def conversation(cache_size: int) -> tuple[list[GenerateResponse], dict[str, Any]]:
        async with engine(model_dirs["v0"], prefix_cache_size=cache_size, seed=3) as local:
            first_prompt = prompt_of(20)
            first, other = await asyncio.gather(
                local.generate(turn("a", first_prompt)), local.generate(turn("b", prompt_of(9, 5)))
            )
            second_prompt = first_prompt + first.output_ids + prompt_of(6, 2)
            second = await local.generate(turn("a", second_prompt))
            # another trajectory: nothing is cached under c
            third = await local.generate(turn("c", second_prompt))
            return [first, other, second, third], local.stats()

    cached, stats = run(conversation(cache_size=4))
    plain, plain_stats = run(conversation(cache_size=0))
    for with_cache, without in zip(cached, plain, strict=True):
        assert with_cache.output_ids == without.output_ids
        assert torch.allclose(
            torch.tensor(with_cache.output_token_logprobs),
            torch.tensor(without.output_token_logprobs),
            atol=ALIGNMENT_TOLERANCE,
        )
    # turn 2 of "a" reused its 20 prompt tokens and 7 of its 8 outputs (the last output was never fed)
    assert stats["prefix_cached_tokens"] == 20 + 7
    assert plain_stats["prefix_cached_tokens"] == 0
    assert stats["prefill_tokens"] == plain_stats["prefill_tokens"] - 27

    async def after_reset(reset: str) -> int:
        async with engine(model_dirs["v0"], prefix_cache_size=4) as local:
            response = await local.generate(turn("a", prompt_of(20)))
            if reset == "flush":
                assert await local.flush_cache()
            else:
                await local.update_weights_from_disk(str(model_dirs["v1"]), weight_version=1)
            await local.generate(turn("a", prompt_of(20) + response.output_ids + [11]))
            return int(local.stats()["prefix_cached_tokens"])

    assert run(after_reset("flush")) == 0
    assert run(after_reset("update")) == 0


def test_prefix_cache_evicts_the_least_recently_used(model_dirs: dict[str, Path]) -> None:
    async def scenario() -> int:
        async with engine(model_dirs["v0"], prefix_cache_size=1) as local:
            prompts = {rid: prompt_of(10, offset) for rid, offset in (("a", 0), ("b", 4))}
            outputs = {}
            for rid, prompt in prompts.items():  # b evicts a
                response = await local.generate(request(prompt, 4).model_copy(update={"rid": rid}))
                outputs[rid] = response.output_ids
            for rid in ("b", "a"):  # b finds its prefix; a was evicted
                follow = prompts[rid] + outputs[rid] + [12]
                await local.generate(request(follow, 4).model_copy(update={"rid": rid}))
            return int(local.stats()["prefix_cached_tokens"])

    assert run(scenario()) == 10 + 3


def test_negative_prefix_cache_size_is_refused(model_dirs: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="prefix_cache_size"):
        engine(model_dirs["v0"], prefix_cache_size=-1)


def hf_greedy(model_dir: Path, prompt: list[int], new_tokens: int) -> list[int]:
    """Hugging Face greedy `generate` on the request alone (batch 1, no padding, its own cache)."""
    model, _ = load_model_and_tokenizer(model_dir)
    generate: Any = model.generate  # untyped through nn.Module's __getattr__
    with torch.no_grad():
        output = generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return [int(token) for token in output[0, len(prompt) :]]


@pytest.mark.parametrize(
    ("model_name", "cache_size", "row_call_keys"),
    [("v0", 0, None), ("v0", 4, None), ("moe", 0, None), ("moe", 4, None), ("v0", 4, 0), ("v0", 0, 10**9)],
    ids=["dense", "dense-prefix-cache", "moe", "moe-prefix-cache", "per-row-attention", "padded-attention"],
)
def test_greedy_equals_hf_generate_as_requests_join_and_leave(
    model_dirs: dict[str, Path],
    model_name: str,
    cache_size: int,
    row_call_keys: int | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Greedy tokens equal Hugging Face `generate` on each request alone, for prompts of different lengths that
    join and leave a batch of 3 at different times (a queue behind it), and for next turns of trajectories (the
    prefix cache on: only the new tokens prefilled; off: the whole prompt); decode attention in runs of rows as
    decode_runs splits them, or forced by row_call_keys (0: one call per row; huge: one padded call)."""
    if row_call_keys is not None:
        monkeypatch.setattr(slots, "ROW_CALL_KEYS", row_call_keys)
    first_turns = {
        f"t{i}": (prompt_of(length, 5 * i), new)
        for i, (length, new) in enumerate([(37, 9), (5, 17), (120, 4), (64, 12), (1, 7), (250, 10)])
    }

    async def go() -> tuple[dict[str, list[tuple[list[int], GenerateResponse]]], dict[str, Any]]:
        async with engine(model_dirs[model_name], max_batch_size=3, prefix_cache_size=cache_size) as local:
            results: dict[str, list[tuple[list[int], GenerateResponse]]] = {}

            async def trajectory(rid: str, prompt: list[int], new: int, delay_steps: int) -> None:
                while local.stats()["decode_steps"] < delay_steps:  # join while others decode
                    await asyncio.sleep(0.001)
                for turn in range(2):
                    sampling = SamplingParams(max_new_tokens=new + turn, temperature=0.0, ignore_eos=True)
                    response = await local.generate(
                        GenerateRequest(input_ids=prompt, sampling_params=sampling, rid=rid)
                    )
                    results.setdefault(rid, []).append((prompt, response))
                    prompt = prompt + response.output_ids + prompt_of(3 + turn, len(prompt))

            await asyncio.gather(
                *(trajectory(rid, prompt, new, 4 * i) for i, (rid, (prompt, new)) in enumerate(first_turns.items()))
            )
            return results, local.stats()

    results, stats = run(go())
    for turns in results.values():
        for prompt, response in turns:
            assert response.output_ids == hf_greedy(model_dirs[model_name], prompt, len(response.output_ids))
    assert max(stats["batch_size_histogram"]) == 3
    if cache_size:  # every second turn reused its first turn's prompt and outputs but the last
        assert stats["prefix_cached_tokens"] == sum(
            len(turns[0][0]) + len(turns[0][1].output_ids) - 1 for turns in results.values()
        )
    else:
        assert stats["prefix_cached_tokens"] == 0


def test_sample_rows_equals_sample_token_row_by_row() -> None:
    """The vectorised sampler draws the same tokens and reports the same log-probs as sampling each row alone
    with its own generator, whatever the other rows' settings."""
    logits = torch.randn(7, 300, generator=torch.Generator().manual_seed(1)) * 4
    settings = [(0.0, 1.0), (0.7, 0.9), (1.3, 1.0), (1.0, 0.5), (0.0, 0.8), (0.9, 1.0), (2.0, 0.95)]
    for original in (False, True):
        for draw in range(5):
            expected = [
                sample_token(
                    logits[i],
                    t,
                    p,
                    torch.Generator().manual_seed(100 * draw + i),
                    return_original_logprob=original,
                )
                for i, (t, p) in enumerate(settings)
            ]
            tokens, logprobs = sample_rows(
                logits,
                [t for t, _ in settings],
                [p for _, p in settings],
                [torch.Generator().manual_seed(100 * draw + i) for i in range(len(settings))],
                return_original_logprob=original,
            )
            assert tokens == [token for token, _ in expected]
            assert logprobs == pytest.approx([logprob for _, logprob in expected], abs=1e-6)


def test_joining_and_leaving_requests_neither_rebuild_nor_copy_the_batch_cache(
    model_dirs: dict[str, Path],
) -> None:
    """Requests join and leave the running batch while its KV buffers stay the same tensors (written in place)."""

    async def go() -> tuple[list[int], list[int], dict[str, Any]]:
        async with engine(model_dirs["v0"], max_batch_size=4) as local:
            cache = local._batch.cache
            before = [tensor.data_ptr() for tensor in cache.keys + cache.values]
            requests = [request(prompt_of(3 + 9 * i, i), max_new_tokens=5 + 3 * i) for i in range(10)]
            await asyncio.gather(*(local.generate(r) for r in requests))
            after = [tensor.data_ptr() for tensor in cache.keys + cache.values]
            return before, after, local.stats()

    before, after, stats = run(go())
    assert before == after  # the prompts and outputs fit the first capacity: no growth either
    assert stats["requests_completed"] == 10 and max(stats["batch_size_histogram"]) == 4


def test_decode_runs_read_the_fewest_keys_counting_each_call() -> None:
    """decode_runs' split of decode rows into runs of consecutive slots (one padded call each) costs no more than
    any other split (all checked), keeps equal lengths in one call, and cuts a long row out of short ones."""
    call = slots.ROW_CALL_KEYS

    def cost(ends: list[int], runs: list[tuple[int, int]]) -> int:
        return sum((end - begin) * max(ends[begin:end]) + call for begin, end in runs)

    assert slots.decode_runs([300] * 16) == [(0, 16)]
    assert slots.decode_runs([10, 1000, 10, 10]) == [(0, 1), (1, 2), (2, 4)]
    assert slots.decode_runs([]) == []
    generator = torch.Generator().manual_seed(0)
    for _ in range(40):
        count = int(torch.randint(1, 9, (1,), generator=generator))
        ends = torch.randint(1, 1200, (count,), generator=generator).tolist()
        runs = slots.decode_runs(ends)
        assert [begin for begin, _ in runs] == [0] + [end for _, end in runs[:-1]] and runs[-1][1] == count
        splits = [
            [(a, b) for a, b in zip((0, *cuts), (*cuts, count), strict=True)]
            for mask in range(2 ** (count - 1))
            for cuts in [tuple(i for i in range(1, count) if mask >> (i - 1) & 1)]
        ]
        assert cost(ends, runs) == min(cost(ends, split) for split in splits)


@pytest.mark.parametrize("model_name", ["v0", "moe"])
def test_fused_weights_follow_weights_copied_in_place(model_dirs: dict[str, Path], model_name: str) -> None:
    """SlotModel's concatenated q/k/v and gate/up weights are rebuilt when the model's parameters change in place
    (as every weight update writes them): its logits follow the model's own forward before and after."""
    model, _ = load_model_and_tokenizer(model_dirs[model_name])
    other, _ = load_model_and_tokenizer(model_dirs["v1" if model_name == "v0" else "v0"])
    step_model = slots.SlotModel(model, CONTEXT)
    prompt = prompt_of(20)

    def compare() -> None:
        cache = step_model.new_cache(2)
        prefill = step_model.step(cache, slots.StepRows(tokens=prompt, starts=[0], counts=[len(prompt)]))
        decode = step_model.step(cache, slots.StepRows(tokens=[prompt[0]], starts=[len(prompt)], counts=[1]))
        with torch.no_grad():
            expected = model(torch.tensor([prompt + prompt[:1]])).logits[0, -2:]
        torch.testing.assert_close(torch.cat([prefill, decode]), expected, atol=ALIGNMENT_TOLERANCE, rtol=0)

    compare()
    with torch.no_grad():  # the dense layers of v1 (the MoE model's attention, embeddings and norms)
        current = model.state_dict()
        changed = {k: v for k, v in other.state_dict().items() if k in current and current[k].shape == v.shape}
        model.load_state_dict(changed, strict=False)
    assert any("q_proj" in name for name in changed)
    compare()


def test_a_model_other_than_qwen3_is_refused(model_dirs: dict[str, Path], tmp_path: Path) -> None:
    """The engine runs its own Qwen3 forward: another architecture is refused at load, not served wrongly."""
    from transformers import LlamaConfig, LlamaForCausalLM

    _, tokenizer = load_model_and_tokenizer(model_dirs["v0"])
    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=CONTEXT,
        )
    )
    path = save_model_and_tokenizer(llama, tokenizer, tmp_path / "llama")
    with pytest.raises(ValueError, match="Qwen3"):
        engine(path)
