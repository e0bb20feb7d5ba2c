"""A latency-emulating engine server: SGLang's native API subset with no model behind it, for benchmarks of the
client and router and for the failure paths a real engine cannot be made to take on demand.

    python -m swerl.engine.emulated_server --port N [--latency-s 1.0] [--output-tokens 16]

/generate sleeps `latency_s`, then answers `output_tokens` deterministic ids with log-prob -1.0, finish reason
length, the current weight version and SGLang's meta_info shape. /update_weights_from_disk needs an existing
path; /pause_generation holds new and running generations until /continue_generation. POST /fault makes the next
`count` /generate calls answer HTTP `status`, drop the connection (`drop`) or sleep `delay_s` more. GET
/engine_stats reports requests and the peak of generations in flight (the concurrency the server saw).
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from aiohttp import web


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
        self.faults: list[dict[str, Any]] = []

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
                return web.json_response(
                    {"error": {"message": "injected fault"}}, status=int(fault["status"])
                )
            await self.running.wait()
            await asyncio.sleep(self.latency_s + float(fault.get("delay_s", 0.0)))
            await self.running.wait()
            prompt = body["input_ids"]
            params = body.get("sampling_params") or {}
            count = min(self.output_tokens, int(params.get("max_new_tokens", self.output_tokens)))
            output = [(prompt[-1] + 1 + index) % 1000 for index in range(count)]
            meta = {
                "id": body.get("rid"),
                "finish_reason": {"type": "length"},
                "prompt_tokens": len(prompt),
                "completion_tokens": count,
                "output_token_logprobs": [[-1.0, token, None] for token in output],
                "weight_version": str(self.weight_version),
            }
            return web.json_response({"output_ids": output, "meta_info": meta})
        finally:
            self.in_flight -= 1

    async def update_weights(self, request: web.Request) -> web.Response:
        body = await request.json()
        if not os.path.exists(body["model_path"]):
            return web.json_response(
                {"success": False, "message": f"{body['model_path']} not found"}, status=400
            )
        self.weight_version = int(body.get("weight_version") or self.weight_version + 1)
        return web.json_response({"success": True, "message": "ok", "num_paused_requests": 0})

    async def pause(self, request: web.Request) -> web.Response:
        self.running.clear()
        return web.json_response({"status": "ok"})

    async def resume(self, request: web.Request) -> web.Response:
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
            {"requests": self.requests, "in_flight": self.in_flight, "peak_in_flight": self.peak_in_flight}
        )

    async def reset_stats(self, request: web.Request) -> web.Response:
        self.requests, self.peak_in_flight = 0, self.in_flight
        return web.json_response({})


def create_app(engine: EmulatedServer) -> web.Application:
    app = web.Application()
    app.router.add_post("/generate", engine.generate)
    app.router.add_post("/update_weights_from_disk", engine.update_weights)
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
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
