"""Weight sync over a process group, SGLang's way: the trainer (rank 0) broadcasts tensors to every engine rank.

Both sides use this module: the trainer calls `open_group` (rank 0) and `send_buckets` / `send_tensors`; an engine
(swerl's local engine; SGLang does the same in its own code) calls `open_group` (rank >= 1) and `receive_tensors`.
The engine side of one sync is `update_engine_from_distributed` (begin, one update_weights_from_distributed request
per bucket, end, through the Engine protocol); `sync_weights` runs both sides from one process.

The group never touches torch.distributed's default group (a trainer rank already has one for FSDP): it is built
from public classes, a TCPStore (rank 0 serves it) and one ProcessGroupGloo / ProcessGroupNCCL, under the store
prefixes SGLang's `init_custom_process_group` gets from torch (`group_name`, then `group_name/`, then the first
device the backend serves: `cpu/` for gloo, which torch also uses for CUDA tensors, `cuda/` for nccl), so a real
SGLang server and this module's rank 0 meet in one group (tests/engine/test_weight_sync.py forms one with torch's own
helper on the other side).

Wire semantics (SGLang's receive_weights_from_distributed): per bucket, the engine allocates empty tensors of the
requested dtypes and shapes and each is broadcast from rank 0, in request order. Nothing on the wire checks that
the sender's tensors have the requested shapes (gloo silently fills a larger buffer), so `send_buckets` checks the
tensors against the specs before sending anything.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist

from swerl.engine.base import Engine, WeightUpdateError

GroupBackend = Literal["gloo", "nccl"]

BACKEND_DEVICES: dict[str, tuple[str, ...]] = {"gloo": ("cpu", "cuda"), "nccl": ("cuda",)}
"""The devices torch gives a backend of each name (distributed_c10d.BackendConfig), in its order. One backend
instance serves them all (torch registers a single backend when every device maps to the same one), formed under
the first device's prefix: both sides must use the same, or each waits for the other's keys."""


class WeightGroupError(RuntimeError):
    """The weight group could not be formed, or a broadcast on it failed."""


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of an update request, as SGLang's UpdateWeightsFromDistributedReqInput lists it."""

    name: str
    dtype: str
    """torch's name of the dtype, as SGLang takes it: "bfloat16", "float32", ..."""
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        torch_dtype(self.dtype)  # refuses an unknown name early
        if any(size < 0 for size in self.shape):
            raise ValueError(f"{self.name}: negative size in shape {list(self.shape)}")

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> TensorSpec:
        return cls(name, dtype_name(tensor.dtype), tuple(tensor.shape))

    @property
    def numel(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count

    @property
    def nbytes(self) -> int:
        return self.numel * torch_dtype(self.dtype).itemsize


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype SGLang's getattr(torch, name) finds, refusing anything that is not a dtype."""
    dtype = getattr(torch, name, None) if name and not name.startswith("_") else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} (torch's names: bfloat16, float16, float32, ...)")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bfloat16" (the name SGLang's request carries)."""
    return str(dtype).removeprefix("torch.")


def plan_buckets(specs: Sequence[TensorSpec], bucket_bytes: int) -> list[list[TensorSpec]]:
    """Split specs, in order, into buckets of at most bucket_bytes each (one update request per bucket).

    Greedy and deterministic: a bucket takes the next tensor while it fits; a tensor larger than a bucket gets a
    bucket of its own. Concatenating the buckets gives the specs back.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    buckets: list[list[TensorSpec]] = []
    current: list[TensorSpec] = []
    size = 0
    for spec in specs:
        if current and size + spec.nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(spec)
        size += spec.nbytes
    if current:
        buckets.append(current)
    return buckets


@dataclass(eq=False)
class WeightGroup:
    """One member's handle on a weight group: its rank and its backend instance."""

    name: str
    rank: int
    world_size: int
    backend: GroupBackend
    device: torch.device
    """Where this member's tensors live (nccl: its CUDA device)."""
    master_addr: str
    master_port: int
    timeout_s: float
    store: dist.Store
    instance: Any = None
    """The ProcessGroupGloo / ProcessGroupNCCL."""
    closed: threading.Event = field(default_factory=threading.Event)

    def where(self) -> str:
        return (
            f"weight group {self.name!r} at {self.master_addr}:{self.master_port} "
            f"(rank {self.rank} of {self.world_size}, {self.backend})"
        )

    def close(self) -> None:
        """Drop the group: a broadcast this member is waiting on (in any thread) fails within a second instead of
        waiting out timeout_s. Gloo cannot cancel the operation itself, so the group is unusable afterwards."""
        self.closed.set()


def open_group(
    master_addr: str,
    master_port: int,
    rank: int,
    world_size: int,
    backend: GroupBackend,
    timeout_s: float,
    device: str | torch.device = "cpu",
    *,
    group_name: str = "weight_update_group",
    socket_ifname: str | None = None,
    on_port: Callable[[int], None] | None = None,
) -> WeightGroup:
    """Join (rank >= 1) or host (rank 0) a weight group; returns once all world_size ranks have joined.

    Rank 0 serves the rendezvous store on master_port; 0 picks a free port, which `on_port` is told before the
    group forms (hand it to the engines). device: where this member's tensors live (gloo carries CPU and CUDA
    tensors alike; nccl needs this rank's CUDA device, made current here). socket_ifname sets GLOO_SOCKET_IFNAME
    and NCCL_SOCKET_IFNAME for this process (both sides: the engines get it from their launcher). Raises
    WeightGroupError naming the address, port, rank and world size when the group does not form within timeout_s.
    """
    where_device = _member_device(master_port, rank, world_size, backend, device)
    if backend == "nccl" and where_device.index is not None:
        torch.cuda.set_device(where_device)
    if socket_ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = socket_ifname
        os.environ["NCCL_SOCKET_IFNAME"] = socket_ifname
    timeout = datetime.timedelta(seconds=timeout_s)
    where = f"weight group {group_name!r} at {master_addr}:{master_port} (rank {rank} of {world_size}, {backend})"
    try:
        store = dist.TCPStore(master_addr, master_port, world_size, rank == 0, timeout=timeout, wait_for_workers=False)
    except Exception as error:
        raise WeightGroupError(f"{where}: no rendezvous store within {timeout_s:g} s: {error}") from error
    port = int(store.port) if rank == 0 else master_port
    if on_port is not None:
        on_port(port)
    group = WeightGroup(group_name, rank, world_size, backend, where_device, master_addr, port, timeout_s, store)
    # SGLang's init_custom_process_group: PrefixStore(group_name, store); torch's group helper then adds
    # "group_name/" and "DEVICE/" for the backend's first device.
    prefixed = dist.PrefixStore(f"{group_name}/", dist.PrefixStore(group_name, store))
    instance_store = dist.PrefixStore(f"{BACKEND_DEVICES[backend][0]}/", prefixed)
    try:
        group.instance = _backend_instance(backend, instance_store, rank, world_size, timeout)
    except Exception as error:
        group.close()
        raise WeightGroupError(
            f"{group.where()}: the group did not form within {timeout_s:g} s (every engine rank must join; "
            f"check the address and port are reachable from the engines): {error}"
        ) from error
    return group


def _member_device(
    master_port: int, rank: int, world_size: int, backend: GroupBackend, device: str | torch.device
) -> torch.device:
    """open_group's arguments checked (ValueError, or WeightGroupError where this machine lacks NCCL); the device."""
    if world_size < 2:
        raise ValueError(f"a weight group needs the trainer and at least one engine rank, got world_size {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    if master_port == 0 and rank != 0:
        raise ValueError("only rank 0 (the trainer) may pick the port (master_port 0)")
    if backend not in BACKEND_DEVICES:
        raise ValueError(f"weight group backend must be gloo or nccl, got {backend!r}")
    where_device = torch.device(device)
    if backend == "nccl" and not (torch.cuda.is_available() and dist.is_nccl_available()):
        raise WeightGroupError("backend nccl needs CUDA and a torch built with NCCL (use gloo on CPU)")
    if where_device.type not in BACKEND_DEVICES[backend]:
        raise ValueError(f"backend {backend} does not carry {where_device.type} tensors")
    return where_device


def _backend_instance(
    backend: GroupBackend, store: dist.Store, rank: int, world_size: int, timeout: datetime.timedelta
) -> Any:
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    options = dist.ProcessGroupNCCL.Options()
    options.is_high_priority_stream = False
    options._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, world_size, options)


WAIT_SLICE_S = 1.0
"""A broadcast is waited on in slices of this many seconds, so that closing the group ends the wait."""


def _broadcast(group: WeightGroup, tensors: Sequence[torch.Tensor]) -> None:
    """Broadcast each tensor from rank 0 on the group's instance (all posted, then waited, as SGLang does)."""
    if group.closed.is_set():
        raise WeightGroupError(f"{group.where()}: the group was closed")
    instance = group.instance
    options = dist.BroadcastOptions()
    options.rootRank = 0
    options.rootTensor = 0
    deadline = time.monotonic() + group.timeout_s
    try:
        works = [instance.broadcast([tensor], options) for tensor in tensors]
    except Exception as error:
        raise WeightGroupError(f"{group.where()}: broadcast failed: {error}") from error
    for work in works:
        while True:
            try:
                work.wait(datetime.timedelta(seconds=WAIT_SLICE_S))
                break
            except RuntimeError as error:
                if "timed out" not in str(error).lower():
                    raise WeightGroupError(f"{group.where()}: broadcast failed: {error}") from error
            if group.closed.is_set():
                raise WeightGroupError(f"{group.where()}: the group was closed during a broadcast")
            if time.monotonic() > deadline:
                raise WeightGroupError(
                    f"{group.where()}: a broadcast did not complete within {group.timeout_s:g} s (a member "
                    "did not take part: every engine rank must receive every tensor)"
                )


def send_tensors(group: WeightGroup, tensors: Sequence[torch.Tensor]) -> int:
    """Rank 0: broadcast each tensor, in order; returns the bytes sent (payload, once per tensor)."""
    if group.rank != 0:
        raise ValueError(f"only rank 0 sends; this member is rank {group.rank}")
    ready = [tensor.detach().contiguous() for tensor in tensors]
    _broadcast(group, ready)
    if group.backend == "nccl":
        torch.cuda.synchronize()
    return sum(tensor.numel() * tensor.element_size() for tensor in ready)


def send_buckets(
    group: WeightGroup, tensors: Mapping[str, torch.Tensor], buckets: Sequence[Sequence[TensorSpec]]
) -> int:
    """Rank 0: send every bucket in order (each tensor cast to its spec's dtype); returns the bytes sent.

    Every tensor is checked against its spec before anything is sent: a shape the engines did not ask for would
    not be caught on the wire.
    """
    for bucket in buckets:
        for spec in bucket:
            tensor = tensors.get(spec.name)
            if tensor is None:
                raise KeyError(f"no tensor named {spec.name!r} to send")
            if tuple(tensor.shape) != spec.shape:
                raise ValueError(f"{spec.name}: tensor shape {list(tensor.shape)} != spec {list(spec.shape)}")
    sent = 0
    for bucket in buckets:
        sent += send_tensors(group, [tensors[spec.name].to(torch_dtype(spec.dtype)) for spec in bucket])
    return sent


def receive_tensors(
    group: WeightGroup, specs: Sequence[TensorSpec], device: str | torch.device
) -> dict[str, torch.Tensor]:
    """An engine rank: empty tensors of the specs' dtypes and shapes on device, each filled by rank 0's broadcast,
    in order (SGLang's receive_weights_from_distributed)."""
    tensors = receive_list(group, specs, device)
    names = [spec.name for spec in specs]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise ValueError(f"names sent more than once in one request: {duplicated[:8]}")
    return dict(zip(names, tensors, strict=True))


def receive_list(group: WeightGroup, specs: Sequence[TensorSpec], device: str | torch.device) -> list[torch.Tensor]:
    """receive_tensors' tensors as a list (kept in step with the sender whatever the names are)."""
    if group.rank == 0:
        raise ValueError("rank 0 is the sender")
    tensors = [torch.empty(spec.shape, dtype=torch_dtype(spec.dtype), device=device) for spec in specs]
    _broadcast(group, tensors)
    return tensors


@dataclass(frozen=True)
class SyncStats:
    """One sync: wall seconds, payload bytes, requests (buckets) and tensors."""

    seconds: float
    bytes: int
    buckets: int
    tensors: int

    def metrics(self, prefix: str = "weight_sync/") -> dict[str, float]:
        return {
            f"{prefix}seconds": self.seconds,
            f"{prefix}bytes": float(self.bytes),
            f"{prefix}buckets": float(self.buckets),
            f"{prefix}tensors": float(self.tensors),
            f"{prefix}gbytes_per_s": self.bytes / 1e9 / self.seconds if self.seconds > 0 else 0.0,
        }


REFUSAL_GRACE_S = 10.0
"""After an engine refuses a bucket, how long its broadcast may still take before the group counts as out of step
(an engine that refused before receiving never takes part in it)."""


async def update_engine_from_distributed(
    engine: Engine,
    buckets: Sequence[Sequence[TensorSpec]],
    group_name: str,
    weight_version: int,
    flush_cache: bool = True,
    send: Callable[[int], Awaitable[Any]] | None = None,
) -> None:
    """The engine side of one sync: begin_weight_update, one update_weights_from_distributed per bucket, end.

    The last bucket carries weight_version (the engine's version moves once, with the whole sync) and flush_cache;
    the others neither (SGLang: flush only after the last). A bucket the engine refuses does not stop the
    requests: the sender broadcasts every bucket, so the engines keep receiving (behind a router, the engines that
    refused nothing still take the new version), and the first refusal is raised at the end.

    send(index), when given, is bucket index's broadcast (sync_weights: rank 0 in this process): it runs beside
    the request, and both finish before the next bucket. If the engine refused the bucket and its broadcast has
    not completed within REFUSAL_GRACE_S, the engine never received it: WeightGroupError (the group is out of
    step; form it again).
    """
    refused: WeightUpdateError | None = None
    await engine.begin_weight_update()
    try:
        for index, bucket in enumerate(buckets):
            last = index == len(buckets) - 1
            sending = asyncio.ensure_future(send(index)) if send is not None else None
            try:
                await engine.update_weights_from_distributed(
                    [spec.name for spec in bucket],
                    [spec.dtype for spec in bucket],
                    [list(spec.shape) for spec in bucket],
                    group_name,
                    weight_version if last else None,
                    flush_cache and last,
                )
            except WeightUpdateError as error:
                refused = refused or error
                if sending is not None:
                    done, _ = await asyncio.wait([sending], timeout=REFUSAL_GRACE_S)
                    if not done:
                        sending.cancel()  # its thread ends when the caller closes the group
                        raise WeightGroupError(
                            f"bucket {index} was refused and never received, so the group is out of step: {error}"
                        ) from error
            except BaseException:
                if sending is not None:
                    sending.cancel()  # its thread ends when the caller closes the group
                raise
            if sending is not None:
                await sending
    finally:
        await engine.end_weight_update()
    if refused is not None:
        raise refused


async def sync_weights(
    engine: Engine,
    group: WeightGroup,
    tensors: Mapping[str, torch.Tensor],
    *,
    bucket_bytes: int,
    weight_version: int,
    flush_cache: bool = True,
) -> SyncStats:
    """Both sides of one sync from one process: rank 0's broadcasts (in a thread) beside the engine's requests.

    On any failure but a refusal the group is closed (a broadcast left waiting on an engine that failed ends).
    """
    specs = [TensorSpec.of(name, tensor) for name, tensor in tensors.items()]
    buckets = plan_buckets(specs, bucket_bytes)
    sent = 0

    async def send(index: int) -> None:
        nonlocal sent
        sent += await asyncio.to_thread(send_buckets, group, tensors, [buckets[index]])

    started = time.perf_counter()
    try:
        await update_engine_from_distributed(engine, buckets, group.name, weight_version, flush_cache, send)
    except WeightUpdateError:
        raise
    except BaseException:
        group.close()
        raise
    return SyncStats(time.perf_counter() - started, sent, len(buckets), len(specs))
