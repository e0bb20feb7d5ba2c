"""Size-capped tmpfs workspaces for local sandboxes, each in a mount namespace of its own.

A local sandbox's workspace is a directory bound at /workspace; without a cap, a command can fill the host disk
file by file (RLIMIT_FSIZE bounds one file only). A tmpfs of the configured size on the sandbox's root directory
caps it: a write past the size fails with ENOSPC inside the sandbox, and the host is untouched.

The tmpfs is not mounted in the host's mount namespace: every bubblewrap start copies its parent's mount table,
so N host mounts would make each of N concurrent starts copy N more entries (measured: p99 start latency 2x worse
at a burst of 384). Instead a holder process (`setpriv --pdeathsig KILL unshare --mount sh`, then `sleep`) owns a
private mount namespace with the one tmpfs in it; commands enter it with `nsenter --mount`, and the host reaches
the files through `/proc/PID/root`. When the holder dies (close, or swerl itself dying: the parent-death signal)
the namespace and the tmpfs go with it: nothing to unmount, nothing leaked by a crash.
Mounting needs CAP_SYS_ADMIN (root on a normal host).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import shutil
import tempfile
from pathlib import Path

from swerl.errors import InfraError

MS_NOSUID = 2
MS_NODEV = 4
MNT_DETACH = 2
SOURCE = b"swerl-sandbox"
"""The mount source shown in /proc/mounts."""

_libc: ctypes.CDLL | None = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def mount_tmpfs(path: Path, size_mb: int, mode: int = 0o700) -> None:
    """Mount a tmpfs of size_mb MiB (nosuid, nodev) on path; OSError (EPERM without the capability) on failure."""
    options = f"size={size_mb}m,mode={mode:o}".encode()
    if _c().mount(SOURCE, os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mount tmpfs on {path}: {os.strerror(code)}")


def unmount(path: Path) -> None:
    """Detach the mount at path (lazily: processes still inside keep it until they end); not mounted is fine."""
    if _c().umount2(os.fsencode(path), MNT_DETACH) != 0:
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOENT):  # EINVAL: nothing is mounted there
            raise OSError(code, f"umount {path}: {os.strerror(code)}")


HOLDER_TOOLS = ("setpriv", "unshare", "nsenter")
"""util-linux tools a holder needs (setpriv is required by local sandboxes anyway)."""


def holder_tools() -> dict[str, str] | None:
    """Paths of the holder's tools, or None if one is missing."""
    found = {tool: shutil.which(tool) for tool in HOLDER_TOOLS}
    return None if None in found.values() else {tool: str(path) for tool, path in found.items()}


def can_hold_tmpfs(probe_parent: Path) -> tuple[bool, str]:
    """Whether size-capped workspaces work here: the holder's tools are installed and this process may mount."""
    if holder_tools() is None:
        missing = [tool for tool in HOLDER_TOOLS if shutil.which(tool) is None]
        return False, f"{' and '.join(missing)} not found (install util-linux)"
    return can_mount(probe_parent)


def can_mount(probe_parent: Path) -> tuple[bool, str]:
    """Whether this process may mount a tmpfs (tried for real on a scratch directory under probe_parent)."""
    probe_parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="swerl-mount-probe-", dir=probe_parent))
    try:
        mount_tmpfs(scratch, 1)
    except OSError as exc:
        return False, str(exc)
    else:
        unmount(scratch)
        return True, "tmpfs mounts allowed"
    finally:
        os.rmdir(scratch)


_HOLDER_SCRIPT = (
    'mount -t tmpfs -o "size=${SWERL_TMPFS_MB}m,mode=0700,nosuid,nodev" "$SWERL_TMPFS_SOURCE" "$SWERL_TMPFS_ROOT" '
    "&& echo ready && exec sleep infinity"
)


class TmpfsHolder:
    """The process whose private mount namespace has a size-capped tmpfs mounted on `root`."""

    def __init__(self, proc: asyncio.subprocess.Process, root: Path, nsenter: str) -> None:
        self.proc, self.root, self.nsenter = proc, root, nsenter

    @property
    def host_root(self) -> Path:
        """`root` as the host reaches it: through the holder's /proc/PID/root, inside its mount namespace."""
        return Path(f"/proc/{self.proc.pid}/root") / self.root.relative_to("/")

    def enter_args(self) -> list[str]:
        """The command prefix that runs a command in the holder's mount namespace (nsenter execs it directly)."""
        return [self.nsenter, f"--mount=/proc/{self.proc.pid}/ns/mnt", "--"]

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def close(self) -> None:
        """End the holder; the namespace and the tmpfs (with every file in it) go with it."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        await self.proc.wait()


async def hold_tmpfs(root: Path, size_mb: int, tools: dict[str, str], timeout_s: float) -> TmpfsHolder:
    """Start a holder with a tmpfs of size_mb MiB on root (an existing directory) in its own mount namespace.

    tools maps setpriv, unshare and nsenter to their paths. InfraError(start_failed/start_timeout) on failure.
    """
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "SWERL_TMPFS_MB": str(size_mb),
        "SWERL_TMPFS_ROOT": str(root),
        "SWERL_TMPFS_SOURCE": SOURCE.decode(),
    }
    proc = await asyncio.create_subprocess_exec(
        tools["setpriv"],
        "--pdeathsig",
        "KILL",
        "--",
        tools["unshare"],
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        _HOLDER_SCRIPT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    holder = TmpfsHolder(proc, root, tools["nsenter"])
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), timeout_s)
    except TimeoutError:
        await holder.close()
        raise InfraError("start_timeout", f"workspace tmpfs not mounted within {timeout_s}s") from None
    except BaseException:
        await holder.close()
        raise
    if line.strip() != b"ready":
        rest = b""
        with contextlib.suppress(TimeoutError):
            rest = await asyncio.wait_for(proc.stdout.read(4096), 5)
        await holder.close()
        raise InfraError(
            "start_failed",
            f"cannot mount the workspace tmpfs: {(line + rest).decode(errors='replace').strip()}",
        )
    return holder
