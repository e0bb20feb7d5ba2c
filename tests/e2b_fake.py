"""A FAKE of the e2b SDK's AsyncSandbox, the cloud boundary that cannot run here (no network, no API key).

It has the SDK's method shapes (`AsyncSandbox.create`, `.commands.run`, `.files.read/.write`, `.kill`,
`.sandbox_id`) and raises the SDK's own exception classes (`e2b.exceptions`, `e2b.CommandExitException`), so
swerl.sandbox.e2b runs against it unchanged. The "VM" is a directory with workspace/ and tmp/, and commands
really run, under bubblewrap with no network, as uid 1000 (e2b's `user`), with exactly the `envs` they were given
(like envd); it has no resource limits, so it is not for the security suite. Knobs on the
class inject the failures the cloud can produce (rate limit, missing template, VM killed, hung command).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from e2b import CommandExitException
from e2b.exceptions import (
    FileNotFoundException,
    InvalidArgumentException,
    NotFoundException,
    RateLimitException,
    SandboxNotRunningException,
    TimeoutException,
)


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
        self.vm.calls.append(("commands.run", {"cmd": cmd, "envs": dict(envs or {}), "cwd": cwd}))
        self.vm._check_alive()
        if FakeAsyncSandbox.hang_commands_matching and FakeAsyncSandbox.hang_commands_matching in cmd:
            # envd stops answering: the stream deadline (timeout) passes with no end event.
            await asyncio.sleep(timeout or 0)
            raise TimeoutException("context deadline exceeded")
        argv = [
            "bwrap", "--tmpfs", "/", "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
            "--symlink", "usr/sbin", "/sbin", "--dev", "/dev", "--proc", "/proc",
            "--bind", str(self.vm.root / "workspace"), "/workspace",
            "--bind", str(self.vm.root / "tmp"), "/tmp",
            "--ro-bind", str(self.vm.root / "localbin"), "/usr/local/bin",
            *(["--ro-bind", str(FakeAsyncSandbox.image_templates[self.vm.template]), "/opt/swerl/env"]
              if self.vm.template in FakeAsyncSandbox.image_templates else []),
            "--unshare-all", "--unshare-user", "--uid", "1000", "--gid", "1000",  # e2b's `user`
            "--die-with-parent", "--clearenv",
        ]  # fmt: skip
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
        for prefix in ("/workspace", "/tmp"):
            if path == prefix or path.startswith(prefix + "/"):
                return self.vm.root / prefix.lstrip("/") / path[len(prefix) :].lstrip("/")
        raise InvalidArgumentException(f"fake e2b: {path} is outside the fake VM's writable dirs")

    async def read(self, path: str, format: str = "text", user: str | None = None,
                   request_timeout: float | None = None) -> str:  # fmt: skip
        self.vm._check_alive()
        host = self._host(path)
        if not host.is_file():
            raise FileNotFoundException(f"path '{path}' does not exist")
        return host.read_text()

    async def write(self, path: str, data: str | bytes, user: str | None = None,
                    request_timeout: float | None = None) -> None:  # fmt: skip
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
        cls.create_calls.append({"template": template, "timeout": timeout, "metadata": metadata,
                                 "envs": dict(envs or {}), "allow_internet_access": allow_internet_access,
                                 **opts})  # fmt: skip
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
        if not self.alive:
            raise SandboxNotRunningException("The sandbox was killed or reached its timeout")

    async def kill(self, **opts: Any) -> bool:
        was_alive = self.alive
        self.die()
        shutil.rmtree(self.root, ignore_errors=True)
        return was_alive
