"""The local engine as an HTTP server speaking the subset of SGLang's native API that swerl uses.

    python -m swerl.engine.server --model DIR --port N [--host 127.0.0.1] [--max-batch-size 8]
        [--max-context-tokens 2048] [--threads 1] [--seed 0] [--weight-version 0] [--prefix-cache-size 0]
        [--device cpu|cuda] [--dtype float32|bfloat16] [--weight-sync-timeout-s 600]

Routes: POST /generate, POST /update_weights_from_disk, GET|POST /flush_cache, GET /health, GET /health_generate,
GET /get_model_info (and /model_info), POST /pause_generation, POST /continue_generation, GET /engine_stats
(swerl's counters), and weight sync over a process group as SGLang serves it: POST /init_weights_update_group,
/destroy_weights_update_group, /begin_weight_update, /update_weights_from_distributed, /end_weight_update (each
answers {"success", "message"}, HTTP 200 or 400). Concurrent /generate calls share the LocalEngine's continuous batch; a
request that reaches the context cap finishes with reason length, as SGLang does. Bad input answers 400 with {"error":
{"message"}} and the engine keeps serving; an engine failure answers 503.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from swerl.engine.base import GenerateRequest, InvalidRequestError, WeightUpdateError
from swerl.engine.local import LocalEngine
from swerl.errors import InfraError

log = logging.getLogger("swerl.engine.server")

SAMPLING_ACCEPTED_AS_NO_OPS = frozenset({"skip_special_tokens", "no_stop_trim", "spaces_between_special_tokens"})
"""SGLang sampling params that only shape detokenized text, which this token-only engine never produces."""
GENERATE_ACCEPTED_AS_NO_OPS = frozenset({"stream", "logprob_start_len", "return_text_in_logprobs"})
"""/generate fields accepted with their default meaning (no streaming, output log-probs only)."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class UpdateWeightsBody(BaseModel):
    """The fields of SGLang's UpdateWeightFromDiskReqInput this engine honours (others are ignored)."""

    model_config = ConfigDict(extra="ignore")

    model_path: str
    weight_version: str | None = None


class InitGroupBody(BaseModel):
    """SGLang's InitWeightsUpdateGroupReqInput (its defaults)."""

    model_config = ConfigDict(extra="ignore")

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"


class GroupNameBody(BaseModel):
    """SGLang's DestroyWeightsUpdateGroupReqInput."""

    model_config = ConfigDict(extra="ignore")

    group_name: str = "weight_update_group"


class DistributedUpdateBody(BaseModel):
    """The fields of SGLang's UpdateWeightsFromDistributedReqInput this engine honours (others are ignored)."""

    model_config = ConfigDict(extra="ignore")

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    weight_version: str | None = None


class PauseBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    mode: Literal["abort", "retract", "in_place"] = "abort"


def create_app(engine_factory: Callable[[], LocalEngine], model_path: str) -> FastAPI:
    """The FastAPI app; engine_factory() builds the LocalEngine inside the server's event loop."""
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state["engine"] = engine_factory()
        state["model_path"] = model_path
        try:
            yield
        finally:
            await state["engine"].close()

    app = FastAPI(lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)

    def engine() -> LocalEngine:
        return state["engine"]  # type: ignore[no-any-return]

    @app.post("/generate")
    async def generate(raw: Request) -> JSONResponse:
        try:
            body = await raw.json()
            request = parse_generate(body)
        except (ValueError, ValidationError) as error:  # JSONDecodeError is a ValueError
            return _error(400, f"bad /generate request: {error}")
        try:
            response = await engine().generate(request)
        except InvalidRequestError as error:
            return _error(400, str(error))
        except InfraError as error:
            return _error(503, str(error))
        return JSONResponse(response.to_sglang(request.rid))

    @app.post("/update_weights_from_disk")
    async def update_weights(raw: Request) -> JSONResponse:
        try:
            body = UpdateWeightsBody.model_validate(await raw.json())
            version = int(body.weight_version) if body.weight_version is not None else None
        except (ValueError, ValidationError) as error:
            return _update_result(False, f"bad request: {error}")
        target = engine().weight_version + 1 if version is None else version
        try:
            await engine().update_weights_from_disk(body.model_path, target)
        except WeightUpdateError as error:
            return _update_result(False, str(error))
        except InfraError as error:
            return JSONResponse({"success": False, "message": str(error)}, status_code=503)
        state["model_path"] = body.model_path
        return _update_result(True, f"weights from {body.model_path} serve as version {target}")

    _add_weight_group_routes(app, engine)
    _add_control_routes(app, engine, state)
    return app


async def _weight_call(raw: Request, body_type: type[BaseModel] | None, call: Callable[[Any], Any]) -> JSONResponse:
    """A weight-control route: parse, call, answer SGLang's {"success", "message"} (400 when refused)."""
    try:
        body = body_type.model_validate(await raw.json()) if body_type is not None else None
    except (ValueError, ValidationError) as error:
        return _update_result(False, f"bad request: {error}")
    try:
        message = await call(body)
    except WeightUpdateError as error:
        return _update_result(False, str(error))
    except InfraError as error:
        return JSONResponse({"success": False, "message": str(error)}, status_code=503)
    return _update_result(True, message)


def _add_weight_group_routes(app: FastAPI, engine: Callable[[], LocalEngine]) -> None:
    """Weight sync over a process group, as SGLang serves it: join and leave the group, a session of buckets."""

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(raw: Request) -> JSONResponse:
        async def call(body: InitGroupBody) -> str:
            await engine().init_weights_update_group(
                body.master_address, body.master_port, body.rank_offset, body.world_size, body.group_name, body.backend
            )
            return "Succeeded to initialize custom process group."

        return await _weight_call(raw, InitGroupBody, call)

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(raw: Request) -> JSONResponse:
        async def call(body: GroupNameBody) -> str:
            await engine().destroy_weights_update_group(body.group_name)
            return "Succeeded to destroy custom process group."

        return await _weight_call(raw, GroupNameBody, call)

    @app.post("/begin_weight_update")
    async def begin_weight_update(raw: Request) -> JSONResponse:
        async def call(body: None) -> str:
            await engine().begin_weight_update()
            return "Success"

        return await _weight_call(raw, None, call)

    @app.post("/end_weight_update")
    async def end_weight_update(raw: Request) -> JSONResponse:
        async def call(body: None) -> str:
            await engine().end_weight_update()
            return "Success"

        return await _weight_call(raw, None, call)

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(raw: Request) -> JSONResponse:
        async def call(body: DistributedUpdateBody) -> str:
            version = int(body.weight_version) if body.weight_version is not None else None
            await engine().update_weights_from_distributed(
                body.names, body.dtypes, body.shapes, body.group_name, version, body.flush_cache
            )
            message = "Succeeded to update parameter online."
            return message + (f" Weight version updated to {version}." if version is not None else "")

        return await _weight_call(raw, DistributedUpdateBody, call)


def _add_control_routes(app: FastAPI, engine: Callable[[], LocalEngine], state: dict[str, Any]) -> None:
    """Cache, health, model info, pause/continue and counters."""

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> PlainTextResponse:
        await engine().flush_cache()
        return PlainTextResponse("Cache flushed.\n")

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("", status_code=200 if await engine().health() else 503)

    @app.get("/health_generate")
    async def health_generate() -> PlainTextResponse:
        """Serving, and the worker thread answers between model steps.

        Unlike SGLang this does not generate a token: a probe request would take an arrival number and so shift
        the seeded sampling of every later request.
        """
        local = engine()
        if not await local.health():
            return PlainTextResponse("engine closed or its scheduler died", status_code=503)
        await local.ping_worker()
        return PlainTextResponse("")

    @app.get("/get_model_info")
    @app.get("/model_info")
    async def model_info() -> dict[str, Any]:
        local = engine()
        return {
            "model_path": state["model_path"],
            "tokenizer_path": state["model_path"],
            "is_generation": True,
            "weight_version": str(local.weight_version),
            "context_length": local.max_context_tokens,
            "vocab_size": local.vocab_size,
            "max_batch_size": local.max_batch_size,
        }

    @app.post("/pause_generation")
    async def pause_generation(raw: Request) -> JSONResponse:
        try:
            body = PauseBody.model_validate(await raw.json())
        except (ValueError, ValidationError) as error:
            return _error(400, f"bad /pause_generation request: {error}")
        # retract and in_place both hold requests with their KV cache here (no memory pressure to free);
        # SGLang's abort mode ends every request, which this engine does not do
        if body.mode == "abort":
            return _error(400, "pause mode 'abort' is not supported by the local engine; use in_place or retract")
        await engine().pause_generation()
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation() -> JSONResponse:
        await engine().continue_generation()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    @app.get("/engine_stats")
    async def engine_stats() -> dict[str, Any]:
        return {**engine().stats(), "paused": engine().paused}


def parse_generate(body: Any) -> GenerateRequest:
    """An SGLang GenerateReqInput body -> GenerateRequest; fields this engine cannot honour are a ValueError."""
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    body = dict(body)
    if body.get("stream"):
        raise ValueError("stream=true is not supported by the local engine")
    for key in GENERATE_ACCEPTED_AS_NO_OPS:
        body.pop(key, None)
    if "input_ids" not in body:
        raise ValueError("input_ids is required (the local engine takes token ids, never text)")
    sampling = dict(body.get("sampling_params") or {})
    for key in SAMPLING_ACCEPTED_AS_NO_OPS:
        sampling.pop(key, None)
    body["sampling_params"] = sampling
    return GenerateRequest.model_validate(body)


def _error(status: int, message: str) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "engine_error"
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def _update_result(success: bool, message: str) -> JSONResponse:
    body = {"success": success, "message": message, "num_paused_requests": 0}
    return JSONResponse(body, status_code=200 if success else 400)


def _exit_with_parent(parent: int, interval_s: float = 1.0) -> None:
    """Exit when `parent` is no longer this process's parent (it died: the server was re-parented)."""
    while os.getppid() == parent:
        time.sleep(interval_s)
    log.warning("the process that launched this engine server (%d) is gone: exiting", parent)
    os._exit(0)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="local Hugging Face model directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--max-context-tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads of the forward passes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--weight-version", type=int, default=0)
    parser.add_argument("--prefix-cache-size", type=int, default=0, help="finished requests kept for reuse by rid")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the model and its KV cache)")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="weights and forward passes")
    parser.add_argument(
        "--weight-sync-timeout-s",
        type=float,
        default=600.0,
        help="joining a weight group, or one bucket's broadcast, may take this long",
    )
    parser.add_argument(
        "--prefill-tokens-per-step", type=int, default=1024, help="most prompt tokens prefilled in one model step"
    )
    parser.add_argument("--backlog", type=int, default=2048, help="listen backlog (pending connections)")
    parser.add_argument("--limit-concurrency", type=int, default=None, help="uvicorn's cap (None: none)")
    parser.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        help="exit once this process is gone (a SIGKILLed stage leaves no engine behind)",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    import uvicorn

    if args.parent_pid is not None:
        threading.Thread(target=_exit_with_parent, args=(args.parent_pid,), daemon=True, name="parent").start()

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    model = str(Path(args.model).resolve())

    def build() -> LocalEngine:
        return LocalEngine(
            model,
            max_batch_size=args.max_batch_size,
            max_context_tokens=args.max_context_tokens,
            seed=args.seed,
            weight_version=args.weight_version,
            intra_op_threads=args.threads,
            prefix_cache_size=args.prefix_cache_size,
            device=args.device,
            dtype=DTYPES[args.dtype],
            weight_sync_timeout_s=args.weight_sync_timeout_s,
            prefill_tokens_per_step=args.prefill_tokens_per_step,
        )

    app = create_app(build, model)
    log.info(
        "local engine server for %s on %s:%d (batch %d, context %d)",
        model,
        args.host,
        args.port,
        args.max_batch_size,
        args.max_context_tokens,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        backlog=args.backlog,
        limit_concurrency=args.limit_concurrency,
        timeout_keep_alive=300,
        loop="asyncio",
    )


if __name__ == "__main__":
    main()
