"""Host-side preparation for bubblewrap sandboxes: required tools, interpreter directories."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from swerl.errors import InfraError


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
        out = subprocess.run(
            [python_executable, "-I", "-c", probe], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InfraError(
            "start_failed", f"cannot run sandbox interpreter {python_executable}: {exc}"
        ) from exc
    if out.returncode != 0:
        raise InfraError(
            "start_failed", f"sandbox interpreter {python_executable} failed: {out.stderr.strip()}"
        )
    dirs = sorted(
        {os.path.realpath(p) for p in json.loads(out.stdout)} | {str(Path(python_executable).parent.parent)}
    )
    # /usr is bound whole; a prefix inside another one needs no bind of its own.
    outside = [d for d in dirs if d != "/" and not d.startswith("/usr/") and d != "/usr"]
    return [d for d in outside if not any(d != o and d.startswith(o + "/") for o in outside)]
