"""An image's root file system on the host, for local sandboxes that run image tasks.

The local backend runs an image task from the image's files, not in a container: the image (with swerl's sandbox
layer, swerl.sandbox.images.build_task_layer) is exported once per image id through a Docker engine into
`cache_dir()/rootfs/<id>` (extracted into a temporary directory, then renamed: a half-exported tree is never
used), and each sandbox binds its top-level directories read-only where the host's would be (`rootfs_layout`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from swerl.sandbox.images import ENV_SOURCE

SKIP_TOP = frozenset({"proc", "dev", "sys", "tmp", "run", "workspace", "mnt", "media", "boot", "lost+found"})
"""Top-level entries of an image that a sandbox gets from its own layout (or not at all)."""
SKIP_ETC = frozenset(
    {
        "passwd",
        "group",
        "shadow",
        "gshadow",
        "passwd-",
        "group-",
        "shadow-",
        "gshadow-",
        "hostname",
        "hosts",
        "resolv.conf",
        "mtab",
    }
)
"""/etc entries a sandbox never takes from the image (its init writes passwd and group; no credentials)."""


def exported_rootfs(client: Any, tag: str, cache: Path) -> Path:
    """The root file system of image `tag`, exported once per image id into `cache`; returns its directory.

    `client` is a docker.DockerClient. Files keep their owners (swerl runs as root wherever it may mount)."""
    image = client.images.get(tag)
    target = cache / image.id.replace("sha256:", "")[:32]
    if (target / ENV_SOURCE.lstrip("/")).is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    container = client.containers.create(image.id, command=["/bin/true"], network_disabled=True)
    try:
        staging = Path(tempfile.mkdtemp(prefix=".export-", dir=cache))
        try:
            untar = subprocess.Popen(
                ["tar", "-x", "--numeric-owner", "--exclude=dev/*", "-C", str(staging)], stdin=subprocess.PIPE
            )
            assert untar.stdin is not None
            for chunk in container.export():
                untar.stdin.write(chunk)
            untar.stdin.close()
            if untar.wait() != 0:
                raise RuntimeError(f"extracting the root file system of {tag} failed (tar exit {untar.returncode})")
            if not (staging / ENV_SOURCE.lstrip("/")).is_dir():
                raise RuntimeError(f"{tag} has no {ENV_SOURCE}: not an image with swerl's sandbox layer")
            try:
                os.rename(staging, target)
            except OSError:  # another process exported it meanwhile
                if not (target / ENV_SOURCE.lstrip("/")).is_dir():
                    raise
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    finally:
        container.remove(force=True)
    return target


def rootfs_layout(rootfs: Path) -> list[list[Any]]:
    """The supervisor's mount plan for a sandbox over `rootfs`: every top-level directory bound read-only, its
    symlinks recreated, /etc a directory of its own with the image's entries (not its users) bound or copied."""
    layout: list[list[Any]] = []
    for entry in sorted(rootfs.iterdir(), key=lambda p: p.name):
        if entry.name in SKIP_TOP or entry.name == "etc":
            continue
        if entry.is_symlink():
            layout.append(["symlink", f"/{entry.name}", os.readlink(entry)])
        elif entry.is_dir():
            layout.append(["ro-bind", f"/{entry.name}", str(entry)])
    layout.append(["dir", "/etc", 0o755])
    etc = rootfs / "etc"
    for entry in sorted(etc.iterdir(), key=lambda p: p.name) if etc.is_dir() else []:
        if entry.name in SKIP_ETC:
            continue
        if entry.is_symlink():
            layout.append(["symlink", f"/etc/{entry.name}", os.readlink(entry)])
        elif entry.is_dir():
            layout.append(["ro-bind", f"/etc/{entry.name}", str(entry)])
        elif entry.is_file():
            layout.append(["copy-try", f"/etc/{entry.name}", str(entry)])
    return layout


def bwrap_rootfs_args(rootfs: Path) -> list[str]:
    """bubblewrap's arguments for the same file system as rootfs_layout (passwd and group bound by the caller)."""
    args: list[str] = []
    for kind, dest, src in rootfs_layout(rootfs):
        if kind == "symlink":
            args += ["--symlink", str(src), dest]
        elif kind == "dir":
            args += ["--perms", "0755", "--dir", dest]
        else:  # ro-bind and copy-try: bubblewrap binds files as cheaply as it copies them
            args += ["--ro-bind", str(src), dest]
    return args
