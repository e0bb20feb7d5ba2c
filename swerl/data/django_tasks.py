"""SWE-bench-style Django instances built offline from Django's PyPI sdist: a real non-pytest harness.

Django's sdist ships its own test suite (`tests/`, `tests/runtests.py`), so an instance in SWE-bench's layout can
be built without a registry: the sdist becomes a project image (swerl.sandbox.images.build_project_image: the
repository at /testbed as a git repository, a virtualenv with Django's runtime dependencies from wheels fetched at
build time); each task's bug is committed on top in an instance image named as swebench names it
(`swebench/sweb.eval.x86_64.django_1776_django-90001:latest`, build_instance_image). A task becomes a swebench 5
row: the fix as `patch`, a `test_patch` adding a regression test, `version` 5.0 and an `eval_script` in the shape
of swebench 5's Django rows (reset the test files, apply the test patch, `./tests/runtests.py --verbosity 2
--settings=test_sqlite --parallel 1 MODULE` between the START/END markers, reset again). FAIL_TO_PASS and
PASS_TO_PASS are found as SWE-bench validates its rows: the eval script run in the image without and with the fix,
its log read by swebench's Django parser, so the ids are the runner's own names (`test_a (app.tests.T.test_a)` on
Python 3.11, a docstring's first line where the test has one).

    rows = build_django_rows(workdir)   # builds the images (reused when present), validates the tasks
"""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swerl.data.diffs import reverse_patch, unified_diff
from swerl.data.loaders import swebench_image
from swerl.data.repoenv import fetch_sdist
from swerl.sandbox.images import build_instance_image, build_project_image, swesmith_image_name

DJANGO_VERSION = "5.0.14"
"""The newest Django of SWE-bench's newest Django version (5.0, Python 3.11: the base image's Debian python3)."""
SWEBENCH_VERSION = "5.0"
REQUIREMENTS = ("asgiref==3.8.1", "sqlparse==0.5.3")
"""Django 5.0's runtime dependencies (its tests of the modules used here need nothing else)."""
TEST_CMD = "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1"
"""SWE-bench's Django test command (its TEST_DJANGO), the test modules appended."""
SDIST_CACHE = Path.home() / ".cache" / "swerl-test-sdists"
HEREDOC = "EOF_114329324912"
"""The delimiter swebench's eval scripts use around the test patch."""


@dataclass(frozen=True)
class Edit:
    """One replacement in one file: `before` must occur exactly once in the pristine file."""

    path: str
    before: str
    after: str

    def apply(self, text: str) -> str:
        if text.count(self.before) != 1:
            raise ValueError(f"{self.path}: expected exactly one {self.before!r}")
        return text.replace(self.before, self.after)

    def diff(self, text: str) -> str:
        """The edit as a git diff of the file whose content is `text`."""
        return unified_diff(self.path, text, self.apply(text))


@dataclass(frozen=True)
class DjangoTask:
    """A hand-written Django task: the bug (an edit of the pristine source), a wrong fix (an edit of the bugged
    source), the regression test the test patch adds, and the test module the eval script runs."""

    number: int
    problem_statement: str
    bug: Edit
    wrong_fix: Edit
    test: Edit
    module: str

    @property
    def instance_id(self) -> str:
        return f"django__django-{self.number}"


TASKS = (
    DjangoTask(
        90001,
        "slugify() no longer strips leading and trailing underscores: slugify('_ Hello World _') returns "
        "'_-hello-world-_' instead of 'hello-world', although its docstring says underscores are stripped.",
        Edit("django/utils/text.py", '.strip("-_")\n\n\ndef camel_case', '.strip("-")\n\n\ndef camel_case'),
        Edit(
            "django/utils/text.py",
            '.strip("-")\n\n\ndef camel_case',
            '.strip("-").strip("_")\n\n\ndef camel_case',
        ),
        Edit(
            "tests/utils_tests/test_text.py",
            "    def test_unescape_string_literal(self):",
            "    def test_slugify_strips_underscores(self):\n"
            '        """slugify() strips leading and trailing underscores."""\n'
            '        self.assertEqual(text.slugify("_ Hello World _"), "hello-world")\n\n'
            "    def test_unescape_string_literal(self):",
        ),
        "utils_tests.test_text",
    ),
    DjangoTask(
        90002,
        "CaseInsensitiveMapping is no longer case-insensitive: CaseInsensitiveMapping({'Accept': 'x'})['accept'] "
        "raises KeyError, and so does iterating over its items.",
        Edit(
            "django/utils/datastructures.py",
            "return self._store[key.lower()][1]",
            "return self._store[key][1]",
        ),
        Edit(
            "django/utils/datastructures.py",
            "return self._store[key][1]",
            "return dict(self._store.values())[key]",
        ),
        Edit(
            "tests/utils_tests/test_datastructures.py",
            "    def test_in(self):",
            "    def test_getitem_any_case(self):\n"
            '        """A key is found whatever its case, whatever the case it was stored in."""\n'
            '        mapping = CaseInsensitiveMapping({"X-Token": "1"})\n'
            '        self.assertEqual(mapping["x-TOKEN"], "1")\n\n'
            "    def test_in(self):",
        ),
        "utils_tests.test_datastructures",
    ),
)


def django_commit() -> str:
    """A stand-in for the upstream commit SWE-smith names project images by (the sdist has none)."""
    return hashlib.sha1(f"django-{DJANGO_VERSION}".encode()).hexdigest()[:8]


PROJECT_IMAGE = swesmith_image_name("django", "django", django_commit())


def django_source(into: Path, cache: Path = SDIST_CACHE) -> Path:
    """Django's sdist (downloaded once into `cache`), unpacked under `into`; returns the source directory."""
    archive = fetch_sdist("django", DJANGO_VERSION, cache)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / f"Django-{DJANGO_VERSION}"


def eval_script(base_commit: str, test_files: list[str], test_patch: str, modules: list[str]) -> str:
    """An eval script in the shape of swebench 5's Django rows (no conda here: the image's venv is on PATH)."""
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
            " ".join([TEST_CMD, *modules]),
            ": '>>>>> End Test Output'",
            f"git checkout {base_commit} {files}",
            "",
        ]
    )


def run_in_image(image: str, script: str, timeout_s: float = 600) -> str:
    """`script` run by bash as root in a fresh container of `image` (network "none"); its output."""
    done = subprocess.run(
        ["docker", "run", "--rm", "-i", "--network", "none", "--user", "root", image, "bash", "-s"],
        input=script,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    return done.stdout + done.stderr


def applying(patch: str) -> str:
    """Shell lines applying `patch` in /testbed."""
    return f"cd /testbed && git apply - <<'{HEREDOC}'\n{patch.rstrip(chr(10))}\n{HEREDOC}\n"


def validated_lists(image: str, script: str, fix: str) -> tuple[list[str], list[str]]:
    """(FAIL_TO_PASS, PASS_TO_PASS) as SWE-bench validates a row: the eval script's log without and with the fix,
    read by swebench's Django parser."""
    from swebench.harness.log_parsers.python import parse_log_django

    before = parse_log_django(run_in_image(image, script), None)
    after = parse_log_django(run_in_image(image, applying(fix) + script), None)
    passed = {name for name, status in after.items() if status == "PASSED"}
    f2p = sorted(n for n in passed if before.get(n) != "PASSED")
    p2p = sorted(n for n in passed if before.get(n) == "PASSED")
    return f2p, p2p


def django_rows(client: Any, source: Path, tasks: tuple[DjangoTask, ...] = TASKS) -> list[dict[str, Any]]:
    """Build the project image and each task's instance image (reused when present), validate each task in its
    image and return the swebench 5 rows. Each row also carries `wrong_patch` (not a swebench column: a fix that
    looks plausible and resolves nothing, for graders' tests)."""
    build_project_image(client, source, PROJECT_IMAGE, list(REQUIREMENTS))
    rows = []
    for task in tasks:
        pristine = (source / task.bug.path).read_text()
        bug = task.bug.diff(pristine)
        image = swebench_image(task.instance_id)
        build_instance_image(client, PROJECT_IMAGE, bug, image)
        base = run_in_image(image, "git -C /testbed rev-parse HEAD").split()[-1]
        test_patch = task.test.diff((source / task.test.path).read_text())
        wrong = task.wrong_fix.diff(task.bug.apply(pristine))
        fix = reverse_patch(bug)
        script = eval_script(base, [task.test.path], test_patch, [task.module])
        f2p, p2p = validated_lists(image, script, fix)
        if not f2p:
            raise RuntimeError(f"{task.instance_id}: no test fails without the fix and passes with it")
        rows.append(
            {
                "instance_id": task.instance_id,
                "repo": "django/django",
                "base_commit": base,
                "patch": fix,
                "test_patch": test_patch,
                "problem_statement": task.problem_statement,
                "version": SWEBENCH_VERSION,
                "FAIL_TO_PASS": json.dumps(f2p),
                "PASS_TO_PASS": json.dumps(p2p),
                "environment_setup_commit": base,
                "eval_script": script,
                "image": image,
                "log_parser": "parse_log_django",
                "eval_type": "pass_and_fail",
                "created_at": "2026-12-05T00:00:00Z",
                "hints_text": "",
                "wrong_patch": wrong,
            }
        )
    return rows


def build_django_rows(workdir: Path, tasks: tuple[DjangoTask, ...] = TASKS) -> list[dict[str, Any]]:
    """django_rows on the local Docker engine, the sdist unpacked under `workdir` (images reused when present)."""
    import docker

    client = docker.from_env()
    try:
        return django_rows(client, django_source(workdir), tasks)
    finally:
        client.close()
