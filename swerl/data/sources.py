"""What each published task source's rows hold, and how their columns become TaskInstance fields.

- SWE-bench (princeton-nlp/SWE-bench*, SWE-bench/SWE-bench*): the reference fix, `test_patch`, `version`. From
  swebench 5 on a row also carries its harness: `eval_script` (the script swebench runs: test files reset, test
  patch applied, the test command between its START/END markers), `image` and `log_parser` (swebench's
  task/checks.py REQUIRED_KEYS). The image is the row's, else swebench's per-instance name.
- SWE-bench Pro (ScaleAI/SWE-bench_Pro, the public set): lower-case `fail_to_pass` / `pass_to_pass` as text (a JSON
  or a Python list literal: its own evaluator reads them with `eval`), `requirements` and `interface` that its
  harness shows the agent after the problem statement, `dockerhub_tag` naming the image
  `jefzda/sweap-images:<tag>`. Its tests run through per-instance scripts (run_scripts/<id>/run_script.sh and
  parser.py in scaleapi/SWE-bench_Pro-os) that the rows do not hold, so its tasks carry no eval_script.
- SWE-rebench (nebius/SWE-rebench): SWE-bench's columns plus `install_config` (python, install, test_cmd,
  log_parser, ...) and `docker_image` (`swerebench/sweb.eval.x86_64.<id>`). Its harness (SWE-rebench's fork of
  swebench) builds each eval script from install_config the way swebench 4 built one from its spec table; swerl
  writes that script here, so the task carries its test command and parser like a SWE-bench 5 row.

Nothing here imports swebench (an optional extra, slow to import): the markers and the non-test file suffixes are
swebench's values, checked against the installed package by the tests.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from typing import Any

START_TEST_OUTPUT = ">>>>> Start Test Output"
END_TEST_OUTPUT = ">>>>> End Test Output"
"""swebench.harness.constants' markers around the test command's output."""
NON_TEST_EXTS = (".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")
"""swebench's NON_TEST_EXTS: files of a test patch that are not test modules to run."""
HEREDOC = "EOF_114329324912"
"""The here-document delimiter swebench's eval scripts apply the test patch with."""

PRO_IMAGE_REPOSITORY = "jefzda/sweap-images"
"""Where SWE-bench Pro's public images are (helper_code/image_uri.py: `<user>/sweap-images:<tag>`)."""
REBENCH_NAMESPACE = "swerebench"
"""The Docker Hub namespace of SWE-rebench's prebuilt instance images (`--namespace swerebench`)."""

_DOCKER_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)


class FieldError(ValueError):
    """A row's field that a source's convention does not allow: which field, what is wrong."""

    def __init__(self, field_name: str, reason: str) -> None:
        self.field_name = field_name
        super().__init__(reason)


def swebench_image(instance_id: str, namespace: str = "swebench") -> str:
    """swebench's per-instance image name ('__' is spelled '_1776_' in image names)."""
    key = f"sweb.eval.x86_64.{instance_id.replace('__', '_1776_').lower()}:latest"
    return f"{namespace}/{key}" if namespace else key


def _text(row: Mapping[str, Any], name: str) -> str | None:
    value = row.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str | int | float):
        raise FieldError(name, f"expected text, got {type(value).__name__}")
    return str(value)


def swebench_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """A SWE-bench row's fields beyond the common ones; a SWE-bench 5 row's harness (eval_script, image,
    log_parser) kept as the row gives it."""
    script = _text(row, "eval_script")
    if script is not None and not (START_TEST_OUTPUT in script and END_TEST_OUTPUT in script):
        raise FieldError("eval_script", f"has no {START_TEST_OUTPUT!r} / {END_TEST_OUTPUT!r} markers")
    return {
        "base_commit": row["base_commit"],
        "problem_statement": row["problem_statement"],
        "patch_kind": "fix",
        "test_patch": row.get("test_patch") or "",
        "image": _text(row, "image") or swebench_image(str(row["instance_id"])),
        "difficulty": row.get("difficulty") or None,
        "version": _text(row, "version"),
        "eval_script": script,
        "log_parser": _text(row, "log_parser"),
    }


def literal_list(value: Any, name: str) -> Any:
    """A list of test ids published as text: JSON, or a Python list literal (SWE-bench Pro's, read by its own
    evaluator with eval; here with ast.literal_eval, which runs nothing). Anything else is returned as it is."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        pass
    try:
        parsed = ast.literal_eval(value.strip())
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        raise FieldError(name, f"neither a JSON nor a Python list of test ids: {value[:80]!r}") from None
    if not isinstance(parsed, list | tuple):
        raise FieldError(name, f"expected a list of test ids, got {type(parsed).__name__}")
    return list(parsed)


def pro_columns(row: Mapping[str, Any]) -> dict[str, Any]:
    """A SWE-bench Pro row with its test lists under swerl's names (FAIL_TO_PASS / PASS_TO_PASS, parsed)."""
    out = dict(row)
    for upper in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        lower = upper.lower()
        value = row.get(upper) if row.get(upper) is not None else row.get(lower)
        out[upper] = literal_list(value, lower if row.get(upper) is None else upper)
    return out


def pro_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """A SWE-bench Pro row's fields: the statement as its harness shows it (requirements and new interfaces
    after the issue), its image on Docker Hub."""
    tag = _text(row, "dockerhub_tag") or ""
    if not _DOCKER_TAG.match(tag):
        raise FieldError("dockerhub_tag", f"not a Docker tag: {tag[:140]!r}")
    statement = str(row["problem_statement"])
    for title, name in (("Requirements", "requirements"), ("New interfaces introduced", "interface")):
        part = _text(row, name)
        if part is not None:
            statement += f"\n\n{title}:\n{part}"
    return {
        "base_commit": row["base_commit"],
        "problem_statement": statement,
        "patch_kind": "fix",
        "test_patch": row.get("test_patch") or "",
        "image": f"{PRO_IMAGE_REPOSITORY}:{tag}",
        "difficulty": None,
    }


def test_files(test_patch: str) -> tuple[list[str], list[str]]:
    """(files the test patch modifies, files it creates), test modules and data alike, in patch order."""
    modified: list[str] = []
    created: list[str] = []
    for section in re.split(r"(?=^diff --git )", test_patch, flags=re.M):
        header = _DIFF_HEADER.search(section)
        if header is None:
            continue
        new = "\n--- /dev/null" in section.split("\n+++ ", 1)[0] or "\nnew file mode" in section
        (created if new else modified).append(header.group(2))
    return modified, created


def test_directives(test_patch: str) -> list[str]:
    """The test modules a test patch touches (swebench's get_test_directives, for non-Django repositories)."""
    modified, created = test_files(test_patch)
    return [f for f in modified + created if not f.endswith(NON_TEST_EXTS)]


def _install_config(row: Mapping[str, Any]) -> dict[str, Any]:
    config = row.get("install_config")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except ValueError:
            raise FieldError("install_config", "not a JSON object") from None
    if not isinstance(config, Mapping):
        raise FieldError("install_config", f"expected a mapping, got {type(config).__name__}")
    return dict(config)


def rebench_eval_script(base_commit: str, test_patch: str, test_cmd: str | list[str]) -> str:
    """SWE-rebench's eval script for one task, in swebench's shape: test files reset to the base commit, the test
    patch applied, the test command on the patch's test modules between the markers, the test files reset again.

    swebench's script also reinstalls the package in place before the tests; that step is left out here, as the
    image's environment is already built and sandboxes have no network to install with."""
    modified, created = test_files(test_patch)
    reset = [f"git checkout {base_commit} {' '.join(modified)}"] if modified else []
    reset += [f"rm -f {' '.join(created)}"] if created else []
    commands = [test_cmd] if isinstance(test_cmd, str) else list(test_cmd)
    commands[-1] = " ".join([commands[-1], *test_directives(test_patch)])
    lines = [
        "#!/bin/bash",
        "set -uxo pipefail",
        "source /opt/miniconda3/bin/activate",
        "conda activate testbed",
        "cd /testbed",
        *reset,
        f"git apply -v - <<'{HEREDOC}'\n{test_patch}\n{HEREDOC}" if test_patch.strip() else ": no test patch",
        f": '{START_TEST_OUTPUT}'",
        *commands,
        f": '{END_TEST_OUTPUT}'",
        *reset,
    ]
    return "\n".join(lines) + "\n"


def rebench_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """A SWE-rebench row's fields: its image, and its harness (eval script and parser) from install_config."""
    config = _install_config(row)
    test_cmd = config.get("test_cmd")
    commands = [test_cmd] if isinstance(test_cmd, str) else test_cmd
    if not isinstance(commands, list) or not commands or not all(isinstance(c, str) and c for c in commands):
        raise FieldError("install_config.test_cmd", "missing or empty: the task's test command (text or a list)")
    parser = config.get("log_parser")
    if not isinstance(parser, str) or not parser:
        raise FieldError("install_config.log_parser", "missing or empty: the parser of the task's logs")
    test_patch = row.get("test_patch") or ""
    if not isinstance(test_patch, str):
        raise FieldError("test_patch", f"expected a diff, got {type(test_patch).__name__}")
    image = _text(row, "docker_image") or _text(row, "image_name")
    return {
        "base_commit": row["base_commit"],
        "problem_statement": row["problem_statement"],
        "patch_kind": "fix",
        "test_patch": test_patch,
        "image": image or swebench_image(str(row["instance_id"]), REBENCH_NAMESPACE),
        "difficulty": None,
        "version": _text(row, "version"),
        "eval_script": rebench_eval_script(str(row["base_commit"]), test_patch, commands),
        "log_parser": parser,
    }
