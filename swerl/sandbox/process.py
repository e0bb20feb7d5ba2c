"""Process plumbing for local sandboxes: bounded output capture, status pipe, group kill, the shell commands."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import os
import shlex
import signal

from swerl.sandbox.base import WORKSPACE, ExecResult


class BoundedOutput:
    """Collects command output, keeping the head and the tail when it exceeds its budget."""

    def __init__(self, max_bytes: int) -> None:
        self.half = max(1, max_bytes // 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > self.half:
            self.dropped += len(self.tail) - self.half
            del self.tail[: len(self.tail) - self.half]

    def text(self) -> str:
        marker = f"\n[... {self.dropped} bytes of output omitted ...]\n".encode() if self.dropped else b""
        return bytes(self.head + marker + self.tail).decode("utf-8", errors="replace")


def kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the command's process group; bubblewrap's death takes its PID namespace with it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def kill_processes_mentioning(text: str) -> int:
    """SIGKILL every process whose command line contains `text`; returns how many were signalled.

    A bubblewrap killed within milliseconds of its start can orphan its namespace's init before that process
    has asked for --die-with-parent's signal, in another process group than the one kill_group reaches. Its
    command line still names the sandbox's directory, which is how close() finds it.
    """
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
    return killed


def read_status(fd: int) -> dict[str, int]:
    """Merge the JSON documents bubblewrap wrote to its status pipe (child-pid, exit-code)."""
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 65536):
            data += chunk
    os.close(fd)
    merged: dict[str, int] = {}
    decoder, text, pos = json.JSONDecoder(), data.decode(errors="replace"), 0
    while (pos := _skip_space(text, pos)) < len(text):
        try:
            doc, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        merged.update({k: v for k, v in doc.items() if isinstance(v, int)})
    return merged


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks after boot (/proc/PID/stat field 22), or None if it is gone.

    A pid with its start time names one process for good: a recycled pid has another start time.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) may hold spaces and parentheses: the fields after it follow the last ')'
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[19])  # field 22 of the whole line is the 20th after comm


def owner_tag(pid: int | None = None) -> str:
    """`PID-STARTTIME` of a process (default: this one): put in a directory name, it tells whether the process
    that made the directory still lives."""
    pid = os.getpid() if pid is None else pid
    start = process_start_time(pid)
    if start is None:
        raise ProcessLookupError(f"no process {pid}")
    return f"{pid}-{start}"


def owner_alive(tag: str) -> bool:
    """Whether the process an owner_tag names is still running (same pid, same start time)."""
    pid, _, start = tag.partition("-")
    return process_start_time(int(pid)) == int(start)


INLINE_COMMAND_BYTES = 64 * 1024
"""Commands up to this size travel as bash's -c argument; longer ones on its stdin (one argument may hold at most
128 KiB, MAX_ARG_STRLEN, and a supervisor message 1 MiB). Not a limit: a command of any size runs."""
_FROM_STDIN = '__swerl_cmd=$(cat) && exec </dev/null && eval "$__swerl_cmd"'
"""Read the command from stdin, then run it with stdin /dev/null as for an inline command (the pipe is swerl's:
reopening it through /dev/fd is refused to the sandbox's uid, and no argument may hold it)."""


def shell_command(cmd: str) -> tuple[str, bytes | None]:
    """bash -c's script and stdin for `cmd`: the command itself, or, when long, a reader of the command on stdin."""
    data = cmd.encode("utf-8", errors="surrogateescape")
    if len(data) <= INLINE_COMMAND_BYTES:
        return cmd, None
    return _FROM_STDIN, data


def refuse_nul(**fields: str) -> ExecResult | None:
    """An error result (exit 2, the reason as output) when one of `fields` holds a NUL byte, else None."""
    bad = [name for name, value in fields.items() if "\0" in value]
    if not bad:
        return None
    message = f"swerl: the {' and '.join(bad)} holds a NUL byte, which no command line can carry; nothing ran\n"
    return ExecResult(exit_code=2, output=message, timed_out=False, duration_s=0.0)


class CommandSandbox(abc.ABC):
    """exec, read_file and write_file of a sandbox that runs an argv (its `_run`) as the sandbox's user."""

    @abc.abstractmethod
    async def _run(self, argv: list[str], timeout: float, cwd: str, stdin: bytes | None) -> ExecResult:
        """Run argv in the sandbox as its user, in cwd, with stdin (None: /dev/null); output merged, bounded."""

    async def exec(self, cmd: str, timeout: float, cwd: str | None = None) -> ExecResult:
        """Run `cmd` with bash in the sandbox; a wall-clock overrun kills the whole sandboxed process tree.

        A command of any size runs (a long one is read by bash from a pipe, see shell_command); one holding a NUL
        byte cannot be a shell command and is an error result, the policy's own doing."""
        refused = refuse_nul(cmd=cmd, cwd=cwd or "")
        if refused is not None:
            return refused
        script, stdin = shell_command(cmd)
        return await self._run(["/bin/bash", "-c", script], timeout, cwd or WORKSPACE, stdin=stdin)

    async def read_file(self, path: str) -> str:
        """Read a file as the sandbox sees it (so a symlink cannot reach outside it)."""
        if "\0" in path:
            raise FileNotFoundError(f"cannot read {path!r} in sandbox: a path cannot hold a NUL byte")
        result = await self._run(["/bin/cat", "--", self._abs(path)], 60.0, WORKSPACE, stdin=None)
        if result.exit_code != 0:
            raise FileNotFoundError(f"cannot read {path} in sandbox: {result.output.strip()}")
        return result.output

    async def write_file(self, path: str, content: str) -> None:
        """Write a file under /workspace from inside the sandbox, creating parent directories."""
        if "\0" in path:
            raise OSError(f"cannot write {path!r} in sandbox: a path cannot hold a NUL byte")
        target = self._abs(path)
        if not (target == WORKSPACE or target.startswith(WORKSPACE + "/")):
            raise ValueError(f"write_file({path!r}): only paths under {WORKSPACE} are writable")
        script = f"mkdir -p -- {shlex.quote(os.path.dirname(target))} && cat > {shlex.quote(target)}"
        result = await self._run(["/bin/bash", "-c", script], 60.0, WORKSPACE, stdin=content.encode())
        if result.exit_code != 0:
            raise OSError(f"cannot write {path} in sandbox: {result.output.strip()}")

    @staticmethod
    def _abs(path: str) -> str:
        return os.path.normpath(path if path.startswith("/") else f"{WORKSPACE}/{path}")
