"""Host-side preparation for local sandboxes (both runtimes): required tools, interpreter directories, the /etc
entries and start commands every sandbox gets, and the naming and sweep of sandbox directories."""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from swerl.errors import InfraError
from swerl.sandbox.base import IGNORED_AT_START_CMD
from swerl.sandbox.process import owner_alive, owner_tag

ETC_FILES = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf")
"""Host /etc entries a sandbox sees (dynamic linker and locale plumbing; nothing with credentials)."""

_GIT = ["git", "-c", "user.name=swerl", "-c", "user.email=swerl@localhost", "-c", "init.defaultBranch=main"]
GIT_BASELINE = (
    " && ".join(
        shlex.join([*_GIT, *args])
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "--no-verify", "-m", "task start"])
    )
    + f" && {shlex.join(_GIT)} {IGNORED_AT_START_CMD}"
)
"""git_baseline: the agent's patch is later `git diff` against this commit, the task's starting state."""

START_CHECK = "test -w /workspace && python -c 'pass'"
"""A provider's first start runs this in its sandbox: the workspace is writable and the interpreter runs."""

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
def own_tag(pid: int) -> str:
    """This process's owner_tag, read once (keyed by pid: a forked child gets its own)."""
    return owner_tag(pid)


def require_tools(bwrap: str) -> dict[str, str]:
    """Absolute paths of bwrap, prlimit and setpriv, or InfraError(start_failed) naming what to install."""
    found: dict[str, str] = {}
    for tool, package in ((bwrap, "bubblewrap"), ("prlimit", "util-linux"), ("setpriv", "util-linux")):
        path = shutil.which(tool)
        if path is None:
            raise InfraError(
                "start_failed",
                f"{tool} not found: local sandboxes need it (install {package}, e.g. apt-get install {package}); "
                "swerl never runs task code unsandboxed",
            )
        found[tool] = path
    return found


def ancestors(path: str) -> list[str]:
    """'/a/b/c' -> ['/a', '/a/b'] (the directories bubblewrap must create above a bind target)."""
    parts = Path(path).parts[1:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def interpreter_dirs(python_executable: str) -> list[str]:
    """The directories an interpreter needs at run time: its venv and base prefixes, outside /usr."""
    probe = (
        "import json, os, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, "
        "sys.base_exec_prefix, os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))]))"
    )

    try:
        out = subprocess.run([python_executable, "-I", "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InfraError("start_failed", f"cannot run sandbox interpreter {python_executable}: {exc}") from exc
    if out.returncode != 0:
        raise InfraError("start_failed", f"sandbox interpreter {python_executable} failed: {out.stderr.strip()}")
    dirs = sorted({os.path.realpath(p) for p in json.loads(out.stdout)} | {str(Path(python_executable).parent.parent)})
    # /usr is bound whole; a prefix inside another one needs no bind of its own.
    outside = [d for d in dirs if d != "/" and not d.startswith("/usr/") and d != "/usr"]
    return [d for d in outside if not any(d != o and d.startswith(o + "/") for o in outside)]
