"""The local sandbox supervisor: namespaces, mounts and the privilege drop done in-process, once per sandbox.

This file runs as its own small interpreter (`python -I -S nsinit.py FD PPID`, standard library only), started
once per LocalSandboxProvider (swerl/sandbox/supervisor.py is the host side). It is a zygote: for each sandbox
swerl sends it one request over the SOCK_SEQPACKET socket FD, with the sandbox's own control socket attached, and
it does unshare(CLONE_NEWPID) and forks (then setns back into its own pid namespace): the child, I, is pid 1 of
a new pid namespace, the sandbox's init.

I unshares mount, network, IPC, UTS and cgroup namespaces, mounts a size-capped tmpfs on the sandbox's directory
(workspace_mb), builds the sandbox's file system in it (read-only binds of /usr and the interpreter, a minimal
/etc and /dev, /proc, a bounded /tmp), copies the task's repository to /workspace owned by the sandbox's uid,
and pivots into it. Then, once, it sets what every command inherits: the limits, no_new_privs, an empty bounding
set, no groups, and real uid/gid = the sandbox's (its effective uid stays 0). Each command is one posix_spawn
(vfork + exec) with POSIX_SPAWN_RESETIDS: the effective ids become the sandbox's, and at the exec the saved ids
and the (empty) capabilities follow. Its output goes to the pipe swerl passed along, never through I.

No process outlives its command: when a command's main process ends, I kills every other process of the sandbox
(kill(-1) from a pid namespace's init reaches exactly its namespace). A kill request does the same at once. When
swerl closes the control socket (close(), or swerl dying), I kills everything, reaps it, and exits; the kernel
tears the namespaces and the tmpfs down with it. Parent-death signals tie the zygote to swerl and I to the zygote.

Why not bubblewrap per command: each command paid nsenter + prlimit + bubblewrap + setpriv + bash, and each start
a holder chain (setpriv, unshare, sh, mount, sleep): 4x the CPU of a bare `bwrap /bin/true` (docs/benchmarks.md).
Here a start is one fork of a small interpreter plus ~20 mount calls, and a command is a vfork and its own exec.
Needs root (CAP_SYS_ADMIN); without it, LocalSandboxProvider uses bubblewrap.

Messages are JSON. swerl -> zygote: {"root", "uid", "env_dir", "env"} with the control socket attached (the
layout, limits and base environment came once, as the first message). I -> swerl: {"ready", "pid"} or
{"error", "pid"} (pid: I's host pid); {"id", "exit"} or {"id", "error"} per command. swerl -> I: {"op": "exec",
"id", "argv", "cwd"} with the output pipe's write end (and stdin's read end) attached; {"op": "kill"}.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import gc
import json
import os
import resource
import select
import signal
import socket
import stat
import struct
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
SIOCSIFFLAGS, IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x8914, 0x1, 0x8, 0x40
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
MESSAGE_BYTES = 1 << 20
"""The largest message either side sends (a start's environment is the biggest)."""
DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}
"""The character devices a sandbox's /dev has (major, minor)."""
RLIMITS = {
    "as": resource.RLIMIT_AS,
    "nproc": resource.RLIMIT_NPROC,
    "cpu": resource.RLIMIT_CPU,
    "fsize": resource.RLIMIT_FSIZE,
    "nofile": resource.RLIMIT_NOFILE,
    "core": resource.RLIMIT_CORE,
}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.syscall.argtypes = [ctypes.c_long, ctypes.c_char_p, ctypes.c_char_p]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _b(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(
        _libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)),
        f"mount {fstype or source} on {target}",
    )


def prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, arg, 0, 0, 0), f"prctl({option})")


def send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    socket.send_fds(sock, [json.dumps(message).encode()], fds or [])


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent ends (and at once if the parent already has)."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


# ---------------------------------------------------------------------------------------------------- the zygote


def zygote(sock: socket.socket, swerl_pid: int) -> None:
    die_with_parent(swerl_pid)
    config = json.loads(sock.recv(MESSAGE_BYTES))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps each init: nothing here waits for one
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    # No collector: it would write to every object's header, and each write after a fork copies a page (the
    # zygote and each init share theirs copy-on-write). Nothing here makes reference cycles.
    gc.disable()
    gc.freeze()
    while True:
        data, fds, _, _ = socket.recv_fds(sock, MESSAGE_BYTES, 4)
        if not data:
            return  # swerl closed the launcher (or ended)
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            continue
        ctl = socket.socket(fileno=fds[0])
        try:
            pid = fork_into_new_pid_namespace(own_pid_ns)
        except OSError as exc:
            with contextlib.suppress(OSError):  # swerl may have given up on this start already
                send(ctl, {"error": f"cannot start a sandbox: {exc}"})
            ctl.close()
            continue
        if pid == 0:
            code = 1
            try:
                sock.close()
                os.close(own_pid_ns)
                code = init(config, json.loads(data), ctl)
            except BaseException:  # noqa: BLE001 - a supervisor bug: said on swerl's stderr
                __import__("traceback").print_exc()
            finally:
                os._exit(code)
        ctl.close()


def fork_into_new_pid_namespace(own_pid_ns: int) -> int:
    """fork(), the child being pid 1 of a new pid namespace; this process stays in (and forks into) its own."""
    _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")  # for the next child only
    try:
        pid = os.fork()
    except OSError:
        _check(_libc.setns(own_pid_ns, CLONE_NEWPID), "setns(own pid namespace)")
        raise
    if pid != 0:
        _check(_libc.setns(own_pid_ns, CLONE_NEWPID), "setns(own pid namespace)")
    return pid


# ------------------------------------------------------------------------------------------------ the sandbox init


def init(config: dict, request: dict, ctl: socket.socket) -> int:
    """pid 1 of the sandbox: its namespaces and file system, then its commands until swerl lets go."""
    # Dies with the zygote (outside this pid namespace: getppid() is 0 here, so a zygote that ended before this
    # call goes unseen; the control socket still ends this sandbox when swerl closes it or dies).
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # no handler: a signal sent from inside cannot reach init
    os.set_inheritable(ctl.fileno(), False)
    # The host's procfs (still mounted here) names this process by its pid out there, the one swerl needs.
    host_pid = int(os.readlink("/proc/self"))
    try:
        flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
        if _libc.unshare(flags | CLONE_NEWCGROUP) != 0:
            _check(_libc.unshare(flags), "unshare")  # kernels without cgroup namespaces
        build_root(config, request)
        drop_privileges(config, request["uid"])
    except Exception as exc:  # noqa: BLE001 - every setup failure is reported, with its cause
        send(ctl, {"error": f"{type(exc).__name__}: {exc}", "pid": host_pid})
        return 1
    send(ctl, {"ready": True, "pid": host_pid})
    return serve(request, ctl)


def drop_privileges(config: dict, uid: int) -> None:
    """What every command inherits: limits, no_new_privs, an empty bounding set, no groups, real ids = uid.

    Init keeps effective uid 0 (it still kills, reaps and spawns); a command is spawned with POSIX_SPAWN_RESETIDS
    (effective ids := real ids = uid), and at its exec the saved ids follow: uid everywhere, no capability (the
    bounding, inheritable and ambient sets are empty). The limits bind init too: one process of the uid's
    RLIMIT_NPROC is init's, hence the + 1.
    """
    with open("/proc/self/status") as status:
        inheritable = next(line for line in status if line.startswith("CapInh:")).split()[1]
    if int(inheritable, 16) != 0:
        raise PermissionError(f"swerl's inheritable capabilities are not empty ({inheritable}): refusing")
    prctl(PR_SET_DUMPABLE, 0)
    for name, value in config["rlimits"].items():
        limit = value + 1 if name == "nproc" else value
        resource.setrlimit(RLIMITS[name], (limit, limit))
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    _check(_libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    for cap in range(config["cap_last_cap"] + 1):
        prctl(PR_CAPBSET_DROP, cap)
    os.setgroups([])
    os.setresgid(uid, 0, 0)
    os.setresuid(uid, 0, 0)  # euid 0 stays: no capability is lost while one id is still 0


def build_root(config: dict, request: dict) -> None:
    """The sandbox's file system on a tmpfs at request["root"], then pivot_root into it."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    root = request["root"]
    mount("swerl-sandbox", root, "tmpfs", MS_NOSUID | MS_NODEV, f"size={config['workspace_mb']}m,mode=0755")
    os.umask(0)
    for entry in config["layout"]:
        kind, path = entry[0], root + entry[1]
        if kind == "dir":
            os.makedirs(path, mode=entry[2], exist_ok=True)
        elif kind == "symlink":
            os.symlink(entry[2], path)
        elif kind in ("ro-bind", "ro-bind-try"):
            bind(entry[2], path, kind == "ro-bind-try")
        elif kind == "copy-try":
            with contextlib.suppress(FileNotFoundError):
                copy_file(entry[2], path, os.stat(entry[2]), 0, 0o644)
        elif kind == "tmpfs":
            os.makedirs(path, mode=0o755, exist_ok=True)
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={entry[2]}m,mode={entry[3]:o}")
        elif kind == "proc":
            os.makedirs(path, mode=0o555, exist_ok=True)
            mount("proc", path, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        elif kind == "dev":
            make_dev(path)
        else:
            raise ValueError(f"unknown layout entry {entry!r}")
    uid = request["uid"]
    os.makedirs(root + "/etc", mode=0o755, exist_ok=True)
    write(
        root + "/etc/passwd", f"root:x:0:0:root:/root:/bin/sh\nsandbox:x:{uid}:{uid}:sandbox:/tmp:/bin/bash\n"
    )
    write(root + "/etc/group", f"root:x:0:\nsandbox:x:{uid}:\n")
    workspace = root + config["workspace"]
    os.mkdir(workspace, 0o755)
    copy_tree(
        request["env_dir"], workspace, uid, set(config["ignore_names"]), tuple(config["ignore_suffixes"])
    )
    os.chown(workspace, uid, uid)
    os.umask(0o022)
    loopback_up()
    os.chdir(root)
    _check(_libc.syscall(SYS_PIVOT_ROOT[os.uname().machine], b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "detach the host's root")
    os.chdir("/")


def bind(source: str, target: str, optional: bool) -> None:
    """A read-only, nosuid, nodev bind of source (not its submounts) at target."""
    try:
        is_dir = stat.S_ISDIR(os.stat(source).st_mode)
    except FileNotFoundError:
        if optional:
            return
        raise
    os.makedirs(target if is_dir else os.path.dirname(target), mode=0o755, exist_ok=True)
    if not is_dir:
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o644))
    mount(source, target, None, MS_BIND)
    mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def make_dev(path: str) -> None:
    """A minimal /dev: the harmless character devices, a private pts instance, shm, the fd links."""
    os.makedirs(path, mode=0o755, exist_ok=True)
    mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=1m,mode=0755")
    for name, (major, minor) in DEVICES.items():
        os.mknod(f"{path}/{name}", stat.S_IFCHR | 0o666, os.makedev(major, minor))
    os.mkdir(f"{path}/shm", 0o1777)
    os.mkdir(f"{path}/pts", 0o755)
    mount("devpts", f"{path}/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx")):  # fmt: skip
        os.symlink(target, f"{path}/{name}")


def write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def copy_tree(
    source: str, target: str, uid: int, ignore_names: set[str], ignore_suffixes: tuple[str, ...]
) -> None:
    """Copy source into the existing directory target, everything owned by uid; symlinks copied as links.

    Modes are kept without set-id bits; files keep their modification times; other file types (fifos, sockets,
    devices) are left out.
    """
    with os.scandir(source) as entries:
        for entry in entries:
            name = entry.name
            if name in ignore_names or name.endswith(ignore_suffixes):
                continue
            src, dst = entry.path, f"{target}/{name}"
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(src), dst)
                os.lchown(dst, uid, uid)
            elif stat.S_ISDIR(st.st_mode):
                os.mkdir(dst, stat.S_IMODE(st.st_mode) & 0o1777)
                copy_tree(src, dst, uid, ignore_names, ignore_suffixes)
                os.chown(dst, uid, uid)
            elif stat.S_ISREG(st.st_mode):
                copy_file(src, dst, st, uid)


def copy_file(source: str, target: str, st: os.stat_result, uid: int, mode: int | None = None) -> None:
    """Copy one regular file (contents, mode without set-id bits or `mode`, modification time), owned by uid."""
    fin = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    try:
        mode = stat.S_IMODE(st.st_mode) & 0o777 if mode is None else mode
        fout = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            offset = 0
            while offset < st.st_size:
                sent = os.sendfile(fout, fin, offset, st.st_size - offset)
                if sent == 0:
                    break  # the source shrank while being copied
                offset += sent
            os.fchown(fout, uid, uid)
            os.utime(fout, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(fout)
    finally:
        os.close(fin)


def loopback_up() -> None:
    """Bring the new network namespace's loopback up (as bubblewrap does): 127.0.0.1 inside, nothing outside."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:  # any socket reaches the device ioctls
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh22x", b"lo", IFF_UP | IFF_LOOPBACK | IFF_RUNNING))


def serve(request: dict, ctl: socket.socket) -> int:
    """Run commands until swerl closes the control socket; then kill and reap everything, and return."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    running: dict[int, int] = {}  # pid -> command id
    env = request["env"]
    while True:
        ready, _, _ = select.select([ctl.fileno(), wake_r], [], [])
        if wake_r in ready:
            while True:
                try:
                    if not os.read(wake_r, 512):
                        break
                except BlockingIOError:
                    break
            reap(ctl, running)
        if ctl.fileno() in ready:
            try:
                data, fds, _, _ = socket.recv_fds(ctl, MESSAGE_BYTES, 2)
            except OSError:
                data, fds = b"", []
            if not data:
                kill_all()
                while True:
                    try:
                        os.waitpid(-1, 0)
                    except ChildProcessError:
                        return 0
            message = json.loads(data)
            if message["op"] == "exec":
                try:
                    running[spawn(env, message, fds)] = message["id"]
                except OSError as exc:
                    with contextlib.suppress(OSError):
                        send(ctl, {"id": message["id"], "error": str(exc)})
                finally:
                    for fd in fds:
                        os.close(fd)
            elif message["op"] == "kill":
                kill_all()


def kill_all() -> None:
    """SIGKILL every process of this pid namespace but init (this process)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)


def reap(ctl: socket.socket, running: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        command = running.pop(pid, None)
        if command is None:
            continue  # a command's orphan, reparented to init
        if not running:
            kill_all()  # nothing outlives its command (and the output pipe reaches end of file)
        code = os.waitstatus_to_exitcode(status)
        with contextlib.suppress(OSError):  # swerl is gone: the end of file that follows ends this init
            send(ctl, {"id": command, "exit": code if code >= 0 else 128 - code})


def spawn(env: dict, message: dict, fds: list[int]) -> int:
    """Start one command (vfork + exec, as the sandbox's uid); OSError if it could not start."""
    for fd in fds:
        os.set_inheritable(fd, False)  # the command gets them as 0, 1, 2 only
    stdin = (
        (os.POSIX_SPAWN_DUP2, fds[1], 0)
        if len(fds) > 1
        else (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)
    )
    os.chdir(message["cwd"])
    argv = message["argv"]
    return os.posix_spawn(
        argv[0],
        argv,
        env,
        file_actions=[stdin, (os.POSIX_SPAWN_DUP2, fds[0], 1), (os.POSIX_SPAWN_DUP2, fds[0], 2)],
        setsid=True,
        resetids=True,
        setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGINT),
    )


if __name__ == "__main__":
    zygote(socket.socket(fileno=int(sys.argv[1])), int(sys.argv[2]))
