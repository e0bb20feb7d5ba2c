"""Where a task's sandbox starts from: its environment reference resolved to a directory, and the patch applied
at start (the bug, for bug-kind tasks). The one place this is done: episodes, grading, the rollout's environment
planner and SFT's tokenizer corpus all call it.

An environment reference (`TaskInstance.image`) is `local://repos/NAME` for a shipped repository,
`local:///ABSOLUTE/PATH` for any other directory, `micro://SPLIT/SEED/INDEX` for a procedural micro repository
(regenerated into a cache directory on first use), or a container image: `docker://NAME[:TAG]` (the repository at
the image's WORKDIR), or a bare image name as SWE-smith's `image_name` and SWE-bench's per-instance images spell it
(`swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest`): the repository at the image's WORKDIR (/testbed in
both), their conda environment `testbed` first on PATH, as their own harnesses activate it. A repository curated
with a virtualenv of its own (`curate.repos` mappings) is `venv:///ABSOLUTE/PATH?python_path=..&install=..&env=KEY`
(swerl.data.repoenv): the directory and the environment it runs in, a VenvEnvironment for the providers; a
missing environment is InfraError(image_missing) saying how to rebuild it, never swerl's own interpreter.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

from swerl.data.micro import GENERATOR_VERSION, materialize_micro_repo, parse_micro_image
from swerl.data.repoenv import VENV_SCHEME, find_env, parse_env_reference, rebuild_hint
from swerl.data.repos import BUILTIN_ROOT, tree_hash
from swerl.data.schema import TaskInstance
from swerl.errors import InfraError
from swerl.sandbox.base import Environment, ImageEnvironment, VenvEnvironment

DOCKER_SCHEME = "docker://"
CONDA_TESTBED_PATH = ("/opt/miniconda3/envs/testbed/bin", "/opt/miniconda3/bin")
"""Where SWE-bench's and SWE-smith's images keep the repository's interpreter (their scripts `conda activate
testbed`); directories that do not exist in an image are simply not found on PATH."""


def resolve_environment(image: str, base_commit: str | None = None) -> Path:
    """The directory behind an environment reference (`local://repos/NAME`, `local:///PATH`, `micro://...`).

    A micro repository is materialized if it is not cached yet; given the task's `base_commit`, its tree hash
    must match (a mismatch means the task was made by another generator version: a ValueError says so).
    """
    if image.startswith("micro://"):
        path = materialize_micro_repo(*parse_micro_image(image))
        if base_commit is not None and (actual := tree_hash(path)) != base_commit:
            raise ValueError(
                f"micro environment {image!r} regenerated at {path} has tree hash {actual[:12]}, but the task "
                f"expects base_commit {base_commit[:12]}: the task was made by another micro generator version "
                f"than this one (v{GENERATOR_VERSION}, swerl.data.micro); re-run curate with this swerl"
            )
        return path
    if image.startswith(VENV_SCHEME):
        path = parse_env_reference(image).path
        if not path.is_dir():
            raise ValueError(f"environment {image!r}: its repository {path} does not exist")
        return path
    if not image.startswith("local://"):
        raise ValueError(
            f"environment {image!r} is not a local directory reference (local://..., micro://... or venv://...)"
        )
    rest = image[len("local://") :]
    path = BUILTIN_ROOT / rest[len("repos/") :] if rest.startswith("repos/") else Path(rest)
    if not path.is_dir():
        raise ValueError(f"environment {image!r} resolves to {path}, which does not exist")
    return path


def is_image_reference(image: str) -> bool:
    """Whether an environment reference names a container image (not a host directory)."""
    return bool(image) and not image.startswith(("local://", "micro://", VENV_SCHEME))


def image_environment(image: str) -> ImageEnvironment:
    """The ImageEnvironment behind an image reference (`docker://NAME` or a bare SWE-smith/SWE-bench name)."""
    if image.startswith(DOCKER_SCHEME):
        name = image[len(DOCKER_SCHEME) :]
        if not name:
            raise ValueError(f"environment {image!r} names no image")
        return ImageEnvironment(name)
    if "://" in image:
        raise ValueError(
            f"environment {image!r}: unknown scheme (local://, micro://, venv://, docker:// or a bare image name)"
        )
    return ImageEnvironment(image, path_prepend=CONDA_TESTBED_PATH)


_checked_trees: set[tuple[str, str]] = set()
_checked_lock = threading.Lock()


def venv_environment(image: str, tree: str | None = None) -> VenvEnvironment:
    """The VenvEnvironment behind a `venv://` reference: the repository directory and its built virtualenv.

    ValueError when the directory or the environment is missing (saying how to rebuild it), or when `tree` (a
    task's base_commit) is given and the directory's tree hash differs (checked once per process and source)."""
    ref = parse_env_reference(image)
    if not ref.path.is_dir():
        raise ValueError(f"environment {image!r}: its repository {ref.path} does not exist; {rebuild_hint(image)}")
    if tree is not None and (str(ref.path), tree) not in _checked_trees:
        if (actual := tree_hash(ref.path)) != tree:
            raise ValueError(
                f"environment {image!r}: {ref.path} has tree hash {actual[:12]} but the task expects "
                f"{tree[:12]}: the repository changed since curation; rerun curate"
            )
        with _checked_lock:
            _checked_trees.add((str(ref.path), tree))
    env = find_env(ref, tree)
    if env is None:
        raise ValueError(
            f"environment {image!r}: its virtualenv ({ref.key}, install {list(ref.install)}) is not built on "
            f"this machine; {rebuild_hint(image)}"
        )
    return VenvEnvironment(ref.path, env.python, env.key, env.installed, env.python_path)


def spec_environment(image: str, path: Path) -> Environment:
    """Where a repository's sandboxes start at curate time: its image, its directory with its own virtualenv
    (venv://), or its directory `path`."""
    if image.startswith(VENV_SCHEME):
        return venv_environment(image)
    return image_environment(image) if is_image_reference(image) else path


def setup_patch(task: TaskInstance) -> str | None:
    """The patch applied at sandbox start: the bug of a bug-kind task, nothing for a fix-kind one."""
    return task.patch if task.patch_kind == "bug" else None


def environment_dir(task: TaskInstance) -> Path:
    """The task's environment directory; InfraError(image_missing) if it is not there (never the policy's fault)."""
    try:
        return Path(resolve_environment(task.image, task.base_commit))  # checked for micro:// repositories
    except ValueError as exc:
        raise InfraError("image_missing", str(exc)) from exc


def task_env(task: TaskInstance) -> Environment:
    """Where the task's sandbox starts from: its directory, its directory with its own virtualenv, or its image;
    InfraError(image_missing) for a task naming no environment, a directory or a virtualenv that is not there."""
    if not task.image:
        raise InfraError("image_missing", f"task {task.instance_id} names no environment (its `image` is empty)")
    if is_image_reference(task.image) or task.image.startswith(VENV_SCHEME):
        try:
            if task.image.startswith(VENV_SCHEME):
                return venv_environment(task.image, task.base_commit)
            return image_environment(task.image)
        except ValueError as exc:
            raise InfraError("image_missing", f"task {task.instance_id}: {exc}") from exc
    return environment_dir(task)


def task_environment(task: TaskInstance) -> tuple[Environment, str | None]:
    """The task's environment and setup patch: what `SandboxProvider.start` takes."""
    return task_env(task), setup_patch(task)


def environment_order(tasks: Sequence[TaskInstance]) -> list[int]:
    """Indices of `tasks` in the order to run them over a bounded set of sandboxes: tasks of one environment
    (`image`) together, environments in order of first need, each environment's tasks in their given order.

    Stages that walk a task list (evaluation's attempts, oracle traces) run in this order and put results back
    in the given one, so the order changes when an environment is needed (its image prepared, its sandboxes
    started), never what is run or how it is scored."""
    first: dict[str, int] = {}
    for index, task in enumerate(tasks):
        first.setdefault(task.image, index)
    return sorted(range(len(tasks)), key=lambda index: (first[tasks[index].image], index))
