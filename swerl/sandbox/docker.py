"""Docker sandboxes: one container per sandbox, network "none", resource limits, removal guaranteed.

A container runs from the repository's environment image (swerl.sandbox.images: the base image plus the
repository at ENV_SOURCE) with a read-only root file system, a private tmpfs /workspace (the repository is copied
there at start, so every sandbox starts pristine and a disk-filling command hits the tmpfs size, counted in the
container's memory limit) and a tmpfs /tmp. Every process runs as an unprivileged user with no capabilities.
PID 1 is a bash loop that only sleeps and reaps orphans; it leaves after `max_lifetime_s` and the container then
removes itself, so a crashed run leaks nothing for long.

Commands run through the Docker API (exec), one at a time per sandbox. No process outlives its command: the
wrapper kills every process of the sandbox user when the command ends, and a command past its timeout is killed
the same way from a second exec (`kill -9 -1` spares only PID 1). The docker SDK blocks, so its calls run on a
thread pool sized by config (a running command holds a thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import shlex
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from swerl.errors import InfraError
from swerl.sandbox.base import (
    IGNORED_AT_START_CMD,
    WORKSPACE,
    Environment,
    ExecResult,
    ImageEnvironment,
    SandboxResources,
    VenvEnvironment,
)
from swerl.sandbox.images import ENV_SOURCE, SANDBOX_UID, build_env, build_project_image, build_task_layer
from swerl.sandbox.process import BoundedOutput, refuse_nul, shell_command
from swerl.sandbox.ratelimit import WindowLimit

log = logging.getLogger(__name__)

T = TypeVar("T")

LABEL = "org.swerl.sandbox"
"""Every sandbox container carries this label (value: its provider's id), so leftovers can be found."""
USER = f"{SANDBOX_UID}:{SANDBOX_UID}"
_GATE = ["/bin/sh", "-c", 'head -c 1 >/dev/null; exec "$@"', "swerl-gate"]
"""Prefix of every exec: start the command only once the client is attached (see exec_blocking)."""

# Runs the command as a child, then kills whatever it left behind (kill -1 spares the caller and PID 1).
# stderr joins stdout inside the container: one stream keeps the order the command wrote in (Docker frames two
# streams from separate readers, so `print; echo >&2` could come back as err-then-out), as the local backend does.
_WRAPPER = 'exec 2>&1; cd -- "$1" || exit 1; /bin/bash -c "$2"; status=$?; kill -9 -1 2>/dev/null; exit $status'
# PID 1: sleeps, reaps orphans (bash waits for any child on SIGCHLD), leaves after the lifetime.
_INIT = "trap 'exit 0' TERM; end=$((SECONDS + {lifetime})); while [ $SECONDS -lt $end ]; do sleep 60 & wait $!; done"
_PATCH_FAILED = 91
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
VENV_IMAGE_REPOSITORY = "swerl-venv"
"""Images of repositories with an environment of their own (VenvEnvironment): tagged by its key."""


@dataclasses.dataclass(frozen=True)
class PreparedImage:
    """What a container of one environment runs: the image (with swerl's sandbox layer) and its PATH."""

    tag: str
    path: str


class DockerSandbox:
    """One running container; commands run in it through the Docker API as the sandbox user."""

    def __init__(
        self,
        provider: DockerSandboxProvider,
        container_id: str,
        name: str,
        max_output_bytes: int,
        kill_grace_s: float,
    ) -> None:
        self.container_id = container_id
        self.name = name
        self._provider = provider
        self._max_output_bytes = max_output_bytes
        self._kill_grace_s = kill_grace_s
        self._lock = asyncio.Lock()
        self._closed = False
        self._removal: asyncio.Future[None] | None = None

    async def exec(self, cmd: str, timeout: float, cwd: str | None = None) -> ExecResult:
        """Run `cmd` with bash; past `timeout` every process of the command is killed (timed_out=True)."""
        refused = refuse_nul(cmd=cmd, cwd=cwd or "")
        if refused is not None:
            return refused
        script, stdin = shell_command(cmd)
        return await self._run(script, timeout, cwd or WORKSPACE, stdin=stdin)

    async def read_file(self, path: str) -> str:
        """Read a file as the sandbox user sees it."""
        if "\0" in path:
            raise FileNotFoundError(f"cannot read {path!r} in sandbox: a path cannot hold a NUL byte")
        result = await self._run(f"cat -- {shlex.quote(_abs(path))}", 60.0, WORKSPACE, stdin=None)
        if result.exit_code != 0:
            raise FileNotFoundError(f"cannot read {path} in sandbox: {result.output.strip()}")
        return result.output

    async def write_file(self, path: str, content: str) -> None:
        """Write a file under /workspace as the sandbox user (content through the exec's stdin)."""
        if "\0" in path:
            raise OSError(f"cannot write {path!r} in sandbox: a path cannot hold a NUL byte")
        target = _abs(path)
        if not (target == WORKSPACE or target.startswith(WORKSPACE + "/")):
            raise ValueError(f"write_file({path!r}): only paths under {WORKSPACE} are writable")
        script = f"mkdir -p -- {shlex.quote(os.path.dirname(target))} && cat > {shlex.quote(target)}"
        result = await self._run(script, 60.0, WORKSPACE, stdin=content.encode())
        if result.exit_code != 0:
            raise OSError(f"cannot write {path} in sandbox: {result.output.strip()}")

    async def close(self) -> None:
        """Remove the container (killing everything in it); idempotent, and concurrent calls share one removal."""
        self._closed = True
        if self._removal is None:
            self._removal = asyncio.ensure_future(self._provider.remove(self.name))
        if not self._removal.done():
            await asyncio.shield(self._removal)

    async def _run(self, cmd: str, timeout: float, cwd: str, stdin: bytes | None) -> ExecResult:
        if self._closed:
            raise InfraError("sandbox_died", f"sandbox {self.name} is closed")
        async with self._lock:
            if self._closed:
                raise InfraError("sandbox_died", f"sandbox {self.name} is closed")
            output = BoundedOutput(self._max_output_bytes)
            started = time.monotonic()
            argv = ["/bin/bash", "-c", _WRAPPER, "swerl-exec", cwd, cmd]
            # The read timeout on the exec's socket is the backstop for a daemon that stops answering.
            running = self._provider.call(
                self._provider.exec_blocking,
                self.container_id,
                argv,
                stdin,
                output,
                timeout + self._kill_grace_s,
            )
            timed_out = False
            try:
                exit_code = await asyncio.wait_for(asyncio.shield(running), timeout)
            except TimeoutError:
                timed_out = True
                exit_code = await self._kill_after_timeout(running, cmd)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await self._provider.call(self._provider.kill_all_blocking, self.container_id)
                raise
            except InfraError:
                if self._closed:
                    raise InfraError("sandbox_died", f"sandbox {self.name} was closed while running") from None
                raise
        if self._closed:
            raise InfraError("sandbox_died", f"sandbox {self.name} was closed while running {cmd[:200]!r}")
        return ExecResult(
            exit_code=124 if timed_out else exit_code,
            output=output.text(),
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )

    async def _kill_after_timeout(self, running: asyncio.Future[int], cmd: str) -> int:
        try:
            await asyncio.wait_for(
                self._provider.call(self._provider.kill_all_blocking, self.container_id), self._kill_grace_s
            )
            return await asyncio.wait_for(running, self._kill_grace_s)
        except TimeoutError as exc:
            raise InfraError(
                "exec_unresponsive", f"command still running {self._kill_grace_s}s after kill: {cmd[:200]!r}"
            ) from exc


class DockerSandboxProvider:
    """Starts DockerSandboxes from repository directories, building each one's environment image once."""

    def __init__(
        self,
        resources: SandboxResources,
        *,
        base_image: str,
        cpus: float,
        kill_grace_s: float,
        max_lifetime_s: int,
        api_threads: int,
        api_timeout_s: float,
        allow_pull: bool = False,
        pulls_per_hour: int = 100,
        extra_env: Mapping[str, str] | None = None,
        git_baseline: bool = False,
        docker_host: str | None = None,
    ) -> None:
        """The backend's own arguments are DockerSandboxConfig's fields; docker_host (None: the environment's
        DOCKER_HOST, or the default socket) and extra_env are not config."""
        self.allow_pull = allow_pull
        self.pulls = WindowLimit(pulls_per_hour, 3600.0, "docker image pulls (agent.sandbox.docker.pulls_per_hour)")
        self.resources = resources
        self.base_image = base_image
        self.cpus = cpus
        self.kill_grace_s = kill_grace_s
        self.max_lifetime_s = max_lifetime_s
        self.api_threads = api_threads
        self.api_timeout_s = api_timeout_s
        self.extra_env = dict(extra_env or {})
        self.git_baseline = git_baseline
        self.docker_host = docker_host
        self.id = secrets.token_hex(4)
        self._executor = ThreadPoolExecutor(max_workers=api_threads, thread_name_prefix="swerl-docker")
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._images: dict[Environment, PreparedImage] = {}
        self._image_locks: dict[Environment, asyncio.Lock] = {}
        self.image_counters: dict[str, int] = {"pulled": 0, "built": 0, "reused": 0}

    def limits(self) -> dict[str, int | float]:
        """Every limit this provider enforces, for logging at start."""
        return {
            "cpus": self.cpus,
            **dataclasses.asdict(self.resources),
            "max_lifetime_s": self.max_lifetime_s,
            "api_threads": self.api_threads,
            "pulls_per_hour": self.pulls.limit if self.allow_pull else 0,
        }

    async def start(
        self, env_dir: Environment, setup_patch: str | None = None, env: Mapping[str, str] | None = None
    ) -> DockerSandbox:
        """A container whose /workspace is a private copy of the environment's repository (a directory's image,
        or a task image with swerl's sandbox layer) with `setup_patch` applied."""
        prepared = await self.environment_image(
            env_dir if isinstance(env_dir, ImageEnvironment | VenvEnvironment) else Path(env_dir)
        )
        image = prepared.tag
        env = {"PATH": prepared.path, **(env or {})}
        name = f"swerl-{self.id}-{secrets.token_hex(6)}"
        abandoned = threading.Event()
        timeout_s = self.resources.start_timeout_s
        sandbox: DockerSandbox | None = None
        try:
            async with asyncio.timeout(timeout_s):
                container_id = await self.call(self._create_blocking, image, name, env or {}, abandoned)
                sandbox = DockerSandbox(self, container_id, name, self.resources.max_output_bytes, self.kill_grace_s)
                probe = await sandbox._run(
                    self._setup_script(setup_patch),
                    timeout_s,
                    "/",
                    (setup_patch.encode() if setup_patch else None),
                )
        except TimeoutError as exc:
            abandoned.set()  # a create still in flight removes its own container
            await self.remove(name)
            raise InfraError("start_timeout", f"container did not start within {timeout_s}s") from exc
        except BaseException:
            abandoned.set()
            await asyncio.shield(self.remove(name))
            raise
        assert sandbox is not None
        if probe.timed_out:
            await sandbox.close()
            raise InfraError("start_timeout", f"sandbox set-up did not finish within {timeout_s}s")
        if probe.exit_code != 0:
            await sandbox.close()
            if probe.exit_code == _PATCH_FAILED:
                raise InfraError("start_failed", f"setup patch does not apply to {env_dir}: {probe.output.strip()}")
            raise InfraError("start_failed", f"sandbox set-up failed ({probe.exit_code}): {probe.output.strip()}")
        return sandbox

    async def environment_image(self, env_dir: Environment) -> PreparedImage:
        """The image a sandbox of this environment runs, prepared once: a repository directory's image built on
        the base image, a task image (pulled only where allowed, within pulls_per_hour) with swerl's sandbox
        layer built on it (swerl.sandbox.images.build_task_layer), or for a repository with an environment of its
        own (VenvEnvironment) a project image with its pinned requirements (`_prepare_venv_image`)."""
        if isinstance(env_dir, VenvEnvironment):
            if not env_dir.path.is_dir():
                raise InfraError("image_missing", f"environment directory {env_dir.path} does not exist")
        elif not isinstance(env_dir, ImageEnvironment):
            env_dir = Path(env_dir)
            if not env_dir.is_dir():
                raise InfraError("image_missing", f"environment directory {env_dir} does not exist")
            env_dir = env_dir.resolve()
        if env_dir in self._images:
            return self._images[env_dir]
        lock = self._image_locks.setdefault(env_dir, asyncio.Lock())
        async with lock:
            if env_dir not in self._images:
                client = await self.call(self._docker)
                if isinstance(env_dir, ImageEnvironment):
                    self._images[env_dir] = await self._prepare_task_image(client, env_dir)
                    return self._images[env_dir]
                if isinstance(env_dir, VenvEnvironment):
                    self._images[env_dir] = await self._prepare_venv_image(client, env_dir)
                    return self._images[env_dir]
                try:
                    tag = await self.call(build_env, client, env_dir, self.base_image)
                except Exception as exc:  # the SDK raises several types; all mean "no image to run"
                    raise InfraError(
                        "image_missing",
                        f"cannot build the environment image of {env_dir} on {self.base_image} ({exc}); "
                        "build the base with `python -m swerl.sandbox.images base`",
                    ) from exc
                self._images[env_dir] = PreparedImage(tag, _DEFAULT_PATH)
        return self._images[env_dir]

    async def _prepare_task_image(self, client: Any, env: ImageEnvironment) -> PreparedImage:
        import docker.errors

        try:
            await self.call(client.images.get, env.image)
        except docker.errors.ImageNotFound:
            if not self.allow_pull:
                raise InfraError(
                    "image_missing",
                    f"image {env.image} is not on this Docker engine and pulling is off "
                    "(agent.sandbox.docker.allow_pull: false): build or load it first",
                ) from None
            await self._pull(client, env.image)
        except docker.errors.APIError as exc:
            raise InfraError("image_missing", f"cannot inspect image {env.image}: {exc}") from exc
        try:
            tag, path, reused = await self.call(build_task_layer, client, env.image, env.repo_dir)
        except Exception as exc:  # the SDK raises several types; all mean "no image to run"
            raise InfraError("image_missing", f"cannot build swerl's sandbox layer on {env.image}: {exc}") from exc
        self.image_counters["reused" if reused else "built"] += 1
        return PreparedImage(tag, ":".join([*env.path_prepend, path or _DEFAULT_PATH]))

    async def _prepare_venv_image(self, client: Any, env: VenvEnvironment) -> PreparedImage:
        """A repository with an environment of its own: an image in SWE-bench's layout (images.build_project_image:
        the repository at /testbed, a virtualenv at /opt/venv with the environment's pinned requirements, its
        python_path on the path) built once on the base image, then swerl's sandbox layer on it. The wheels are
        fetched here, at preparation time, by pip (its index, or the wheelhouse it is configured with:
        PIP_FIND_LINKS, PIP_NO_INDEX); the image build itself has no network."""
        requirements = list(env.requirements) or ["pytest"]
        tag = f"{VENV_IMAGE_REPOSITORY}:{env.key or 'latest'}"
        try:
            await self.call(build_project_image, client, env.path, tag, requirements, env.python_path, self.base_image)
        except Exception as exc:  # pip, the SDK and the build raise several types; all mean "no image to run"
            raise InfraError(
                "image_missing",
                f"cannot build the image of {env.path} with its environment's requirements {requirements} on "
                f"{self.base_image} ({exc}); pip fetches the wheels from its index or the wheelhouse it is "
                "configured with (PIP_FIND_LINKS, PIP_NO_INDEX)",
            ) from exc
        self.image_counters["built"] += 1
        return await self._prepare_task_image(client, ImageEnvironment(tag))

    async def _pull(self, client: Any, image: str) -> None:
        """Pull one image within the pulls_per_hour budget (a wait is logged); failures are image_missing."""
        waited = await self.pulls.acquire()
        log.info("pulling %s (waited %.1f s for the pull budget)", image, waited)
        try:
            await self.call(client.images.pull, image)
        except Exception as exc:  # noqa: BLE001 - every failure means the same: no image to run
            raise InfraError("image_missing", f"pulling {image} failed: {exc}") from exc
        self.image_counters["pulled"] += 1

    async def remove(self, name: str) -> None:
        """Force-remove a container by name (gone already is fine); retried, then logged as a leak."""
        for attempt in range(3):
            try:
                await self.call(self._remove_blocking, name)
                return
            except Exception as exc:  # removal must never raise into an episode's cleanup
                log.warning("removing sandbox container %s failed (attempt %d): %s", name, attempt + 1, exc)
                await asyncio.sleep(0.5 * (attempt + 1))
        log.error("sandbox container %s may be left behind; `docker rm -f %s` removes it", name, name)

    async def remove_all(self) -> int:
        """Remove every container this provider started that is still there; returns how many."""
        client = await self.call(self._docker)
        found = await self.call(client.api.containers, all=True, filters={"label": f"{LABEL}={self.id}"}, quiet=True)
        for container in found:
            await self.remove(container["Id"])
        return len(found)

    def close(self) -> None:
        """Release the API threads (sandboxes must be closed first)."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------------------------------------------------
    # Blocking Docker API calls (run on the provider's threads)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> asyncio.Future[T]:
        """Run a blocking function on the provider's thread pool."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    def _docker(self) -> Any:
        with self._client_lock:
            if self._client is None:
                import docker

                try:
                    kwargs: dict[str, Any] = {
                        "timeout": int(self.api_timeout_s),
                        "max_pool_size": self.api_threads,
                    }
                    if self.docker_host:
                        self._client = docker.DockerClient(base_url=self.docker_host, **kwargs)
                    else:
                        self._client = docker.from_env(**kwargs)
                    self._client.ping()
                except Exception as exc:
                    self._client = None
                    raise InfraError("start_failed", f"Docker engine not reachable: {exc}") from exc
            return self._client

    def _create_blocking(self, image: str, name: str, env: Mapping[str, str], abandoned: threading.Event) -> str:
        import docker.errors

        api = self._docker().api
        host_config = self._host_config(api)
        base_env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "USER": "sandbox",
        }
        try:
            created = api.create_container(
                image,
                command=["/bin/bash", "-c", _INIT.format(lifetime=self.max_lifetime_s)],
                name=name,
                user=USER,
                working_dir=WORKSPACE,
                hostname="sandbox",
                environment={**base_env, **self.extra_env, **env},
                labels={LABEL: self.id},
                network_disabled=True,
                host_config=host_config,
            )
            api.start(created["Id"])
        except docker.errors.ImageNotFound as exc:
            raise InfraError("image_missing", f"image {image} not found: {exc.explanation}") from exc
        except docker.errors.APIError as exc:
            raise InfraError("start_failed", f"cannot start container from {image}: {exc.explanation}") from exc
        if abandoned.is_set():
            self._remove_blocking(name)
        return str(created["Id"])

    def _host_config(self, api: Any) -> Any:
        """A container's isolation and limits: no network, read-only root, tmpfs /workspace and /tmp, no caps."""
        from docker.types import Ulimit

        mib = 1024 * 1024
        res = self.resources
        return api.create_host_config(
            network_mode="none",
            nano_cpus=int(self.cpus * 1e9),
            mem_limit=res.memory_mb * mib,
            memswap_limit=res.memory_mb * mib,  # no swap: the limit is the limit
            pids_limit=res.max_processes,
            ulimits=[
                Ulimit(name="nofile", soft=res.max_open_files, hard=res.max_open_files),
                Ulimit(name="fsize", soft=res.file_size_mb * mib, hard=res.file_size_mb * mib),
                Ulimit(name="cpu", soft=res.cpu_time_s, hard=res.cpu_time_s),
                Ulimit(name="core", soft=0, hard=0),
            ],
            read_only=True,
            tmpfs={
                WORKSPACE: (
                    f"rw,exec,nosuid,nodev,size={res.workspace_mb}m,mode=0755,uid={SANDBOX_UID},gid={SANDBOX_UID}"
                ),
                "/tmp": f"rw,exec,nosuid,nodev,size={res.tmp_size_mb}m,mode=1777",
            },
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            auto_remove=True,
        )

    def exec_blocking(
        self,
        container_id: str,
        argv: list[str],
        stdin: bytes | None,
        output: BoundedOutput,
        read_timeout: float,
    ) -> int:
        """Run argv in the container as the sandbox user, streaming merged output; returns the exit code.

        The command waits for one byte on stdin before it starts (_GATE): output that reached the client in the
        same read as the daemon's upgrade headers would sit in the HTTP reader's buffer, which the hijacked
        socket bypasses, and be lost (seen under load: a fast `echo` returned no output).
        """
        import docker.errors
        from docker.utils.socket import frames_iter

        api = self._docker().api
        try:
            exec_id = api.exec_create(container_id, [*_GATE, *argv], stdin=True, user=USER)["Id"]
            sock = api.exec_start(exec_id, socket=True)
        except docker.errors.APIError as exc:
            raise InfraError("sandbox_died", f"cannot run a command in {container_id[:12]}: {exc}") from exc
        raw: socket.socket = getattr(sock, "_sock", sock)
        try:
            raw.settimeout(read_timeout)
            raw.sendall(b"\n" + (stdin or b""))  # the gate's byte, then the command's own stdin
            raw.shutdown(socket.SHUT_WR)
            for _stream, chunk in frames_iter(sock, tty=False):
                output.add(chunk)
        except TimeoutError as exc:
            raise InfraError("exec_unresponsive", f"no end of command output within {read_timeout}s") from exc
        except OSError as exc:
            raise InfraError("sandbox_died", f"connection to {container_id[:12]} lost: {exc}") from exc
        finally:
            sock.close()
        return self._exit_code(exec_id)

    def _exit_code(self, exec_id: str) -> int:
        import docker.errors

        api = self._docker().api
        for _ in range(100):  # the exit code lands a moment after the output ends
            try:
                state = api.exec_inspect(exec_id)
            except docker.errors.APIError as exc:
                raise InfraError("sandbox_died", f"command state unavailable: {exc}") from exc
            if not state["Running"] and state["ExitCode"] is not None:
                return int(state["ExitCode"])
            time.sleep(0.02)
        raise InfraError("exec_unresponsive", "command output ended but the command did not exit")

    def kill_all_blocking(self, container_id: str) -> None:
        """SIGKILL every process of the sandbox user (kill -1 spares only the killer and PID 1).

        Retried for up to kill_grace_s: under a fork bomb the killer itself may not get a process at first.
        """
        deadline = time.monotonic() + self.kill_grace_s
        while True:
            try:
                self.exec_blocking(
                    container_id,
                    ["/bin/bash", "-c", "kill -9 -1"],
                    None,
                    BoundedOutput(4096),
                    self.kill_grace_s,
                )
                return
            except InfraError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _remove_blocking(self, name: str) -> None:
        import docker.errors

        try:
            self._docker().api.remove_container(name, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if not (exc.status_code == 409 and "in progress" in str(exc)):
                raise
            # Auto-removal is already under way (the container ended): wait until it is really gone.
            deadline = time.monotonic() + self.api_timeout_s
            while time.monotonic() < deadline:
                try:
                    self._docker().api.inspect_container(name)
                except docker.errors.NotFound:
                    return
                time.sleep(0.1)
            raise

    def _setup_script(self, setup_patch: str | None) -> str:
        steps = [f"cp -a {ENV_SOURCE}/. {WORKSPACE}/", f"cd {WORKSPACE}"]
        if setup_patch:
            steps.append(f"git apply --whitespace=nowarn - || exit {_PATCH_FAILED}")
        if self.git_baseline:
            git = "git -c user.name=swerl -c user.email=swerl@localhost -c init.defaultBranch=main"
            steps.append(
                f"{git} init -q && {git} add -A && {git} commit -q --no-verify -m 'task start'"
                f" && {git} {IGNORED_AT_START_CMD}"
            )
        return "set -e\n" + "\n".join(steps)


def _abs(path: str) -> str:
    return os.path.normpath(path if path.startswith("/") else f"{WORKSPACE}/{path}")
