"""Which harness a task's tests run under, the command it runs, and how it reads the log that command writes.

Three harnesses write the logs swerl grades, and each reads its own logs its own way:

- SWE-bench (the `swebench` package). Its test command per repository and version is in the package's
  `MAP_REPO_VERSION_TO_SPECS` (swebench <= 4) or, from swebench 5 on (the pinned 5.0.2 ships no such table), in
  each dataset row's `eval_script`, between its START/END markers. Its log parser per repository is in
  `swebench.harness.log_parsers` (MAP_REPO_TO_PARSER_* per language): pytest's `-rA` summary lines, which START
  with the status (`PASSED tests/test_x.py::test_a`), or Django's runner (`test_a (app.tests.T.test_a) ... ok`).
  Its grader: a test missing from the log failed; a skipped FAIL_TO_PASS test is no fix, a skipped PASS_TO_PASS
  test no regression; the log must have the markers, and a non-zero exit code with no failure in the log is not
  trusted.
- SWE-smith (github.com/SWE-bench/SWE-smith, not installable here). Its Python repository profile runs
  `pytest --disable-warnings --color=no --tb=no --verbose` on the FAIL_TO_PASS tests' files and reads the verbose
  lines, where the status FOLLOWS the node id (`tests/test_x.py::test_a PASSED   [ 50%]`). Its grader: only the
  FAIL_TO_PASS files' tests count, a test missing from the log passed, only FAILED/ERROR fail (a SKIPPED test
  counts for neither side), and FAIL_TO_PASS and PASS_TO_PASS all passing is resolved (swebench's
  get_resolution_status). Its eval script runs under `set -x`, so its markers are the trace lines
  `+ : '>>>>> Start Test Output'`. swerl reimplements that parser and grader here (its own code).
- swerl's own tasks: `TaskInstance.test_cmd` or swerl's default pytest `-rA` command, read by swebench's parser
  for the repository (swerl/grading/grader.py's sealed runner grades them for training and evaluation).

`detect_log_formats` says which of those formats a log is in, so that a log is read by the parser of the
command that wrote it rather than by the task's default.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from swerl.data.schema import TaskInstance
from swerl.data.testrun import pytest_command

HarnessName = Literal["swebench", "swesmith", "swerl"]
LogFormat = Literal["pytest-rA", "pytest-verbose", "unittest"]

DEFAULT_PARSER = "parse_log_pytest"
"""swebench's parser for pytest `-rA` summaries, for repositories swebench has no parser of its own for."""

SWESMITH_VERBOSE = "swesmith.parse_log_pytest"
"""swerl's reimplementation of SWE-smith's pytest parser: `<node id> <STATUS>` lines of `pytest --verbose`."""
SWESMITH_SUMMARY = "swesmith.parse_log_paramiko"
"""swerl's reimplementation of SWE-smith's parser for profiles that run `pytest -rA`: `<STATUS> <node id>`."""

SWESMITH_TEST_CMD = "pytest --disable-warnings --color=no --tb=no --verbose"
"""SWE-smith's Python profile's test command (swesmith/profiles/python.py, PythonProfile.test_cmd)."""

# SWE-smith profiles that differ from the Python default (swesmith/profiles/python.py): their test command, and
# the parser when it is not the verbose one.
_SWESMITH_PROFILES: dict[str, tuple[str, str]] = {
    "paramiko/paramiko": ("pytest -rA --color=no --disable-warnings", SWESMITH_SUMMARY),
    "tkrajina/gpxpy": ("pytest test.py --verbose --color=no --tb=no --disable-warnings", SWESMITH_VERBOSE),
    "mido/mido": (f"{SWESMITH_TEST_CMD} -rs -c /dev/null", SWESMITH_VERBOSE),
    "jax-ml/jax": (f"{SWESMITH_TEST_CMD} -n auto", SWESMITH_VERBOSE),
}
# SWE-smith profiles whose logs SWE-smith reads with a parser of their own that swerl does not reimplement.
_SWESMITH_OWN_PARSERS = {
    "hips/autograd": "parse_log_autograd (pytest-xdist `[gwN] STATUS id` lines)",
    "python/mypy": "parse_log_mypy",
    "tornadoweb/tornado": "parse_log_tornado (tornado's own runner)",
    "un33k/python-slugify": "parse_log_python_slugify (unittest lines)",
    "gin-gonic/gin": "parse_log_gotest (go test)",
}

_STATUSES = ("FAILED", "PASSED", "SKIPPED", "ERROR", "XFAIL")
"""swebench's TestStatus values: the only words SWE-smith's parsers recognise (an XPASS line is no result)."""
_STATUS_AFTER_ID = re.compile(rf"^(\S+)\s+({'|'.join(_STATUSES)})")
_STATUS_BEFORE_ID = re.compile(rf"^({'|'.join(_STATUSES)})\s(\S+)")

_VERBOSE_EVIDENCE = re.compile(r"^\S+::\S*\s+(?:PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.M)
# A node id or a test file's path after the status, unlike `FAILED (failures=1)` or `ERROR: test_a` (unittest).
_NODE = r"[^\s(:]+(?:::|\.py\b)"
_SUMMARY_PASS_EVIDENCE = re.compile(rf"^(?:PASSED|XFAIL|XPASS) {_NODE}", re.M)
_SUMMARY_EVIDENCE = re.compile(rf"^(?:PASSED|FAILED|ERROR|XFAIL|XPASS) {_NODE}", re.M)
_UNITTEST_EVIDENCE = re.compile(r"^\w+ \([\w.]+\)(?: \.\.\. |$)", re.M)
_UNITTEST_RAN = re.compile(r"^Ran \d+ tests? in ", re.M)


class HarnessSpecError(ValueError):
    """No specification is known for the task's repository/version: nothing is guessed in its place."""


@dataclass(frozen=True)
class HarnessSpec:
    """The command a harness runs for a task and the parser that reads the log it writes."""

    harness: HarnessName
    test_cmd: str
    """The shell command (SWE-bench: the base command, before the test files its eval script appends)."""
    parser: str
    """A swebench PARSER_REGISTRY name, or SWESMITH_VERBOSE / SWESMITH_SUMMARY."""
    source: str
    """Where the command and parser came from, in words."""
    test_files: tuple[str, ...] = ()
    """SWE-smith: the FAIL_TO_PASS tests' files, appended to the command; only their tests are graded."""

    @property
    def rule(self) -> Literal["swebench", "swesmith"]:
        """Whose per-test rule grades the log: SWE-smith's for its own harness, swebench's otherwise."""
        return "swesmith" if self.harness == "swesmith" else "swebench"


def _swebench() -> Any:
    try:
        from swebench.harness import constants, grading, log_parsers
    except ImportError as exc:
        raise ImportError("grading evaluation logs needs the swebench package: pip install 'swerl[swebench]'") from exc
    return constants, grading, log_parsers


@cache
def _repo_parsers() -> dict[str, str]:
    """'owner/name' (lowercase) -> the name (in swebench's PARSER_REGISTRY) of the parser swebench uses for it."""
    _, _, log_parsers = _swebench()
    import swebench.harness.log_parsers as package

    registry = log_parsers.PARSER_REGISTRY
    out: dict[str, str] = {}
    for module_name in ("python", "javascript", "c", "go", "java", "php", "ruby", "rust"):
        module = getattr(package, module_name, None)
        for attr, value in vars(module).items() if module else ():
            if not (attr.startswith("MAP_REPO_TO_PARSER") and isinstance(value, dict)):
                continue
            for repo, fn in value.items():
                # Several registry names alias one function: prefer the one named after the repository.
                own = f"parse_log_{repo.split('/')[-1].split('-')[0].lower()}"
                names = [n for n, f in registry.items() if f is fn]
                if names:
                    out[repo.lower()] = own if own in names else names[0]
    return out


def log_parser_for(task: TaskInstance) -> str:
    """The parser the task's row names (TaskInstance.log_parser), else swebench's parser for the task's repository
    (SWE-smith repos map to their upstream), else pytest's."""
    return task.log_parser or _repo_parsers().get(task.repo_key, DEFAULT_PARSER)


@cache
def _summary_parsers() -> frozenset[str]:
    """swebench's parsers that read pytest's status-first summary lines (`-rA`)."""
    _, _, log_parsers = _swebench()
    from swebench.harness.log_parsers import python

    readers = {
        python.parse_log_pytest,
        python.parse_log_pytest_options,
        python.parse_log_pytest_v2,
        python.parse_log_matplotlib,
        python.parse_log_seaborn,
    }
    return frozenset(n for n, f in log_parsers.PARSER_REGISTRY.items() if f in readers)


def parser_format(parser: str) -> LogFormat | None:
    """The log format a parser reads; None for formats swerl does not detect (sympy's runner, other languages)."""
    if parser == SWESMITH_VERBOSE:
        return "pytest-verbose"
    if parser == SWESMITH_SUMMARY or parser in _summary_parsers():
        return "pytest-rA"
    if parser == "parse_log_django":
        return "unittest"
    return None


def harness_kind(task: TaskInstance) -> HarnessName:
    """SWE-smith for its tasks (source 'swesmith' or its hub id, or its `swesmith/owner__name.commit` repo
    spelling), SWE-bench for tasks carrying the reference fix, swerl's own otherwise."""
    source = task.source.strip().lower().replace("-", "").replace("_", "")
    if source == "swesmith" or "swesmith" in source.split("/")[-1] or task.repo.lower().startswith("swesmith/"):
        return "swesmith"
    if task.patch_kind == "fix":
        return "swebench"
    return "swerl"


def _between_markers(script: str) -> str:
    """The command(s) an eval script runs between SWE-bench's START and END markers."""
    constants, _, _ = _swebench()
    lines = script.splitlines()
    start = next((i for i, line in enumerate(lines) if constants.START_TEST_OUTPUT in line), None)
    end = next((i for i, line in enumerate(lines) if constants.END_TEST_OUTPUT in line), None)
    if start is None or end is None or end < start:
        raise HarnessSpecError("the eval_script has no START/END test output markers around a test command")
    capture = getattr(constants, "TEST_EXIT_CODE_VAR", "SWEBENCH_TEST_EXIT_CODE") + "="
    body = [ln.strip() for ln in lines[start + 1 : end] if ln.strip() and not ln.strip().startswith(capture)]
    if not body:
        raise HarnessSpecError("the eval_script runs no command between its test output markers")
    return "\n".join(body)


def swebench_spec(
    repo: str, version: str | None = None, eval_script: str | None = None, parser: str | None = None
) -> HarnessSpec:
    """SWE-bench's test command and parser for `repo` at `version`: from the row's `eval_script` when given
    (swebench 5's source of truth), else from the installed swebench's MAP_REPO_VERSION_TO_SPECS. The parser is
    the row's own (`parser`, a PARSER_REGISTRY name: SWE-bench 5 and SWE-rebench rows name one), else swebench's
    for the repository.

    Raises HarnessSpecError naming the repository and version (and the versions known) when neither has it."""
    constants, _, log_parsers = _swebench()
    if parser is not None and parser not in log_parsers.PARSER_REGISTRY:
        raise HarnessSpecError(f"{repo} {version}: the row's log parser {parser!r} is not one swebench has")
    parser = parser or _repo_parsers().get(repo.lower())
    if parser is None:
        need = "a log_parser" if eval_script else "its eval_script and log_parser"
        raise HarnessSpecError(
            f"swebench has no log parser for repository {repo!r} (version {version!r}): the task needs {need} "
            "(SWE-bench 5 rows carry both; SWE-rebench rows get them from install_config)"
        )
    if eval_script:
        return HarnessSpec(
            "swebench", _between_markers(eval_script), parser, f"{repo} {version}: the row's eval_script"
        )
    specs: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = getattr(constants, "MAP_REPO_VERSION_TO_SPECS", None)
    if specs is None:
        import swebench

        raise HarnessSpecError(
            f"{repo} version {version!r}: swebench {getattr(swebench, '__version__', '?')} has no "
            "MAP_REPO_VERSION_TO_SPECS (from swebench 5 on, each dataset row's eval_script holds the test "
            "command): load the task from rows that carry their eval_script (SWE-bench 5 rows; SWE-rebench rows "
            "get one from install_config) or give the task its eval_script"
        )
    by_version = specs.get(repo) or next((v for k, v in specs.items() if k.lower() == repo.lower()), None)
    if by_version is None:
        raise HarnessSpecError(f"swebench's MAP_REPO_VERSION_TO_SPECS has no repository {repo!r} (version {version!r})")
    if version is None or str(version) not in by_version:
        known = ", ".join(sorted(by_version, key=_version_key))
        raise HarnessSpecError(f"swebench has no spec for {repo} version {version!r}; known versions: {known}")
    command = by_version[str(version)].get("test_cmd")
    if not command:
        raise HarnessSpecError(f"swebench's spec for {repo} version {version} has no test_cmd")
    test_cmd = command if isinstance(command, str) else "; ".join(command)
    return HarnessSpec("swebench", test_cmd, parser, f"swebench MAP_REPO_VERSION_TO_SPECS[{repo!r}][{version!r}]")


def _version_key(version: str) -> tuple[tuple[int, str], ...]:
    return tuple((int(p), "") if p.isdigit() else (-1, p) for p in re.split(r"[.\-]", version))


def swesmith_spec(task: TaskInstance) -> HarnessSpec:
    """SWE-smith's profile for the task's repository: its Python profile's verbose pytest command on the
    FAIL_TO_PASS tests' files (sorted), read by its verbose parser, unless the profile says otherwise."""
    repo = task.repo_key
    if repo in _SWESMITH_OWN_PARSERS:
        raise HarnessSpecError(
            f"SWE-smith's profile for {repo} reads its logs with {_SWESMITH_OWN_PARSERS[repo]}, which swerl does "
            "not reimplement"
        )
    files = sorted({t.split("::", 1)[0] for t in task.FAIL_TO_PASS})
    odd = [f for f in files if not f.endswith(".py")]
    if odd:
        raise HarnessSpecError(
            f"{task.instance_id} ({repo}): FAIL_TO_PASS ids are not pytest node ids (e.g. {odd[0]!r}), so its "
            "SWE-smith profile is not the Python one swerl reimplements"
        )
    command, parser = _SWESMITH_PROFILES.get(repo, (SWESMITH_TEST_CMD, SWESMITH_VERBOSE))
    where = "its own profile" if repo in _SWESMITH_PROFILES else "the Python profile's default"
    return HarnessSpec("swesmith", " ".join([command, *files]), parser, f"SWE-smith {repo}: {where}", tuple(files))


def swerl_spec(task: TaskInstance) -> HarnessSpec:
    """The command swerl's own grader runs for the task (without the node ids it appends), read by swebench's
    parser for the repository."""
    command = task.test_cmd.strip() or pytest_command()
    where = "the task's test_cmd" if task.test_cmd.strip() else "swerl's default pytest -rA command"
    return HarnessSpec("swerl", command, log_parser_for(task), where)


def harness_for(task: TaskInstance, version: str | None = None, eval_script: str | None = None) -> HarnessSpec:
    """The spec of the harness the task comes from. A SWE-bench task's command comes from its row's `eval_script`
    or its `version` (the task's own fields unless given here): a repository's command changes between versions."""
    kind = harness_kind(task)
    if kind == "swesmith":
        return swesmith_spec(task)
    if kind == "swebench":
        try:
            return swebench_spec(task.repo, version or task.version, eval_script or task.eval_script, task.log_parser)
        except HarnessSpecError as exc:  # the task is named: a task set has many of one repository
            raise HarnessSpecError(f"SWE-bench task {task.instance_id} ({task.source}): {exc}") from None
    return swerl_spec(task)


def parse_swesmith_verbose(log: str) -> dict[str, str]:
    """SWE-smith's reading of `pytest --verbose` (swerl's own code): on each line, the first token, blanks, then
    a swebench status word is that test's status; a later line for the same test wins."""
    status_map: dict[str, str] = {}
    for line in log.split("\n"):
        match = _STATUS_AFTER_ID.match(line)
        if match:
            status_map[match.group(1)] = match.group(2)
    return status_map


def parse_swesmith_summary(log: str) -> dict[str, str]:
    """SWE-smith's reading of `pytest -rA` for the profiles that run it: a status word, a blank, the node id."""
    status_map: dict[str, str] = {}
    for line in log.split("\n"):
        match = _STATUS_BEFORE_ID.match(line)
        if match:
            status_map[match.group(2)] = match.group(1)
    return status_map


SWESMITH_PARSERS: dict[str, Callable[[str], dict[str, str]]] = {
    SWESMITH_VERBOSE: parse_swesmith_verbose,
    SWESMITH_SUMMARY: parse_swesmith_summary,
}


def swesmith_test_region(log: str) -> str | None:
    """The test output SWE-smith's grader reads: between its `set -x` trace markers (`+ : '<marker>'`), or
    between the plain marker lines for a log written without the trace (SWE-smith would read nothing there);
    None when its grader finds no run to grade (a patch that did not apply, a timeout, no markers)."""
    constants, _, _ = _swebench()
    start, end = constants.START_TEST_OUTPUT, constants.END_TEST_OUTPUT
    if constants.APPLY_PATCH_FAIL in log or constants.TESTS_TIMEOUT in log or start not in log or end not in log:
        return None
    traced_start, traced_end = f"+ : '{start}'", f"+ : '{end}'"
    i, j = log.find(traced_start), log.find(traced_end)
    if i >= 0 and j >= 0:
        return log[i + len(traced_start) : j] if i <= j else None  # SWE-smith raises on markers out of order
    i, j = log.find(start), log.find(end)
    return log[i + len(start) : j] if i <= j else None


def swesmith_tests_report(
    status_map: Mapping[str, str],
    fail_to_pass: Sequence[str],
    pass_to_pass: Sequence[str],
    test_files: Sequence[str] = (),
) -> dict[str, dict[str, list[str]]]:
    """SWE-smith's per-test rule (swerl's own code): tests outside `test_files` (when given) are not graded; a
    graded test missing from the log passed; FAILED/ERROR failed; SKIPPED counts for neither side."""

    def relevant(ids: Sequence[str]) -> list[str]:
        return [t for t in ids if any(t.startswith(f) for f in test_files)] if test_files else list(ids)

    def split(ids: list[str]) -> dict[str, list[str]]:
        return {
            "success": [t for t in ids if status_map.get(t, "PASSED") in ("PASSED", "XFAIL")],
            "failure": [t for t in ids if status_map.get(t) in ("FAILED", "ERROR")],
        }

    return {"FAIL_TO_PASS": split(relevant(fail_to_pass)), "PASS_TO_PASS": split(relevant(pass_to_pass))}


def traced_command(log: str) -> str | None:
    """The test command an eval script run under `set -x` (SWE-bench's and SWE-smith's both are) traced right
    after its start marker, e.g. `pytest --disable-warnings --color=no --tb=no --verbose tests/test_x.py`."""
    constants, _, _ = _swebench()
    lines = log.splitlines()
    start = next((i for i, line in enumerate(lines) if constants.START_TEST_OUTPUT in line), None)
    if start is None:
        return None
    for line in lines[start + 1 :]:
        if constants.END_TEST_OUTPUT in line:
            return None
        if line.startswith("+ ") and line[2:].strip():
            return line[2:].strip()
    return None


def command_formats(command: str) -> frozenset[LogFormat]:
    """The formats a test command writes: pytest's `-rA` summary (an -r flag with A or P), its verbose lines
    (-v, -vv, --verbose), the unittest/Django runner's lines (Django's runtests.py / `django test`, unittest)."""
    words = command.split()
    formats: set[LogFormat] = set()
    if any(w == "pytest" or w.endswith(("/pytest", "pytest.py")) for w in words) or " -m pytest" in command:
        if any(re.fullmatch(r"-r[a-zA-Z]*[AP][a-zA-Z]*", w) for w in words):
            formats.add("pytest-rA")
        if any(re.fullmatch(r"-v+", w) or w == "--verbose" for w in words):
            formats.add("pytest-verbose")
    elif any(w.endswith("runtests.py") for w in words) or re.search(
        r"\b(django|manage\.py) test\b|-m unittest\b", command
    ):
        formats.add("unittest")
    return frozenset(formats)


def detect_log_formats(log: str) -> frozenset[LogFormat]:
    """The test-output formats of a log: pytest's `-rA` summary (status first), pytest's `--verbose` lines
    (status after the node id), unittest/Django's runner (`test_a (module.Class.test_a) ... ok`).

    The command the eval script traced decides when it is one of those (a verbose run whose tests never ran
    still came from a verbose command); else the lines do. pytest prints FAILED/ERROR summary lines by default
    (`-r fE`), so a verbose log has those too: only a status-first pass line, or summary lines without verbose
    ones, show that `-rA` wrote the log."""
    command = traced_command(log)
    by_command = command_formats(command) if command else frozenset()
    if by_command:
        return by_command
    formats: set[LogFormat] = set()
    verbose = bool(_VERBOSE_EVIDENCE.search(log))
    if _SUMMARY_PASS_EVIDENCE.search(log) or (not verbose and _SUMMARY_EVIDENCE.search(log)):
        formats.add("pytest-rA")
    if verbose:
        formats.add("pytest-verbose")
    if _UNITTEST_EVIDENCE.search(log) and _UNITTEST_RAN.search(log):
        formats.add("unittest")
    return frozenset(formats)


_READING_BY_FORMAT: dict[LogFormat, tuple[HarnessName, str]] = {
    "pytest-rA": ("swebench", DEFAULT_PARSER),
    "pytest-verbose": ("swesmith", SWESMITH_VERBOSE),
    "unittest": ("swebench", "parse_log_django"),
}


def reading_for_log(task: TaskInstance, log: str) -> tuple[HarnessName, str]:
    """(harness, parser) for a log of `task`: the task's own harness when the log is in its format (or in no
    format swerl detects), else the harness whose command writes the format the log is in."""
    kind = harness_kind(task)
    own: tuple[HarnessName, str] = (
        ("swesmith", swesmith_spec(task).parser) if kind == "swesmith" else (kind, log_parser_for(task))
    )
    own_format = parser_format(own[1])
    found = detect_log_formats(log)
    if own_format is None or not found or own_format in found:
        return own
    for fmt in ("pytest-rA", "pytest-verbose", "unittest"):
        if fmt in found:
            harness, parser = _READING_BY_FORMAT[fmt]
            if harness == "swebench" and parser_format(log_parser_for(task)) == fmt:
                parser = log_parser_for(task)
            return harness, parser
    return own


def read_harness_log(task: TaskInstance, log: str, parser: str) -> tuple[dict[str, str], str | None]:
    """(test -> status, why the log cannot be graded or None), read as the harness that wrote it reads it.

    swebench's parsers go through swebench's own `get_logs_eval` and so its rules (swebench 5): the log must hold
    the START/END markers and none of the patch/reset/timeout failure lines; a log with no results and no sign that
    the suite ran is invalid; a log reporting no failure from a command that exited non-zero is invalid. SWE-smith's
    readers take the test region between its markers."""
    if parser in SWESMITH_PARSERS:
        region = swesmith_test_region(log)
        if region is None:
            return {}, "no test output between SWE-smith's markers"
        return SWESMITH_PARSERS[parser](region), None
    constants, grading, _ = _swebench()
    from swebench.types import TestSpec

    spec = TestSpec(
        instance_id=task.instance_id,
        image=task.image,
        eval_script_list=[],
        repo=task.repo_key,
        version=task.version or "",
        FAIL_TO_PASS=list(task.FAIL_TO_PASS),
        PASS_TO_PASS=list(task.PASS_TO_PASS),
        log_parser=parser,
        eval_type=constants.EvalType.PASS_AND_FAIL.value,
    )
    with tempfile.TemporaryDirectory(prefix="swerl-log-") as tmp:
        path = Path(tmp) / "test_output.txt"
        path.write_text(log)
        status_map, valid = grading.get_logs_eval(spec, str(path))
    if valid:
        return dict(status_map), None
    code = grading.parse_test_exit_code(log)
    if constants.START_TEST_OUTPUT not in log or constants.END_TEST_OUTPUT not in log:
        why = "the log has no START/END test output markers"
    elif code not in (None, 0) and any(s == "PASSED" for s in grading.PARSER_REGISTRY[parser](log, spec).values()):
        why = f"the test command exited {code} while its log reports no failure"
    else:
        why = "no results and no sign that the test suite ran"
    return {}, why
