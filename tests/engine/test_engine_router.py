"""The router over two real local engine processes on 127.0.0.1: least-outstanding routing, rid stickiness,
weight-version tagging across updates (pause and drain), bad requests, an engine killed and brought back."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from swerl.engine.base import ContextLengthError, Engine, GenerateResponse, WeightUpdateError
from swerl.engine.launcher import EngineLauncher
from swerl.engine.router import Router
from swerl.errors import InfraError
from swerl.services import free_port
from tests.engine_helpers import greedy, launch_local, make_client, make_router, prompt_of

CONTEXT = 256
T = TypeVar("T")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def engines(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineLauncher]:
    launcher = launch_local(models["v0"], 2, tmp_path_factory.mktemp("logs"), max_context_tokens=CONTEXT)
    try:
        yield launcher
    finally:
        launcher.stop()


def with_router(urls: list[str], scenario: Callable[[Router], Awaitable[T]], **options: Any) -> T:
    async def run() -> T:
        clients = [make_client(url, pool_size=32, request_timeout_s=120) for url in urls]
        async with make_router(clients, **{"health_interval_s": 0.0} | options) as router:
            return await scenario(router)

    return asyncio.run(run())


def engine_stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/engine_stats", timeout=10) as response:  # noqa: S310 - loopback
        return dict(json.loads(response.read()))


def test_router_is_an_engine() -> None:
    assert isinstance(make_router([make_client("http://127.0.0.1:1", pool_size=1)]), Engine)


def test_least_outstanding_spreads_load_and_a_trajectory_sticks(engines: EngineLauncher) -> None:
    async def scenario(router: Router) -> tuple[list[int], list[int]]:
        await asyncio.gather(*(router.generate(greedy(prompt_of(6, i), 30, rid=f"x{i}")) for i in range(8)))
        spread = [slot.requests for slot in router.slots]
        before = [slot.requests for slot in router.slots]
        turns = prompt_of(5)
        for _turn in range(3):  # a trajectory's turns, each with other traffic in flight
            other = [asyncio.create_task(router.generate(greedy(prompt_of(6, i), 30))) for i in range(3)]
            response = await router.generate(greedy(turns, 4, rid="trajectory-7"))
            turns = turns + response.output_ids + [11]
            await asyncio.gather(*other)
        sticky = router._sticky["trajectory-7"].index
        return spread, [slot.requests - before[i] - (3 if i == sticky else 0) for i, slot in enumerate(router.slots)]

    spread, others = with_router(engines.urls, scenario)
    assert spread == [4, 4]  # 8 concurrent requests, least outstanding first
    assert sum(others) == 9 and min(others) >= 3  # the other traffic still spread


def test_stickiness_yields_to_a_much_busier_engine() -> None:
    router = make_router([make_client(f"http://127.0.0.1:{p}", pool_size=1) for p in (1, 2)], sticky_max_excess=2)
    first = router.pick("t")
    first.outstanding = 2
    assert router.pick("t") is first  # 2 more than the other: still within the allowed excess
    first.outstanding = 3
    moved = router.pick("t")
    assert moved is not first and router.pick("t") is moved  # moved, and sticks to its new engine
    first.healthy = False
    assert router.pick("u") is moved


def test_weight_versions_tag_every_response_across_a_paused_update(
    engines: EngineLauncher, models: dict[str, Path]
) -> None:
    async def scenario(router: Router) -> tuple[GenerateResponse, list[GenerateResponse]]:
        long = asyncio.create_task(router.generate(greedy(prompt_of(4), CONTEXT - 8, rid="long")))
        while not any(engine_stats(url)["running"] for url in engines.urls):
            await asyncio.sleep(0.01)
        await router.update_weights_from_disk(str(models["v1"]), 1)
        after = await asyncio.gather(*(router.generate(greedy(prompt_of(6, i), 4)) for i in range(4)))
        spanning = await long
        await router.update_weights_from_disk(str(models["v0"]), 2)  # v0's weights again for later tests
        return spanning, list(after)

    spanning, after = with_router(engines.urls, scenario, weight_update_mode="pause")
    versions = spanning.output_token_weight_versions
    assert versions is not None and versions == sorted(versions) and {versions[0], versions[-1]} == {0, 1}
    assert spanning.weight_version == 1  # the version that sampled its last token
    assert all(r.weight_version == 1 and r.output_token_weight_versions == [1] * 4 for r in after)
    assert [engine_stats(url)["weight_version"] for url in engines.urls] == [2, 2]


def test_a_drained_update_keeps_each_response_on_one_version(engines: EngineLauncher, models: dict[str, Path]) -> None:
    async def scenario(router: Router) -> tuple[GenerateResponse, bool]:
        long = asyncio.create_task(router.generate(greedy(prompt_of(4), 120)))
        while not any(engine_stats(url)["running"] for url in engines.urls):
            await asyncio.sleep(0.01)
        await router.update_weights_from_disk(str(models["v0"]), 3)
        done = long.done()
        return await long, done

    response, done_before_update_returned = with_router(
        engines.urls, scenario, weight_update_mode="drain", weight_version=2
    )
    assert done_before_update_returned  # the update waited for the request in flight
    assert response.output_token_weight_versions == [2] * 120 and response.weight_version == 2
    assert [engine_stats(url)["weight_version"] for url in engines.urls] == [3, 3]


def test_bad_requests_and_bad_weights_leave_every_engine_in_rotation(
    engines: EngineLauncher, models: dict[str, Path]
) -> None:
    async def scenario(router: Router) -> tuple[list[bool], int, GenerateResponse]:
        with pytest.raises(ContextLengthError):
            await router.generate(greedy(prompt_of(CONTEXT), 4))
        with pytest.raises(WeightUpdateError):
            await router.update_weights_from_disk("/does/not/exist", 9)
        with pytest.raises(WeightUpdateError, match="do not fit"):
            await router.update_weights_from_disk(str(models["wide"]), 9)
        fine = await router.generate(greedy(prompt_of(4), 4))
        return [slot.healthy for slot in router.slots], router.weight_version, fine

    healthy, version, fine = with_router(engines.urls, scenario, weight_version=3)
    assert healthy == [True, True] and version == 3 and fine.weight_version == 3


def test_no_engine_reachable_is_an_infra_error() -> None:
    async def scenario(router: Router) -> None:
        await router.generate(greedy([1, 2], 2))

    with pytest.raises(InfraError) as caught:
        with_router([f"http://127.0.0.1:{free_port()}"], scenario, retries=1)
    assert caught.value.cause == "engine_unreachable"


def test_a_killed_engine_is_taken_out_and_put_back_at_the_current_version(
    engines: EngineLauncher, models: dict[str, Path]
) -> None:
    victim = engines.services[1]
    assert victim.proc is not None

    async def scenario(router: Router) -> dict[str, Any]:
        os.kill(victim.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
        victim.proc.wait()  # type: ignore[union-attr]
        during = await asyncio.gather(*(router.generate(greedy(prompt_of(5, i), 4, rid=f"k{i}")) for i in range(6)))
        out = not router.slots[1].healthy
        await router.update_weights_from_disk(str(models["v1"]), 4)  # only the live engine gets it
        await asyncio.to_thread(victim.start)  # same port, fresh process at version 0
        deadline = time.monotonic() + 60
        while not router.slots[1].healthy and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        back = router.slots[1].healthy
        before = router.slots[1].requests
        after = await asyncio.gather(*(router.generate(greedy(prompt_of(5, i), 4)) for i in range(6)))
        return {
            "during": during,
            "out": out,
            "back": back,
            "served_after": router.slots[1].requests - before,
            "after": after,
            "retried": router.retried,
        }

    result = with_router(engines.urls, scenario, health_interval_s=0.3, weight_version=3, retries=2)
    assert len(result["during"]) == 6 and result["out"] and result["retried"] >= 1
    assert all(r.weight_version == 3 for r in result["during"])
    assert result["back"], "the restarted engine was not put back"
    assert engine_stats(engines.urls[1])["weight_version"] == 4  # brought to the router's version on return
    assert result["served_after"] > 0 and all(r.weight_version == 4 for r in result["after"])


def test_a_weight_update_with_every_engine_out_waits_for_them_instead_of_failing() -> None:
    """Found by benchmarks/chaos.py: one dropped connection took the only engine out and the next weight update
    killed the stage. With a health loop the update becomes the router's version, which each engine gets on return;
    without one it is still an InfraError."""
    dead = f"http://127.0.0.1:{free_port()}"

    async def scenario(router: Router) -> int:
        router.slots[0].healthy = False
        await router.update_weights_from_disk("/nonexistent/weights", 7)
        return router.weight_version

    assert with_router([dead], scenario, health_interval_s=30.0) == 7
    with pytest.raises(InfraError) as caught:
        with_router([dead], scenario)
    assert caught.value.cause == "engine_unreachable"
