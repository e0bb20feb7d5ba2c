"""What the agent stages share: running coroutines from sync stage code, moving model directories through the
store, the episode limits and sandbox provider from config, episodes with infrastructure retries, and the
durable checkpoint folder a crashed stage resumes from.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from swerl.agent.episode import EpisodeLimits
from swerl.config.agent import AgentConfig
from swerl.config.sandbox import SandboxLimits, SandboxPoolConfig
from swerl.config.train import DistributedConfig
from swerl.data.schema import TaskInstance
from swerl.data.taskio import tasks_from_parquet
from swerl.sandbox.base import SandboxResources
from swerl.sandbox.docker import DockerSandboxProvider
from swerl.sandbox.e2b import E2BSandboxProvider
from swerl.sandbox.local import LocalSandboxProvider
from swerl.sandbox.pool import PoolLimits, SandboxPool
from swerl.stages.runner import ArtifactRecord, Manifest, StageContext
from swerl.storage import DamagedArtifact, Store, artifact_mismatch
from swerl.train.checkpoint import CheckpointMirror
from swerl.trajectory import EpisodeStatus, Trajectory

T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion, on a helper thread if this thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="swerl-stage-loop")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def sandbox_resources(limits: SandboxLimits) -> SandboxResources:
    """The limits every backend enforces, from config: the one place SandboxLimits' fields become them."""
    return SandboxResources(
        memory_mb=limits.memory_mb,
        max_processes=limits.max_processes,
        cpu_time_s=limits.cpu_time_s,
        file_size_mb=limits.file_size_mb,
        tmp_size_mb=limits.tmp_size_mb,
        workspace_mb=limits.workspace_mb,
        max_open_files=limits.max_open_files,
        max_output_bytes=limits.max_output_bytes,
        start_timeout_s=limits.start_timeout_s,
    )


def sandbox_provider(
    limits: SandboxLimits, git_baseline: bool = False
) -> LocalSandboxProvider | DockerSandboxProvider | E2BSandboxProvider:
    """The configured sandbox provider (local bubblewrap, docker, or e2b) with every limit from config."""
    resources = sandbox_resources(limits)
    if limits.backend == "e2b":
        e2b = limits.e2b
        return E2BSandboxProvider(
            resources,
            template=e2b.template,
            lifetime_s=e2b.lifetime_s,
            request_timeout_s=e2b.request_timeout_s,
            exec_grace_s=e2b.exec_grace_s,
            image_templates=e2b.image_templates,
            git_baseline=git_baseline,
        )
    if limits.backend == "docker":
        docker = limits.docker
        return DockerSandboxProvider(
            resources,
            base_image=docker.base_image,
            cpus=docker.cpus,
            kill_grace_s=docker.kill_grace_s,
            max_lifetime_s=docker.max_lifetime_s,
            api_threads=docker.api_threads,
            api_timeout_s=docker.api_timeout_s,
            allow_pull=docker.allow_pull,
            pulls_per_hour=docker.pulls_per_hour,
            git_baseline=git_baseline,
        )
    return LocalSandboxProvider(
        limits.python or sys.executable,
        resources,
        root_dir=limits.workspace_dir,
        workspace_quota=limits.workspace_quota,
        runtime=limits.runtime,
        git_baseline=git_baseline,
    )


async def closing(pool: SandboxPool, work: Awaitable[T]) -> T:
    """Await `work`, then close the pool (warm sandboxes, starts still in flight) before the event loop ends."""
    async with pool:
        return await work


def pool_limits(pool: SandboxPoolConfig) -> PoolLimits:
    """The pool's named limits, from config: the one place SandboxPoolConfig's fields become them."""
    return PoolLimits(
        max_concurrent=pool.max_concurrent,
        start_timeout_s=pool.start_timeout_s,
        start_retries=pool.start_retries,
        retry_causes=frozenset(pool.retry_causes),
        retry_backoff_s=pool.retry_backoff_s,
        warm_size=pool.warm_size,
        price_per_sandbox_hour=pool.price_per_sandbox_hour,
    )


def sandbox_pool(limits: SandboxLimits, git_baseline: bool = False) -> SandboxPool:
    """The configured provider behind the pool's named limits (concurrency, start timeout and retries, warm)."""
    return SandboxPool(sandbox_provider(limits, git_baseline), pool_limits(limits.pool), owns_provider=True)


def episode_limits(agent: AgentConfig) -> EpisodeLimits:
    return EpisodeLimits(
        max_turns=agent.max_turns,
        max_trajectory_tokens=agent.max_trajectory_tokens,
        max_new_tokens_per_turn=agent.max_new_tokens_per_turn,
        command_timeout_s=agent.command_timeout_s,
        max_observation_chars=agent.max_observation_chars,
        test_timeout_s=agent.test_timeout_s,
        episode_timeout_s=agent.episode_timeout_s,
        max_malformed_calls=agent.max_malformed_calls,
        max_command_bytes=agent.max_command_bytes,
        max_edit_bytes=agent.max_edit_bytes,
    )


# ----------------------------------------------------------------------------------------------------------------
# Inputs and outputs through the store


def input_manifest(ctx: StageContext, stage: str) -> Manifest:
    if stage not in ctx.inputs:
        raise ValueError(f"stage {ctx.stage} needs the output of stage {stage!r}; inputs: {sorted(ctx.inputs)}")
    return ctx.inputs[stage]


def read_input(store: Store, manifest: Manifest, name: str) -> bytes:
    """An input artifact's bytes, checked against the size and sha256 its manifest records (DamagedArtifact)."""
    record = manifest.artifact(name)
    data = store.read_bytes(store.rel_of(record.uri))
    _check(data, record, manifest)
    return data


def _check(data: bytes | Path, record: ArtifactRecord, manifest: Manifest) -> None:
    found = artifact_mismatch(data, record.sha256, record.size)
    if found is not None:
        raise DamagedArtifact(record.uri, found, manifest.stage, manifest.uri)


def load_tasks(store: Store, manifest: Manifest, name: str) -> list[TaskInstance]:
    """Tasks from a curate manifest's parquet artifact (train.parquet / eval.parquet)."""
    return tasks_from_parquet(read_input(store, manifest, name))


def put_dir(ctx: StageContext, name: str, local: Path) -> None:
    """Publish every file of a local directory as artifacts `name/RELPATH` of the stage."""
    files = sorted(p for p in local.rglob("*") if p.is_file())
    if not files:
        raise ValueError(f"{local} holds no files to publish as {name}")
    for path in files:
        ctx.put_artifact(f"{name}/{path.relative_to(local).as_posix()}", path)


def get_dir(store: Store, manifest: Manifest, name: str, local: Path) -> Path:
    """Download the artifacts `name/...` of a manifest into a local directory (a model folder, typically)."""
    prefix = f"{name}/"
    records = [a for n, a in manifest.artifacts.items() if n.startswith(prefix)]
    if not records:
        raise ValueError(f"stage {manifest.stage} ({manifest.uri}) published no {name}/ directory")
    for record in records:  # each file hashed once, as it arrives (seconds per GB: docs/benchmarks.md)
        _check(store.get_file(store.rel_of(record.uri), local / record.name[len(prefix) :]), record, manifest)
    return local


class DurableCheckpoints(CheckpointMirror):
    """Training checkpoints mirrored to the store under the stage's key (not its attempt), so a rerun of a
    crashed stage resumes from the newest intact complete one (a damaged newest one is skipped, said in the log);
    the store keeps the newest `keep` (the stage's keep_checkpoints), like the trainer's local folder. A forced run's
    are its force epoch's own (`stages/NAME/KEY/forced/EPOCH/checkpoints`, StageContext.durable): it finds none
    of the attempts before it, and its crashed attempts resume from its own."""

    def __init__(self, ctx: StageContext, local_root: Path, keep: int) -> None:
        super().__init__(ctx.store, ctx.durable("checkpoints"), local_root, keep=keep)


# ----------------------------------------------------------------------------------------------------------------
# Episodes with the failure rule


async def episode_with_retries(
    run: Callable[[int], Awaitable[Trajectory]], retries: int, counts: dict[str, int]
) -> Trajectory:
    """Run an episode; rerun it (up to `retries` times) while it ends in an infrastructure error.

    `run(retry)` runs one try. Every infrastructure error is counted in counts['infra_error.CAUSE']; the last
    try's trajectory is returned, infra_error or not (callers leave those out of scores and baselines).
    """
    trajectory = await run(0)
    for retry in range(1, retries + 1):
        if trajectory.status is not EpisodeStatus.INFRA_ERROR:
            break
        counts[f"infra_error.{trajectory.infra_cause}"] = counts.get(f"infra_error.{trajectory.infra_cause}", 0) + 1
        trajectory = await run(retry)
    if trajectory.status is EpisodeStatus.INFRA_ERROR:
        counts[f"infra_error.{trajectory.infra_cause}"] = counts.get(f"infra_error.{trajectory.infra_cause}", 0) + 1
        counts["infra_error.gave_up"] = counts.get("infra_error.gave_up", 0) + 1
    return trajectory


def seeded_sample(items: Sequence[T], k: int, seed: int | str) -> list[T]:
    """k items (all when fewer) in a seeded order independent of the input order's accidents."""
    chosen = list(items)
    random.Random(seed).shuffle(chosen)
    return chosen[:k]


def trainer_processes(trainer: object, d: DistributedConfig) -> dict[str, Any]:
    """Where a stage's trainer ran, as run (its report's record: backend, device, process ids of its ranks)."""
    pids = getattr(trainer, "pids", None) or [getattr(trainer, "pid", None) or os.getpid()]
    return {"backend": d.backend, "device": d.device, "ranks": len(pids), "pids": pids}
