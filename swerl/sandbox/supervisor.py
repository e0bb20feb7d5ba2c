"""The host side of the supervisor runtime for local sandboxes (swerl/sandbox/nsinit.c is the other side).

`helper_binary` builds nsinit.c once per source version (a C compiler is needed once); `Launcher` owns one
zygote process per LocalSandboxProvider; `Control` is one sandbox's control socket (the messages of its init
process, dispatched to futures); `SupervisedSandbox` runs commands through it. A command's
output comes back on a pipe whose write end travels with the request (SCM_RIGHTS), so output never passes through
the supervisor; its exit status comes back as a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from swerl.errors import InfraError
from swerl.sandbox.base import WORKSPACE, ExecResult
from swerl.sandbox.process import BoundedOutput, CommandSandbox

SOURCE = Path(__file__).with_name("nsinit.c")
CFLAGS = ("-O2", "-Wall")
MESSAGE_BYTES = 1 << 20
"""The largest message either side sends (as MESSAGE_BYTES in nsinit.c)."""
BUILD_TIMEOUT_S = 120.0
"""How long compiling nsinit.c may take (once per source version and cache directory)."""
_build_lock = threading.Lock()
CGROUP_DIR = "swerl"
"""The cgroup, under this process's own, that every sandbox's cgroup is made in."""


def cache_dir() -> Path:
    """Where the built supervisor lives: $SWERL_CACHE_DIR, else $XDG_CACHE_HOME/swerl, else ~/.cache/swerl."""
    if os.environ.get("SWERL_CACHE_DIR"):
        return Path(os.environ["SWERL_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "swerl"


def helper_binary() -> Path:
    """The supervisor executable, compiled from nsinit.c once per source version and compiler flags.

    Raises InfraError(start_failed) naming the cause when there is no C compiler or the build fails."""
    cc = os.environ.get("CC") or "cc"
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join(CFLAGS).encode()).hexdigest()[:16]
    target = cache_dir() / f"nsinit-{digest}"
    if os.access(target, os.X_OK):
        return _trusted(target)
    command = shlex.split(cc)  # CC may carry flags or a wrapper ("ccache gcc", "gcc -m64")
    compiler = shutil.which(command[0]) if command else None
    if compiler is None:
        raise InfraError(
            "start_failed",
            f"the sandbox supervisor is C ({SOURCE}) and needs a C compiler once: {cc!r} was not found "
            "(install gcc, set CC, or set agent.sandbox.runtime: bubblewrap)",
        )
    with _build_lock:
        if os.access(target, os.X_OK):
            return _trusted(target)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
                built = Path(tmp) / "nsinit"
                done = subprocess.run(
                    [compiler, *command[1:], *CFLAGS, "-o", str(built), str(SOURCE)],
                    capture_output=True,
                    text=True,
                    timeout=BUILD_TIMEOUT_S,
                    check=False,
                )
                if done.returncode != 0:
                    raise InfraError(
                        "start_failed",
                        f"building the sandbox supervisor failed ({compiler} {SOURCE}): {done.stderr[-2000:]}",
                    )
                # atomic: a concurrent build of the same source wrote the same bytes
                os.replace(built, target)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise InfraError("start_failed", f"cannot build the sandbox supervisor into {target}: {exc}") from exc
    return _trusted(target)


def _trusted(binary: Path) -> Path:
    """binary, if only this user could have written it or its directory (it runs with this user's rights)."""
    for path in (binary, binary.parent):
        st = path.stat()
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise InfraError(
                "start_failed",
                f"refusing to run the sandbox supervisor {binary}: {path} is not owned by uid {os.geteuid()} "
                f"or is writable by others (mode {st.st_mode & 0o7777:o}); remove it or set SWERL_CACHE_DIR",
            )
    return binary


def encode(*tokens: str | int) -> bytes:
    """One message: each token NUL-terminated (nsinit.c splits on NUL). A token holding a NUL byte is refused."""
    out = []
    for token in tokens:
        data = os.fsencode(str(token))
        if b"\0" in data:
            raise ValueError(f"sandbox message token contains a NUL byte: {data[:80]!r}")
        out.append(data + b"\0")
    return b"".join(out)


def decode(data: bytes) -> list[str]:
    return [os.fsdecode(token) for token in data.split(b"\0")[:-1]]


def encode_config(config: dict[str, Any]) -> bytes:
    """The first message to the zygote: workspace, limits, copy rules and the mount plan (see nsinit.c)."""
    tokens: list[str | int] = ["config", config["workspace"], config["workspace_mb"], config["cap_last_cap"]]
    tokens.append(len(config["rlimits"]))
    for name, value in config["rlimits"].items():
        tokens += [name, int(value)]
    for key in ("ignore_names", "ignore_suffixes"):
        tokens += [len(config[key]), *config[key]]
    tokens.append(len(config["layout"]))
    for entry in config["layout"]:
        if len(entry) > 4:
            raise ValueError(f"layout entry with more than 3 arguments: {entry!r}")
        tokens += [*entry, *[""] * (4 - len(entry))]
    return encode(*tokens)


def encode_start(
    root: str, uid: int, env_dir: str, env: dict[str, str], cgroups: list[str] | tuple[str, ...] = ()
) -> bytes:
    bad = [name for name in env if not name or "=" in name]
    if bad:
        raise ValueError(f"environment variable names must be non-empty and hold no '=': {bad!r}")
    return encode(
        "start",
        root,
        uid,
        env_dir,
        len(cgroups),
        *cgroups,
        len(env),
        *(f"{name}={value}" for name, value in env.items()),
    )


def seccomp_program(helper: Path) -> bytes:
    """The commands' seccomp filter (struct sock_filter[]) as nsinit.c builds it, for bubblewrap's --seccomp."""
    done = subprocess.run([str(helper), "--seccomp"], capture_output=True, timeout=30, check=False)
    if done.returncode != 0 or not done.stdout or len(done.stdout) % 8:
        raise InfraError("start_failed", f"{helper} --seccomp failed: {done.stderr[-500:]!r}")
    return done.stdout


class Cgroups:
    """Per-sandbox cgroups (memory with swap, pids) under this process's own cgroup, v2 or v1 hierarchies.

    `Cgroups.detect()` is None, with the reason, where they cannot be made (not root, not writable, no memory or
    pids controller); then only the per-process rlimits bound a sandbox."""

    def __init__(self, version: int, parents: dict[str, Path]) -> None:
        self.version = version
        self.parents = parents
        """controller -> the directory sandbox cgroups are made in (v2: one, keyed "unified")."""

    @staticmethod
    def detect() -> tuple[Cgroups | None, str]:
        try:
            mounts = [line.split() for line in Path("/proc/self/mounts").read_text().splitlines()]
            own = {}
            for line in Path("/proc/self/cgroup").read_text().splitlines():
                _, controllers, path = line.split(":", 2)
                for name in controllers.split(",") if controllers else [""]:
                    own[name] = path.lstrip("/")
        except OSError as exc:
            return None, f"cannot read the cgroup mounts: {exc}"
        if os.geteuid() != 0:
            return None, "not root: per-sandbox cgroups need root"
        for _, point, kind, *_ in mounts:
            if kind != "cgroup2":
                continue
            try:
                available = Path(point, "cgroup.controllers").read_text().split()
            except OSError:
                continue
            if {"memory", "pids"} <= set(available):
                parent = Path(point) / own.get("", "") / CGROUP_DIR
                try:
                    parent.mkdir(exist_ok=True)
                    (parent.parent / "cgroup.subtree_control").write_text("+memory +pids")
                    (parent / "cgroup.subtree_control").write_text("+memory +pids")
                except OSError as exc:
                    return None, f"cannot make cgroup {parent} with memory and pids controllers: {exc}"
                return Cgroups(2, {"unified": parent}), ""
        parents: dict[str, Path] = {}
        for _, point, kind, options, *_ in mounts:
            if kind != "cgroup":
                continue
            for controller in ("memory", "pids"):
                if controller in options.split(",") and controller not in parents:
                    parents[controller] = Path(point) / own.get(controller, "") / CGROUP_DIR
        if set(parents) != {"memory", "pids"}:
            return (
                None,
                f"no cgroup v2 or v1 hierarchy with memory and pids controllers (found {sorted(parents)})",
            )
        try:
            for parent in parents.values():
                parent.mkdir(exist_ok=True)
        except OSError as exc:
            return None, f"cannot make the sandboxes' cgroups: {exc}"
        return Cgroups(1, parents), ""

    def create(self, name: str, memory_mb: int, max_processes: int) -> list[Path]:
        """The directories of one sandbox's cgroups, limits set: memory (swap none) and pids (+1: its init)."""
        made: list[Path] = []
        memory = str(memory_mb * 1024 * 1024)
        try:
            for controller, parent in self.parents.items():
                path = parent / name
                path.mkdir()
                made.append(path)
                if self.version == 2:
                    (path / "memory.max").write_text(memory)
                    swap = path / "memory.swap.max"
                    if swap.exists():
                        swap.write_text("0")
                    (path / "pids.max").write_text(str(max_processes + 1))
                elif controller == "memory":
                    (path / "memory.limit_in_bytes").write_text(memory)
                    memsw = path / "memory.memsw.limit_in_bytes"
                    if memsw.exists():
                        memsw.write_text(memory)
                else:
                    (path / "pids.max").write_text(str(max_processes + 1))
        except OSError as exc:
            self.remove(made)
            raise InfraError("start_failed", f"cannot make the sandbox's cgroup {name}: {exc}") from exc
        return made

    @staticmethod
    def remove(paths: list[Path]) -> None:
        """Remove a closed sandbox's cgroups (its processes are gone; a moment's retry for the last exits)."""
        for path in paths:
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)

    def sweep(self, alive: Callable[[str], bool]) -> None:
        """Remove the cgroups of sandboxes whose owning process (the name's owner tag) is gone."""
        for parent in self.parents.values():
            with contextlib.suppress(OSError):
                for entry in parent.iterdir():
                    tag = "-".join(entry.name.split("-")[2:4])
                    if entry.is_dir() and entry.name.startswith("swerl-sbx-") and not alive(tag):
                        with contextlib.suppress(OSError):
                            entry.rmdir()


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a future's exception seen: a start or command nobody awaits any more may still fail."""
    if not future.cancelled():
        future.exception()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def send(sock: socket.socket, lock: asyncio.Lock, data: bytes, fds: list[int] | None = None) -> None:
    """Send one message (with fds attached) on a non-blocking SOCK_SEQPACKET socket, waiting while it is full.

    `lock` is the socket's: one waiter at a time (a second add_writer on the same fd would replace the first's).
    """
    if len(data) > MESSAGE_BYTES:
        raise ValueError(f"sandbox message of {len(data)} bytes exceeds {MESSAGE_BYTES}")
    loop = asyncio.get_running_loop()
    async with lock:
        while True:
            try:
                socket.send_fds(sock, [data], fds or [])
                return
            except BlockingIOError:
                writable = loop.create_future()
                loop.add_writer(sock.fileno(), _wake, writable)
                try:
                    await writable
                finally:
                    loop.remove_writer(sock.fileno())


class LoopLock:
    """An asyncio.Lock per event loop (a provider may outlive one asyncio.run and serve the next)."""

    def __init__(self) -> None:
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}

    def get(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            self._locks = {known: lock for known, lock in self._locks.items() if not known.is_closed()}
            lock = self._locks[loop] = asyncio.Lock()
        return lock


class Launcher:
    """The zygote (nsinit.c) that forks every sandbox of one provider; started at the first start."""

    def __init__(self, helper: Path, config: dict[str, Any], mount_point: Path) -> None:
        self._helper = helper
        self._config = encode_config(config)
        self.mount_point = mount_point
        """The empty host directory every init mounts its sandbox's tmpfs on (in its own mount namespace)."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._lock = LoopLock()

    def _ensure(self) -> socket.socket:
        # The zygote dies with the thread that launches it (a parent-death signal follows the thread): a stage's
        # event-loop thread, which outlives its pool. A start after it ended (poll() set) launches a new one.
        if self._proc is not None and self._proc.poll() is None and self._sock is not None:
            return self._sock
        self.close()
        # The mount point is gone if the provider was closed before (it may be used again).
        self.mount_point.mkdir(exist_ok=True)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [str(self._helper), str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,  # a terminal's Ctrl-C reaches swerl, which closes sandboxes in order
                env={"PATH": "/usr/bin:/bin"},
            )
        except OSError as exc:
            ours.close()
            raise InfraError("start_failed", f"cannot start the sandbox supervisor: {exc}") from exc
        finally:
            theirs.close()
        ours.sendall(self._config)
        ours.setblocking(False)
        self._sock = ours
        return ours

    async def start(self, request: bytes) -> Control:
        """Ask the zygote for a sandbox (an encode_start message); its init answers on the returned Control."""
        sock = self._ensure()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            await send(sock, self._lock.get(), request, [theirs.fileno()])
        except OSError as exc:
            mine.close()
            self.close()  # the next start launches a new zygote
            raise InfraError("start_failed", f"the sandbox supervisor has ended: {exc}") from exc
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        return Control(mine)

    def shutdown(self) -> None:
        """End the zygote and remove the mount point (for good: the provider is closed)."""
        self.close()
        with contextlib.suppress(OSError):
            self.mount_point.rmdir()  # still in use (a sandbox not closed yet): the sweep of a later run takes it

    def close(self) -> None:
        """End the zygote (sandboxes already started live on until closed: each is its own process tree)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None


class Control:
    """One sandbox's control socket: start-up messages, then each command's result, matched by id."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self.init_pid: int | None = None
        self._pidfd = -1
        """Readable once the init has exited, i.e. after the kernel killed and reaped its whole namespace."""
        self.started: asyncio.Future[int] = self._loop.create_future()
        self.started.add_done_callback(_retrieve)
        """Resolves to the init's host pid once the sandbox is ready; InfraError if its set-up failed."""
        self.ended: asyncio.Future[None] = self._loop.create_future()
        """Resolves when the init has ended (every process of the sandbox killed and reaped)."""
        self._ready = False
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        self._loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, MESSAGE_BYTES, 1)
            except BlockingIOError:
                return
            except OSError:
                data, fds = b"", []
            for fd in fds:
                os.close(fd)
            if not data:
                self._end()
                return
            kind, *args = decode(data) or [""]
            if kind in ("exit", "failed"):  # exit ID CODE | failed ID TEXT
                future = self._pending.pop(int(args[0]), None) if args and args[0].isdigit() else None
                if future is not None and not future.done():
                    future.set_result({"exit": int(args[1])} if kind == "exit" else {"error": args[1]})
                continue
            if kind in ("ready", "error") and args and int(args[0]) > 0:  # ready PID | error PID TEXT
                self.init_pid = int(args[0])
                with contextlib.suppress(ProcessLookupError):  # (it sent this itself: alive a moment ago)
                    self._pidfd = os.pidfd_open(self.init_pid)
            if kind == "ready":
                self._ready = True
            elif kind == "error" and not self.started.done():
                self.started.set_exception(InfraError("start_failed", f"sandbox set-up failed: {args[-1]}"))
            if self._ready and self.init_pid is not None and not self.started.done():
                self.started.set_result(self.init_pid)

    def _end(self) -> None:
        self._loop.remove_reader(self.sock.fileno())
        died = InfraError("sandbox_died", "the sandbox's init process has ended")
        if not self.started.done():
            self.started.set_exception(died)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(died)
        self._pending.clear()
        if not self.ended.done():
            self.ended.set_result(None)

    @property
    def alive(self) -> bool:
        return not self.ended.done()

    def expect(self) -> tuple[int, asyncio.Future[dict[str, Any]]]:
        """A new command id and the future of its result."""
        command = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        future.add_done_callback(_retrieve)
        self._pending[command] = future
        return command, future

    async def send(self, *tokens: str | int, fds: list[int] | None = None) -> None:
        try:
            await send(self.sock, self._lock, encode(*tokens), fds)
        except OSError as exc:
            raise InfraError("sandbox_died", f"the sandbox's init does not listen: {exc}") from exc

    async def close(self, grace_s: float) -> None:
        """Ask the init to kill everything and end; SIGKILL it if it has not within grace_s. Returns once the init
        (and so every process of the sandbox) is gone."""
        if not self.ended.done():
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_WR)
            try:
                await asyncio.wait_for(asyncio.shield(self.ended), grace_s)
            except TimeoutError:
                self._kill_init()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self.ended), grace_s)
        if not self.ended.done():
            self._end()
        self.sock.close()
        if self._pidfd >= 0:
            # The socket closes early in the init's exit; the pidfd turns readable at its very end.
            exited = self._loop.create_future()
            self._loop.add_reader(self._pidfd, _wake, exited)
            try:
                await asyncio.wait_for(exited, grace_s)
            except TimeoutError:
                self._kill_init()
            finally:
                self._loop.remove_reader(self._pidfd)
                os.close(self._pidfd)
                self._pidfd = -1

    def _kill_init(self) -> None:
        """SIGKILL the init (its namespace, every process of the sandbox, dies with it)."""
        if self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)


async def _read_until_eof(fd: int, output: BoundedOutput) -> None:
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            readable = loop.create_future()
            loop.add_reader(fd, _wake, readable)
            try:
                await readable
            finally:
                loop.remove_reader(fd)
            continue
        if not chunk:
            return
        output.add(chunk)


def _write_all(fd: int, data: bytes) -> None:
    try:
        with contextlib.suppress(BrokenPipeError):
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


class SupervisedSandbox(CommandSandbox):
    """A sandbox whose init process (nsinit.c) runs each command with one fork and one exec."""

    def __init__(
        self,
        root: Path,
        uid: int,
        control: Control,
        init_pid: int,
        max_output_bytes: int,
        kill_grace_s: float,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.root = root
        """Where the init mounted the sandbox's tmpfs, in its own mount namespace (on the host: an empty directory
        shared by every sandbox of the provider)."""
        self.uid = uid
        self.control = control
        self.init_pid = init_pid
        self.workspace = Path(f"/proc/{init_pid}/root{WORKSPACE}")
        """The workspace as this (host) process reaches it: through the init's root, while it lives."""
        self.holder = None  # no holder process: the init itself holds the tmpfs (LocalSandbox's attribute)
        self._max_output_bytes = max_output_bytes
        self._kill_grace_s = kill_grace_s
        self._on_close = on_close
        self._closed = False
        self.cgroups: list[Path] = []
        """This sandbox's cgroup directories (memory, pids), removed when it closes; empty: none."""

    async def close(self) -> None:
        """Kill every process of the sandbox (its init does, then ends) and remove its directory."""
        if self._closed:
            return
        self._closed = True
        await self.control.close(self._kill_grace_s)
        if self._on_close is not None:
            self._on_close()

    async def _run(self, argv: list[str], timeout: float, cwd: str, stdin: bytes | None) -> ExecResult:
        if self._closed:
            raise InfraError("sandbox_died", f"sandbox {self.root} is closed")
        if not self.control.alive:
            raise InfraError("sandbox_died", f"sandbox {self.root}'s init process has ended")
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        in_r, in_w = os.pipe2(os.O_CLOEXEC) if stdin is not None else (-1, -1)
        command, result = self.control.expect()
        started = time.monotonic()
        try:
            await self.control.send("exec", command, cwd, len(argv), *argv, fds=[out_w] + ([in_r] if in_r >= 0 else []))
        except BaseException:
            os.close(out_r)
            if in_w >= 0:
                os.close(in_w)
            raise
        finally:
            os.close(out_w)
            if in_r >= 0:
                os.close(in_r)
        output = BoundedOutput(self._max_output_bytes)
        loop = asyncio.get_running_loop()
        timed_out = False
        try:
            # One deadline, no extra task: at `timeout` the init kills the command's processes and the deadline
            # moves kill_grace_s on; passing that too means the command did not die (exec_unresponsive).
            async with asyncio.timeout(None) as deadline:

                def expire() -> None:
                    nonlocal timed_out
                    timed_out = True
                    deadline.reschedule(loop.time() + self._kill_grace_s)
                    self._kill_soon()

                timer = loop.call_later(timeout, expire)
                try:
                    message = await self._collect(out_r, in_w, stdin, output, result)
                finally:
                    timer.cancel()
        except TimeoutError as exc:
            raise InfraError(
                "exec_unresponsive", f"command still alive {self._kill_grace_s}s after SIGKILL: {argv!r}"
            ) from exc
        except asyncio.CancelledError:
            self._kill_soon()
            raise
        duration = time.monotonic() - started
        if self._closed:
            raise InfraError("sandbox_died", f"sandbox {self.root} was closed while running {argv!r}")
        if "error" in message:
            raise InfraError("start_failed", f"sandbox command did not start: {message['error']}")
        exit_code = 124 if timed_out else int(message["exit"])
        return ExecResult(exit_code=exit_code, output=output.text(), timed_out=timed_out, duration_s=duration)

    def _kill_soon(self) -> None:
        """Ask the init to kill the sandbox's commands (from a callback: the request is sent by a task)."""
        if self.control.alive:
            asyncio.ensure_future(self.control.send("kill")).add_done_callback(_retrieve)

    @staticmethod
    async def _collect(
        out_r: int,
        in_w: int,
        stdin: bytes | None,
        output: BoundedOutput,
        result: asyncio.Future[dict[str, Any]],
    ) -> dict[str, Any]:
        writer = asyncio.ensure_future(asyncio.to_thread(_write_all, in_w, stdin)) if stdin is not None else None
        try:
            await _read_until_eof(out_r, output)
            if writer is not None:
                await writer
            return await result
        finally:
            os.close(out_r)
