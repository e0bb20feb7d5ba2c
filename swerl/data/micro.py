"""Procedural micro repositories: a task family small enough for a few-million-parameter model on a CPU.

A micro repository is `mod.py` (2-3 small functions from the templates in micro_templates.py),
`tests/test_mod.py` (3 one-line tests per function, expected values computed by running the clean code) and
`run_tests.py`, a dependency-free harness that prints pytest's `-rA` summary lines in a fraction of pytest's
start-up time. Bugs are put in later
by the ordinary modifiers (swerl.data.bugs) and validated by swerl.data.synth like any other repository.

Identifiers come from a shipped word list split by a stable hash into disjoint train and eval halves, so the
eval split's repositories use names never seen in training. Generation is deterministic: the same (split, seed,
index) gives byte-identical files on any machine (a sha256 counter-mode generator, no `random`, no hash or set
order). Test arguments are chosen, among seeded candidates, to tell the clean code from its mutants (the same
modifiers run in-process, with a line budget against mutants that loop), so the output also depends on
swerl.data.bugs: a change there, or to the templates or the word list, must bump GENERATOR_VERSION.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import FrameType
from typing import Any

from swerl.data.bugs import MODIFIERS, apply_edit, find_edits
from swerl.data.micro_templates import (
    CHECK,
    CONFTEST,
    PLAIN_TEMPLATES,
    RUN_TESTS,
    TEMPLATES,
    ArgSpec,
    Template,
)
from swerl.data.repos import RepoSpec, iter_files

log = logging.getLogger(__name__)

GENERATOR_VERSION = 3
"""Part of every cache path and environment reference's meaning: bump it whenever generated files change."""

SPLITS = ("train", "eval")
IMAGE_PREFIX = "micro://"
REPO_OWNER = "swerl-micro"
TEST_CMD = "python run_tests.py"
"""The per-task test command of micro repositories (node ids are appended)."""

TESTS_PER_FUNCTION = 3
_CANDIDATE_INPUTS = 24
_LINE_BUDGET = 5000
_MAX_MODULE_LINES = 25


class _Rng:
    """sha256 in counter mode: the same draws for the same key on every machine and Python version."""

    def __init__(self, key: str) -> None:
        self._key = key
        self._counter = 0

    def below(self, n: int) -> int:
        self._counter += 1
        digest = hashlib.sha256(f"{self._key}:{self._counter}".encode()).digest()
        return int.from_bytes(digest[:8], "big") % n

    def randint(self, lo: int, hi: int) -> int:
        return lo + self.below(hi - lo + 1)

    def choice(self, items: Sequence[Any]) -> Any:
        return items[self.below(len(items))]

    def shuffled(self, items: Sequence[Any]) -> list[Any]:
        out = list(items)
        for i in range(len(out) - 1, 0, -1):
            j = self.below(i + 1)
            out[i], out[j] = out[j], out[i]
        return out


# ---------------------------------------------------------------------------------------------------------------
# Words


def word_split(word: str) -> str:
    """'train' or 'eval': which half of the vocabulary a word belongs to (a stable hash, not Python's)."""
    return "eval" if hashlib.sha256(word.encode()).digest()[0] & 1 else "train"


@functools.cache
def _all_words() -> tuple[str, ...]:
    text = resources.files("swerl.data").joinpath("resources/micro_words.txt").read_text(encoding="utf-8")
    words = {line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")}
    return tuple(sorted(words))


@functools.cache
def vocabulary(split: str) -> tuple[str, ...]:
    """The words identifiers of `split` are made of, sorted."""
    _check_split(split)
    return tuple(w for w in _all_words() if word_split(w) == split)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"micro split must be one of {SPLITS}, got {split!r}")


# ---------------------------------------------------------------------------------------------------------------
# Generation


class _OverBudget(Exception):
    """A call ran more lines than _LINE_BUDGET (a mutant that loops)."""


def _call_bounded(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[str, Any]:
    """('ok', result) or ('raise', exception type name): the call's outcome, under a deterministic line budget."""
    steps = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal steps
        if event == "line":
            steps += 1
            if steps > _LINE_BUDGET:
                raise _OverBudget
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        return "ok", fn(*(list(a) if isinstance(a, list) else a for a in args))
    except Exception as exc:  # a mutant may raise anything
        return "raise", type(exc).__name__
    finally:
        sys.settrace(previous)


def _same(outcome: tuple[str, Any], clean: Any) -> bool:
    """Whether a mutant's outcome passes a test expecting the clean result (`check` compares with `!=`)."""
    status, value = outcome
    try:
        return status == "ok" and bool(value == clean)
    except Exception:
        return False


def _load(source: str) -> dict[str, Any] | None:
    namespace: dict[str, Any] = {"__name__": "mod"}
    try:
        exec(compile(source, "mod.py", "exec"), namespace)
    except Exception:
        return None
    return namespace


def _plain(value: object) -> bool:
    """Whether a clean result is exactly representable in a test (ints, bools, lists of ints)."""
    if isinstance(value, bool | int):
        return True
    return isinstance(value, list) and all(type(v) is int for v in value)


def _draw_args(rng: _Rng, specs: tuple[ArgSpec, ...], consts: Sequence[int]) -> tuple[Any, ...]:
    args: list[Any] = []
    for spec in specs:
        if spec[0] == "bool":
            args.append(rng.below(2) == 1)
        elif spec[0] == "int":
            # A third of the time at or next to a constant or another argument: where mutants differ.
            near = [*consts, *(a for a in args if type(a) is int)]
            if near and rng.below(3) == 0:
                args.append(rng.choice(near) + rng.randint(-1, 1))
            else:
                args.append(rng.randint(spec[1], spec[2]))
        else:
            _, lo, hi, min_len, max_len = spec
            args.append([rng.randint(lo, hi) for _ in range(rng.randint(min_len, max_len))])
    return tuple(args)


@dataclass(frozen=True)
class _Function:
    name: str
    specs: tuple[ArgSpec, ...]
    consts: tuple[int, ...]


def _name(rng: _Rng, words: Sequence[str], used: set[str], parts: int) -> str:
    for _ in range(1000):
        name = "_".join(rng.choice(words) for _ in range(parts))
        if name not in used:
            used.add(name)
            return name
    raise RuntimeError("micro vocabulary exhausted")  # pragma: no cover - thousands of words


def _instantiate(template: Template, rng: _Rng, words: Sequence[str], used: set[str]) -> tuple[str, list[_Function]]:
    values: dict[str, str] = {}
    consts: dict[str, int] = {name: rng.randint(lo, hi) for name, lo, hi in template.consts}
    for slot in template.slots:
        if slot in consts:
            values[slot] = str(consts[slot])
        elif slot in template.args:
            values[slot] = _name(rng, words, used, 1 + rng.below(2))
        else:
            values[slot] = _name(rng, words, used, 1)
    functions = [_Function(values[slot], specs, tuple(consts.values())) for slot, specs in template.args.items()]
    return template.code.format(**values), functions


def _call_graph(source: str) -> tuple[dict[str, tuple[int, int]], dict[str, set[str]]]:
    """(function -> its first and last line, function -> the module functions a call to it may run)."""
    tree = ast.parse(source)
    defs = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    spans = {d.name: (d.lineno, d.end_lineno or d.lineno) for d in defs}
    calls = {
        d.name: {
            n.func.id
            for n in ast.walk(d)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in spans
        }
        for d in defs
    }
    reaches = {}
    for name in spans:
        seen, todo = {name}, [name]
        while todo:
            for callee in calls[todo.pop()] - seen:
                seen.add(callee)
                todo.append(callee)
        reaches[name] = seen
    return spans, reaches


def _pick_tests(source: str, functions: Sequence[_Function], rng: _Rng) -> list[tuple[str, str, str]]:
    """(function, call arguments, expected) triples: per function, the candidates that tell most mutants apart."""
    clean = _load(source)
    if clean is None:
        raise RuntimeError(f"micro template does not load:\n{source}")
    spans, reaches = _call_graph(source)
    mutants: list[tuple[str, dict[str, Any]]] = []  # (function edited, module namespace)
    for modifier in sorted(MODIFIERS):
        for edit in find_edits(modifier, source):
            namespace = _load(apply_edit(source, edit))
            edited = next((name for name, (first, last) in spans.items() if first <= edit.line <= last), "")
            if namespace is not None and edited:
                mutants.append((edited, namespace))
    tests = []
    for fn in functions:
        pool: list[tuple[tuple[Any, ...], Any]] = []
        seen: set[str] = set()
        for _ in range(_CANDIDATE_INPUTS):
            args = _draw_args(rng, fn.specs, fn.consts)
            key = repr(args)
            if key in seen:
                continue
            seen.add(key)
            status, result = _call_bounded(clean[fn.name], args)
            if status == "ok" and _plain(result):
                pool.append((args, result))
        relevant = [(m, ns) for m, (edited, ns) in enumerate(mutants) if edited in reaches[fn.name]]
        kills = [
            {m for m, namespace in relevant if not _same(_call_bounded(namespace[fn.name], args), result)}
            for args, result in pool
        ]
        chosen: list[int] = []
        killed: set[int] = set()
        while len(chosen) < min(TESTS_PER_FUNCTION, len(pool)):
            best = max((i for i in range(len(pool)) if i not in chosen), key=lambda i: (len(kills[i] - killed), -i))
            chosen.append(best)
            killed |= kills[best]
        if len(chosen) < TESTS_PER_FUNCTION:
            raise RuntimeError(f"micro function {fn.name} has too few valid test inputs")
        for i in chosen:
            args, result = pool[i]
            tests.append((fn.name, ", ".join(repr(a) for a in args), repr(result)))
    return tests


def render_repo(templates: Sequence[Template], split: str, key: str) -> dict[str, str]:
    """The files of a micro repository made of `templates`, names drawn from `split`'s words by `key`."""
    _check_split(split)
    rng = _Rng(f"micro-v{GENERATOR_VERSION}:{key}")
    words = vocabulary(split)
    used: set[str] = set()
    blocks: list[str] = []
    functions: list[_Function] = []
    for template in templates:
        code, fns = _instantiate(template, rng, words, used)
        blocks.append(code)
        functions += fns
    source = "\n\n".join(blocks)
    tests = _pick_tests(source, functions, rng)
    names = ", ".join(fn.name for fn in functions)
    lines = [f"from mod import {names}", "", "", CHECK]
    counter: dict[str, int] = {}
    for name, args, expected in tests:
        counter[name] = counter.get(name, 0) + 1
        lines += ["", f"def test_{name}_{counter[name]}():", f"    check({name}({args}), {expected})", ""]
    return {
        "mod.py": source,
        "run_tests.py": RUN_TESTS,
        "tests/conftest.py": CONFTEST,
        "tests/test_mod.py": "\n".join(lines).rstrip("\n") + "\n",
    }


def choose_templates(rng: _Rng) -> list[Template]:
    """One function that can hold a bug and one plain function (no bug site), in a random order.

    The bug is then always in the one function with operators, which the agent finds by reading the file, not by
    matching a failing test's name to a definition: a 4M-parameter model does not learn to copy or match novel
    identifiers within a CPU budget (TINY-MODEL-NOTES; docs/experiments.md). The plain function's tests are the
    task's PASS_TO_PASS.
    """
    buggy = rng.shuffled([t for t in TEMPLATES if t.functions == 1])[0]
    plain = rng.shuffled(list(PLAIN_TEMPLATES))[0]
    return [buggy, plain] if rng.below(2) else [plain, buggy]


def micro_repo_files(split: str, seed: int, index: int) -> dict[str, str]:
    """Relative path -> text of micro repository `index` of `split` under `seed` (deterministic)."""
    _check_split(split)
    if index < 0 or seed < 0:
        raise ValueError(f"micro seed ({seed}) and index ({index}) must be >= 0")
    key = f"{split}:{seed}:{index}"
    templates = choose_templates(_Rng(f"micro-v{GENERATOR_VERSION}:templates:{key}"))
    return render_repo(templates, split, key)


# ---------------------------------------------------------------------------------------------------------------
# Materializing


def default_cache_root() -> Path:
    """Where micro repositories are written: $SWERL_CACHE_DIR or ~/.cache/swerl, under micro/v{VERSION}."""
    base = os.environ.get("SWERL_CACHE_DIR") or str(Path.home() / ".cache" / "swerl")
    return Path(base).expanduser() / "micro" / f"v{GENERATOR_VERSION}"


def micro_image(split: str, seed: int, index: int) -> str:
    """The environment reference of a micro repository: micro://SPLIT/SEED/INDEX."""
    return f"{IMAGE_PREFIX}{split}/{seed}/{index}"


def parse_micro_image(image: str) -> tuple[str, int, int]:
    """micro://SPLIT/SEED/INDEX -> (split, seed, index)."""
    parts = image[len(IMAGE_PREFIX) :].split("/") if image.startswith(IMAGE_PREFIX) else []
    if len(parts) != 3 or parts[0] not in SPLITS or not all(p.isascii() and p.isdigit() for p in parts[1:]):
        raise ValueError(f"not a micro environment reference (micro://SPLIT/SEED/INDEX): {image!r}")
    return parts[0], int(parts[1]), int(parts[2])


@functools.lru_cache(maxsize=4096)
def _generated(split: str, seed: int, index: int) -> tuple[tuple[str, bytes], ...]:
    """micro_repo_files as bytes, generated once per process."""
    return tuple((rel, text.encode()) for rel, text in sorted(micro_repo_files(split, seed, index).items()))


def _holds(directory: Path, files: tuple[tuple[str, bytes], ...]) -> bool:
    """Whether a directory holds exactly these files (caches such as __pycache__ aside)."""
    if [p.as_posix() for p in iter_files(directory)] != [rel for rel, _ in files]:
        return False
    return all((directory / rel).read_bytes() == data for rel, data in files)


def materialize_micro_repo(split: str, seed: int, index: int, cache_root: Path | None = None) -> Path:
    """The directory of a micro repository, written once (atomically) under the cache and reused after.

    A cached directory is reused only if it holds exactly what this generator makes (checked once per call,
    the generation itself once per process); one left by another generator build, or edited, is replaced.
    """
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    target = root / f"{split}-{seed}-{index}"
    files = _generated(split, seed, index)
    if target.is_dir() and _holds(target, files):
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    stale = root / f"{staging.name}.stale"
    try:
        staging.chmod(0o755)
        for rel, data in files:
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        if target.is_dir():
            log.warning("micro repository %s differs from what this generator makes: replacing it", target)
            with contextlib.suppress(FileNotFoundError):  # another process may be replacing it too
                target.rename(stale)
        try:
            staging.rename(target)
        except OSError:
            if not (target.is_dir() and _holds(target, files)):  # another process may have won the race
                raise
    finally:
        for leftover in (staging, stale):
            if leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)
    return target


def micro_repo_name(split: str, index: int) -> str:
    """The RepoSpec name of a micro repository: micro-SPLIT-NNNN."""
    return f"micro-{split}-{index:04d}"


def micro_repo_spec(split: str, seed: int, index: int, cache_root: Path | None = None) -> RepoSpec:
    """A micro repository, materialized, as a repository to synthesize tasks from (its own test command)."""
    path = materialize_micro_repo(split, seed, index, cache_root)
    return RepoSpec(
        name=micro_repo_name(split, index),
        path=path,
        repo=f"{REPO_OWNER}/{split}-{index:04d}",
        image=micro_image(split, seed, index),
        test_cmd=TEST_CMD,
    )


def micro_split(repo: str) -> str | None:
    """'train' / 'eval' for a micro repository's published name (swerl-micro/SPLIT-NNNN), else None."""
    owner, _, rest = repo.partition("/")
    split = rest.split("-", 1)[0]
    return split if owner == REPO_OWNER and split in SPLITS else None
