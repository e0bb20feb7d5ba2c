"""E2B sandboxes: one cloud micro-VM per trajectory, from the template built in images/e2b/.

The repository is uploaded as a tar into /workspace at start and the setup patch applied there, so any
environment directory works; per-repository templates (images/e2b/) make that upload small. A command runs under
coreutils `timeout` inside the VM: overrunning its timeout is an observation (exit 124, `timed_out`), and only a
command that does not come back `exec_grace_s` later is InfraError(exec_unresponsive). SDK errors map to
InfraError causes (`infra_cause`). Nothing from the host environment reaches the VM: its variables are exactly
SANDBOX_ENV plus what the caller passes; the API key goes to the SDK's connection, never into `envs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shlex
import tarfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
from swerl.sandbox.images import ENV_SOURCE
from swerl.sandbox.process import BoundedOutput

SANDBOX_ENV: dict[str, str] = {
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
}
"""The whole environment of a command in an e2b sandbox (the template's PATH has the task's Python first)."""

_COPY_IGNORE = {"__pycache__", ".pytest_cache"}
_UPLOAD = "/tmp/swerl-env.tar"
_PATCH = "/tmp/swerl-setup.patch"


def infra_cause(exc: BaseException, during: str) -> str:
    """The InfraError cause of an e2b SDK exception; `during` is 'start' or 'exec' (the same error means
    a different thing when creating a sandbox than when talking to a running one)."""
    from e2b import exceptions as e2b_exc

    if isinstance(exc, e2b_exc.RateLimitException | e2b_exc.ServiceBusyException):
        return "quota"
    if during == "start":
        if isinstance(exc, e2b_exc.NotFoundException):
            return "image_missing"  # the template does not exist
        if isinstance(exc, e2b_exc.TimeoutException | TimeoutError):
            return "start_timeout"
        return "start_failed"
    if isinstance(exc, e2b_exc.SandboxNotRunningException | e2b_exc.SandboxNotFoundException):
        return "sandbox_died"
    if isinstance(exc, e2b_exc.TimeoutException | TimeoutError):
        return "exec_unresponsive"  # includes SandboxUnreachableException: running, but envd does not answer
    return "sandbox_died"


class E2BSandbox:
    """A running e2b sandbox seen through the Sandbox protocol."""

    def __init__(
        self,
        sdk_sandbox: Any,
        *,
        env: Mapping[str, str],
        exec_grace_s: float,
        request_timeout_s: float,
        max_output_bytes: int,
    ) -> None:
        self.sdk_sandbox = sdk_sandbox
        self.sandbox_id: str = str(getattr(sdk_sandbox, "sandbox_id", ""))
        self._env = dict(env)
        self._exec_grace_s = exec_grace_s
        self._request_timeout_s = request_timeout_s
        self._max_output_bytes = max_output_bytes
        self._closed = False

    async def exec(self, cmd: str, timeout: float, cwd: str | None = None) -> ExecResult:
        """Run `cmd` with bash; at `timeout` the in-VM `timeout` kills its process group (exit 124)."""
        from e2b import CommandExitException

        self._check_open()
        output = BoundedOutput(self._max_output_bytes)
        limit = f"{max(timeout, 0.001):.3f}"
        wrapped = f"exec 2>&1; timeout -k 2 {limit} /bin/bash -c {shlex.quote(cmd)}"
        started = time.monotonic()
        try:
            result = await self.sdk_sandbox.commands.run(
                wrapped,
                envs=self._env,
                cwd=cwd or WORKSPACE,
                on_stdout=lambda text: output.add(text.encode()),
                on_stderr=lambda text: output.add(text.encode()),
                timeout=timeout + self._exec_grace_s,
                request_timeout=self._request_timeout_s,
                retain_output=False,
            )
            exit_code = int(result.exit_code)
        except CommandExitException as exc:
            exit_code = int(exc.exit_code)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise InfraError(infra_cause(exc, "exec"), f"e2b {self.sandbox_id}: {exc}") from exc
        duration = time.monotonic() - started
        # `timeout` answers 124 after TERM, 137 when it had to KILL the group (itself included).
        timed_out = exit_code in (124, 137) and duration >= timeout
        return ExecResult(
            exit_code=124 if timed_out else exit_code,
            output=output.text(),
            timed_out=timed_out,
            duration_s=duration,
        )

    async def read_file(self, path: str) -> str:
        from e2b.exceptions import FileNotFoundException

        self._check_open()
        try:
            return str(await self.sdk_sandbox.files.read(self._abs(path), request_timeout=self._request_timeout_s))
        except FileNotFoundException as exc:
            raise FileNotFoundError(f"cannot read {path} in sandbox: {exc}") from exc
        except Exception as exc:
            raise InfraError(infra_cause(exc, "exec"), f"e2b {self.sandbox_id}: {exc}") from exc

    async def write_file(self, path: str, content: str) -> None:
        from e2b.exceptions import InvalidArgumentException, NotEnoughSpaceException

        target = self._abs(path)
        if not (target == WORKSPACE or target.startswith(WORKSPACE + "/")):
            raise ValueError(f"write_file({path!r}): only paths under {WORKSPACE} are writable")
        self._check_open()
        try:
            await self.sdk_sandbox.files.write(target, content, request_timeout=self._request_timeout_s)
        except (NotEnoughSpaceException, InvalidArgumentException) as exc:
            raise OSError(f"cannot write {path} in sandbox: {exc}") from exc  # the policy's doing
        except Exception as exc:
            raise InfraError(infra_cause(exc, "exec"), f"e2b {self.sandbox_id}: {exc}") from exc

    async def close(self) -> None:
        """Kill the VM (everything in it goes with it); idempotent, never raises for a VM already gone."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            await self.sdk_sandbox.kill(request_timeout=self._request_timeout_s)

    def _check_open(self) -> None:
        if self._closed:
            raise InfraError("sandbox_died", f"e2b sandbox {self.sandbox_id} is closed")

    @staticmethod
    def _abs(path: str) -> str:
        return os.path.normpath(path if path.startswith("/") else f"{WORKSPACE}/{path}")


def pack_environment(env_dir: Path) -> bytes:
    """The environment directory as an uncompressed tar (caches left out)."""

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(info.name).parts
        if any(p in _COPY_IGNORE for p in parts) or info.name.endswith(".pyc"):
            return None
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(env_dir, arcname=".", filter=keep)
    return buffer.getvalue()


class E2BSandboxProvider:
    """Starts E2BSandboxes from a template: create the VM, upload the environment, apply the setup patch."""

    def __init__(
        self,
        resources: SandboxResources,
        *,
        template: str,
        lifetime_s: int,
        request_timeout_s: float,
        exec_grace_s: float,
        image_templates: Mapping[str, str] | None = None,
        git_baseline: bool = False,
        api_key: str | None = None,
        sdk: Any = None,
    ) -> None:
        """Of `resources` only max_output_bytes and start_timeout_s apply (the template sizes the VM); the rest are
        E2BConfig's fields. api_key: None reads E2B_API_KEY at start; sdk: a stand-in for e2b.AsyncSandbox."""
        self.resources = resources
        self.template = template
        self.image_templates = dict(image_templates or {})
        self.lifetime_s = lifetime_s
        self.request_timeout_s = request_timeout_s
        self.exec_grace_s = exec_grace_s
        self.git_baseline = git_baseline
        self._api_key = api_key
        self._sdk = sdk

    def limits(self) -> dict[str, int | float]:
        """Every limit this provider enforces, for logging at start."""
        return {
            "e2b.lifetime_s": self.lifetime_s,
            "start_timeout_s": self.resources.start_timeout_s,
            "e2b.request_timeout_s": self.request_timeout_s,
            "e2b.exec_grace_s": self.exec_grace_s,
            "max_output_bytes": self.resources.max_output_bytes,
        }

    def _sdk_class(self) -> Any:
        if self._sdk is None:
            try:
                from e2b import AsyncSandbox
            except ImportError as exc:
                raise InfraError("start_failed", "the e2b backend needs the e2b extra: pip install swerl[e2b]") from exc
            self._sdk = AsyncSandbox
        return self._sdk

    async def start(
        self, env_dir: Environment, setup_patch: str | None = None, env: Mapping[str, str] | None = None
    ) -> E2BSandbox:
        """A fresh VM whose /workspace holds the environment's repository with setup_patch applied: env_dir
        uploaded into the base template, or an image's repository copied within the template built from it."""
        template, payload, name = self.template, None, ""
        if isinstance(env_dir, VenvEnvironment):
            raise InfraError(
                "image_missing",
                f"the e2b backend cannot run {env_dir.path} with its own virtualenv ({env_dir.python}): its "
                "template brings one interpreter; run tasks curated from real repositories on the local or "
                "docker backend",
            )
        if isinstance(env_dir, ImageEnvironment):
            template, name = self._image_template(env_dir), env_dir.image
        else:
            env_dir = Path(env_dir)
            if not env_dir.is_dir():
                raise InfraError("image_missing", f"environment directory {env_dir} does not exist")
            name = env_dir.name
        api_key = self._api_key or os.environ.get("E2B_API_KEY")
        if not api_key:
            raise InfraError("start_failed", "the e2b backend needs E2B_API_KEY in the environment")
        sdk = self._sdk_class()
        if not isinstance(env_dir, ImageEnvironment):
            payload = await asyncio.to_thread(pack_environment, env_dir)
        sandbox_env = {**SANDBOX_ENV, **(env or {})}
        if isinstance(env_dir, ImageEnvironment) and env_dir.path_prepend:
            sandbox_env["PATH"] = ":".join(
                [*env_dir.path_prepend, sandbox_env.get("PATH", "/usr/local/bin:/usr/bin:/bin")]
            )
        sdk_sandbox = await self._create(sdk, template, sandbox_env, name, api_key)
        sandbox = E2BSandbox(
            sdk_sandbox,
            env=sandbox_env,
            exec_grace_s=self.exec_grace_s,
            request_timeout_s=self.request_timeout_s,
            max_output_bytes=self.resources.max_output_bytes,
        )
        try:
            async with asyncio.timeout(self.resources.start_timeout_s):
                await self._populate(sandbox, payload, setup_patch)
        except BaseException as exc:
            await sandbox.close()
            if isinstance(exc, TimeoutError):
                raise InfraError(
                    "start_timeout", f"e2b workspace upload over {self.resources.start_timeout_s}s"
                ) from exc
            raise
        return sandbox

    async def _create(self, sdk: Any, template: str, sandbox_env: dict[str, str], name: str, api_key: str) -> Any:
        """The VM from `template`, without internet access; a failure is an InfraError naming its cause."""
        try:
            async with asyncio.timeout(self.resources.start_timeout_s):
                return await sdk.create(
                    template=template,
                    timeout=self.lifetime_s,
                    envs=dict(sandbox_env),
                    metadata={"swerl.env": name},
                    allow_internet_access=False,
                    api_key=api_key,
                    request_timeout=self.request_timeout_s,
                )
        except InfraError:
            raise
        except Exception as exc:
            raise InfraError(infra_cause(exc, "start"), f"e2b create ({template}): {exc}") from exc

    def _image_template(self, env: ImageEnvironment) -> str:
        template = self.image_templates.get(env.image)
        if template is None:
            raise InfraError(
                "image_missing",
                f"no e2b template for image {env.image}: write one with `python -m swerl.sandbox.images "
                f"e2b-template {env.image} DIR`, build it there with `e2b template build` and name it in "
                "agent.sandbox.e2b.image_templates",
            )
        return template

    async def _populate(self, sandbox: E2BSandbox, payload: bytes | None, setup_patch: str | None) -> None:
        """The workspace filled (the upload unpacked, or, in an image's template, the repository its sandbox
        layer keeps at ENV_SOURCE copied: swerl.sandbox.images.write_e2b_template), the setup patch applied, the
        git baseline made."""
        try:
            if payload is not None:
                await sandbox.sdk_sandbox.files.write(_UPLOAD, payload, request_timeout=self.request_timeout_s)
            if setup_patch:
                await sandbox.sdk_sandbox.files.write(_PATCH, setup_patch, request_timeout=self.request_timeout_s)
        except Exception as exc:
            raise InfraError(infra_cause(exc, "exec"), f"e2b upload: {exc}") from exc
        git = "git -c user.name=swerl -c user.email=swerl@localhost -c init.defaultBranch=main"
        if payload is None:
            fill = f"cp -a {ENV_SOURCE}/. {WORKSPACE}/"
        else:
            fill = f"mkdir -p {WORKSPACE} && tar -xf {_UPLOAD} -C {WORKSPACE} && rm -f {_UPLOAD}"
        steps = [
            ("upload", fill, "/"),
            ("setup patch", f"git apply --whitespace=nowarn {_PATCH} && rm -f {_PATCH}", WORKSPACE),
            (
                "git baseline",
                f"{git} init -q && {git} add -A && {git} commit -q --no-verify -m start"
                f" && {git} {IGNORED_AT_START_CMD}",
                WORKSPACE,
            ),
        ]
        for what, step, cwd in steps:
            if (what == "setup patch" and not setup_patch) or (what == "git baseline" and not self.git_baseline):
                continue
            result = await sandbox.exec(step, timeout=self.resources.start_timeout_s, cwd=cwd)
            if result.exit_code != 0:
                raise InfraError("start_failed", f"e2b {what} failed: {result.output.strip()}")
