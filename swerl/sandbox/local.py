"""Local sandboxes: private workspace, no network, no host secrets, resource limits; two runtimes.

The supervisor (runtime auto as root, or supervisor; swerl/sandbox/nsinit.c and supervisor.py) builds each
sandbox once in a namespace init of its own and runs each command with one fork and exec. Bubblewrap (runtime
bubblewrap, or auto without the right to mount) runs every command in a fresh bubblewrap instance over the
sandbox's workspace. Both give the same sandbox: the task's repository bound read-write at /workspace, the host's
/usr (read-only), a minimal /etc, the interpreter's own prefix directories (read-only) and a bounded tmpfs /tmp;
processes run as a per-sandbox unprivileged uid with no capabilities, which is what makes the process limit bite
(the kernel never applies RLIMIT_NPROC to root), and none outlives its command. Under bubblewrap /tmp lasts one
command; under the supervisor, the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
import weakref
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
from swerl.sandbox.hostprep import ancestors, interpreter_dirs, require_tools
from swerl.sandbox.images import ENV_SOURCE, build_task_layer
from swerl.sandbox.process import (
    BoundedOutput,
    CommandSandbox,
    kill_group,
    kill_processes_mentioning,
    owner_alive,
    owner_tag,
    read_status,
)
from swerl.sandbox.rootfs import bwrap_rootfs_args, exported_rootfs, rootfs_layout
from swerl.sandbox.supervisor import (
    Cgroups,
    Launcher,
    SupervisedSandbox,
    cache_dir,
    encode_start,
    helper_binary,
    seccomp_program,
)
from swerl.sandbox.tmpfs import TmpfsHolder, can_hold_tmpfs, can_mount, hold_tmpfs, holder_tools

log = logging.getLogger(__name__)

_ETC_FILES = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf")
"""Host /etc entries a sandbox sees (dynamic linker and locale plumbing; nothing with credentials)."""

_GIT = ["git", "-c", "user.name=swerl", "-c", "user.email=swerl@localhost", "-c", "init.defaultBranch=main"]
_GIT_BASELINE = (
    " && ".join(
        shlex.join([*_GIT, *args])
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "--no-verify", "-m", "task start"])
    )
    + f" && {shlex.join(_GIT)} {IGNORED_AT_START_CMD}"
)
"""git_baseline: the agent's patch is later `git diff` against this commit, the task's starting state."""

_START_CHECK = "test -w /workspace && python -c 'pass'"
"""A provider's first start runs this in its sandbox: the workspace is writable and the interpreter runs."""

_COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")

MiB = 1024 * 1024

SANDBOX_PREFIX = "swerl-sbx-"
_OWNED = re.compile(rf"^{SANDBOX_PREFIX}(\d+-\d+)-")
"""A sandbox directory is named `swerl-sbx-PID-STARTTIME-RANDOM` after the process that made it (owner_tag)."""


def sweep_dead_sandboxes(parent: Path) -> list[Path]:
    """Remove the sandbox directories under `parent` whose owning process is gone (a run that was SIGKILLed).

    A run that dies leaves its directories behind: empty ones (the tmpfs died with its holder) or whole workspaces
    (workspace_quota none). The owner in the name tells a dead run's directory from a live one of another run,
    which emptiness cannot. Directories without an owner in their name, and mount points, are left alone.
    """
    removed: list[Path] = []
    try:
        entries = list(os.scandir(parent))
    except FileNotFoundError:
        return removed
    for entry in entries:
        match = _OWNED.match(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False) or owner_alive(match.group(1)):
            continue
        path = Path(entry.path)
        if os.path.ismount(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    return removed


@functools.cache
def _own_tag(pid: int) -> str:
    """This process's owner_tag, read once (keyed by pid: a forked child gets its own)."""
    return owner_tag(pid)


class LocalSandbox(CommandSandbox):
    """One sandbox: a workspace directory on the host, commands run under bubblewrap as `uid`."""

    def __init__(
        self,
        root: Path,
        uid: int,
        bwrap_args: list[str],
        prlimit_args: list[str],
        setpriv_args: list[str],
        max_output_bytes: int,
        kill_grace_s: float,
        holder: TmpfsHolder | None = None,
        seccomp: bytes | None = None,
    ) -> None:
        self.root = root
        self._seccomp = seccomp
        """The commands' seccomp program (nsinit.c's), handed to bubblewrap's --seccomp; None: no filter."""
        """The sandbox's directory as its commands see it (inside the holder's mount namespace, if any)."""
        self.holder = holder
        """The process holding this sandbox's size-capped tmpfs (workspace_quota), or None: a plain directory."""
        self.workspace = (holder.host_root if holder else root) / "workspace"
        """The workspace as this (host) process reaches it."""
        self.uid = uid
        self._bwrap_args = bwrap_args
        self._prlimit_args = prlimit_args
        self._setpriv_args = setpriv_args
        self._max_output_bytes = max_output_bytes
        self._kill_grace_s = kill_grace_s
        self._running: set[asyncio.subprocess.Process] = set()
        self._closed = False
        self._killed = False  # a command was killed: close() sweeps for orphans (kill_processes_mentioning)

    async def close(self) -> None:
        """Kill every running command and delete the workspace."""
        self._closed = True
        for proc in list(self._running):
            kill_group(proc)
            self._killed = True
        for proc in list(self._running):
            with contextlib.suppress(TimeoutError, ProcessLookupError):
                await asyncio.wait_for(proc.wait(), self._kill_grace_s)
        if self._killed:
            await asyncio.to_thread(kill_processes_mentioning, str(self.root))
        if self.holder is not None:
            await self.holder.close()
        await asyncio.to_thread(shutil.rmtree, self.root, True)

    async def _run(self, argv: list[str], timeout: float, cwd: str, stdin: bytes | None) -> ExecResult:
        if self._closed:
            raise InfraError("sandbox_died", f"sandbox {self.root} is closed")
        if self.holder is not None and not self.holder.alive:
            raise InfraError("sandbox_died", f"the process holding sandbox {self.root}'s workspace has ended")
        status_read, status_write = os.pipe()
        seccomp_fd = -1
        if self._seccomp is not None:
            seccomp_fd, seccomp_w = os.pipe()
            os.write(seccomp_w, self._seccomp)  # a few hundred bytes: within the pipe's buffer
            os.close(seccomp_w)
        started = time.monotonic()
        try:
            proc = await self._spawn(
                self._command(argv, cwd, status_write, seccomp_fd),
                stdin,
                status_read,
                status_write,
                seccomp_fd,
            )
        finally:
            if seccomp_fd >= 0:
                os.close(seccomp_fd)
        self._running.add(proc)
        output = BoundedOutput(self._max_output_bytes)
        try:
            timed_out = await self._wait(proc, stdin, output, timeout, argv)
        finally:
            self._running.discard(proc)
            status = read_status(status_read)
        duration = time.monotonic() - started
        if self._closed:
            raise InfraError("sandbox_died", f"sandbox {self.root} was closed while running {argv!r}")
        if "child-pid" not in status and not timed_out:
            # bubblewrap itself failed before running anything: never the policy's doing.
            raise InfraError(
                "start_failed", f"bubblewrap failed (exit {proc.returncode}): {output.text().strip()}"
            )
        # 124 for a timeout follows timeout(1); otherwise the sandboxed command's own status, not bwrap's.
        exit_code = 124 if timed_out else int(status.get("exit-code", proc.returncode or 0))
        return ExecResult(exit_code=exit_code, output=output.text(), timed_out=timed_out, duration_s=duration)

    def _command(self, argv: list[str], cwd: str, status_fd: int, seccomp_fd: int = -1) -> list[str]:
        """The host command line: into the holder's mount namespace (if any), prlimit, bwrap, setpriv, argv."""
        return [
            *(self.holder.enter_args() if self.holder is not None else []),
            *self._prlimit_args,
            *self._bwrap_args,
            "--chdir",
            cwd,
            "--json-status-fd",
            str(status_fd),
            *(["--seccomp", str(seccomp_fd)] if seccomp_fd >= 0 else []),
            "--",
            *self._setpriv_args,
            *argv,
        ]

    async def _spawn(
        self,
        command: list[str],
        stdin: bytes | None,
        status_read: int,
        status_write: int,
        seccomp_fd: int = -1,
    ) -> asyncio.subprocess.Process:
        """Start the command in a process group of its own; the status pipe's write end is closed here either way,
        its read end too if nothing started."""
        try:
            return await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                pass_fds=(status_write, *([seccomp_fd] if seccomp_fd >= 0 else [])),
                start_new_session=True,  # one process group to kill: prlimit execs bwrap, bwrap holds the rest
            )
        except OSError as exc:
            os.close(status_read)
            raise InfraError("start_failed", f"cannot spawn bubblewrap: {exc}") from exc
        except BaseException:
            # Cancelled mid-spawn: asyncio killed the process alone, maybe orphaning its namespace's init.
            os.close(status_read)
            self._killed = True  # so close() sweeps for it
            raise
        finally:
            os.close(status_write)

    async def _wait(
        self,
        proc: asyncio.subprocess.Process,
        stdin: bytes | None,
        output: BoundedOutput,
        timeout: float,
        argv: list[str],
    ) -> bool:
        """Feed stdin and collect output until the command ends; past `timeout` kill its group. True: timed out."""
        collect = asyncio.ensure_future(self._collect(proc, stdin, output))
        try:
            await asyncio.wait_for(asyncio.shield(collect), timeout)
        except TimeoutError:
            kill_group(proc)
            self._killed = True  # close() sweeps for a namespace init the kill may have orphaned
            try:
                await asyncio.wait_for(collect, self._kill_grace_s)
            except TimeoutError as exc:
                collect.cancel()
                raise InfraError(
                    "exec_unresponsive",
                    f"command still alive {self._kill_grace_s}s after SIGKILL: {argv!r}",
                ) from exc
            return True
        except asyncio.CancelledError:
            kill_group(proc)
            self._killed = True
            collect.cancel()
            raise
        return False

    @staticmethod
    async def _collect(proc: asyncio.subprocess.Process, stdin: bytes | None, output: BoundedOutput) -> None:
        if stdin is not None and proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(stdin)
                await proc.stdin.drain()
            proc.stdin.close()
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            output.add(chunk)
        await proc.wait()


class LocalSandboxProvider:
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
            raise ValueError(
                "runtime supervisor always caps the workspace: it cannot run with workspace_quota none"
            )
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
        self._first_start_lock = (
            threading.Lock()
        )  # decided at the first start (auto: whether this process may mount)
        self._tools: dict[str, str] | None = None
        self._python_dirs: list[str] | None = None
        self._seccomp: bytes | None = None
        self._cgroups: Cgroups | None = None
        """Per-sandbox memory and pids cgroups (supervisor runtime), decided at the first start; None: rlimits only."""

    def limits(self) -> dict[str, int | float]:
        """Every limit this provider enforces, for logging at start (workspace_mb 0: the workspace is uncapped)."""
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

    async def _start_bubblewrap(
        self, env_dir: Path, setup_patch: str | None, env: Mapping[str, str]
    ) -> LocalSandbox:
        """A sandbox for bubblewrap: its directory (a held tmpfs where this process may mount) made and filled on
        the host, then, once per provider, probed."""
        if self._tools is None:
            self._tools = require_tools(self.bwrap)
        prefix = f"{SANDBOX_PREFIX}{_own_tag(os.getpid())}-"
        root = Path(tempfile.mkdtemp(prefix=prefix, dir=self.root_dir)).resolve()
        holder: TmpfsHolder | None = None
        start_timeout_s = self.resources.start_timeout_s
        try:
            if self._mount:
                holder = await hold_tmpfs(root, self.resources.workspace_mb, self._tools, start_timeout_s)
            uid = self._new_uid()
            host_root = holder.host_root if holder is not None else root
            await asyncio.to_thread(self._prepare, host_root, env_dir, uid, setup_patch, holder)
            sandbox = self._bubblewrap_sandbox(root, uid, env, holder)
            # The binds (interpreter, workspace) are checked by a probe once per provider: later starts differ
            # only in the workspace copy, and a bubblewrap that fails later is an InfraError(start_failed) from
            # the first command anyway. One bubblewrap less per start: -18..-35% start-to-first-exec at a burst.
            probe = None
            if not self._python_ok:
                probe = await sandbox.exec(_START_CHECK, timeout=start_timeout_s)
        except BaseException:
            if holder is not None:
                await asyncio.shield(holder.close())
            shutil.rmtree(root, ignore_errors=True)
            raise
        if probe is not None and probe.timed_out:
            await sandbox.close()
            raise InfraError("start_timeout", f"sandbox did not start within {start_timeout_s}s")
        if probe is not None and probe.exit_code != 0:
            await sandbox.close()
            raise InfraError("start_failed", f"sandbox start check failed: {probe.output.strip()}")
        self._python_ok = True
        return sandbox

    def _bubblewrap_sandbox(
        self, root: Path, uid: int, env: Mapping[str, str], holder: TmpfsHolder | None
    ) -> LocalSandbox:
        """The LocalSandbox over a prepared directory: its command lines (prlimit, bwrap, setpriv) fixed now."""
        assert self._tools is not None
        return LocalSandbox(
            root=root,
            uid=uid,
            bwrap_args=self._bwrap_args(root, env),
            prlimit_args=self._prlimit_args(),
            setpriv_args=[
                self._tools["setpriv"],
                f"--reuid={uid}",
                f"--regid={uid}",
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "--",
            ],
            max_output_bytes=self.resources.max_output_bytes,
            kill_grace_s=self.kill_grace_s,
            holder=holder,
            seccomp=self._bwrap_seccomp(),
        )

    def _bwrap_seccomp(self) -> bytes | None:
        """nsinit.c's seccomp program for bubblewrap, built once; without a C compiler, a warning and none."""
        if self._seccomp is None:
            try:
                self._seccomp = seccomp_program(helper_binary())
            except InfraError as exc:
                log.warning("local sandboxes (bubblewrap): no seccomp filter: %s", exc)
                self._seccomp = b""
        return self._seccomp or None

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
                prefix = f"{SANDBOX_PREFIX}{_own_tag(os.getpid())}-mnt-"
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
                    self.python_executable, self.resources, root_dir=self.root_dir,
                    workspace_quota=self.workspace_quota, runtime=self.runtime, kill_grace_s=self.kill_grace_s,
                    extra_env=self.extra_env, git_baseline=self.git_baseline, uid_range=self.uid_range,
                    bwrap=self.bwrap, rootfs=rootfs, rootfs_path=":".join([*env.path_prepend, path]),
                )  # fmt: skip
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
                python, self.resources, root_dir=self.root_dir, workspace_quota=self.workspace_quota,
                runtime=self.runtime, kill_grace_s=self.kill_grace_s, extra_env=self.extra_env,
                git_baseline=self.git_baseline, uid_range=self.uid_range, bwrap=self.bwrap,
            )  # fmt: skip
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
                ["proc", "/proc"], ["dev", "/dev"], ["tmpfs", "/tmp", self.resources.tmp_size_mb, 0o1777],
            ]  # fmt: skip
        layout: list[list[Any]] = [["ro-bind", "/usr", "/usr"]]
        for link in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = Path("/") / link
            if host.is_symlink():
                layout.append(["symlink", f"/{link}", os.readlink(host)])
            elif host.is_dir():
                layout.append(["ro-bind", f"/{link}", str(host)])
        layout.append(["dir", "/etc", 0o755])
        # Small files are copied (a bind costs two mount calls now and one at teardown).
        for name in _ETC_FILES:
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
        assert self._launcher is not None
        uid = self._new_uid()
        root = self._launcher.mount_point
        cgroups: list[Path] = []
        if self._cgroups is not None:
            name = f"{SANDBOX_PREFIX}{_own_tag(os.getpid())}-{uid}-{secrets.token_hex(4)}"
            cgroups = self._cgroups.create(name, self.resources.memory_mb, self.resources.max_processes)
        try:
            control = await self._launcher.start(
                encode_start(str(root), uid, str(env_dir), self._environment(env), [str(c) for c in cgroups])
            )
        except BaseException:
            Cgroups.remove(cgroups)
            raise
        sandbox = SupervisedSandbox(
            root, uid, control, 0, self.resources.max_output_bytes, self.kill_grace_s,
            on_close=(lambda: Cgroups.remove(cgroups)) if cgroups else None,
        )  # fmt: skip
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
                steps.append((_GIT_BASELINE, None))
            if not self._python_ok:
                steps.append((_START_CHECK, None))
            for script, stdin in steps:
                argv = ["/bin/bash", "-c", script]
                result = await sandbox._run(
                    argv, self.resources.start_timeout_s, WORKSPACE, None if stdin is None else stdin.encode()
                )
                if result.timed_out:
                    raise InfraError(
                        "start_timeout", f"sandbox did not start within {self.resources.start_timeout_s}s"
                    )
                if result.exit_code != 0:
                    what = (
                        "setup patch does not apply to"
                        if stdin is not None
                        else "sandbox start check failed for"
                    )
                    raise InfraError("start_failed", f"{what} {env_dir}: {result.output.strip()}")
        except BaseException:
            await asyncio.shield(sandbox.close())
            raise
        self._python_ok = True
        return sandbox

    def _parent(self) -> Path:
        """Where sandbox directories are made."""
        return self.root_dir or Path(tempfile.gettempdir())

    def _decide_mount(self) -> bool:
        """Whether each sandbox gets its own size-capped tmpfs (workspace_quota; auto probes for the right)."""
        if self.workspace_quota == "none":
            return False
        parent = self._parent()
        allowed, why = can_hold_tmpfs(parent)
        if allowed:
            assert self._tools is not None
            self._tools |= holder_tools() or {}
            return True
        if self.workspace_quota == "tmpfs":
            raise InfraError(
                "start_failed", f"workspace_quota is tmpfs but {why} (needs root or CAP_SYS_ADMIN)"
            )
        log.warning(
            "local sandboxes: workspaces are not size-capped (%s); a command can fill %s file by file. Run as "
            "root or set sandbox.workspace_quota: none to silence this.", why, parent,
        )  # fmt: skip
        return False

    def _prepare(
        self, root: Path, env_dir: Path, uid: int, setup_patch: str | None, holder: TmpfsHolder | None = None
    ) -> None:
        """Copy the environment, apply the setup patch, write /etc/passwd, hand the workspace to `uid`.

        `root` is the sandbox directory as this process reaches it; with a holder, git runs inside the holder's
        mount namespace (through the host's /proc/PID/root path git would resolve its own directory wrongly).
        """

        workspace = root / "workspace"
        shutil.copytree(env_dir, workspace, symlinks=True, ignore=_COPY_IGNORE)

        def in_workspace(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
            if holder is None:
                return subprocess.run(
                    argv, cwd=workspace, capture_output=True, text=True, timeout=120, **kwargs
                )
            # inside the holder's namespace; nsenter --wd would open its directory before entering it: cd there
            inner = str(holder.root / "workspace")
            command = [*holder.enter_args(), "/bin/sh", "-c", 'cd "$0" && exec "$@"', inner, *argv]
            return subprocess.run(command, capture_output=True, text=True, timeout=120, **kwargs)

        if setup_patch:
            applied = in_workspace(["git", "apply", "--whitespace=nowarn", "-"], input=setup_patch)
            if applied.returncode != 0:
                raise InfraError(
                    "start_failed", f"setup patch does not apply to {env_dir}: {applied.stderr.strip()}"
                )
        if self.git_baseline:
            # One shell for the three commands: each process chain (nsenter, sh, git) costs a spawn per start.
            in_workspace(["/bin/sh", "-c", _GIT_BASELINE], check=True)
        etc = root / "etc"
        etc.mkdir()
        (etc / "passwd").write_text(
            f"root:x:0:0:root:/root:/bin/sh\nsandbox:x:{uid}:{uid}:sandbox:/tmp:/bin/bash\n"
        )
        (etc / "group").write_text(f"root:x:0:\nsandbox:x:{uid}:\n")
        for dirpath, dirnames, filenames in os.walk(workspace):
            os.lchown(dirpath, uid, uid)
            for name in dirnames + filenames:
                os.lchown(os.path.join(dirpath, name), uid, uid)

    def _prlimit_args(self) -> list[str]:
        assert self._tools is not None
        return [
            self._tools["prlimit"],
            f"--as={self.resources.memory_mb * MiB}",
            f"--nproc={self.resources.max_processes}",
            f"--cpu={self.resources.cpu_time_s}",
            f"--fsize={self.resources.file_size_mb * MiB}",
            f"--nofile={self.resources.max_open_files}",
            "--core=0",
            "--",
        ]

    def _bwrap_args(self, root: Path, env: Mapping[str, str]) -> list[str]:
        assert self._tools is not None and self._python_dirs is not None
        args = [
            self._tools[self.bwrap],
            "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session",
        ]  # fmt: skip
        args += bwrap_rootfs_args(self.rootfs) if self.rootfs is not None else self._bwrap_host_system()
        args += [
            "--ro-bind",
            str(root / "etc/passwd"),
            "/etc/passwd",
            "--ro-bind",
            str(root / "etc/group"),
            "/etc/group",
        ]
        # /tmp comes before the interpreter binds: an interpreter living under /tmp (a CI clone's venv) is then
        # bound on top of the private tmpfs instead of being hidden by it.
        args += [
            "--proc", "/proc", "--dev", "/dev",
            "--perms", "1777", "--size", str(self.resources.tmp_size_mb * MiB), "--tmpfs", "/tmp",
        ]  # fmt: skip
        made: set[str] = {"/usr", "/etc", "/tmp"}
        for prefix in self._python_dirs:
            for parent in ancestors(prefix):
                if parent not in made:
                    args += ["--perms", "0755", "--dir", parent]
                    made.add(parent)
            args += ["--ro-bind", prefix, prefix]
        args += ["--bind", str(root / "workspace"), WORKSPACE, "--clearenv"]
        for key, value in self._environment(env).items():
            args += ["--setenv", key, value]
        return args

    @staticmethod
    def _bwrap_host_system() -> list[str]:
        """bubblewrap's arguments for the host's system directories and its linker/locale /etc entries."""
        args = ["--ro-bind", "/usr", "/usr"]
        for link in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            host = Path("/") / link
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), f"/{link}"]
            elif host.is_dir():
                args += ["--ro-bind", str(host), f"/{link}"]
        args += ["--perms", "0755", "--dir", "/etc"]
        for name in _ETC_FILES:
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        return args
