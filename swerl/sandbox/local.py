"""Local sandboxes: private workspace, no network, no host secrets, resource limits; two runtimes.

The supervisor (runtime auto as root, or supervisor; swerl/sandbox/nsinit.c and supervisor.py) builds each
sandbox once in a namespace init of its own and runs each command with one fork and exec. Bubblewrap (bwrap.py;
runtime bubblewrap, or auto without the right to mount) runs every command in a fresh bubblewrap instance over the
sandbox's workspace. Both give the same sandbox: the task's repository bound read-write at /workspace, the host's
/usr (read-only), a minimal /etc, the interpreter's own prefix directories (read-only) and a bounded tmpfs /tmp;
processes run as a per-sandbox unprivileged uid with no capabilities, which is what makes the process limit bite
(the kernel never applies RLIMIT_NPROC to root), and none outlives its command. Under bubblewrap /tmp lasts one
command; under the supervisor, the sandbox. The provider here decides at its first start which runtime runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import tempfile
import threading
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from swerl.errors import InfraError
from swerl.sandbox.base import WORKSPACE, Environment, ImageEnvironment, SandboxResources, VenvEnvironment
from swerl.sandbox.bwrap import BubblewrapRuntime, LocalSandbox
from swerl.sandbox.hostprep import (
    ETC_FILES,
    GIT_BASELINE,
    SANDBOX_PREFIX,
    START_CHECK,
    MiB,
    ancestors,
    interpreter_dirs,
    own_tag,
    require_tools,
    sweep_dead_sandboxes,
)
from swerl.sandbox.images import ENV_SOURCE, build_task_layer
from swerl.sandbox.process import owner_alive
from swerl.sandbox.rootfs import exported_rootfs, rootfs_layout
from swerl.sandbox.supervisor import (
    Cgroups,
    Launcher,
    SupervisedSandbox,
    cache_dir,
    encode_start,
    helper_binary,
)
from swerl.sandbox.tmpfs import can_mount

log = logging.getLogger(__name__)


class LocalSandboxProvider(BubblewrapRuntime):
    """Starts LocalSandboxes: copies the environment directory, applies the setup patch, checks it runs."""

    def __init__(
        self,
        python_executable: str | os.PathLike[str],
        resources: SandboxResources,
        *,
        root_dir: str | os.PathLike[str] | None,
        workspace_quota: str,
        runtime: str,
        kill_grace_s: float = 10.0,
        extra_env: Mapping[str, str] | None = None,
        git_baseline: bool = False,
        uid_range: tuple[int, int] = (200_000, 1_200_000),
        bwrap: str = "bwrap",
        rootfs: Path | None = None,
        rootfs_path: str = "",
    ) -> None:
        """`root_dir`: where sandbox directories are made (None: the system temp dir); `workspace_quota` and
        `runtime` as SandboxLimits documents them. kill_grace_s, extra_env, uid_range and bwrap are not config.
        `rootfs` (with the PATH its commands get): sandboxes see that image root file system instead of the host's
        /usr, /etc and interpreter (swerl.sandbox.rootfs); the provider for one image task makes such a child."""
        if workspace_quota not in ("auto", "tmpfs", "none"):
            raise ValueError(f"workspace_quota must be auto, tmpfs or none, not {workspace_quota!r}")
        if runtime not in ("auto", "supervisor", "bubblewrap"):
            raise ValueError(f"runtime must be auto, supervisor or bubblewrap, not {runtime!r}")
        if runtime == "supervisor" and workspace_quota == "none":
            raise ValueError("runtime supervisor always caps the workspace: it cannot run with workspace_quota none")
        self.python_executable = os.path.abspath(python_executable)
        self.resources = resources
        self._python_ok = False
        self.kill_grace_s = kill_grace_s
        self.extra_env = dict(extra_env or {})
        self.git_baseline = git_baseline
        self.root_dir = Path(root_dir) if root_dir is not None else None
        self.uid_range = uid_range
        self.bwrap = bwrap
        self.workspace_quota = workspace_quota
        self.runtime = runtime
        """auto: the supervisor (swerl/sandbox/nsinit.c) where this process may mount and it can be built, else
        bubblewrap."""
        self.rootfs = rootfs
        self.rootfs_path = rootfs_path
        self._images: dict[ImageEnvironment, LocalSandboxProvider] = {}
        self._images_lock = asyncio.Lock()
        self._pythons: dict[str, LocalSandboxProvider] = {}
        self._launcher: Launcher | None = None
        self._mount: bool | None = None
        self._first_start_lock = threading.Lock()  # decided at the first start (auto: whether this process may mount)
        self._tools: dict[str, str] | None = None
        self._python_dirs: list[str] | None = None
        self._seccomp: bytes | None = None
        self._cgroups: Cgroups | None = None
        """Per-sandbox memory and pids cgroups (supervisor runtime), decided at the first start; None: rlimits only."""

    def limits(self) -> dict[str, int | float]:
        """Every limit this provider enforces, for logging at start (workspace_mb 0: the workspace is uncapped), with
        the runtime decided first: memory_per_sandbox 1 where a cgroup caps each sandbox's memory (the supervisor,
        as root), 0 where memory_mb caps each process's address space (bubblewrap: N processes, up to N x memory_mb)."""
        if self._mount is None:  # decided as a first start decides it (which needs the interpreter's directories)
            if self._python_dirs is None:
                self._python_dirs = [] if self.rootfs is not None else interpreter_dirs(self.python_executable)
            self._first_start()
        return {
            **dataclasses.asdict(self.resources),
            "workspace_mb": self.resources.workspace_mb if self._mount is not False else 0,
            "memory_per_sandbox": 1 if self._cgroups is not None else 0,
        }

    async def start(
        self, env_dir: Environment, setup_patch: str | None = None, env: Mapping[str, str] | None = None
    ) -> LocalSandbox | SupervisedSandbox:
        """A sandbox whose /workspace is a private copy of env_dir with `setup_patch` (a unified diff) applied; for
        an image, a sandbox over the image's exported root file system (`image_provider`); for a directory with an
        interpreter of its own (VenvEnvironment), a sandbox running that interpreter (`python_provider`)."""
        if isinstance(env_dir, ImageEnvironment):
            child = await self.image_provider(env_dir)
            assert child.rootfs is not None
            return await child.start(child.rootfs / ENV_SOURCE.lstrip("/"), setup_patch, env)
        if isinstance(env_dir, VenvEnvironment):
            return await self.python_provider(env_dir.python).start(env_dir.path, setup_patch, env)
        if self._python_dirs is None and self.rootfs is not None:
            self._python_dirs = []  # the image brings its own interpreter
        if self._python_dirs is None:
            self._python_dirs = await asyncio.to_thread(interpreter_dirs, self.python_executable)
        env_dir = Path(env_dir).absolute()
        if not env_dir.is_dir():
            raise InfraError("image_missing", f"environment directory {env_dir} does not exist")
        if self._mount is None:  # the first start
            self._mount = await asyncio.to_thread(self._first_start)
        if self._launcher is not None:
            return await self._start_supervised(env_dir, setup_patch, env or {})
        return await self._start_bubblewrap(env_dir, setup_patch, env or {})

    def _new_uid(self) -> int:
        """A random uid of uid_range for one sandbox."""
        return self.uid_range[0] + secrets.randbelow(self.uid_range[1] - self.uid_range[0])

    def _first_start(self) -> bool:
        """Once per provider: remove dead runs' sandbox directories, then decide the runtime and workspace kind."""
        if self.root_dir is not None:
            self.root_dir.mkdir(parents=True, exist_ok=True)
        with self._first_start_lock:  # concurrent first starts: one decides, the others take its decision
            if self._mount is None:
                self._mount = self._decide_runtime()
            return self._mount

    def _decide_runtime(self) -> bool:
        removed = sweep_dead_sandboxes(self._parent())
        if removed:
            log.warning("removed %d sandbox directories of dead runs under %s", len(removed), self._parent())
        if self.runtime != "bubblewrap" and self.workspace_quota != "none":
            allowed, why = can_mount(self._parent())
            helper = None
            if allowed:
                try:
                    helper = helper_binary()
                except InfraError as exc:
                    if self.runtime == "supervisor":
                        raise
                    allowed, why = False, str(exc)
                    log.warning("local sandboxes run under bubblewrap: %s", why)
            if allowed and helper is not None:
                self._cgroups = self._decide_cgroups()
                # Every init mounts its sandbox's tmpfs on this one empty directory, each in its own mount
                # namespace: the host sees nothing there, and a start makes no directory of its own. Named after
                # this process like a sandbox directory, so a dead run's is swept.
                prefix = f"{SANDBOX_PREFIX}{own_tag(os.getpid())}-mnt-"
                mount_point = Path(tempfile.mkdtemp(prefix=prefix, dir=self.root_dir)).resolve()
                self._launcher = Launcher(helper, self._supervisor_config(), mount_point)
                weakref.finalize(self, self._launcher.shutdown)
                return True
            if self.runtime == "supervisor":
                raise InfraError("start_failed", f"runtime supervisor needs root (CAP_SYS_ADMIN): {why}")
        if self._tools is None:
            self._tools = require_tools(self.bwrap)
        return self._decide_mount()

    async def image_provider(self, env: ImageEnvironment) -> LocalSandboxProvider:
        """The provider of this image's sandboxes: same limits and runtime, over the root file system of the image
        with swerl's sandbox layer, exported once per image id through a Docker engine (never pulled)."""
        async with self._images_lock:
            if env not in self._images:
                rootfs, path = await asyncio.to_thread(self._export_image, env)
                self._images[env] = LocalSandboxProvider(
                    self.python_executable,
                    self.resources,
                    root_dir=self.root_dir,
                    workspace_quota=self.workspace_quota,
                    runtime=self.runtime,
                    kill_grace_s=self.kill_grace_s,
                    extra_env=self.extra_env,
                    git_baseline=self.git_baseline,
                    uid_range=self.uid_range,
                    bwrap=self.bwrap,
                    rootfs=rootfs,
                    rootfs_path=":".join([*env.path_prepend, path]),
                )
            return self._images[env]

    def python_provider(self, python: str) -> LocalSandboxProvider:
        """The provider of sandboxes running `python` (a repository's own virtualenv) instead of this provider's
        interpreter: same limits and runtime, that interpreter's prefix bound read-only and its bin/ first on
        PATH. This provider itself when it already runs that interpreter; one child per interpreter."""
        python = os.path.abspath(python)
        if python == self.python_executable:
            return self
        if self.rootfs is not None:
            raise InfraError(
                "image_missing",
                f"a sandbox over an image's root file system cannot run host interpreter {python}",
            )
        if python not in self._pythons:
            self._pythons[python] = LocalSandboxProvider(
                python,
                self.resources,
                root_dir=self.root_dir,
                workspace_quota=self.workspace_quota,
                runtime=self.runtime,
                kill_grace_s=self.kill_grace_s,
                extra_env=self.extra_env,
                git_baseline=self.git_baseline,
                uid_range=self.uid_range,
                bwrap=self.bwrap,
            )
        return self._pythons[python]

    def _export_image(self, env: ImageEnvironment) -> tuple[Path, str]:
        """(the exported root file system, the image's PATH); InfraError(image_missing) saying what is missing."""
        try:
            import docker

            client = docker.from_env(timeout=300)
            client.ping()
        except Exception as exc:  # the SDK raises several types; all mean "no engine to export from"
            raise InfraError(
                "image_missing",
                f"image {env.image}: the local backend runs an image from its files, exported once through a "
                f"Docker engine, and none is reachable ({exc})",
            ) from exc
        try:
            try:
                client.images.get(env.image)
            except docker.errors.ImageNotFound:
                raise InfraError(
                    "image_missing",
                    f"image {env.image} is not on this Docker engine (the local backend never pulls)",
                ) from None
            try:
                tag, path, _ = build_task_layer(client, env.image, env.repo_dir)
                rootfs = exported_rootfs(client, tag, cache_dir() / "rootfs")
            except (RuntimeError, docker.errors.DockerException) as exc:
                raise InfraError("image_missing", f"cannot export image {env.image}: {exc}") from exc
        finally:
            client.close()
        return rootfs, path or "/usr/local/bin:/usr/bin:/bin"

    @property
    def mount_point(self) -> Path | None:
        """The supervisor's one (empty) host directory its inits mount on; None under bubblewrap."""
        return self._launcher.mount_point if self._launcher is not None else None

    def close(self) -> None:
        """End the supervisor's zygote, if any, and its image and interpreter providers' (sandboxes still open stay
        open until closed)."""
        if self._launcher is not None:
            self._launcher.shutdown()
        for child in [*self._images.values(), *self._pythons.values()]:
            child.close()

    def _decide_cgroups(self) -> Cgroups | None:
        """Per-sandbox cgroups where they can be made; else a warning (once per provider): rlimits only."""
        cgroups, why = Cgroups.detect()
        if cgroups is None:
            log.warning(
                "local sandboxes: no per-sandbox cgroup (%s); memory_mb bounds each process's address space, "
                "not the sandbox (its processes together may use more), and max_processes is per uid",
                why,
            )
            return None
        cgroups.sweep(owner_alive)
        return cgroups

    def _supervisor_config(self) -> dict[str, Any]:
        """What every sandbox of this provider shares: its file system layout, limits and workspace rules."""
        with open("/proc/sys/kernel/cap_last_cap") as file:
            cap_last_cap = int(file.read())
        return {
            "layout": self._layout(),
            "workspace": WORKSPACE,
            "workspace_mb": self.resources.workspace_mb,
            "rlimits": {
                # with a memory cgroup the sandbox as a whole is capped (an address space is not memory used)
                **({} if self._cgroups is not None else {"as": self.resources.memory_mb * MiB}),
                "nproc": self.resources.max_processes,
                "cpu": self.resources.cpu_time_s,
                "fsize": self.resources.file_size_mb * MiB,
                "nofile": self.resources.max_open_files,
                "core": 0,
            },
            "cap_last_cap": cap_last_cap,
            "ignore_names": ["__pycache__", ".pytest_cache"],
            "ignore_suffixes": [".pyc"],
        }

    def _layout(self) -> list[list[Any]]:
        """The supervisor's mount plan: the same file system _bwrap_args gives bubblewrap."""
        assert self._python_dirs is not None
        if self.rootfs is not None:
            return [
                *rootfs_layout(self.rootfs),
                ["proc", "/proc"],
                ["dev", "/dev"],
                ["tmpfs", "/tmp", self.resources.tmp_size_mb, 0o1777],
            ]
        layout: list[list[Any]] = [["ro-bind", "/usr", "/usr"]]
        for link in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = Path("/") / link
            if host.is_symlink():
                layout.append(["symlink", f"/{link}", os.readlink(host)])
            elif host.is_dir():
                layout.append(["ro-bind", f"/{link}", str(host)])
        layout.append(["dir", "/etc", 0o755])
        # Small files are copied (a bind costs two mount calls now and one at teardown).
        for name in ETC_FILES:
            kind = "ro-bind-try" if os.path.isdir(f"/etc/{name}") else "copy-try"
            layout.append([kind, f"/etc/{name}", f"/etc/{name}"])
        layout += [["proc", "/proc"], ["dev", "/dev"], ["tmpfs", "/tmp", self.resources.tmp_size_mb, 0o1777]]
        made: set[str] = {"/usr", "/etc", "/tmp"}
        for prefix in self._python_dirs:
            for parent in ancestors(prefix):
                if parent not in made:
                    layout.append(["dir", parent, 0o755])
                    made.add(parent)
            layout.append(["ro-bind", prefix, prefix])
        return layout

    def _environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """A command's whole environment: the base, then the provider's extra_env, then the sandbox's own."""
        python_bin = str(Path(self.python_executable).parent)
        base_env = {
            "PATH": self.rootfs_path or f"{python_bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONUNBUFFERED": "1",
            "USER": "sandbox",
        }
        return {**base_env, **self.extra_env, **env}

    async def _start_supervised(
        self, env_dir: Path, setup_patch: str | None, env: Mapping[str, str]
    ) -> SupervisedSandbox:
        """A sandbox from the supervisor: its init copies env_dir into the workspace; git runs as its first commands."""
        # Over 60 lines: the start and its setup steps share one cleanup: any failure closes the sandbox.
        assert self._launcher is not None
        uid = self._new_uid()
        root = self._launcher.mount_point
        cgroups: list[Path] = []
        if self._cgroups is not None:
            name = f"{SANDBOX_PREFIX}{own_tag(os.getpid())}-{uid}-{secrets.token_hex(4)}"
            cgroups = self._cgroups.create(name, self.resources.memory_mb, self.resources.max_processes)
        try:
            control = await self._launcher.start(
                encode_start(str(root), uid, str(env_dir), self._environment(env), [str(c) for c in cgroups])
            )
        except BaseException:
            Cgroups.remove(cgroups)
            raise
        sandbox = SupervisedSandbox(
            root,
            uid,
            control,
            0,
            self.resources.max_output_bytes,
            self.kill_grace_s,
            on_close=(lambda: Cgroups.remove(cgroups)) if cgroups else None,
        )
        sandbox.cgroups = cgroups
        try:
            try:
                sandbox.init_pid = await asyncio.wait_for(
                    asyncio.shield(control.started), self.resources.start_timeout_s
                )
            except TimeoutError:
                raise InfraError(
                    "start_timeout", f"sandbox did not start within {self.resources.start_timeout_s}s"
                ) from None
            sandbox.workspace = Path(f"/proc/{sandbox.init_pid}/root{WORKSPACE}")
            steps: list[tuple[str, str | None]] = []
            if setup_patch:
                steps.append(("git apply --whitespace=nowarn -", setup_patch))
            if self.git_baseline:
                steps.append((GIT_BASELINE, None))
            if not self._python_ok:
                steps.append((START_CHECK, None))
            for script, stdin in steps:
                argv = ["/bin/bash", "-c", script]
                result = await sandbox._run(
                    argv, self.resources.start_timeout_s, WORKSPACE, None if stdin is None else stdin.encode()
                )
                if result.timed_out:
                    raise InfraError("start_timeout", f"sandbox did not start within {self.resources.start_timeout_s}s")
                if result.exit_code != 0:
                    what = "setup patch does not apply to" if stdin is not None else "sandbox start check failed for"
                    raise InfraError("start_failed", f"{what} {env_dir}: {result.output.strip()}")
        except BaseException:
            await asyncio.shield(sandbox.close())
            raise
        self._python_ok = True
        return sandbox

    def _parent(self) -> Path:
        """Where sandbox directories are made."""
        return self.root_dir or Path(tempfile.gettempdir())
