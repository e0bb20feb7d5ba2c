"""SWE-bench-style instances of a real project for tests that grade with swebench's harness and with swerl's.

toolz's PyPI sdist is built into an image in SWE-bench's layout (swerl.sandbox.images.build_project_image), bugs
are synthesized and validated in it (tests/data/test_image_tasks.py does the same), and each bug becomes an instance
image named as swebench names them (`swebench/sweb.eval.x86_64.pytoolz_1776_toolz-N:latest`, the bug committed at
/testbed) and a swebench 5 row: the fix as `patch`, a test patch (a marker test appended to a FAIL_TO_PASS file,
listed in PASS_TO_PASS, so a grader that skips the test patch fails it), and an `eval_script` in the shape swebench
5's rows have (reset the test files, apply the test patch, the test command between the START/END markers, reset
again; swebench's harness adds the exit-code capture itself).
"""

from __future__ import annotations

import asyncio
import difflib
import json
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swerl.data.bugs import MODIFIERS
from swerl.data.diffs import reverse_patch
from swerl.data.loaders import rows_to_tasks, swebench_image
from swerl.data.repos import RepoSpec
from swerl.data.schema import TaskInstance
from swerl.data.synth import synthesize_repo
from swerl.sandbox.base import SandboxProvider
from swerl.sandbox.images import build_instance_image, build_project_image
from tests.data.test_image_tasks import PROJECTS, sdist_source

TOOLZ = PROJECTS[0]
SWEBENCH_PYTEST = "pytest --no-header -rA --tb=no -p no:cacheprovider"
"""swebench's pytest command for Python repositories (its TEST_PYTEST)."""
MARKER_TEST = "test_swerl_crosscheck_marker"
HEREDOC = "EOF_114329324912"
"""The delimiter swebench's eval scripts use around the test patch."""


@dataclass(frozen=True)
class Instance:
    row: dict[str, Any]
    """The swebench 5 row (what a dataset publishes), its image on the engine."""
    task: TaskInstance
    """The row as swerl loads it, with its version and eval_script."""
    bug: str
    """The bug committed in the image (the fix reversed)."""


def eval_script(base_commit: str, test_files: list[str], test_patch: str, test_cmd: str = SWEBENCH_PYTEST) -> str:
    """An eval script in the shape of swebench 5's rows for a Python repository at /testbed."""
    files = " ".join(shlex.quote(f) for f in test_files)
    return "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            "cd /testbed",
            "git config --global --add safe.directory /testbed",
            "cd /testbed",
            "git status",
            "git show --stat",
            f"git -c core.fileMode=false diff {base_commit}",
            f"git checkout {base_commit} {files}",
            f"git apply -v - <<'{HEREDOC}'",
            test_patch.rstrip("\n"),
            HEREDOC,
            ": '>>>>> Start Test Output'",
            f"{test_cmd} {files}",
            ": '>>>>> End Test Output'",
            f"git checkout {base_commit} {files}",
            "",
        ]
    )


def append_test_patch(source: Path, path: str) -> str:
    """A git diff appending a passing test named MARKER_TEST to the test file `path` of `source`."""
    old = (source / path).read_text()
    if not old.endswith("\n"):
        old += "\n"
    new = old + f"\n\ndef {MARKER_TEST}():\n    assert True\n"
    body = difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}")
    return f"diff --git a/{path} b/{path}\n" + "".join(body)


def head_commit(image: str) -> str:
    """The commit at /testbed in an image (its base_commit), read in a container with no network."""
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", image, "git", "-C", "/testbed", "rev-parse", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return done.stdout.strip()


def toolz_instances(provider: SandboxProvider, work: Path, numbers: list[int]) -> list[Instance]:
    """One instance per number (instance ids pytoolz__toolz-N), each a bug synthesized in toolz's image."""
    import docker

    client = docker.from_env()
    try:
        source = sdist_source(TOOLZ, work)
        project = build_project_image(client, source, TOOLZ.image, list(TOOLZ.requirements), TOOLZ.python_path)
        spec = RepoSpec(name=TOOLZ.name, path=source, repo=TOOLZ.swesmith_repo, image=project)
        tasks, report = asyncio.run(
            synthesize_repo(
                spec,
                provider,
                modifiers=list(MODIFIERS),
                max_candidates=12,
                max_tasks=len(numbers),
                seed=0,
                workers=2,
                test_timeout_s=120,
                clean_runs=1,
                bugged_timeout_factor=5.0,
                min_bugged_timeout_s=30.0,
            )
        )
        assert len(tasks) == len(numbers), report.to_dict()
        out = []
        for number, synthesized in zip(numbers, tasks, strict=True):
            instance_id = f"{TOOLZ.owner}__{TOOLZ.name}-{number}"
            image = build_instance_image(client, project, synthesized.patch, swebench_image(instance_id))
            out.append(_instance(instance_id, image, synthesized, source))
        return out
    finally:
        client.close()


def _instance(instance_id: str, image: str, synthesized: TaskInstance, source: Path) -> Instance:
    files = sorted({t.split("::", 1)[0] for t in synthesized.FAIL_TO_PASS})
    test_patch = append_test_patch(source, files[0])
    # swebench runs the test patch's files: PASS_TO_PASS is what of them passes, as SWE-bench's rows list it
    p2p = [t for t in synthesized.PASS_TO_PASS if t.split("::", 1)[0] in files] + [f"{files[0]}::{MARKER_TEST}"]
    base = head_commit(image)
    row = {
        "instance_id": instance_id,
        "repo": f"{TOOLZ.owner}/{TOOLZ.name}",
        "base_commit": base,
        "patch": reverse_patch(synthesized.patch),
        "test_patch": test_patch,
        "version": TOOLZ.version,
        "FAIL_TO_PASS": json.dumps(synthesized.FAIL_TO_PASS),
        "PASS_TO_PASS": json.dumps(p2p),
        "problem_statement": synthesized.problem_statement,
        "image": image,
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
        "eval_script": eval_script(base, files, test_patch),
    }
    return Instance(row, load_row(row), synthesized.patch)


def load_row(row: dict[str, Any]) -> TaskInstance:
    """The row through swerl's loader, its version and eval_script kept (set here if the loader drops them)."""
    (task,), _ = rows_to_tasks([row], "swebench", "swebench-instances", strict=True)
    extra = {k: row[k] for k in ("version", "eval_script") if not getattr(task, k)}
    return task.model_copy(update=extra) if extra else task


def new_file_patch(path: str, text: str) -> str:
    """A patch that adds one file (a 'wrong' prediction: it applies and fixes nothing)."""
    lines = text.splitlines()
    body = "".join(f"+{line}\n" for line in lines)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n{body}"
    )
