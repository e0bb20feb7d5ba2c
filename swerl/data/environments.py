"""Where a task's sandbox starts from: its environment reference resolved to a directory, and the patch applied
at start (the bug, for bug-kind tasks). The one place this is done: episodes, grading, the rollout's environment
planner and SFT's tokenizer corpus all call it.

An environment reference (`TaskInstance.image`) is `local://repos/NAME` for a shipped repository,
`local:///ABSOLUTE/PATH` for any other directory and `micro://SPLIT/SEED/INDEX` for a procedural micro repository
(regenerated into a cache directory on first use).
"""

from __future__ import annotations

from pathlib import Path

from swerl.data.micro import GENERATOR_VERSION, materialize_micro_repo, parse_micro_image
from swerl.data.repos import BUILTIN_ROOT, tree_hash
from swerl.data.schema import TaskInstance
from swerl.errors import InfraError


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
    if not image.startswith("local://"):
        raise ValueError(
            f"environment {image!r} is not a local directory reference (local://... or micro://...)"
        )
    rest = image[len("local://") :]
    path = BUILTIN_ROOT / rest[len("repos/") :] if rest.startswith("repos/") else Path(rest)
    if not path.is_dir():
        raise ValueError(f"environment {image!r} resolves to {path}, which does not exist")
    return path


def setup_patch(task: TaskInstance) -> str | None:
    """The patch applied at sandbox start: the bug of a bug-kind task, nothing for a fix-kind one."""
    return task.patch if task.patch_kind == "bug" else None


def environment_dir(task: TaskInstance) -> Path:
    """The task's environment directory; InfraError(image_missing) if it is not there (never the policy's fault)."""
    try:
        return Path(resolve_environment(task.image, task.base_commit))  # checked for micro:// repositories
    except ValueError as exc:
        raise InfraError("image_missing", str(exc)) from exc


def task_environment(task: TaskInstance) -> tuple[Path, str | None]:
    """The task's environment directory and setup patch: what `SandboxProvider.start` takes."""
    return environment_dir(task), setup_patch(task)
