"""The bubblewrap runtime of local sandboxes (runtime bubblewrap, or auto without the right to mount).

Every command runs in a fresh bubblewrap instance (prlimit, bwrap, setpriv) over the sandbox's directory, made and
filled on the host (a held tmpfs where this process may mount: workspace_quota), so /tmp lasts one command. The
file system is the one the supervisor runtime builds (swerl.sandbox.supervisor; both chosen between by
swerl.sandbox.local's provider): the task's repository bound read-write at /workspace, the host's /usr
(read-only), a minimal /etc, the interpreter's own prefix directories (read-only) and a bounded tmpfs /tmp, as a
per-sandbox unprivileged uid with no capabilities.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swerl.errors import InfraError
from swerl.sandbox.base import WORKSPACE, ExecResult, SandboxResources
from swerl.sandbox.hostprep import (
    ETC_FILES,
    GIT_BASELINE,
    SANDBOX_PREFIX,
    START_CHECK,
    MiB,
    ancestors,
    own_tag,
    require_tools,
)
from swerl.sandbox.process import (
    BoundedOutput,
    CommandSandbox,
    kill_group,
    kill_processes_mentioning,
    read_status,
)
from swerl.sandbox.rootfs import bwrap_rootfs_args
from swerl.sandbox.supervisor import helper_binary, seccomp_program
from swerl.sandbox.tmpfs import TmpfsHolder, can_hold_tmpfs, hold_tmpfs, holder_tools

log = logging.getLogger(__name__)

_COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")


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
            raise InfraError("start_failed", f"bubblewrap failed (exit {proc.returncode}): {output.text().strip()}")
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


class BubblewrapRuntime:
    """LocalSandboxProvider's bubblewrap half: starting a LocalSandbox (directory, tmpfs, copy, command lines).

    A mixin: the provider (swerl.sandbox.local) holds the state declared here and decides at its first start which
    runtime runs; these methods are its own, moved beside the sandbox they make."""

    resources: SandboxResources
    root_dir: Path | None
    bwrap: str
    rootfs: Path | None
    workspace_quota: str
    kill_grace_s: float
    git_baseline: bool
    _tools: dict[str, str] | None
    _python_dirs: list[str] | None
    _python_ok: bool
    _mount: bool | None
    _seccomp: bytes | None

    if TYPE_CHECKING:  # the provider's own

        def _new_uid(self) -> int: ...

        def _parent(self) -> Path: ...

        def _environment(self, env: Mapping[str, str]) -> dict[str, str]: ...

    async def _start_bubblewrap(self, env_dir: Path, setup_patch: str | None, env: Mapping[str, str]) -> LocalSandbox:
        """A sandbox for bubblewrap: its directory (a held tmpfs where this process may mount) made and filled on
        the host, then, once per provider, probed."""
        if self._tools is None:
            self._tools = require_tools(self.bwrap)
        prefix = f"{SANDBOX_PREFIX}{own_tag(os.getpid())}-"
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
                probe = await sandbox.exec(START_CHECK, timeout=start_timeout_s)
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
            raise InfraError("start_failed", f"workspace_quota is tmpfs but {why} (needs root or CAP_SYS_ADMIN)")
        log.warning(
            "local sandboxes: workspaces are not size-capped (%s); a command can fill %s file by file. Run as "
            "root or set sandbox.workspace_quota: none to silence this.",
            why,
            parent,
        )
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
                return subprocess.run(argv, cwd=workspace, capture_output=True, text=True, timeout=120, **kwargs)
            # inside the holder's namespace; nsenter --wd would open its directory before entering it: cd there
            inner = str(holder.root / "workspace")
            command = [*holder.enter_args(), "/bin/sh", "-c", 'cd "$0" && exec "$@"', inner, *argv]
            return subprocess.run(command, capture_output=True, text=True, timeout=120, **kwargs)

        if setup_patch:
            applied = in_workspace(["git", "apply", "--whitespace=nowarn", "-"], input=setup_patch)
            if applied.returncode != 0:
                raise InfraError("start_failed", f"setup patch does not apply to {env_dir}: {applied.stderr.strip()}")
        if self.git_baseline:
            # One shell for the three commands: each process chain (nsenter, sh, git) costs a spawn per start.
            in_workspace(["/bin/sh", "-c", GIT_BASELINE], check=True)
        etc = root / "etc"
        etc.mkdir()
        (etc / "passwd").write_text(f"root:x:0:0:root:/root:/bin/sh\nsandbox:x:{uid}:{uid}:sandbox:/tmp:/bin/bash\n")
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
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
        ]
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
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--perms",
            "1777",
            "--size",
            str(self.resources.tmp_size_mb * MiB),
            "--tmpfs",
            "/tmp",
        ]
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
        for name in ETC_FILES:
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        return args
