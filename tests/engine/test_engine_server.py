"""The local engine as an HTTP server (a real process on 127.0.0.1, driven by the real client): the same tokens
and log-probs as the in-process engine, batching of concurrent requests, the context cap, every bad-input path
answered clearly while the engine keeps serving, weight versions, pause and continue."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from swerl.engine.base import ContextLengthError, GenerateResponse, InvalidRequestError, WeightUpdateError
from swerl.engine.client import EngineClient
from swerl.engine.launcher import EngineLauncher
from swerl.engine.local import LocalEngine
from tests.engine_helpers import (
    CONTEXT,
    VOCAB,
    greedy,
    launch_local,
    make_client,
    post,
    prompt_of,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def server(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineLauncher]:
    launcher = launch_local(models["v0"], 1, tmp_path_factory.mktemp("logs"), max_batch_size=8)
    try:
        yield launcher
    finally:
        launcher.stop()


def url(server: EngineLauncher) -> str:
    return server.urls[0]


def with_client(server: EngineLauncher, scenario: Any) -> Any:
    async def run() -> Any:
        async with make_client(url(server), pool_size=16) as client:
            return await scenario(client)

    return asyncio.run(run())


def stats(server: EngineLauncher) -> dict[str, Any]:
    with urllib.request.urlopen(url(server) + "/engine_stats", timeout=10) as response:  # noqa: S310
        return dict(json.loads(response.read()))


def test_over_http_equals_in_process(server: EngineLauncher, models: dict[str, Path]) -> None:
    """Greedy tokens and log-probs through the server equal the in-process LocalEngine's (token in, token out)."""
    prompts = [prompt_of(5), prompt_of(17, 3)]

    async def local() -> list[GenerateResponse]:
        async with LocalEngine(
            models["v0"], max_batch_size=8, max_context_tokens=CONTEXT, prefix_cache_size=0
        ) as engine:
            return [await engine.generate(greedy(p, 12)) for p in prompts]

    expected = asyncio.run(local())
    got = with_client(server, lambda c: asyncio.gather(*(c.generate(greedy(p, 12)) for p in prompts)))
    for mine, theirs in zip(got, expected, strict=True):
        assert mine.output_ids == theirs.output_ids and mine.finish_reason == "length"
        assert mine.output_token_logprobs == pytest.approx(theirs.output_token_logprobs, abs=1e-5)


def test_concurrent_requests_share_a_batch(server: EngineLauncher) -> None:
    before = stats(server)["batch_size_histogram"]
    responses = with_client(
        server, lambda c: asyncio.gather(*(c.generate(greedy(prompt_of(6, i), 40)) for i in range(6)))
    )
    assert all(len(r.output_ids) == 40 for r in responses)
    after = stats(server)["batch_size_histogram"]
    grown = {int(size): count - before.get(size, 0) for size, count in after.items()}
    assert any(size >= 2 and count > 0 for size, count in grown.items()), after


def test_context_cap_finishes_with_length(server: EngineLauncher) -> None:
    prompt = prompt_of(CONTEXT - 5)
    response = with_client(server, lambda c: c.generate(greedy(prompt, 50)))
    assert response.finish_reason == "length" and response.completion_tokens == 5
    assert response.prompt_tokens + response.completion_tokens == CONTEXT


def test_bad_requests_are_clear_errors_and_the_engine_keeps_serving(server: EngineLauncher) -> None:
    async def scenario(client: EngineClient) -> list[BaseException | GenerateResponse]:
        return list(
            await asyncio.gather(
                client.generate(greedy(prompt_of(CONTEXT), 4)),  # no room to generate
                client.generate(greedy([1, 2, VOCAB + 5], 4)),  # outside the vocabulary
                client.generate(greedy(prompt_of(4), 4)),  # fine, concurrently with the bad ones
                return_exceptions=True,
            )
        )

    too_long, bad_token, fine = with_client(server, scenario)
    assert isinstance(too_long, ContextLengthError) and "context length" in str(too_long)
    assert isinstance(bad_token, InvalidRequestError) and "outside the vocabulary" in str(bad_token)
    assert isinstance(fine, GenerateResponse) and len(fine.output_ids) == 4
    for body in (b"not json", b'{"text": "hello"}', b'{"input_ids": [1], "sampling_params": {"n": 2}}'):
        with pytest.raises(urllib.error.HTTPError) as caught:
            post(url(server) + "/generate", body)
        assert caught.value.code == 400
    assert with_client(server, lambda c: c.health()) is True


def test_weight_updates_tag_responses_and_a_bad_path_changes_nothing(
    server: EngineLauncher, models: dict[str, Path]
) -> None:
    async def scenario(client: EngineClient) -> list[Any]:
        first = await client.generate(greedy(prompt_of(8), 6))
        for bad in ("/does/not/exist", str(models["wide"])):
            with pytest.raises(WeightUpdateError):
                await client.update_weights_from_disk(bad, 5)
        unchanged = await client.generate(greedy(prompt_of(8), 6))
        info = await client.model_info()
        await client.update_weights_from_disk(str(models["v1"]), 1)
        updated = await client.generate(greedy(prompt_of(8), 6))
        await client.update_weights_from_disk(str(models["v0"]), 2)  # back to v0's weights for later tests
        return [first, unchanged, info, updated, await client.model_info()]

    first, unchanged, info, updated, final = with_client(server, scenario)
    assert first.weight_version == unchanged.weight_version == 0 and info["weight_version"] == "0"
    assert unchanged.output_token_logprobs == first.output_token_logprobs
    assert updated.weight_version == 1 and updated.output_token_weight_versions == [1] * 6
    assert updated.output_token_logprobs != pytest.approx(first.output_token_logprobs, abs=1e-3)  # other weights
    assert final["weight_version"] == "2"


def test_pause_holds_generation_until_continue(server: EngineLauncher) -> None:
    async def scenario(client: EngineClient) -> tuple[bool, GenerateResponse]:
        await client.pause_generation("in_place")
        pending = asyncio.create_task(client.generate(greedy(prompt_of(5), 4)))
        await asyncio.sleep(1.0)
        held = not pending.done()
        assert await client.health()  # a paused engine is healthy (the router must not take it out)
        await client.continue_generation()
        return held, await pending

    held, response = with_client(server, scenario)
    assert held and len(response.output_ids) == 4


def test_an_engine_server_exits_when_the_process_that_launched_it_is_gone() -> None:
    """A SIGKILLed stage must not leave its engine servers behind (the chaos run once found eight, 470 MB each):
    the server's parent watch (--parent-pid, set by the launcher) ends it once it is re-parented."""
    import subprocess
    import sys
    import time

    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import os, subprocess, sys, time\n"
                "code = 'import sys, time; from swerl.engine.server import _exit_with_parent; '"
                " '_exit_with_parent(int(sys.argv[1]), 0.1)'\n"
                "child = subprocess.Popen([sys.executable, '-c', code, str(os.getpid())], start_new_session=True)\n"
                "print(child.pid, flush=True); time.sleep(120)\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert launcher.stdout is not None
    server = int(launcher.stdout.readline())
    time.sleep(0.5)
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return
        if state == "Z":
            return
        time.sleep(0.2)
    raise AssertionError(f"the server {server} outlived its launcher")
