"""Real repositories: a source on disk (directory, sdist, git repository) made a directory, and a virtualenv of
its own to test it in.

Sources: an sdist (`.tar.gz`) is extracted once into swerl's cache (`repo-src/sdist-<sha256 of the archive>`); a
git repository (a bare repository's path or a `file://` URL) is cloned locally into `repo-src/git-<hash of
URL and HEAD>`; a directory is used as it is.

Environments: `build_env` makes `repo-envs/<hash>/` under swerl's cache (SWERL_CACHE_DIR), keyed by the
repository's tree hash, its extra requirements, its import path and the base interpreter, with `python -m venv`
(no system site-packages, so nothing swerl installed can shadow the repository's own dependencies). pip installs
pytest, the `install` requirements and the repository's own dependencies from the registry (or the wheelhouse pip
is configured with) at build time, never at sandbox start. The repository itself is then uninstalled again and a
`.pth` file puts `/workspace/<python_path>` on the path instead: the sandbox's copy of the code (with the bug) is
what the tests import, never a copy installed at build time. The build happens in a temporary directory renamed
into place, so concurrent curations never see half an environment.

References: a task curated from such a repository names its environment as `venv:///SOURCE/DIR?python_path=P&
install=REQ&...&env=KEY` (`env_reference`): the repository directory, the `install` list and import path it was
built from, and the key of the environment that curated it. That is enough to rebuild it (`python -m
swerl.data.repoenv build TASKS.parquet`, or a curate rerun) on any machine holding the same source at the same path
(an sdist's or git repository's copy lives under swerl's cache, keyed by its contents). `find_env` looks the
environment up: the curating one by its key, else the one this interpreter would build (the key recomputed from
the task's `base_commit`, which is the source's tree hash).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from swerl.data.repos import tree_hash
from swerl.sandbox.supervisor import cache_dir

ENV_VERSION = 1
"""Part of every environment's key: bump when the layout of a built environment changes."""
WORKSPACE = "/workspace"
"""Where every sandbox backend puts the repository."""
_PTH_NAME = "swerl-workspace.pth"


class RepoEnvError(RuntimeError):
    """A repository's source or environment could not be prepared; the message says what to set."""


@dataclass(frozen=True)
class RepoEnv:
    """A built environment: its interpreter and what went into it."""

    python: str
    root: Path
    key: str
    python_path: str
    installed: tuple[str, ...]


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_git_source(path: str) -> bool:
    """A file:// URL, or a directory that is a bare git repository (HEAD and objects/, no working tree)."""
    if path.startswith("file://"):
        return True
    p = Path(path).expanduser()
    return p.is_dir() and (p / "HEAD").is_file() and (p / "objects").is_dir() and not (p / ".git").exists()


def _git_head(url: str) -> str:
    out = subprocess.run(["git", "ls-remote", url, "HEAD"], capture_output=True, text=True, timeout=120)
    if out.returncode != 0 or not out.stdout.split():
        raise RepoEnvError(f"git repository {url}: cannot read its HEAD: {out.stderr.strip() or 'no HEAD'}")
    return out.stdout.split()[0]


def source_fingerprint(path: str) -> str:
    """What identifies a source's contents cheaply: an sdist's sha256, a git HEAD, a directory's tree hash."""
    if is_git_source(path):
        return "git:" + _git_head(path)
    p = Path(path).expanduser()
    if p.is_file():
        return "sdist:" + _sha256_file(p)
    if p.is_dir():
        return "tree:" + tree_hash(p.resolve())
    raise RepoEnvError(f"repository source {path} does not exist (a directory, an sdist .tar.gz or a git repository)")


def _publish(tmp: Path, final: Path) -> None:
    """Rename a finished build into place (another process may have won the race: then keep its copy)."""
    try:
        tmp.rename(final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def fetch_sdist(package: str, version: str, cache: Path) -> Path:
    """The sdist of `package`==`version` from the package index, downloaded once into `cache` (its file name as
    the index spells it: Django-5.0.14.tar.gz, toolz-1.0.0.tar.gz)."""

    def cached() -> Path | None:
        want = f"{package}-{version}.tar.gz".lower().replace("_", "-")
        found = [p for p in cache.glob("*.tar.gz") if p.name.lower().replace("_", "-") == want]
        return found[0] if found else None

    archive = cached()
    if archive is None:
        cache.mkdir(parents=True, exist_ok=True)
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"{package}=={version}",
                "-d",
                str(cache),
            ],
            600.0,
            f"pip download {package}=={version} (its sdist)",
        )
        archive = cached()
    if archive is None:
        raise RepoEnvError(f"pip download {package}=={version} wrote no {package}-{version}.tar.gz into {cache}")
    return archive


def materialize_source(path: str) -> tuple[Path, str]:
    """(directory, default name) of a source: a directory as it is, an sdist extracted, a git repository cloned."""
    root = cache_dir() / "repo-src"
    if is_git_source(path):
        head = _git_head(path)
        name = Path(path.removeprefix("file://").rstrip("/")).name.removesuffix(".git")
        final = root / f"git-{hashlib.sha256(f'{path}@{head}'.encode()).hexdigest()[:20]}"
        if not final.is_dir():
            root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".clone-", dir=root))
            out = subprocess.run(
                ["git", "clone", "--quiet", path, str(tmp / "repo")], capture_output=True, text=True, timeout=600
            )
            if out.returncode != 0:
                shutil.rmtree(tmp, ignore_errors=True)
                raise RepoEnvError(f"git clone {path} failed: {out.stderr.strip()[-2000:]}")
            shutil.rmtree(tmp / "repo" / ".git")
            _publish(tmp, final)
        return final / "repo", name
    p = Path(path).expanduser()
    if p.is_dir():
        return p.resolve(), p.resolve().name
    if not p.is_file():
        raise RepoEnvError(
            f"repository source {path} does not exist (a directory, an sdist .tar.gz or a git repository)"
        )
    if not p.name.endswith((".tar.gz", ".tgz")):
        raise RepoEnvError(f"repository source {path}: a file must be an sdist (.tar.gz)")
    final = root / f"sdist-{_sha256_file(p)[:20]}"
    if not final.is_dir():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".sdist-", dir=root))
        with tarfile.open(p) as tar:
            tar.extractall(tmp, filter="data")
        _publish(tmp, final)
    tops = [c for c in final.iterdir() if not c.name.startswith(".")]
    top = tops[0] if len(tops) == 1 and tops[0].is_dir() else final
    return top, top.name if top is not final else p.name.removesuffix(".tar.gz").removesuffix(".tgz")


def default_python_path(repo: Path) -> str:
    """'src' when the repository keeps its packages under src/ (a src layout), else '' (the root)."""
    src = repo / "src"
    if src.is_dir() and any((c / "__init__.py").is_file() or c.suffix == ".py" for c in src.iterdir()):
        return "src"
    return ""


def _installable(repo: Path) -> bool:
    return (repo / "pyproject.toml").is_file() or (repo / "setup.py").is_file()


def env_key(repo: Path, install: Sequence[str], python_path: str, base_python: str) -> str:
    return _key(tree_hash(repo), install, python_path, base_python)


def _key(tree: str, install: Sequence[str], python_path: str, base_python: str) -> str:
    body = json.dumps(
        {
            "v": ENV_VERSION,
            "tree": tree,
            "install": list(install),
            "python_path": python_path,
            "base": os.path.realpath(base_python),
        },
        sort_keys=True,
    )
    return hashlib.sha256(body.encode()).hexdigest()[:20]


VENV_SCHEME = "venv://"
"""A task environment reference naming a repository directory and the virtualenv it runs in (module docstring)."""


@dataclass(frozen=True)
class EnvReference:
    """A parsed `venv://` reference: what the environment is rebuilt from, and the curating environment's key."""

    path: Path
    install: tuple[str, ...]
    python_path: str
    key: str

    def __str__(self) -> str:
        query = urllib.parse.urlencode(
            [("python_path", self.python_path), *(("install", i) for i in self.install), ("env", self.key)]
        )
        return f"{VENV_SCHEME}{urllib.parse.quote(str(self.path))}?{query}"


def env_reference(
    repo: Path, install: Sequence[str] = (), python_path: str | None = None, key: str | None = None
) -> EnvReference:
    """The reference of `repo`'s environment as `build_env` builds it with this interpreter (key computed unless
    given)."""
    python_path = default_python_path(repo) if python_path is None else python_path
    key = env_key(repo, install, python_path, _base_python()) if key is None else key
    return EnvReference(repo.resolve(), tuple(install), python_path, key)


def parse_env_reference(image: str) -> EnvReference:
    """`venv:///DIR?python_path=..&install=..&env=KEY` -> EnvReference; ValueError naming what is wrong."""
    if not image.startswith(VENV_SCHEME):
        raise ValueError(f"environment {image!r} is not a {VENV_SCHEME} reference")
    parsed = urllib.parse.urlsplit(image)
    path = urllib.parse.unquote(parsed.path)
    query = urllib.parse.parse_qs(parsed.query, keep_blank_values=True)
    unknown = sorted(set(query) - {"python_path", "install", "env"})
    if parsed.netloc or not path.startswith("/") or unknown or len(query.get("env", [])) != 1:
        raise ValueError(
            f"environment {image!r}: expected {VENV_SCHEME}/ABSOLUTE/DIR?python_path=P&install=REQ...&env=KEY"
            + (f" (unknown keys {unknown})" if unknown else "")
        )
    return EnvReference(Path(path), tuple(query.get("install", [])), query.get("python_path", [""])[0], query["env"][0])


def load_env(root: Path) -> RepoEnv:
    """The environment built at `root` (its swerl-env.json says what went into it)."""
    info = json.loads((root / "swerl-env.json").read_text())
    return RepoEnv(str(root / "bin" / "python"), root, root.name, info["python_path"], tuple(info["installed"]))


def find_env(ref: EnvReference, tree: str | None = None) -> RepoEnv | None:
    """The built environment of a reference: the curating one (its key), else the one this interpreter builds
    for the source's tree hash `tree` (a task's base_commit; None: hashed now); None when neither is built here."""
    root = cache_dir() / "repo-envs"

    def built(key: str) -> bool:
        return (root / key / "swerl-env.json").is_file() and (root / key / "bin" / "python").exists()

    if built(ref.key):
        return load_env(root / ref.key)
    tree = tree_hash(ref.path) if tree is None else tree
    key = _key(tree, ref.install, ref.python_path, _base_python())
    return load_env(root / key) if built(key) else None


def rebuild_hint(image: str) -> str:
    """How to rebuild a missing environment, for messages."""
    return (
        f"rebuild it with `python -m swerl.data.repoenv build TASKS.parquet` (the tasks naming {image.split('?')[0]}"
        "), or rerun curate (`swerl curate CONFIG --force`) with that repository"
    )


def _run(args: list[str], timeout_s: float, what: str) -> str:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise RepoEnvError(f"{what}: timed out after {timeout_s:.0f} s (build_timeout_s)") from exc
    if out.returncode != 0:
        raise RepoEnvError(f"{what} failed (exit {out.returncode}):\n{(out.stdout + out.stderr)[-4000:]}")
    return out.stdout


def _base_python() -> str:
    """The interpreter environments are made from: the one under swerl's own venv, never the venv itself."""
    return getattr(sys, "_base_executable", None) or sys.executable


def build_env(
    repo: Path, install: Sequence[str] = (), python_path: str | None = None, timeout_s: float = 1800.0
) -> RepoEnv:
    """The repository's own virtualenv (built once per key, reused after): pytest, `install`, its dependencies."""
    python_path = default_python_path(repo) if python_path is None else python_path
    base = _base_python()
    key = env_key(repo, install, python_path, base)
    root = cache_dir() / "repo-envs"
    final = root / key
    python = final / "bin" / "python"
    if not (final / "swerl-env.json").is_file():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
        tmp.chmod(0o755)  # sandboxes run as another uid and bind it read-only
        try:
            _build(tmp, final, repo, install, python_path, base, timeout_s)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _publish(tmp, final)
    info = json.loads((final / "swerl-env.json").read_text())
    return RepoEnv(str(python), final, key, python_path, tuple(info["installed"]))


def _build(
    tmp: Path, final: Path, repo: Path, install: Sequence[str], python_path: str, base: str, timeout_s: float
) -> None:
    # Built where it will live (venvs hold absolute paths), under a temporary name first: made at the final path's
    # sibling and the scripts' paths do not matter here (only bin/python is run, by its absolute path).
    _run([base, "-m", "venv", "--without-pip", str(tmp)], timeout_s, f"python -m venv {tmp}")
    pip = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        str(tmp / "bin" / "python"),
        "--disable-pip-version-check",
    ]
    report = tmp / "pip-report.json"
    # pip builds a project in its source tree (build/lib/<package>/, *.egg-info): build from a throwaway copy, so
    # the source every task's workspace is copied from holds the task's files and nothing else (a build/lib copy
    # of the unbugged code there was a way to "fix" every task of the repository by copying it back).
    with tempfile.TemporaryDirectory(prefix="swerl-build-") as scratch:
        build_copy = Path(scratch) / repo.name
        if _installable(repo):
            shutil.copytree(repo, build_copy, symlinks=True)
        targets = ["pytest", *install] + ([str(build_copy)] if _installable(repo) else [])
        _run(
            [*pip, "install", "--quiet", "--report", str(report), *targets],
            timeout_s,
            f"pip install {' '.join(targets)} (set `install` to the repository's test requirements)",
        )
    items = json.loads(report.read_text()).get("install", [])
    own = [
        i["metadata"]["name"]
        for i in items
        if str(i.get("download_info", {}).get("url", "")).rstrip("/") == build_copy.as_uri().rstrip("/")
    ]
    if own:
        # Its dependencies stay; the code itself is the sandbox's /workspace copy (see the module docstring).
        _run([*pip, "uninstall", "--yes", *own], timeout_s, f"pip uninstall {' '.join(own)}")
    purelib = _run(
        [
            str(tmp / "bin" / "python"),
            "-I",
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        timeout_s,
        "reading the environment's site-packages",
    ).strip()
    workspace_dir = f"{WORKSPACE}/{python_path}".rstrip("/") if python_path else WORKSPACE
    (Path(purelib) / _PTH_NAME).write_text(workspace_dir + "\n")
    installed = sorted(
        f"{i['metadata']['name']}=={i['metadata']['version']}" for i in items if i["metadata"]["name"] not in own
    )
    report.unlink()
    _relocate(tmp, final)
    (tmp / "swerl-env.json").write_text(
        json.dumps(
            {"repo": str(repo), "install": list(install), "python_path": python_path, "installed": installed},
            indent=2,
        )
    )


def _relocate(tmp: Path, final: Path) -> None:
    """Rewrite the venv's own path in pyvenv.cfg and scripts to where it is renamed to."""
    for path in [tmp / "pyvenv.cfg", *(tmp / "bin").iterdir()]:
        if path.is_file() and not path.is_symlink():
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            if str(tmp) in text:
                path.write_text(text.replace(str(tmp), str(final)))


def rebuild(image: str, tree: str, timeout_s: float = 1800.0) -> RepoEnv:
    """Build (or find) the environment a task's `venv://` reference names; the source must be at its path with
    the task's tree hash (`tree`: its base_commit)."""
    ref = parse_env_reference(image)
    if not ref.path.is_dir():
        raise RepoEnvError(
            f"{image}: the repository {ref.path} is not on this machine: put the same source there (an sdist's or "
            "git repository's copy: rerun curate with it, which extracts it to that path under swerl's cache)"
        )
    if (actual := tree_hash(ref.path)) != tree:
        raise RepoEnvError(
            f"{image}: {ref.path} has tree hash {actual[:12]}, the task expects {tree[:12]}: the source changed "
            "since curation; rerun curate"
        )
    return build_env(ref.path, ref.install, ref.python_path, timeout_s)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m swerl.data.repoenv build TASKS.parquet...`: build every repository environment the tasks name."""
    import argparse

    from swerl.data.taskio import tasks_from_parquet

    parser = argparse.ArgumentParser(prog="python -m swerl.data.repoenv")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build the virtualenvs of the venv:// tasks in curate's parquet files")
    build.add_argument("tasks", nargs="+", type=Path)
    build.add_argument("--timeout-s", type=float, default=1800.0)
    args = parser.parse_args(argv)
    wanted: dict[str, str] = {}
    for path in args.tasks:
        for task in tasks_from_parquet(path.read_bytes()):
            if task.image.startswith(VENV_SCHEME):
                wanted.setdefault(task.image, task.base_commit)
    for image, tree in wanted.items():
        env = rebuild(image, tree, args.timeout_s)
        print(f"{image.split('?')[0]}: {env.python} ({', '.join(env.installed)})")
    if not wanted:
        print("no task names a venv:// environment")


if __name__ == "__main__":
    main()
