"""Async client for SGLang's native HTTP API; the local engine server speaks the same subset.

Endpoints: POST /generate (input_ids, sampling_params, return_logprob), POST /update_weights_from_disk,
POST /flush_cache, GET /health_generate, GET /get_model_info, POST /pause_generation, POST /continue_generation.

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

    async def update_weights_from_disk(self, model_path: str, weight_version: int) -> None:
        """POST /update_weights_from_disk; a refusal (bad path, wrong architecture) is a WeightUpdateError."""
        payload = update_weights_payload(model_path, weight_version)

        async def once() -> None:
            try:
                body = await self._request(
                    "POST", "/update_weights_from_disk", payload, self.control_timeout_s
                )
            except InvalidRequestError as error:
                raise WeightUpdateError(f"{self.base_url} refused weights {model_path}: {error}") from error
            if not body.get("success", False):
                raise WeightUpdateError(
                    f"{self.base_url} refused weights {model_path}: {body.get('message')}"
                )

        await self._with_retries(once, self.control_retries)
        self.weight_version = weight_version

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


def update_weights_payload(model_path: str, weight_version: int) -> dict[str, Any]:
    """The JSON body of POST /update_weights_from_disk (fields of SGLang's UpdateWeightFromDiskReqInput)."""
    return {"model_path": model_path, "weight_version": str(weight_version), "flush_cache": True}


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
