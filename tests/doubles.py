"""Test doubles: what stands in for an edge of swerl that cannot run on this machine, or cannot be made to fail on
cue. Tests import them from here, and so do benchmarks (as `tests.doubles`, the repository root on sys.path).

    edge        double                          stands in for
    E2B cloud   FakeAsyncSandbox                the e2b SDK's AsyncSandbox (with FakeCommands, FakeFilesystem)
    engine      launch_emulated                 an SGLang server: swerl.engine.emulated_server in its own process
                FaultProxy                      an engine server's HTTP faults: 503s, dropped connections, stalls
                FailingEngine                   an engine's 503s and timeouts, at the Engine protocol
                VersionEngine                   an engine that only takes weight versions
    sandboxes   KillingProvider, KillableSandbox  a sandbox that dies in the middle of a command
                RefusingProvider                a backend that cannot start any sandbox
    trainer     CountingTrainer                 a PolicyTrainer that only counts its updates

Each says why the real thing is not used. The doubles swerl ships for its own benchmarks and demos stay in swerl:
swerl.engine.emulated (EmulatedEngine), swerl.engine.emulated_server, swerl.engine.scripted (ScriptedEngine).
Helpers that build real things (providers from config defaults, engine processes, tiny models) are not doubles:
tests/sandbox_helpers.py, tests/engine_helpers.py, tests/tiny_models.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import shlex
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from swerl.engine.base import GenerateRequest, GenerateResponse
from swerl.engine.emulated import EmulatedEngine
from swerl.errors import InfraError
from swerl.sandbox.base import Environment, ExecResult, ImageEnvironment, Sandbox
from swerl.sandbox.local import LocalSandboxProvider
from swerl.services import Service, free_port
from swerl.trajectory import Trajectory

# ----------------------------------------------------------------------------------------------------------------
# E2B cloud: a fake of the e2b SDK's AsyncSandbox
#
# The cloud cannot be reached here (no network, no API key). The fake has the SDK's method shapes
# (`AsyncSandbox.create`, `.commands.run`, `.files.read/.write`, `.kill`, `.sandbox_id`) and raises the SDK's own
# exception classes (`e2b.exceptions`, `e2b.CommandExitException`), so swerl.sandbox.e2b runs against it unchanged.
# The "VM" is a directory with workspace/ and tmp/, and commands really run, under bubblewrap with no network, as
# uid 1000 (e2b's `user`), with exactly the `envs` they were given (like envd); it has no resource limits, so it is
# not for the security suite. Knobs on the class inject the failures the cloud can produce (rate limit, missing
# template, VM killed, hung command). e2b (an optional extra) is imported only when a fake VM raises its errors.

_FAKE_VM_ROOT = shlex.split(
    "bwrap --tmpfs / --ro-bind /usr /usr --ro-bind /etc /etc --symlink usr/bin /bin --symlink usr/lib /lib"
    " --symlink usr/lib64 /lib64 --symlink usr/sbin /sbin --dev /dev --proc /proc"
)
"""The fake VM's root: the host's /usr and /etc read-only, its own /dev and /proc."""
_FAKE_VM_ISOLATION = shlex.split("--unshare-all --unshare-user --uid 1000 --gid 1000 --die-with-parent --clearenv")
"""No network, e2b's `user` (uid 1000), gone with its parent, no variable but those the command was given."""


class _Result:
    def __init__(self, exit_code: int) -> None:
        self.exit_code = exit_code
        self.stdout = None
        self.stderr = None
        self.error = None


class FakeCommands:
    def __init__(self, vm: FakeAsyncSandbox) -> None:
        self.vm = vm

    async def run(
        self,
        cmd: str,
        background: bool | None = None,
        envs: dict[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        stdin: bool | None = None,
        timeout: float | None = 60,
        request_timeout: float | None = None,
        *,
        retain_output: bool = True,
    ) -> _Result:
        from e2b import CommandExitException
        from e2b.exceptions import TimeoutException

        self.vm.calls.append(("commands.run", {"cmd": cmd, "envs": dict(envs or {}), "cwd": cwd}))
        self.vm._check_alive()
        if FakeAsyncSandbox.hang_commands_matching and FakeAsyncSandbox.hang_commands_matching in cmd:
            # envd stops answering: the stream deadline (timeout) passes with no end event.
            await asyncio.sleep(timeout or 0)
            raise TimeoutException("context deadline exceeded")
        root = self.vm.root
        template = FakeAsyncSandbox.image_templates.get(self.vm.template)
        argv = [*_FAKE_VM_ROOT, "--bind", str(root / "workspace"), "/workspace"]
        argv += ["--bind", str(root / "tmp"), "/tmp", "--ro-bind", str(root / "localbin"), "/usr/local/bin"]
        if template is not None:
            argv += ["--ro-bind", str(template), "/opt/swerl/env"]
        argv += _FAKE_VM_ISOLATION
        for key, value in (envs or {}).items():
            argv += ["--setenv", key, value]
        argv += ["--chdir", cwd or "/", "/bin/bash", "-c", cmd]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        self.vm.running.add(proc)

        async def pump(stream: asyncio.StreamReader | None, sink: Callable[[str], Any] | None) -> None:
            assert stream is not None
            while chunk := await stream.read(65536):
                if sink is not None:
                    sink(chunk.decode(errors="replace"))

        try:
            async with asyncio.timeout(timeout or None):
                await asyncio.gather(pump(proc.stdout, on_stdout), pump(proc.stderr, on_stderr))
                code = await proc.wait()
        except TimeoutError as exc:
            raise TimeoutException("context deadline exceeded") from exc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            self.vm.running.discard(proc)
        self.vm._check_alive()
        if code != 0:
            raise CommandExitException(stderr=None, stdout=None, exit_code=code, error=None)
        return _Result(code)


class FakeFilesystem:
    def __init__(self, vm: FakeAsyncSandbox) -> None:
        self.vm = vm

    def _host(self, path: str) -> Path:
        from e2b.exceptions import InvalidArgumentException

        for prefix in ("/workspace", "/tmp"):
            if path == prefix or path.startswith(prefix + "/"):
                return self.vm.root / prefix.lstrip("/") / path[len(prefix) :].lstrip("/")
        raise InvalidArgumentException(f"fake e2b: {path} is outside the fake VM's writable dirs")

    async def read(
        self, path: str, format: str = "text", user: str | None = None, request_timeout: float | None = None
    ) -> str:
        from e2b.exceptions import FileNotFoundException

        self.vm._check_alive()
        host = self._host(path)
        if not host.is_file():
            raise FileNotFoundException(f"path '{path}' does not exist")
        return host.read_text()

    async def write(
        self, path: str, data: str | bytes, user: str | None = None, request_timeout: float | None = None
    ) -> None:
        self.vm._check_alive()
        host = self._host(path)
        host.parent.mkdir(parents=True, exist_ok=True)
        host.write_bytes(data.encode() if isinstance(data, str) else bytes(data))


class FakeAsyncSandbox:
    """Stands in for e2b.AsyncSandbox (class-level registry so tests can check what was created and killed)."""

    templates: ClassVar[set[str]] = {"swerl-base"}
    image_templates: ClassVar[dict[str, Path]] = {}
    """Templates made from a task image (swerl.sandbox.images.write_e2b_template): the repository their sandbox
    layer keeps at /opt/swerl/env, here a host directory bound there read-only."""
    created: ClassVar[list[FakeAsyncSandbox]] = []
    create_calls: ClassVar[list[dict[str, Any]]] = []
    rate_limited_creates: ClassVar[int] = 0
    """This many next create() calls raise RateLimitException (429)."""
    hang_commands_matching: ClassVar[str | None] = None
    root_dir: ClassVar[Path | None] = None

    def __init__(self, template: str, envs: dict[str, str]) -> None:
        self.sandbox_id = f"fake-{uuid.uuid4().hex[:8]}"
        self.template = template
        self.envs = envs
        self.root = Path(tempfile.mkdtemp(prefix="e2b-fake-", dir=self.root_dir))
        (self.root / "workspace").mkdir()
        (self.root / "tmp").mkdir()
        (self.root / "localbin").mkdir()  # the template's python-is-python3
        (self.root / "localbin" / "python").symlink_to("/usr/bin/python3")
        self.alive = True
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.running: set[asyncio.subprocess.Process] = set()
        self.commands = FakeCommands(self)
        self.files = FakeFilesystem(self)

    @classmethod
    def reset(cls, root_dir: Path | None = None) -> None:
        cls.templates = {"swerl-base"}
        cls.image_templates = {}
        cls.created = []
        cls.create_calls = []
        cls.rate_limited_creates = 0
        cls.hang_commands_matching = None
        cls.root_dir = root_dir

    @classmethod
    async def create(
        cls,
        template: str | None = None,
        timeout: int | None = None,
        metadata: dict[str, str] | None = None,
        envs: dict[str, str] | None = None,
        allow_internet_access: bool | None = None,
        **opts: Any,
    ) -> FakeAsyncSandbox:
        from e2b.exceptions import NotFoundException, RateLimitException

        call = {"template": template, "timeout": timeout, "metadata": metadata, "envs": dict(envs or {})}
        cls.create_calls.append(call | {"allow_internet_access": allow_internet_access, **opts})
        if cls.rate_limited_creates > 0:
            cls.rate_limited_creates -= 1
            raise RateLimitException("429: rate limit exceeded")
        if template not in cls.templates and template not in cls.image_templates:
            raise NotFoundException(f"template '{template}' not found")
        vm = cls(template or "base", dict(envs or {}))
        cls.created.append(vm)
        return vm

    def die(self) -> None:
        """The VM is gone (lifetime reached, host lost): every later call fails like the SDK's."""
        self.alive = False
        for proc in list(self.running):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def _check_alive(self) -> None:
        from e2b.exceptions import SandboxNotRunningException

        if not self.alive:
            raise SandboxNotRunningException("The sandbox was killed or reached its timeout")

    async def kill(self, **opts: Any) -> bool:
        was_alive = self.alive
        self.die()
        shutil.rmtree(self.root, ignore_errors=True)
        return was_alive


# ----------------------------------------------------------------------------------------------------------------
# Engine


def launch_emulated(
    log_dir: Path, latency_s: float = 0.05, output_tokens: int | None = 4, backlog: int | None = None
) -> Service:
    """SGLang's native HTTP API with no model behind it (swerl.engine.emulated_server), in its own process, healthy
    on return: SGLang needs a GPU. output_tokens None: the server's default; backlog: its listen backlog."""
    port = free_port()
    argv = [sys.executable, "-m", "swerl.engine.emulated_server"]
    argv += ["--port", str(port), "--latency-s", str(latency_s)]
    if output_tokens is not None:
        argv += ["--output-tokens", str(output_tokens)]
    if backlog is not None:
        argv += ["--backlog", str(backlog)]
    url = f"http://127.0.0.1:{port}/health"
    service = Service(f"emulated-{port}", argv, url, log_dir / f"emulated-{port}.log")
    service.stop_timeout_s = 5
    return service.start()


class FaultProxy:
    """Forwards an engine server's HTTP API to `upstream`; POST /fault queues faults for the next /generate calls:
    {"status": 503}, {"drop": true} (the connection closed), {"delay_s": s}, each `count` times. A real server
    fails only when it fails; the chaos run needs its faults on a seeded schedule. Serve it with aiohttp (an
    aiohttp.web app routing POST /fault to `fault` and everything else to `forward`) and set `session`."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.faults: list[dict[str, Any]] = []
        self.session: Any = None

    async def fault(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.json()
        self.faults += [dict(body)] * int(body.pop("count", 1))
        return web.json_response({"queued": len(self.faults)})

    async def forward(self, request: Any) -> Any:
        from aiohttp import ClientTimeout, web

        if request.path == "/generate" and self.faults:
            fault = self.faults.pop(0)
            if fault.get("drop"):
                assert request.transport is not None
                request.transport.close()
                return web.Response(status=500)
            if "status" in fault:
                return web.json_response({"error": {"message": "injected fault"}}, status=int(fault["status"]))
            await asyncio.sleep(float(fault.get("delay_s", 0.0)))
        body = await request.read()
        headers = {"Content-Type": request.content_type}
        url = self.upstream + request.path_qs
        timeout = ClientTimeout(total=None)
        async with self.session.request(request.method, url, data=body, headers=headers, timeout=timeout) as answer:
            return web.Response(body=await answer.read(), status=answer.status, content_type=answer.content_type)


CURRENT_RETRY: contextvars.ContextVar[int] = contextvars.ContextVar("current_retry", default=0)
"""The try of the episode running in this task (set by FailingEngine from the request id)."""


class FailingEngine:
    """Engine boundary fault, on every try of chosen attempts: HTTP 503 (engine_http) or a timeout (engine_timeout).
    Even groups lose attempt 1 (503 when seq % 4 == 0, else a timeout); odd groups lose attempts 0 (503) and 1
    (timeout), leaving one valid attempt: no baseline, the group is dropped. A real engine does not fail on cue;
    `inner` (an EmulatedEngine) answers the rest. Request ids are the agent's: group/attempt/retry."""

    @staticmethod
    def cause(seq: int, attempt: int) -> str | None:
        if seq % 2 == 0:
            return ("engine_http" if seq % 4 == 0 else "engine_timeout") if attempt == 1 else None
        return {0: "engine_http", 1: "engine_timeout"}.get(attempt)

    def __init__(self, inner: EmulatedEngine) -> None:
        self.inner = inner

    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        group, attempt, retry = (request.rid or "").split("/")
        CURRENT_RETRY.set(int(retry))  # the episode's own task context: its sandbox reads it (KillableSandbox)
        cause = self.cause(int(group[1:]), int(attempt))
        if cause == "engine_http":
            raise InfraError("engine_http", "HTTP 503 Service Unavailable")
        if cause == "engine_timeout":
            raise InfraError("engine_timeout", "no response in 60 s")
        return await self.inner.generate(request)

    async def update_weights_from_disk(self, model_path: str, weight_version: int) -> None:
        await self.inner.update_weights_from_disk(model_path, weight_version)

    async def health(self) -> bool:
        return True


class VersionEngine:
    """An engine that only records the weight versions it is given: the loops' tests are about which versions
    they publish, not about sampling."""

    def __init__(self) -> None:
        self.versions: list[int] = []

    async def update_weights_from_disk(self, path: str, version: int) -> None:
        self.versions.append(version)


# ----------------------------------------------------------------------------------------------------------------
# Sandboxes


class KillableSandbox:
    """Sandbox boundary fault: when told to, the real sandbox is closed (its processes killed) while its first
    command runs, which the real backend reports as InfraError(sandbox_died). A retry's sandbox is never killed
    (which first command a retry's is depends on timing: killing it too would make the failure permanent)."""

    def __init__(self, inner: Sandbox, provider: KillingProvider) -> None:
        self.inner, self.provider, self.commands = inner, provider, 0

    async def exec(self, cmd: str, timeout: float, cwd: str | None = None) -> ExecResult:
        self.commands += 1
        if self.commands > 1 or CURRENT_RETRY.get() > 0 or not self.provider.kill_next():
            return await self.inner.exec(cmd, timeout, cwd)
        running = asyncio.ensure_future(self.inner.exec("sleep 5; " + cmd, timeout, cwd))
        # Its failure is seen even if this task is cancelled before it awaits it.
        running.add_done_callback(lambda f: f.cancelled() or f.exception())
        await asyncio.sleep(0.2)
        await self.inner.close()
        return await running

    async def read_file(self, path: str) -> str:
        return await self.inner.read_file(path)

    async def write_file(self, path: str, content: str) -> None:
        await self.inner.write_file(path, content)

    async def close(self) -> None:
        await self.inner.close()


class KillingProvider:
    """Kills the 1st, 6th, 11th, ... first try's sandbox that runs a command (a transient failure: the retry works).
    A sandbox dies on its own only when something outside it goes wrong; this one dies on schedule."""

    def __init__(self, inner: LocalSandboxProvider) -> None:
        self.inner, self.first_commands = inner, 0

    def kill_next(self) -> bool:
        self.first_commands += 1
        return self.first_commands % 5 == 1

    async def start(self, env_dir: Path, setup_patch: str | None = None) -> Sandbox:
        return KillableSandbox(await self.inner.start(env_dir, setup_patch), self)


class RefusingProvider:
    """Refuses every start (so each task is an infra skip) and records which environment was asked for: the
    scheduling tests need the order of starts, not sandboxes (their images exist on no registry here)."""

    def __init__(self) -> None:
        self.started: list[str] = []

    async def start(self, env_dir: Environment, setup_patch: str | None = None) -> Sandbox:
        self.started.append(env_dir.image if isinstance(env_dir, ImageEnvironment) else str(env_dir))
        await asyncio.sleep(0)
        raise InfraError("start_failed", f"refused {env_dir}")


# ----------------------------------------------------------------------------------------------------------------
# Trainer


class CountingTrainer:
    """A PolicyTrainer that counts its updates (what matters to the loops' tests is whether the loop calls it, not
    what an update computes)."""

    def __init__(self) -> None:
        self.step = 0
        self.trained: list[list[list[Trajectory]]] = []

    def train_step(self, groups: Any) -> dict[str, float]:
        self.trained.append([list(group) for group in groups])
        self.step += 1
        return {
            "groups_dropped": 0.0,
            "time_update_s": 0.0,
            "time_logprob_recompute_s": 0.0,
            "reward_mean": 0.0,
        }

    def scored_attempts(self) -> list[tuple[str, int]]:
        return [(t.group_id, t.attempt) for group in self.trained[-1] for t in group if t.reward is not None]

    def export_weights(self, out_dir: str | Path, version: int | None = None) -> Path:
        path = Path(out_dir) / f"v{self.step}"
        path.mkdir(parents=True, exist_ok=True)
        return path
