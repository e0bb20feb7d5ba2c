"""Async client for SGLang's native HTTP API; the local engine server speaks the same subset.

Endpoints: POST /generate (input_ids, sampling_params, return_logprob), POST /update_weights_from_disk,
POST /flush_cache, GET /health_generate, GET /get_model_info, POST /pause_generation, POST /continue_generation;
weight sync over a process group: POST /init_weights_update_group, /destroy_weights_update_group,
/begin_weight_update, /update_weights_from_distributed, /end_weight_update (never retried: a repeated join or
receive would put the group out of step).

Failure mapping (the failure rule): a timeout is InfraError(engine_timeout), an HTTP 5xx is
InfraError(engine_http), a refused or dropped connection is InfraError(engine_unreachable); an HTTP 4xx is the
caller's fault: InvalidRequestError (ContextLengthError for a prompt past the context length) or, for a weight
update, WeightUpdateError. InfraErrors are retried `retries` times with exponential backoff; 4xx never.

The connection pool is sized by the caller (`pool_size`, from the configured concurrency): aiohttp's default of
100 connections is exactly the hidden cap that held the recipe's agents back.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

import aiohttp

from swerl.engine.base import (
    ContextLengthError,
    GenerateRequest,
    GenerateResponse,
    InvalidRequestError,
    WeightUpdateError,
)
from swerl.errors import InfraError

T = TypeVar("T")
PauseMode = Literal["abort", "retract", "in_place"]


class EngineClient:
    """One engine server behind the Engine protocol, over a keep-alive connection pool of `pool_size`.

    swerl.engine.factory.open_engine maps EngineConfig (which holds the defaults) onto these arguments.

    Args:
        base_url: http://HOST:PORT of an SGLang server (or swerl's local engine server).
        pool_size: most open connections (each in-flight request holds one); size it from the concurrency.
        connect_timeout_s: time to open a connection.
        request_timeout_s: wall clock of one /generate call (connection wait included).
        control_timeout_s: wall clock of a weight update, pause, continue or cache flush.
        health_timeout_s: wall clock of a /health_generate probe.
        retries: times a /generate that failed with an InfraError is retried here (0: never; the router retries
            on another engine instead).
        control_retries: the same for weight updates, pause, continue and model info (None: `retries`).
        retry_backoff_s: first wait before a retry; doubled after each.
        weight_version: the version the server serves now (used where a response does not report one).
        tp_size: ranks the server puts in a weight group (SGLang: its tensor-parallel size).
    """

    def __init__(
        self,
        base_url: str,
        *,
        pool_size: int,
        connect_timeout_s: float,
        request_timeout_s: float,
        control_timeout_s: float,
        health_timeout_s: float,
        retries: int,
        control_retries: int | None = None,
        retry_backoff_s: float,
        weight_version: int = 0,
        tp_size: int = 1,
    ) -> None:
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}")
        self.base_url = base_url.rstrip("/")
        self.pool_size = pool_size
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.control_timeout_s = control_timeout_s
        self.health_timeout_s = health_timeout_s
        self.retries = retries
        self.control_retries = retries if control_retries is None else control_retries
        self.retry_backoff_s = retry_backoff_s
        self.weight_version = weight_version
        self.tp_size = tp_size
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"EngineClient({self.base_url!r}, pool_size={self.pool_size})"

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _client(self) -> aiohttp.ClientSession:
        """The session, made on first use inside the running event loop (aiohttp binds it to that loop)."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.pool_size,  # never aiohttp's default (100)
                limit_per_host=self.pool_size,
                ttl_dns_cache=None,
                enable_cleanup_closed=True,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s),
                json_serialize=_dumps,
                raise_for_status=False,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        """POST /generate with token ids; the response's weight_version is the server's (or the known one)."""
        payload = generate_payload(request)

        async def once() -> GenerateResponse:
            body = await self._request("POST", "/generate", payload, self.request_timeout_s)
            return GenerateResponse.from_sglang(body, self.weight_version)

        return await self._with_retries(once, self.retries)

    async def update_weights_from_disk(self, model_path: str, weight_version: int, *, flush_cache: bool = True) -> None:
        """POST /update_weights_from_disk; a refusal (bad path, wrong architecture) is a WeightUpdateError.

        flush_cache: SGLang refuses the update (HTTP 400, after loading) when it cannot flush because requests
        hold KV cache, as under pause mode in_place (the router chooses it: router.flush_cache_allowed).
        """
        payload = update_weights_payload(model_path, weight_version, flush_cache=flush_cache)
        await self._with_retries(
            lambda: self._control("/update_weights_from_disk", payload, f"weights {model_path}"),
            self.control_retries,
        )
        self.weight_version = weight_version

    async def weight_group_ranks(self) -> int:
        return self.tp_size

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
    ) -> None:
        """POST /init_weights_update_group: the server joins the group (answers once every rank joined)."""
        payload = init_weights_update_group_payload(
            master_address, master_port, rank_offset, world_size, group_name, backend
        )
        await self._control("/init_weights_update_group", payload, f"weight group {group_name!r}")

    async def destroy_weights_update_group(self, group_name: str) -> None:
        """POST /destroy_weights_update_group (SGLang refuses a second init under a name until then)."""
        payload = {"group_name": group_name}
        await self._control("/destroy_weights_update_group", payload, f"weight group {group_name!r}")

    async def begin_weight_update(self) -> None:
        await self._control("/begin_weight_update", {}, "a weight-update session")

    async def end_weight_update(self) -> None:
        await self._control("/end_weight_update", {}, "the end of a weight-update session")

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str,
        weight_version: int | None = None,
        flush_cache: bool = True,
    ) -> None:
        """POST /update_weights_from_distributed: the server receives the bucket from rank 0 and loads it."""
        payload = update_weights_from_distributed_payload(
            names, dtypes, shapes, group_name, weight_version, flush_cache=flush_cache
        )
        await self._control("/update_weights_from_distributed", payload, f"{len(names)} tensors")
        if weight_version is not None:
            self.weight_version = weight_version

    async def _control(self, path: str, payload: dict[str, Any], what: str) -> dict[str, Any]:
        """A weight-control POST answered {"success", "message"}; a 4xx or success false is a WeightUpdateError."""
        try:
            body = await self._request("POST", path, payload, self.control_timeout_s)
        except InvalidRequestError as error:
            raise WeightUpdateError(f"{self.base_url}{path} refused {what}: {error}") from error
        if not body.get("success", False):
            raise WeightUpdateError(f"{self.base_url}{path} refused {what}: {body.get('message')}")
        return body

    async def flush_cache(self) -> bool:
        """POST /flush_cache; False when the server refuses (SGLang does while requests are running)."""
        try:
            await self._request("POST", "/flush_cache", None, self.control_timeout_s)
        except InvalidRequestError:
            return False
        return True

    async def pause_generation(self, mode: PauseMode = "in_place") -> None:
        """POST /pause_generation: in_place keeps running requests (and their KV cache) until continue."""
        await self._with_retries(
            lambda: self._request("POST", "/pause_generation", {"mode": mode}, self.control_timeout_s),
            self.control_retries,
        )

    async def continue_generation(self) -> None:
        await self._with_retries(
            lambda: self._request("POST", "/continue_generation", {}, self.control_timeout_s),
            self.control_retries,
        )

    async def model_info(self) -> dict[str, Any]:
        """GET /get_model_info: model_path, weight_version (a string), and whatever else the server reports."""
        return await self._with_retries(
            lambda: self._request("GET", "/get_model_info", None, self.control_timeout_s),
            self.control_retries,
        )

    async def health(self) -> bool:
        """GET /health_generate (the server generates one token); never raises."""
        try:
            await self._request("GET", "/health_generate", None, self.health_timeout_s)
        except (InfraError, InvalidRequestError):
            return False
        return True

    async def _with_retries(self, call: Callable[[], Awaitable[T]], retries: int) -> T:
        delay = self.retry_backoff_s
        for attempt in range(retries + 1):
            try:
                return await call()
            except InfraError:
                if attempt == retries:
                    raise
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    async def _request(
        self, method: str, path: str, payload: dict[str, Any] | None, timeout_s: float
    ) -> dict[str, Any]:
        """One HTTP call mapped onto the failure rule; returns the JSON body ({} for a non-JSON 2xx body)."""
        url = self.base_url + path
        try:
            async with self._client().request(
                method, url, json=payload, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as response:
                text = await response.text()
                status = response.status
        except (TimeoutError, aiohttp.ServerTimeoutError) as error:
            raise InfraError("engine_timeout", f"{method} {url}: no answer in {timeout_s} s") from error
        except aiohttp.ClientError as error:  # refused, reset, dropped mid-response
            raise InfraError("engine_unreachable", f"{method} {url}: {error!r}") from error
        if status >= 500:
            raise InfraError("engine_http", f"{method} {url}: HTTP {status}: {text[:500]}")
        if status >= 400:
            message = _error_message(text)
            if status == 400 and "context length" in message.lower():
                raise ContextLengthError(f"{url}: {message}")
            raise InvalidRequestError(f"{method} {url}: HTTP {status}: {message}")
        try:
            body = json.loads(text) if text else {}
        except json.JSONDecodeError:
            return {}
        return body if isinstance(body, dict) else {"body": body}


def generate_payload(request: GenerateRequest) -> dict[str, Any]:
    """The JSON body of POST /generate (fields of SGLang's GenerateReqInput; checked by the contract test)."""
    params = request.sampling_params
    sampling: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "ignore_eos": params.ignore_eos,
        # token ids out, never text: the client must not re-tokenize, so the server need not detokenize
        "skip_special_tokens": False,
        "no_stop_trim": True,  # a sampled stop token stays in output_ids (it was sampled: it has a log-prob)
    }
    if params.stop_token_ids:
        sampling["stop_token_ids"] = list(params.stop_token_ids)
    payload: dict[str, Any] = {
        "input_ids": request.input_ids,
        "sampling_params": sampling,
        "return_logprob": request.return_logprob,
        "stream": False,
    }
    if request.rid is not None:
        payload["rid"] = request.rid
    return payload


def update_weights_payload(model_path: str, weight_version: int, *, flush_cache: bool) -> dict[str, Any]:
    """The JSON body of POST /update_weights_from_disk (fields of SGLang's UpdateWeightFromDiskReqInput)."""
    return {"model_path": model_path, "weight_version": str(weight_version), "flush_cache": flush_cache}


def init_weights_update_group_payload(
    master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str, backend: str
) -> dict[str, Any]:
    """The JSON body of POST /init_weights_update_group (SGLang's InitWeightsUpdateGroupReqInput)."""
    return {
        "master_address": master_address,
        "master_port": master_port,
        "rank_offset": rank_offset,
        "world_size": world_size,
        "group_name": group_name,
        "backend": backend,
    }


def update_weights_from_distributed_payload(
    names: list[str],
    dtypes: list[str],
    shapes: list[list[int]],
    group_name: str,
    weight_version: int | None,
    *,
    flush_cache: bool,
) -> dict[str, Any]:
    """The JSON body of POST /update_weights_from_distributed (SGLang's UpdateWeightsFromDistributedReqInput);
    weight_version is sent only where given (SGLang's version moves only with it)."""
    if not len(names) == len(dtypes) == len(shapes):
        raise ValueError(f"names, dtypes and shapes differ in length: {len(names)}, {len(dtypes)}, {len(shapes)}")
    payload: dict[str, Any] = {
        "names": list(names),
        "dtypes": list(dtypes),
        "shapes": [[int(size) for size in shape] for shape in shapes],
        "group_name": group_name,
        "flush_cache": flush_cache,
    }
    if weight_version is not None:
        payload["weight_version"] = str(weight_version)
    return payload


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _error_message(text: str) -> str:
    """SGLang's error bodies: {"error": {"message": ...}}, {"error": "..."}, {"message": ...} or plain text."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return text[:500]
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            return str(error.get("message") or error.get("detail") or error)
        return str(error)
    return text[:500]
