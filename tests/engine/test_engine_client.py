"""The SGLang HTTP client: failure mapping (timeout, 5xx, dropped, refused, 4xx), retries, the pool as the only cap.

The server here is swerl.engine.emulated_server in its own process: a real HTTP server speaking SGLang's API with
no model, because a real engine cannot be made to answer 503 or drop a connection on demand. The client against
a real engine is in test_engine_server.py and test_engine_router.py.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from swerl.engine.base import Engine, InvalidRequestError, WeightUpdateError
from swerl.engine.client import EngineClient
from swerl.errors import InfraError
from swerl.services import free_port
from tests.doubles import launch_emulated
from tests.engine_helpers import base_url, greedy, make_client, post

LATENCY_S = 0.3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    service = launch_emulated(tmp_path_factory.mktemp("emulated"), latency_s=LATENCY_S)
    try:
        yield base_url(service)
    finally:
        service.stop()


def fault(url: str, **spec: Any) -> None:
    post(url + "/fault", json.dumps(spec).encode())


def server_stats(url: str, reset: bool = False) -> dict[str, Any]:
    """The server's counters; reset waits for earlier calls (e.g. one the client timed out on) to end first."""
    if reset:
        deadline = time.monotonic() + 10
        while server_stats(url)["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.05)
        post(url + "/engine_stats/reset")
    with urllib.request.urlopen(url + "/engine_stats", timeout=10) as response:  # noqa: S310 - loopback
        return dict(json.loads(response.read()))


def call(client: EngineClient, coroutine_fn: Any) -> Any:
    async def scenario() -> Any:
        async with client:
            return await coroutine_fn(client)

    return asyncio.run(scenario())


def test_client_is_an_engine() -> None:
    assert isinstance(make_client("http://127.0.0.1:1", pool_size=1), Engine)
    with pytest.raises(ValueError, match="pool_size"):
        make_client("http://127.0.0.1:1", pool_size=0)


def test_generate_parses_sglang_meta_info(server: str) -> None:
    response = call(make_client(server, pool_size=2), lambda c: c.generate(greedy([5, 6, 7], rid="r1")))
    assert response.output_ids == [8, 9, 10, 11]
    assert response.output_token_logprobs == [-1.0] * 4 and response.finish_reason == "length"
    assert response.prompt_tokens == 3 and response.weight_version == 0


def test_unreachable_engine_is_an_infra_error() -> None:
    client = make_client(f"http://127.0.0.1:{free_port()}", pool_size=2, retries=1, retry_backoff_s=0.01)
    with pytest.raises(InfraError) as caught:
        call(client, lambda c: c.generate(greedy([1])))
    assert caught.value.cause == "engine_unreachable"
    assert call(client, lambda c: c.health()) is False


@pytest.mark.parametrize(("spec", "cause"), [({"status": 503}, "engine_http"), ({"drop": True}, "engine_unreachable")])
def test_5xx_and_dropped_connections_are_retried_then_infra_errors(
    server: str, spec: dict[str, Any], cause: str
) -> None:
    server_stats(server, reset=True)
    fault(server, count=1, **spec)
    recovered = call(
        make_client(server, pool_size=2, retries=1, retry_backoff_s=0.01), lambda c: c.generate(greedy([1]))
    )
    assert recovered.output_ids == [2, 3, 4, 5]
    assert server_stats(server)["requests"] == 2  # one failure, one retry
    fault(server, count=3, **spec)
    with pytest.raises(InfraError) as caught:
        call(
            make_client(server, pool_size=2, retries=2, retry_backoff_s=0.01),
            lambda c: c.generate(greedy([1])),
        )
    assert caught.value.cause == cause
    assert server_stats(server)["requests"] == 5


def test_timeout_is_an_infra_error(server: str) -> None:
    fault(server, count=1, delay_s=3.0)
    client = make_client(server, pool_size=2, request_timeout_s=LATENCY_S + 0.5)
    started = time.monotonic()
    with pytest.raises(InfraError) as caught:
        call(client, lambda c: c.generate(greedy([1])))
    assert caught.value.cause == "engine_timeout" and time.monotonic() - started < 3.0


def test_4xx_is_the_callers_error_and_never_retried(server: str) -> None:
    server_stats(server, reset=True)
    fault(server, count=1, status=400)
    with pytest.raises(InvalidRequestError, match="injected fault"):
        call(
            make_client(server, pool_size=2, retries=3, retry_backoff_s=0.01),
            lambda c: c.generate(greedy([1])),
        )
    assert server_stats(server)["requests"] == 1


def test_weight_update_tags_later_responses_and_a_missing_path_is_refused(server: str) -> None:
    existing = tempfile.mkdtemp()

    async def scenario(client: EngineClient) -> tuple[int, int]:
        with pytest.raises(WeightUpdateError, match="not found"):
            await client.update_weights_from_disk("/does/not/exist", 7)
        before = (await client.generate(greedy([1]))).weight_version
        await client.update_weights_from_disk(existing, 7)
        after = (await client.generate(greedy([1]))).weight_version
        return before, after

    before, after = call(make_client(server, pool_size=2), scenario)
    assert (before, after) == (0, 7)
    Path(existing).rmdir()


@pytest.mark.parametrize(("pool_size", "expected_peak"), [(8, 8), (64, 40)])
def test_the_pool_size_is_the_only_concurrency_cap(server: str, pool_size: int, expected_peak: int) -> None:
    """40 concurrent calls: a pool of 8 holds the server at 8 in flight; a pool of 64 lets all 40 through."""
    server_stats(server, reset=True)

    async def burst(client: EngineClient) -> list[Any]:
        return list(await asyncio.gather(*(client.generate(greedy([i + 1])) for i in range(40))))

    responses = call(make_client(server, pool_size=pool_size), burst)
    assert len(responses) == 40
    assert server_stats(server)["peak_in_flight"] == expected_peak
