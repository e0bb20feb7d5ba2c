"""A latency-emulating engine server: SGLang's native API subset with no model behind it, for benchmarks of the
client and router and for the failure paths a real engine cannot be made to take on demand.

    python -m swerl.engine.emulated_server --port N [--latency-s 1.0] [--output-tokens 16]

/generate sleeps `latency_s` (in up to 4 chunks, each a share of the tokens), then answers `output_tokens`
deterministic ids with log-prob -1.0, finish reason length and SGLang's meta_info shape: weight_version and the
weight_versions spans (the version current when each token's chunk finished, so a generation across a weight
update reports two). /pause_generation holds new and running generations until /continue_generation.

Weight updates follow SGLang 0.5.23's rules, so that a request SGLang would refuse fails here too:
- /update_weights_from_disk needs an existing path;
- flush_cache with an update is refused (HTTP 400 after "loading", the reported version unchanged) while a
  generation is running under pause mode in_place (scheduler.py: flush_cache needs an idle scheduler; retract
  moves running requests to the waiting queue, which a paused engine ignores); an update while not paused waits
  for running generations first (SGLang's model-update writer lock);
- /init_weights_update_group records the group (no process group is joined: nothing may broadcast to this
  server), /destroy_weights_update_group drops it, /update_weights_from_distributed needs the group and a session
  opened by /begin_weight_update (closed by /end_weight_update), and receives nothing.
GET /engine_stats reports requests, the peak of generations in flight (the concurrency the server saw) and every
weight-control request's body (`weight_requests`). POST /fault makes the next `count` /generate calls answer
HTTP `status`, drop the connection (`drop`) or sleep `delay_s` more.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from aiohttp import web

from swerl.engine.base import weight_version_spans

FLUSH_REFUSED = (
    "Weights were updated, but the cache was not flushed because requests are still running or queued. "
    "Retract or finish them, then call /flush_cache."
)
"""SGLang 0.5.23's message (scheduler_components/weight_updater.py: flush_cache_after_weight_update)."""


class EmulatedServer:
    """The server's state: latency and output size, the weight version, pause, queued faults, request counts."""

    def __init__(self, latency_s: float, output_tokens: int, weight_version: int = 0) -> None:
        self.latency_s = latency_s
        self.output_tokens = output_tokens
        self.weight_version = weight_version
        self.in_flight = 0
        self.peak_in_flight = 0
        self.requests = 0
        self.running = asyncio.Event()  # cleared while paused
        self.running.set()
        self.pause_mode: str | None = None  # while paused
        self.generating = 0  # generations past admission and not finished (SGLang's running batch, roughly)
        self.idle = asyncio.Event()
        self.idle.set()
        self.faults: list[dict[str, Any]] = []
        self.groups: dict[str, dict[str, Any]] = {}
        self.session = False
        self.weight_requests: list[dict[str, Any]] = []
        self.loaded_updates = 0  # updates whose weights "loaded", refused flushes included

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests += 1
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            fault = self.faults.pop(0) if self.faults else {}
            if fault.get("drop"):
                assert request.transport is not None
                request.transport.close()  # the client sees the connection dropped mid-request
                return web.Response(status=500)
            if "status" in fault:
                return web.json_response({"error": {"message": "injected fault"}}, status=int(fault["status"]))
            await self.running.wait()
            prompt = body["input_ids"]
            params = body.get("sampling_params") or {}
            count = min(self.output_tokens, int(params.get("max_new_tokens", self.output_tokens)))
            output = [(prompt[-1] + 1 + index) % 1000 for index in range(count)]
            versions = await self._decode(count, self.latency_s + float(fault.get("delay_s", 0.0)))
            spans = weight_version_spans(versions, self.weight_version)
            meta = {
                "id": body.get("rid"),
                "finish_reason": {"type": "length"},
                "prompt_tokens": len(prompt),
                "completion_tokens": count,
                "output_token_logprobs": [[-1.0, token, None] for token in output],
                "weight_version": spans[-1]["version"],
                "weight_versions": spans,
            }
            return web.json_response({"output_ids": output, "meta_info": meta})
        finally:
            self.in_flight -= 1

    async def _decode(self, count: int, latency_s: float) -> list[int]:
        """Emulate decoding `count` tokens in up to 4 chunks; the version of each token (current as its chunk ends)."""
        chunks = max(1, min(4, count))
        versions: list[int] = []
        self.generating += 1
        self.idle.clear()
        try:
            for chunk in range(chunks):
                await asyncio.sleep(latency_s / chunks)
                await self.running.wait()
                end = count * (chunk + 1) // chunks
                versions += [self.weight_version] * (end - len(versions))
        finally:
            self.generating -= 1
            if self.generating == 0:
                self.idle.set()
        return versions

    async def _flush_refused(self, body: dict[str, Any]) -> bool:
        """Whether SGLang would refuse this update's flush_cache (see the module docstring); an update while not
        paused first waits for running generations, as SGLang's writer lock does."""
        if self.pause_mode is None:
            await self.idle.wait()
            return False
        return bool(body.get("flush_cache", True)) and self.pause_mode == "in_place" and self.generating > 0

    def _answer(self, success: bool, message: str) -> web.Response:
        return web.json_response({"success": success, "message": message}, status=200 if success else 400)

    async def update_weights(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.weight_requests.append({"path": request.path, "body": body, "pause_mode": self.pause_mode})
        if not os.path.exists(body["model_path"]):
            return web.json_response({"success": False, "message": f"{body['model_path']} not found"}, status=400)
        self.loaded_updates += 1
        if await self._flush_refused(body):
            return web.json_response({"success": False, "message": FLUSH_REFUSED}, status=400)
        self.weight_version = int(body.get("weight_version") or self.weight_version + 1)
        return web.json_response({"success": True, "message": "ok", "num_paused_requests": 0})

    async def init_group(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.weight_requests.append({"path": request.path, "body": body, "pause_mode": self.pause_mode})
        missing = [key for key in ("master_address", "master_port", "rank_offset", "world_size") if key not in body]
        if missing:
            return self._answer(False, f"missing {missing}")
        name = body.get("group_name", "weight_update_group")
        if name in self.groups:
            return self._answer(False, "The specified group name has already been created")
        self.groups[name] = body
        return self._answer(True, "Succeeded to initialize custom process group.")

    async def destroy_group(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.weight_requests.append({"path": request.path, "body": body, "pause_mode": self.pause_mode})
        if self.groups.pop(body.get("group_name", "weight_update_group"), None) is None:
            return self._answer(False, "The group to be destroyed does not exist.")
        return self._answer(True, "Succeeded to destroy custom process group.")

    async def begin(self, request: web.Request) -> web.Response:
        self.weight_requests.append({"path": request.path, "body": {}, "pause_mode": self.pause_mode})
        if self.session:
            return self._answer(False, "a weight-update session is already open; call end_weight_update() first")
        self.session = True
        return self._answer(True, "Success")

    async def end(self, request: web.Request) -> web.Response:
        self.weight_requests.append({"path": request.path, "body": {}, "pause_mode": self.pause_mode})
        if not self.session:
            return self._answer(False, "no weight-update session is open; call begin_weight_update() first")
        self.session = False
        return self._answer(True, "Success")

    async def update_distributed(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.weight_requests.append({"path": request.path, "body": body, "pause_mode": self.pause_mode})
        name = body.get("group_name", "weight_update_group")
        if not self.session:
            return self._answer(
                False,
                "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()",
            )
        if name not in self.groups:
            return self._answer(False, f"Failed to receive weights: Group {name} not in {sorted(self.groups)}")
        if not len(body["names"]) == len(body["dtypes"]) == len(body["shapes"]):
            return self._answer(False, "Failed to receive weights: names, dtypes and shapes differ in length")
        self.loaded_updates += 1
        if await self._flush_refused(body):
            return self._answer(False, FLUSH_REFUSED)
        if body.get("weight_version") is not None:
            self.weight_version = int(body["weight_version"])
        return self._answer(True, "Succeeded to update parameter online.")

    async def pause(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else {}
        self.pause_mode = str(body.get("mode", "abort"))
        self.running.clear()
        return web.json_response({"status": "ok"})

    async def resume(self, request: web.Request) -> web.Response:
        self.pause_mode = None
        self.running.set()
        return web.json_response({"status": "ok"})

    async def fault(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.faults += [dict(body)] * int(body.pop("count", 1))
        return web.json_response({"queued": len(self.faults)})

    async def ok(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": "emulated", "weight_version": str(self.weight_version)})

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "requests": self.requests,
                "in_flight": self.in_flight,
                "peak_in_flight": self.peak_in_flight,
                "weight_version": self.weight_version,
                "loaded_updates": self.loaded_updates,
                "weight_requests": self.weight_requests,
            }
        )

    async def reset_stats(self, request: web.Request) -> web.Response:
        self.requests, self.peak_in_flight = 0, self.in_flight
        return web.json_response({})


def create_app(engine: EmulatedServer) -> web.Application:
    app = web.Application()
    app.router.add_post("/generate", engine.generate)
    app.router.add_post("/update_weights_from_disk", engine.update_weights)
    app.router.add_post("/init_weights_update_group", engine.init_group)
    app.router.add_post("/destroy_weights_update_group", engine.destroy_group)
    app.router.add_post("/begin_weight_update", engine.begin)
    app.router.add_post("/end_weight_update", engine.end)
    app.router.add_post("/update_weights_from_distributed", engine.update_distributed)
    app.router.add_post("/pause_generation", engine.pause)
    app.router.add_post("/continue_generation", engine.resume)
    app.router.add_post("/fault", engine.fault)
    app.router.add_route("*", "/flush_cache", engine.ok)
    app.router.add_get("/health", engine.ok)
    app.router.add_get("/health_generate", engine.ok)
    app.router.add_get("/get_model_info", engine.model_info)
    app.router.add_get("/engine_stats", engine.stats)
    app.router.add_post("/engine_stats/reset", engine.reset_stats)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency-s", type=float, default=1.0)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--backlog", type=int, default=4096, help="listen backlog (pending connections)")
    args = parser.parse_args(argv)

    async def serve() -> None:
        engine = EmulatedServer(args.latency_s, args.output_tokens)
        runner = web.AppRunner(create_app(engine), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port, backlog=args.backlog)
        await site.start()
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
