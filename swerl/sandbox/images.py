"""Sandbox images for the Docker backend: the offline base image and per-repository environment images.

No image registry is reachable from the machines this project is developed on, so the base image is built
offline: `debootstrap --variant=minbase` into a directory (from the Debian mirror apt already uses), a few files
added (the sandbox user, `python` on PATH), then `tar | docker import`. An environment image is the base plus
one repository at ENV_SOURCE (a `docker build` with a two-line Dockerfile and no network); a container copies it
to its private /workspace at start. images/ holds the Dockerfiles for machines that can pull from a registry.

    python -m swerl.sandbox.images base [--name NAME] [--mirror URL]
    python -m swerl.sandbox.images env DIR [--base NAME]
    python -m swerl.sandbox.images project SRC_DIR --tag TAG -r pytest -r DEP ... [--python-path src]
    python -m swerl.sandbox.images instance PROJECT_IMAGE BUG.patch --tag TAG
    python -m swerl.sandbox.images e2b-template IMAGE OUT_DIR [--repo-dir /testbed]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BASE_IMAGE = "swerl-base:bookworm"
"""The default base image name (what `python -m swerl.sandbox.images base` builds)."""
ENV_REPOSITORY = "swerl-env"
"""Environment images are tagged swerl-env:<content hash of the repository>."""
TASK_LAYER_REPOSITORY = "swerl-task"
"""A task image with swerl's sandbox layer on top is tagged swerl-task:<hash of the image id and layer recipe>."""
TASK_LAYER_VERSION = 1
"""Part of every task layer's tag: bump it when build_task_layer's recipe changes."""
ENV_SOURCE = "/opt/swerl/env"
"""Where an environment image holds the repository, exactly as it must appear at /workspace."""
SANDBOX_UID = 10001
"""The unprivileged user every sandboxed command runs as (also the owner of ENV_SOURCE)."""
PACKAGES = ("python3", "python3-venv", "git")
"""What debootstrap adds to the minimal base (the CPU default's repositories are pure Python)."""
LABEL = "org.swerl.image"
"""Label on every image swerl builds: 'base' or 'env'."""

_SKIP = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}


def debian_mirror(sources_dir: Path = Path("/etc/apt/sources.list.d"), suite: str = "bookworm") -> str:
    """The Debian mirror apt already uses for `suite` (deb822 .sources or one-line .list files)."""
    candidates = sorted(sources_dir.glob("*.sources")) + sorted(sources_dir.glob("*.list"))
    candidates += [sources_dir.parent / "sources.list"]
    for path in candidates:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for stanza in re.split(r"\n\s*\n", text):
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.+)$", stanza, flags=re.M))
            if suite in fields.get("Suites", "").split() and "URIs" in fields:
                return fields["URIs"].split()[0]
        for line in text.splitlines():
            parts = re.sub(r"\[[^\]]*\]", " ", line).split()  # drop [arch=... signed-by=...] options
            if len(parts) >= 3 and parts[0] == "deb" and parts[2] == suite:
                return parts[1]
    raise RuntimeError(f"no Debian mirror for {suite} in {sources_dir} (pass --mirror)")


def image_present(name: str) -> bool:
    """Whether the local Docker engine has an image by this name."""
    found = subprocess.run(["docker", "image", "inspect", name], capture_output=True, text=True)
    return found.returncode == 0


def build_base(name: str = BASE_IMAGE, mirror: str | None = None, rebuild: bool = False) -> str:
    """Build the base image offline (debootstrap + docker import); an existing image is reused."""
    if image_present(name) and not rebuild:
        print(f"{name}: present, reused")
        return name
    for tool in ("debootstrap", "docker"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} not found (apt-get install {'docker.io' if tool == 'docker' else tool})")
    mirror = mirror or debian_mirror()
    with tempfile.TemporaryDirectory(prefix="swerl-rootfs-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        include = ",".join(PACKAGES)
        print(f"debootstrap bookworm from {mirror} into {rootfs} (a few minutes)")
        subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={include}", "bookworm", str(rootfs), mirror],
            check=True,
        )
        finish_rootfs(rootfs)
        changes = [
            "ENV PATH=/usr/local/bin:/usr/bin:/bin",
            "ENV LANG=C.UTF-8",
            "WORKDIR /workspace",
            'CMD ["/bin/bash"]',
            f"LABEL {LABEL}=base",
        ]
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["docker", "import", *[arg for c in changes for arg in ("--change", c)], "-", name],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
        )
        assert tar.stdout is not None
        tar.stdout.close()
        if tar.wait() != 0 or imported.returncode != 0:
            raise RuntimeError(f"docker import failed: {imported.stderr.strip()}")
    print(f"{name}: built")
    return name


def finish_rootfs(rootfs: Path) -> None:
    """Add the sandbox user, `python`, /workspace and ENV_SOURCE; drop apt's caches."""
    uid = SANDBOX_UID
    with (rootfs / "etc/passwd").open("a") as f:
        f.write(f"sandbox:x:{uid}:{uid}:sandbox:/tmp:/bin/bash\n")
    with (rootfs / "etc/group").open("a") as f:
        f.write(f"sandbox:x:{uid}:\n")
    python = rootfs / "usr/local/bin/python"
    python.parent.mkdir(parents=True, exist_ok=True)
    if not python.exists():
        python.symlink_to("/usr/bin/python3")
    for directory in ("workspace", ENV_SOURCE.lstrip("/")):
        (rootfs / directory).mkdir(parents=True, exist_ok=True)
        os.chown(rootfs / directory, uid, uid)
    for cache in ("var/cache/apt", "var/lib/apt/lists"):
        for entry in (rootfs / cache).glob("*"):
            if entry.is_file():
                entry.unlink()


def env_digest(env_dir: Path, base: str) -> str:
    """A content hash of a repository directory (paths, modes, bytes) and the base image name."""
    digest = hashlib.sha256(base.encode())
    for path in _walk(env_dir):
        rel = path.relative_to(env_dir).as_posix()
        digest.update(f"\0{rel}\0{path.lstat().st_mode:o}\0".encode())
        digest.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
    return digest.hexdigest()[:16]


def env_image_name(env_dir: Path, base: str = BASE_IMAGE) -> str:
    """The tag of a repository's environment image: swerl-env:<content hash>."""
    return f"{ENV_REPOSITORY}:{env_digest(env_dir, base)}"


def build_offline(
    client: Any,
    tag: str,
    dockerfile: str,
    labels: dict[str, str],
    files: dict[str, str] | None = None,
    trees: dict[str, Path] | None = None,
    what: str = "",
) -> None:
    """`docker build` of `dockerfile` with network "none" and no pull (a FROM image must be on the engine), its
    context the given directory `trees` (arcname -> path, "." for the context's root; caches skipped, a root
    Dockerfile replaced by `dockerfile`) and small `files` (name -> text); RuntimeError with the last line of the
    build's last error."""

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if info.name in ("Dockerfile", "./Dockerfile") else _skip_caches(info)

    with tempfile.TemporaryFile() as context:
        with tarfile.open(fileobj=context, mode="w") as tar:
            for name, tree in (trees or {}).items():
                tar.add(tree, arcname=name, filter=keep)
            for name, text in {**(files or {}), "Dockerfile": dockerfile}.items():
                data = text.encode()
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        context.seek(0)
        log = client.api.build(
            fileobj=context,
            custom_context=True,
            tag=tag,
            rm=True,
            forcerm=True,
            pull=False,
            network_mode="none",
            labels=labels,
            use_config_proxy=False,
            decode=True,
        )
        errors = [str(entry["error"]).strip() for entry in log if "error" in entry]
    if errors:
        last = errors[-1].splitlines()[-1] if errors[-1] else errors[-1]
        raise RuntimeError(f"building {tag}{' ' + what if what else ''} failed: {last}")


def build_env(client: Any, env_dir: Path, base: str = BASE_IMAGE) -> str:
    """Build (or reuse) the environment image of a repository directory on `base`; returns its tag.

    `client` is a docker.DockerClient. The build runs with network "none": it only copies files.
    """
    import docker.errors

    tag = env_image_name(env_dir, base)
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    try:  # checked first: a build FROM a missing image would try to pull it from a registry
        client.images.get(base)
    except docker.errors.ImageNotFound as exc:
        raise RuntimeError(f"base image {base} is missing") from exc
    dockerfile = f"FROM {base}\nCOPY --chown={SANDBOX_UID}:{SANDBOX_UID} src/ {ENV_SOURCE}/\n"
    labels = {LABEL: "env", "org.swerl.env.source": str(env_dir)}
    build_offline(client, tag, dockerfile, labels, trees={"src": env_dir}, what=f"from {env_dir}")
    return tag


def task_layer_dockerfile(image: str, repo_dir: str, uid: int = SANDBOX_UID, user: str = "sandbox") -> str:
    """swerl's sandbox layer on a task image: the repository moved to ENV_SOURCE without its git history (which
    can hold the fix), its old place a symlink to /workspace (where each sandbox gets its private copy, so the
    image's editable installs and scripts see that copy), the sandbox user (`uid`, named `user` where the image
    has no such uid), /workspace."""
    repo = repo_dir.rstrip("/")
    script = " && ".join(
        [
            f'test -d "{repo}" || {{ echo "swerl: no repository at {repo} in {image}" >&2; exit 3; }}',
            f"mkdir -p {os.path.dirname(ENV_SOURCE)} /workspace",
            f"rm -rf {ENV_SOURCE}",
            f'mv "{repo}" {ENV_SOURCE}',
            f"rm -rf {ENV_SOURCE}/.git",
            f'ln -s /workspace "{repo}"',
            f"(grep -q '^[^:]*:[^:]*:{uid}:' /etc/passwd "
            f"|| echo '{user}:x:{uid}:{uid}:{user}:/tmp:/bin/bash' >> /etc/passwd)",
            f"(grep -q '^[^:]*:[^:]*:{uid}:' /etc/group || echo '{user}:x:{uid}:' >> /etc/group)",
            f"chown -R {uid}:{uid} {ENV_SOURCE} /workspace",
            "(command -v git >/dev/null || { echo 'swerl: the image has no git' >&2; exit 4; })",
        ]
    )
    return f'FROM {image}\nUSER root\nRUN ["/bin/sh", "-c", {json.dumps(script)}]\nWORKDIR /workspace\n'


def build_task_layer(client: Any, image: str, repo_dir: str | None = None) -> tuple[str, str, bool]:
    """swerl's sandbox layer built (or reused) on a task image already on the engine (task_layer_dockerfile);
    `repo_dir` None: the image's WORKDIR. Returns (tag, the image's PATH, reused).

    `client` is a docker.DockerClient. The build runs with network "none" and never pulls."""
    source = client.images.get(image)
    config = source.attrs.get("Config") or {}
    repo = repo_dir or (config.get("WorkingDir") or "")
    if not repo.startswith("/") or repo.rstrip("/") == "":
        raise RuntimeError(
            f"image {image} has no WORKDIR naming its repository (got {repo!r}): give the repository's path "
            "(ImageEnvironment.repo_dir)"
        )
    path = next((e[5:] for e in config.get("Env") or [] if e.startswith("PATH=")), "")
    recipe = f"{TASK_LAYER_VERSION}\0{source.id}\0{repo}"
    tag = f"{TASK_LAYER_REPOSITORY}:{hashlib.sha256(recipe.encode()).hexdigest()[:16]}"
    try:
        client.images.get(tag)
        return tag, path, True
    except docker_errors().ImageNotFound:
        pass
    labels = {LABEL: "task", "org.swerl.task.image": image, "org.swerl.task.repo_dir": repo}
    build_offline(
        client,
        tag,
        task_layer_dockerfile(source.id, repo),
        labels,
        what=f"(swerl's sandbox layer on {image})",
    )
    return tag, path, False


def swesmith_image_name(owner: str, name: str, commit: str) -> str:
    """SWE-smith's name for a repository's environment image ('/' spelled '_1776_', the commit's first 8)."""
    return f"swesmith.x86_64.{owner}_1776_{name}.{commit[:8]}".lower()


PROJECT_REPO_DIR = "/testbed"
"""Where project images keep the repository, as SWE-bench's and SWE-smith's images do."""
PROJECT_VENV = "/opt/venv"
"""The project image's interpreter: a virtualenv first on PATH, the repository on its path (a .pth file)."""


def project_dockerfile(base: str, python_path: str) -> str:
    """A repository's image in SWE-bench's layout: the repository at /testbed (a git repository at one
    commit), a virtualenv with the test requirements from the build's wheelhouse (no network), the repository
    (or its `python_path` subdirectory, e.g. src) on the virtualenv's path like an editable install."""
    site = f"$({PROJECT_VENV}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')"
    target = f"{PROJECT_REPO_DIR}/{python_path}".rstrip("/").replace("/./", "/")
    git = "git -c user.name=swerl -c user.email=swerl@localhost -c init.defaultBranch=main"
    run = " && ".join(
        [
            f"python3 -m venv {PROJECT_VENV}",
            f"{PROJECT_VENV}/bin/pip install --no-index --no-cache-dir --find-links /opt/wheels "
            "-r /opt/wheels/requirements.txt",
            f'echo {target} > "{site}/swerl-testbed.pth"',
            "rm -rf /opt/wheels",
            f"cd {PROJECT_REPO_DIR} && {git} init -q && {git} add -A && {git} commit -q -m base",
        ]
    )
    return (
        f"FROM {base}\nUSER root\nCOPY wheels/ /opt/wheels/\nCOPY src/ {PROJECT_REPO_DIR}/\n"
        f"RUN {run}\nENV PATH={PROJECT_VENV}/bin:/usr/local/bin:/usr/bin:/bin\nWORKDIR {PROJECT_REPO_DIR}\n"
        f"LABEL {LABEL}=project\n"
    )


def download_wheels(requirements: list[str], dest: Path) -> None:
    """Wheels for `requirements` (and their dependencies) from the package index into `dest`, at build time."""
    dest.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["python3", "-m", "pip", "download", "--quiet", "--only-binary=:all:", "-d", str(dest), *requirements],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"pip download {' '.join(requirements)} failed: {done.stderr.strip()[-800:]}")
    (dest / "requirements.txt").write_text("\n".join(requirements) + "\n")


def build_project_image(
    client: Any,
    src_dir: Path,
    tag: str,
    requirements: list[str],
    python_path: str = "",
    base: str = BASE_IMAGE,
    wheelhouse: Path | None = None,
) -> str:
    """Build (or reuse, by the `org.swerl.project.digest` label) an image of a repository in SWE-bench's
    layout (project_dockerfile); `requirements` are the test requirements and the project's own dependencies
    (pytest among them), fetched as wheels at build time. Returns the tag."""
    import docker.errors

    digest = hashlib.sha256(f"{env_digest(src_dir, base)}\0{sorted(requirements)}\0{python_path}".encode()).hexdigest()[
        :16
    ]
    try:
        if client.images.get(tag).labels.get("org.swerl.project.digest") == digest:
            return tag
    except docker.errors.ImageNotFound:
        pass
    with tempfile.TemporaryDirectory(prefix="swerl-project-") as tmp:
        wheels = wheelhouse or Path(tmp) / "wheels"
        if wheelhouse is None:
            download_wheels(requirements, wheels)
        labels = {LABEL: "project", "org.swerl.project.digest": digest}
        build_offline(
            client,
            tag,
            project_dockerfile(base, python_path),
            labels,
            trees={"src": src_dir, "wheels": wheels},
            what=f"from {src_dir}",
        )
    return tag


def build_instance_image(client: Any, project_image: str, bug_patch: str, tag: str) -> str:
    """A SWE-bench-style instance image: the project image with the bug applied and committed, so the
    repository at /testbed starts broken (SWE-bench's `patch` is then the fix)."""
    git = "git -c user.name=swerl -c user.email=swerl@localhost"
    dockerfile = (
        f"FROM {project_image}\nUSER root\nCOPY bug.patch /tmp/bug.patch\n"
        f"RUN cd {PROJECT_REPO_DIR} && git apply /tmp/bug.patch && rm /tmp/bug.patch && {git} commit -qam instance\n"
    )
    build_offline(
        client,
        tag,
        dockerfile,
        {LABEL: "instance"},
        files={"bug.patch": bug_patch},
        what=f"on {project_image}",
    )
    return tag


E2B_UID, E2B_USER = 1000, "user"
"""Who runs commands in an e2b sandbox."""


def write_e2b_template(
    image: str,
    repo_dir: str,
    out_dir: Path,
    name: str | None = None,
    cpu_count: int = 2,
    memory_mb: int = 2048,
) -> str:
    """The e2b template files (e2b.Dockerfile, e2b.toml) of a task image: swerl's sandbox layer for e2b's user
    on the image, so the e2b backend only copies ENV_SOURCE into /workspace at start. `e2b template build` in
    `out_dir` builds and registers it; name it in agent.sandbox.e2b.image_templates. Returns the template name."""
    name = name or "swerl-" + re.sub(r"[^a-z0-9-]+", "-", image.lower()).strip("-")[:50]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "e2b.Dockerfile").write_text(task_layer_dockerfile(image, repo_dir, E2B_UID, E2B_USER))
    (out_dir / "e2b.toml").write_text(
        f"# swerl's sandbox layer on {image}; `e2b template build` here, then\n"
        f'# agent.sandbox.e2b.image_templates: {{"{image}": "{name}"}}\n'
        f'template_name = "{name}"\ndockerfile = "e2b.Dockerfile"\ncpu_count = {cpu_count}\nmemory_mb = {memory_mb}\n'
    )
    return name


def docker_errors() -> Any:
    import docker.errors

    return docker.errors


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP)
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            if not name.endswith(".pyc"):
                yield Path(dirpath) / name


def _skip_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    name = info.name.rsplit("/", 1)[-1]
    return None if name in _SKIP or name.endswith(".pyc") else info


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m swerl.sandbox.images", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    base = sub.add_parser("base", help="build the base image offline (reused when present)")
    base.add_argument("--name", default=BASE_IMAGE)
    base.add_argument("--mirror", default=None, help="Debian mirror (default: the one apt uses)")
    base.add_argument("--rebuild", action="store_true")
    env = sub.add_parser("env", help="build a repository's environment image on the base (reused when present)")
    env.add_argument("env_dir", type=Path)
    env.add_argument("--base", default=BASE_IMAGE)
    project = sub.add_parser(
        "project", help="a project's source as an image in SWE-bench's layout (/testbed, a venv at /opt/venv)"
    )
    project.add_argument("src_dir", type=Path)
    project.add_argument("--tag", required=True, help="e.g. swesmith.x86_64.owner_1776_name.COMMIT8")
    project.add_argument("--requirement", "-r", action="append", default=[], help="pytest, test deps, deps")
    project.add_argument("--python-path", default="", help="where its packages are, e.g. src")
    project.add_argument("--base", default=BASE_IMAGE)
    instance = sub.add_parser("instance", help="a SWE-bench-style instance image: a project image + a bug")
    instance.add_argument("project_image")
    instance.add_argument("bug_patch", type=Path)
    instance.add_argument("--tag", required=True, help="e.g. swebench/sweb.eval.x86_64.owner_1776_name-1:latest")
    e2b = sub.add_parser("e2b-template", help="write the e2b template files of a task image")
    e2b.add_argument("image")
    e2b.add_argument("out_dir", type=Path)
    e2b.add_argument("--repo-dir", default="/testbed", help="where the image holds the repository")
    e2b.add_argument("--name", default=None)
    args = parser.parse_args(argv)
    if args.command == "base":
        build_base(args.name, args.mirror, args.rebuild)
        return
    if args.command == "e2b-template":
        print(write_e2b_template(args.image, args.repo_dir, args.out_dir, args.name))
        return
    import docker

    client = docker.from_env()
    if args.command == "env":
        print(build_env(client, args.env_dir.resolve(), args.base))
    elif args.command == "project":
        requirements = args.requirement or ["pytest"]
        print(build_project_image(client, args.src_dir.resolve(), args.tag, requirements, args.python_path, args.base))
    else:
        print(build_instance_image(client, args.project_image, args.bug_patch.read_text(), args.tag))


if __name__ == "__main__":
    main()
