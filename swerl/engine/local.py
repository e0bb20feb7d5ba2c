"""The local engine: a Hugging Face causal LM behind the Engine protocol, with continuous batching, on CPU (the
default) or a GPU (`device`).

Concurrent `await engine.generate(request)` calls queue up; one scheduler task admits them (FIFO) into a running
batch of at most `max_batch_size` requests, prefills the newly admitted ones together (one model step), and runs
decode steps for the whole batch. Model work runs on the engine's own worker thread (its torch intra-op thread
count set apart from the rest of the process), so the event loop stays responsive; queues, futures and counters
live on the loop. Call the engine from one event loop. The model must be a Qwen3 (dense or MoE), the family
swerl trains; any other architecture is refused at load.

KV cache (slots.SlotCache): one preallocated slot per batch row, per layer keys and values of (max_batch_size,
H_kv, capacity, D), the capacity doubling on demand up to max_context_tokens. Row i of the running batch
(batching.RunningBatch) lives in slot i; a model step (slots.SlotModel: the Qwen3 forward, dense or MoE, run with
the model's own modules over the slots) writes each new token's keys and values in place at its position, and
attention reads each row's slot up to its own length (decode rows in one call padded to the longest and masked,
or one call per row where padding would cost more). A joining request takes the next free slot; a leaving one's
slot is taken by the last row (that row's KV moves), so nothing else is rebuilt or copied. A prefill step runs
several admitted requests' new tokens through the model at once (up to prefill_tokens_per_step; projections and
MLP over all of them together, attention per row, causal).

Prefix cache (SGLang's radix cache, per trajectory): with `prefix_cache_size` > 0, a finished request's KV cache
is kept under its `rid` (a copy of its slot; least recently used first out); the next request with that rid (an
agent's next turn, whose input starts with the previous input and output) gets the longest common prefix copied
into its slot and prefills only the tokens past it.
Weight updates and flush_cache empty it, as SGLang flushes its cache on a weight update, so a cached prefix was
always computed by the weights now served (it holds finished requests only, so emptying it never conflicts with a
running request: the flush_cache flag of a weight update is accepted and the cache is emptied either way).

Weights arrive from disk (update_weights_from_disk) or over a process group, as SGLang takes them:
init_weights_update_group joins the trainer's group (swerl.engine.weight_sync, one rank), begin_weight_update opens
a session, each update_weights_from_distributed receives one bucket (empty tensors of the requested dtypes and
shapes, broadcast from rank 0) and checks it against the model (names, shapes, tied embeddings); the buckets are
staged and loaded together, between model steps, with the bucket that carries a weight_version (end_weight_update
loads any staged after it). Loading is all-or-nothing: a refused bucket drops the session's staged tensors and
the engine keeps serving its weights and version (SGLang loads bucket by bucket).

Semantics follow SGLang's /generate, so one client drives both:
- log-probs are of the temperature-scaled distribution softmax(logits / T), before top-p filtering; greedy
  (T = 0) reports log_softmax(logits). `return_original_logprob=True` reports the unscaled distribution for
  every request, as SGLANG_RETURN_ORIGINAL_LOGPROB does. See `logprob_temperature`.
- a sampled stop token (stop_token_ids, or the model's end-of-sequence ids unless ignore_eos) ends generation
  with finish_reason "stop" and is part of output_ids; reaching max_new_tokens, or prompt + output reaching
  `max_context_tokens`, gives "length" (checked first, as SGLang does).
- a prompt of `max_context_tokens` tokens or more, or a token id outside the vocabulary, is rejected with an
  InvalidRequestError (HTTP 400 in SGLang). Unlike SGLang, prompt + max_new_tokens above the cap is not
  rejected: generation stops at the cap with "length".
Sampling is seeded: request number k (in arrival order) samples with its own generator seeded from
(seed, k), so its tokens do not depend on what it was batched with. A step samples all its rows at once
(batching.sample_rows: one vectorised op per group of greedy, sampled and top-p rows; each row's exponential noise
drawn from its own generator, which is how torch.multinomial draws one sample, so the tokens are those of
sampling row by row).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from swerl.engine.base import (
    ContextLengthError,
    FinishReason,
    GenerateRequest,
    GenerateResponse,
    InvalidRequestError,
    WeightUpdateError,
)
from swerl.engine.batching import RunningBatch, request_seed, sample_rows
from swerl.engine.servable import engine_device, eos_token_ids, load_servable
from swerl.engine.slots import SlotModel, StepRows
from swerl.engine.weight_sync import (
    GroupBackend,
    TensorSpec,
    WeightGroup,
    WeightGroupError,
    open_group,
    receive_list,
)
from swerl.errors import InfraError

T = TypeVar("T")


@dataclass(eq=False)
class _Request:
    """A request's state from arrival to response; the scheduler alone mutates it."""

    request: GenerateRequest
    number: int  # arrival order, seeds the request's generator
    future: asyncio.Future[GenerateResponse]
    generator: torch.Generator
    stop_ids: frozenset[int]
    limit: int  # max tokens to generate: min(max_new_tokens, context cap - prompt length)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None

    def append(self, token: int, logprob: float, version: int) -> None:
        self.output_ids.append(token)
        self.logprobs.append(logprob)
        self.versions.append(version)
        if len(self.output_ids) >= self.limit:  # length before stop, as SGLang's check_finished
            self.finish_reason = "length"
        elif token in self.stop_ids:
            self.finish_reason = "stop"

    def response(self, current_version: int) -> GenerateResponse:
        """The response; its weight_version is the version that sampled the last token."""
        return GenerateResponse(
            output_ids=list(self.output_ids),
            output_token_logprobs=list(self.logprobs),
            finish_reason=self.finish_reason or "abort",
            weight_version=self.versions[-1] if self.versions else current_version,
            prompt_tokens=len(self.request.input_ids),
            completion_tokens=len(self.output_ids),
            output_token_weight_versions=list(self.versions),
        )


@dataclass(eq=False)
class _WeightSession:
    """A weight-update session: buckets received and checked, waiting to be loaded together."""

    staged: dict[str, torch.Tensor] = field(default_factory=dict)
    failed: str | None = None


class LocalEngine:
    """An in-process inference engine: continuous batching, seeded sampling, weights swapped while serving.

    swerl.engine.factory.open_engine maps EngineConfig (which holds the defaults) onto these arguments.

    Args:
        model_path: a local Hugging Face directory with model and tokenizer.
        max_batch_size: most requests decoded together; more wait in a FIFO queue.
        max_context_tokens: prompt + output cap per request (SGLang's --context-length); at most the model's
            max_position_embeddings.
        prefix_cache_size: most finished requests whose KV cache is kept for reuse by the next request with the
            same rid (0: no prefix cache).
        seed: seeds every request's sampling generator (with its arrival number).
        dtype: model parameter dtype.
        device: where the model and its KV cache live ("cpu", "cuda", "cuda:1"); sampling runs on CPU (the
            requests' seeded generators), a step's logits moved there at once.
        weight_sync_timeout_s: how long joining a weight group, or one bucket's broadcast, may take.
        prefill_tokens_per_step: most prompt tokens prefilled in one model step
            (engine.local.prefill_tokens_per_step).
        return_original_logprob: report log-probs of the unscaled (T = 1) distribution for all requests.
        weight_version: version of the weights loaded from model_path.
        intra_op_threads: torch threads of the engine's worker thread; None keeps torch's default. Small models
            decode fastest with 1 (thread synchronisation costs more than the work, worst on a busy machine).
    """

    DECODE_STEPS_PER_ITERATION = 16
    """Most decode steps per hand-over to the worker thread (bounds how long an arrival waits to be admitted)."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        max_batch_size: int,
        max_context_tokens: int,
        prefix_cache_size: int,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        return_original_logprob: bool = False,
        weight_version: int = 0,
        intra_op_threads: int | None = 1,
        device: str | torch.device = "cpu",
        weight_sync_timeout_s: float = 600.0,
        prefill_tokens_per_step: int = 1024,
    ) -> None:
        """Load the model onto its device and set up the engine's state (the arguments: see the class docstring)."""
        # Over 60 lines: the engine's whole state, one assignment each (15 lines are the signature).
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if prefix_cache_size < 0:
            raise ValueError(f"prefix_cache_size must be >= 0, got {prefix_cache_size}")
        if prefill_tokens_per_step < 1:
            raise ValueError(f"prefill_tokens_per_step must be >= 1, got {prefill_tokens_per_step}")
        self.prefill_tokens_per_step = prefill_tokens_per_step
        self.device = engine_device(device)
        model, tokenizer = load_servable(model_path, dtype, max_context_tokens)
        module: torch.nn.Module = model  # transformers types its own .to() too narrowly for a device
        module.to(self.device)
        self.model: PreTrainedModel = model.eval()
        self.dtype = dtype
        self.max_batch_size = max_batch_size
        self.max_context_tokens = max_context_tokens
        embeddings = model.get_input_embeddings()
        assert isinstance(embeddings, torch.nn.Embedding)
        self.vocab_size = embeddings.num_embeddings
        self.return_original_logprob = return_original_logprob
        self.eos_token_ids = eos_token_ids(model, tokenizer.eos_token_id)
        self.weight_version = weight_version
        self._seed = seed
        self._arrivals = 0
        self._waiting: collections.deque[_Request] = collections.deque()
        self._model_step = SlotModel(model, max_context_tokens)
        self._batch = RunningBatch[_Request](self._model_step.new_cache(max_batch_size))
        self._step_lock = asyncio.Lock()  # held around each iteration and around a weight swap
        self._step_lock_waiters = 0
        self._wakeup = asyncio.Event()
        self._scheduler: asyncio.Task[None] | None = None
        self._closed = False
        self._paused = False
        self._counters: collections.Counter[str] = collections.Counter()
        self._batch_sizes: collections.Counter[int] = collections.Counter()
        self._seconds = {"prefill": 0.0, "decode": 0.0}  # time the worker spent in each
        self.prefix_cache_size = prefix_cache_size
        # rid -> (tokens whose KV is cached, per layer (keys, values) of (H_kv, T, D)); the worker alone uses it
        self._prefixes: collections.OrderedDict[str, tuple[list[int], list[tuple[torch.Tensor, torch.Tensor]]]]
        self._prefixes = collections.OrderedDict()
        self.intra_op_threads = intra_op_threads
        self._worker = _model_thread(intra_op_threads)
        self.weight_sync_timeout_s = weight_sync_timeout_s
        self._groups: dict[str, WeightGroup] = {}
        self._weight_session: _WeightSession | None = None
        self._receive_lock = asyncio.Lock()  # one bucket on the wire at a time

    async def __aenter__(self) -> LocalEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        """Generate for one request; cancelling the caller aborts the request and frees its batch slot.

        Log-probs are always returned (return_logprob is not needed to get them). Raises InvalidRequestError (or
        its ContextLengthError) for a request the engine refuses, InfraError when the engine is closed or a model
        step fails.
        """
        if self._closed:
            raise InfraError("engine_unreachable", "the local engine is closed")
        prompt_length = len(request.input_ids)
        try:
            self._validate(request)
        except InvalidRequestError:
            self._counters["requests_rejected"] += 1
            raise
        self._ensure_scheduler()
        params = request.sampling_params
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_token_ids)
        generator = torch.Generator().manual_seed(request_seed(self._seed, self._arrivals))
        state = _Request(
            request=request,
            number=self._arrivals,
            future=asyncio.get_running_loop().create_future(),
            generator=generator,
            stop_ids=frozenset(stop_ids),
            limit=min(params.max_new_tokens, self.max_context_tokens - prompt_length),
        )
        self._arrivals += 1
        self._counters["requests"] += 1
        self._counters["prompt_tokens"] += prompt_length
        self._waiting.append(state)
        self._wakeup.set()
        return await state.future

    def _validate(self, request: GenerateRequest) -> None:
        prompt_length = len(request.input_ids)
        if prompt_length >= self.max_context_tokens:
            raise ContextLengthError(
                f"the input ({prompt_length} tokens) is longer than the engine's context length "
                f"({self.max_context_tokens} tokens): no room to generate"
            )
        bad = [token for token in request.input_ids if not 0 <= token < self.vocab_size]
        if bad:
            raise InvalidRequestError(f"input_ids hold ids outside the vocabulary [0, {self.vocab_size}): {bad[:8]}")

    def _ensure_scheduler(self) -> None:
        if self._scheduler is None or self._scheduler.done():
            self._scheduler = asyncio.get_running_loop().create_task(self._schedule(), name="local-engine-scheduler")

    async def _schedule(self) -> None:
        """The scheduler task; if it ever dies, every request in flight fails instead of hanging."""
        try:
            await self._schedule_loop()
        except BaseException as error:
            self._fail_all(InfraError("engine_http", f"the local engine's scheduler died: {error!r}"))
            raise

    async def _schedule_loop(self) -> None:
        """Admit waiting requests, run one iteration in the worker thread, resolve finished requests; repeat."""
        while not self._closed:
            if not self._batch and not self._waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            async with self._step_lock:
                self._drop_aborted()
                admitted: list[_Request] = []
                while self._waiting and len(self._batch) + len(admitted) < self.max_batch_size:
                    admitted.append(self._waiting.popleft())
                if not self._batch and not admitted:
                    continue
                finished, error = await self._in_worker(self._iterate, admitted, self.weight_version)
                if error is not None:  # fail the requests the step left unfinished, keep serving new ones
                    unfinished = dict.fromkeys(self._batch.rows + admitted).keys() - set(finished)
                    self._batch.clear()
                    cause = InfraError("engine_http", f"local engine step failed: {error!r}")
                    for state in unfinished:
                        if not state.future.done():
                            state.future.set_exception(cause)
                            self._counters["requests_failed"] += 1
            for state in finished:
                if not state.future.done():
                    state.future.set_result(state.response(self.weight_version))
                    self._counters["requests_completed"] += 1

    async def _in_worker(self, function: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._worker, function, *args)

    def _drop_aborted(self) -> None:
        aborted = [state for state in self._waiting if state.future.cancelled()]
        for state in aborted:
            self._waiting.remove(state)
        keep = [not state.future.cancelled() for state in self._batch.rows]
        self._batch.keep(keep)
        self._counters["requests_aborted"] += len(aborted) + keep.count(False)

    @torch.inference_mode()
    def _iterate(self, admitted: list[_Request], version: int) -> tuple[list[_Request], Exception | None]:
        """One scheduler iteration in the worker thread: prefill the admitted, then decode the running batch.

        Decoding goes on for up to DECODE_STEPS_PER_ITERATION steps while nothing needs the event loop (no request
        finished, was cancelled or can be admitted, no weight update or close is waiting): each hand-over between
        loop and worker costs as much as a small model's step on a busy 2-core machine.
        """
        finished: list[_Request] = []
        try:
            if admitted:
                self._prefill(admitted, version)
                finished += self._retire()
            for _ in range(self.DECODE_STEPS_PER_ITERATION):
                if finished or not self._batch or self._loop_needed():
                    break
                self._decode(version)
                finished += self._retire()
        except Exception as error:  # returned, not raised: the requests finished so far still get answers
            return finished, error
        return finished, None

    def _loop_needed(self) -> bool:
        """Whether the scheduler should return to the event loop (read from the worker; each read is atomic)."""
        return (
            self._closed
            or self._step_lock_waiters > 0
            or (bool(self._waiting) and len(self._batch) < self.max_batch_size)
            or any(row.future.cancelled() for row in self._batch.rows)
        )

    def _prefill(self, admitted: list[_Request], version: int) -> None:
        """Give the admitted requests the batch's next slots, fill each slot from the prefix cache where its rid
        has one, then prefill the requests' remaining tokens, several requests per model step (up to
        prefill_tokens_per_step tokens), and sample each one's first token."""
        started = time.perf_counter()
        first = self._batch.add(admitted)
        starts = []
        for offset, state in enumerate(admitted):
            input_ids = state.request.input_ids
            reused = self._reuse_prefix(state.request.rid, input_ids, first + offset)
            starts.append(reused)
            self._counters["prefill_tokens"] += len(input_ids) - reused
            self._counters["prefix_cached_tokens"] += reused
        counts = [len(state.request.input_ids) - start for state, start in zip(admitted, starts, strict=True)]
        group: list[int] = []  # indices into admitted, prefilled in one step
        for index in range(len(admitted)):
            group.append(index)
            fed = sum(counts[i] for i in group)
            if index + 1 < len(admitted) and fed + counts[index + 1] <= self.prefill_tokens_per_step:
                continue
            rows = StepRows(
                tokens=[token for i in group for token in admitted[i].request.input_ids[starts[i] :]],
                starts=[starts[i] for i in group],
                counts=[counts[i] for i in group],
                first=first + group[0],
            )
            logits = self._model_step.step(self._batch.cache, rows)
            self._sample([admitted[i] for i in group], logits, version)
            group = []
        self._seconds["prefill"] += time.perf_counter() - started

    def _reuse_prefix(self, rid: str | None, input_ids: list[int], slot: int) -> int:
        """Fill `slot` with the cached KV of rid's longest common prefix with input_ids (at least one input token
        is left to prefill, for its logits); returns how many tokens it covers."""
        entry = self._prefixes.pop(rid, None) if rid is not None else None
        if entry is None:
            return 0
        tokens, layers = entry
        limit = min(len(tokens), len(input_ids) - 1)
        common = 0
        while common < limit and tokens[common] == input_ids[common]:
            common += 1
        if common:
            self._batch.cache.load(slot, layers, common)
        return common

    def _retire(self) -> list[_Request]:
        """Take the finished rows out of the batch, keeping each one's KV under its rid (prefix cache)."""
        rows = self._batch.rows
        done = [row.finish_reason is not None for row in rows]
        if not any(done):
            return []
        finished = [row for row, is_done in zip(rows, done, strict=True) if is_done]
        for slot, is_done in enumerate(done):
            if is_done:
                self._store_prefix(rows[slot], slot)
        self._batch.keep([not is_done for is_done in done])
        return finished

    def _store_prefix(self, state: _Request, slot: int) -> None:
        """Keep a finished request's KV (prompt and every output token but the last, which was never fed)."""
        rid = state.request.rid
        if self.prefix_cache_size == 0 or rid is None:
            return
        tokens = list(state.request.input_ids) + state.output_ids[:-1]
        assert self._batch.cache.lengths[slot] == len(tokens), "a slot holds its row's fed tokens"
        self._prefixes[rid] = (tokens, self._batch.cache.extract(slot, len(tokens)))
        self._prefixes.move_to_end(rid)
        while len(self._prefixes) > self.prefix_cache_size:
            self._prefixes.popitem(last=False)

    def _decode(self, version: int) -> None:
        """One decode step: every row feeds its last sampled token (written in place into its slot)."""
        started = time.perf_counter()
        rows = self._batch.rows
        count = len(rows)
        step = StepRows(
            tokens=[row.output_ids[-1] for row in rows],
            starts=self._batch.cache.lengths[:count],
            counts=[1] * count,
        )
        logits = self._model_step.step(self._batch.cache, step)
        self._sample(rows, logits, version)
        self._batch_sizes[count] += 1
        self._counters["decode_steps"] += 1
        self._counters["decode_tokens"] += count
        self._seconds["decode"] += time.perf_counter() - started

    def _sample(self, states: list[_Request], logits: torch.Tensor, version: int) -> None:
        """Sample every row of logits (one per state) at once, each with its request's generator (on CPU)."""
        params = [state.request.sampling_params for state in states]
        tokens, logprobs = sample_rows(
            logits.cpu(),
            [p.temperature for p in params],
            [p.top_p for p in params],
            [state.generator for state in states],
            self.return_original_logprob,
        )
        for state, token, logprob in zip(states, tokens, logprobs, strict=True):
            state.append(token, logprob, version)
        self._counters["generated_tokens"] += len(states)

    async def update_weights_from_disk(self, model_path: str, weight_version: int) -> None:
        """Load same-architecture weights from a local Hugging Face directory and serve them as weight_version.

        Reading happens while generation continues; the swap waits for the decode step in flight and happens
        between steps. Requests in flight keep their KV cache and continue under the new weights; each response's
        output_token_weight_versions says which version sampled each token. On any error the engine keeps its
        current weights and version and raises WeightUpdateError.
        """
        if self._closed:
            raise InfraError("engine_unreachable", "the local engine is closed")
        state_dict = await asyncio.to_thread(self._read_weights, Path(model_path))
        await self._between_steps(functools.partial(self._swap_weights, state_dict, True), weight_version)

    async def _between_steps(self, swap: Callable[[], None], weight_version: int | None) -> None:
        """Run swap on the worker between model steps, then serve weight_version (None: keep the version)."""
        if self._paused:  # the pause holds the step lock: no step is running, swap now
            await self._in_worker(swap)
        else:
            self._step_lock_waiters += 1  # asks the worker to end its iteration after the step in flight
            try:
                async with self._step_lock:
                    await self._in_worker(swap)
            finally:
                self._step_lock_waiters -= 1
        if weight_version is not None:
            self.weight_version = weight_version
            self._counters["weight_updates"] += 1

    async def pause_generation(self) -> None:
        """Stop scheduling after the step in flight (SGLang's in_place pause): requests keep their KV cache and
        wait, new ones queue; weight updates still work. Idempotent."""
        if self._paused:
            return
        self._step_lock_waiters += 1
        try:
            await self._step_lock.acquire()
        finally:
            self._step_lock_waiters -= 1
        self._paused = True

    async def continue_generation(self) -> None:
        """Resume scheduling after pause_generation. Idempotent."""
        if not self._paused:
            return
        self._paused = False
        self._step_lock.release()

    @property
    def paused(self) -> bool:
        return self._paused

    async def ping_worker(self) -> None:
        """Return once the worker thread has run a no-op (after the model step it is busy with, if any)."""
        await self._in_worker(lambda: None)

    def _read_weights(self, path: Path) -> dict[str, torch.Tensor]:
        if not (path / "config.json").is_file():
            raise WeightUpdateError(f"{path} is not a local Hugging Face model directory (no config.json)")
        try:
            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=self.dtype)
        except Exception as error:
            raise WeightUpdateError(f"cannot load weights from {path}: {error}") from error
        current = self.model.state_dict()
        new = model.state_dict()
        mismatched = sorted(
            name for name in current.keys() | new.keys() if name not in current or name not in new
        ) + sorted(name for name in current.keys() & new.keys() if current[name].shape != new[name].shape)
        mismatched += [  # same shapes, different wiring: tied embeddings would be overwritten by lm_head
            f"config.{key}"
            for key in ("model_type", "tie_word_embeddings")
            if getattr(model.config, key, None) != getattr(self.model.config, key, None)
        ]
        if mismatched:
            raise WeightUpdateError(f"weights in {path} do not fit the served architecture: {mismatched[:8]}")
        return new

    @torch.no_grad()
    def _swap_weights(self, state_dict: dict[str, torch.Tensor], strict: bool) -> None:
        """Load (by name; a subset where not strict) and empty the prefix cache, computed by the old weights."""
        self.model.load_state_dict(state_dict, strict=strict)
        self._prefixes.clear()

    async def weight_group_ranks(self) -> int:
        """One rank: the whole model receives every tensor."""
        return 1

    async def init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
    ) -> None:
        """Join the trainer's weight group as rank rank_offset (returns once every rank joined); a group of the
        same name is replaced. WeightUpdateError when the group does not form."""
        if self._closed:
            raise InfraError("engine_unreachable", "the local engine is closed")
        if backend not in ("gloo", "nccl"):
            raise WeightUpdateError(f"weight group backend must be gloo or nccl, got {backend!r}")
        kind: GroupBackend = "gloo" if backend == "gloo" else "nccl"
        old = self._groups.pop(group_name, None)
        if old is not None:
            old.close()
        try:
            group = await asyncio.to_thread(
                open_group,
                master_address,
                master_port,
                rank_offset,
                world_size,
                kind,
                self.weight_sync_timeout_s,
                self.device,
                group_name=group_name,
            )
        except (WeightGroupError, ValueError) as error:
            raise WeightUpdateError(f"Failed to initialize custom process group: {error}") from error
        self._groups[group_name] = group

    async def destroy_weights_update_group(self, group_name: str) -> None:
        group = self._groups.pop(group_name, None)
        if group is None:
            raise WeightUpdateError("The group to be destroyed does not exist.")
        group.close()

    async def begin_weight_update(self) -> None:
        if self._weight_session is not None:
            raise WeightUpdateError("a weight-update session is already open; call end_weight_update() first")
        self._weight_session = _WeightSession()

    async def end_weight_update(self) -> None:
        """Close the session; buckets staged after the last one with a weight_version load now (same version)."""
        session = self._weight_session
        if session is None:
            raise WeightUpdateError("no weight-update session is open; call begin_weight_update() first")
        self._weight_session = None
        if session.staged and session.failed is None and not self._closed:
            await self._between_steps(functools.partial(self._swap_weights, session.staged, False), None)

    async def update_weights_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str,
        weight_version: int | None = None,
        flush_cache: bool = True,
    ) -> None:
        """Receive one bucket from rank 0 and stage it; with a weight_version, load every staged bucket (between
        model steps) and serve that version. Raises WeightUpdateError (weights and version unchanged) for a bucket
        that does not fit the model; it is still received, so the group stays in step."""
        if self._closed:
            raise InfraError("engine_unreachable", "the local engine is closed")
        group = self._groups.get(group_name)
        if group is None:
            raise WeightUpdateError(
                f"Group {group_name} not in {sorted(self._groups)}. Please call `init_weights_update_group` first."
            )
        session = self._weight_session
        if session is None:
            raise WeightUpdateError(
                "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()"
            )
        try:
            if not len(names) == len(dtypes) == len(shapes):
                raise ValueError(f"{len(names)} names, {len(dtypes)} dtypes, {len(shapes)} shapes")
            specs = [
                TensorSpec(name, dtype, tuple(shape)) for name, dtype, shape in zip(names, dtypes, shapes, strict=True)
            ]
        except (ValueError, TypeError) as error:  # nothing can be received: the sender will time out
            session.failed = f"bad request: {error}"
            raise WeightUpdateError(f"Failed to receive weights: {error}") from error
        async with self._receive_lock:
            try:
                tensors = await asyncio.to_thread(receive_list, group, specs, self.device)
            except WeightGroupError as error:
                session.failed = str(error)
                self._groups.pop(group_name, None)
                group.close()
                raise WeightUpdateError(f"Failed to receive weights: {error}") from error
        if session.failed is not None:
            raise WeightUpdateError(f"an earlier bucket of this update was refused ({session.failed}): not loaded")
        problems = self._misfits(specs, tensors, session.staged)
        if problems:
            session.failed = problems[0]
            session.staged.clear()
            raise WeightUpdateError(
                f"the weights do not fit the served model, nothing of this update is loaded: {problems[:8]}"
            )
        session.staged.update(zip(names, tensors, strict=True))
        self._counters["weight_sync_bytes"] += sum(t.numel() * t.element_size() for t in tensors)
        if weight_version is not None:
            staged, session.staged = session.staged, {}
            await self._between_steps(functools.partial(self._swap_weights, staged, False), weight_version)

    def _misfits(
        self, specs: list[TensorSpec], tensors: list[torch.Tensor], staged: dict[str, torch.Tensor]
    ) -> list[str]:
        """Why a received bucket cannot load: unknown names, shapes unlike the model's, a name twice, or tied
        weights (one tensor under two names, e.g. embed_tokens and lm_head) given two different values."""
        current = self.model.state_dict()
        problems: list[str] = []
        names = [spec.name for spec in specs]
        problems += [f"{name}: sent twice" for name in sorted({n for n in names if names.count(n) > 1})]
        for spec in specs:
            if spec.name not in current:
                problems.append(f"{spec.name}: no such weight in the model")
            elif tuple(current[spec.name].shape) != spec.shape:
                problems.append(
                    f"{spec.name}: shape {list(spec.shape)} != the model's {list(current[spec.name].shape)}"
                )
        if problems:
            return problems
        incoming = {**staged, **dict(zip(names, tensors, strict=True))}
        by_storage: dict[int, list[str]] = {}
        for name, tensor in current.items():
            by_storage.setdefault(tensor.data_ptr(), []).append(name)
        for aliases in by_storage.values():
            given = [name for name in aliases if name in incoming]
            for name in given[1:]:
                if not torch.equal(incoming[given[0]].to(incoming[name].dtype), incoming[name]):
                    problems.append(f"{given[0]} and {name} are one tied tensor in the model but differ")
        return problems

    async def flush_cache(self) -> bool:
        """SGLang's /flush_cache: empty the prefix cache (between model steps)."""
        if self._closed:
            return True
        await self._in_worker(self._prefixes.clear)
        return True

    async def health(self) -> bool:
        """Serving: not closed and the scheduler (if started) has not died."""
        if self._closed:
            return False
        return self._scheduler is None or not self._scheduler.done()

    def stats(self) -> dict[str, Any]:
        """Counters for metrics: requests, tokens, decode steps, batch-size histogram, queue state."""
        return {
            **{
                name: self._counters[name]
                for name in (
                    "requests",
                    "requests_completed",
                    "requests_rejected",
                    "requests_aborted",
                    "requests_failed",
                    "prompt_tokens",
                    "prefill_tokens",
                    "generated_tokens",
                    "decode_steps",
                    "decode_tokens",
                    "prefix_cached_tokens",
                    "weight_updates",
                    "weight_sync_bytes",
                )
            },
            "prefill_seconds": self._seconds["prefill"],
            "decode_seconds": self._seconds["decode"],
            "batch_size_histogram": dict(sorted(dict(self._batch_sizes).items())),  # copy: the worker writes it
            "running": len(self._batch),
            "waiting": len(self._waiting),
            "weight_version": self.weight_version,
            "max_batch_size": self.max_batch_size,
            "max_context_tokens": self.max_context_tokens,
        }

    async def close(self) -> None:
        """Stop the scheduler after the step in flight; requests still waiting or running fail with InfraError."""
        self._closed = True
        await self.continue_generation()  # a paused scheduler would never see the close
        self._wakeup.set()
        if self._scheduler is not None:
            # Not cancel(): a cancelled await would leave the worker thread mutating the batch.
            await asyncio.gather(self._scheduler, return_exceptions=True)
        self._fail_all(InfraError("engine_unreachable", "the local engine was closed"))
        self._worker.shutdown(wait=False)  # idle now: the scheduler has stopped
        for group in self._groups.values():
            group.close()
        self._groups.clear()

    def _fail_all(self, error: InfraError) -> None:
        for state in [*self._waiting, *self._batch.rows]:
            if not state.future.done():
                state.future.set_exception(error)
                self._counters["requests_failed"] += 1
        self._waiting.clear()
        self._batch.clear()


def _model_thread(intra_op_threads: int | None) -> ThreadPoolExecutor:
    """The one worker thread that runs every forward pass, so model steps never overlap; torch's thread count is
    per thread under OpenMP, so setting it there leaves the rest of the process alone."""
    return ThreadPoolExecutor(
        max_workers=1,
        thread_name_prefix="local-engine",
        initializer=functools.partial(torch.set_num_threads, intra_op_threads) if intra_op_threads else None,
    )
