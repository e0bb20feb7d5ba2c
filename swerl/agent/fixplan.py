"""How an expert would undo a known bug with edits that copy little: pure functions over the task's diff.

A task's diff (the bug for SWE-smith-style tasks, the fix for SWE-bench ones) is turned into the fix as seen
from the broken file. A fix that changes one line becomes a line-addressed `sed -i 'Ns/OLD/NEW/' FILE` whose
fragments are the smallest token-aligned text around the change (`' <= '` -> `' < '`, `'not x'` -> `'x'`);
anything else (an inserted statement, a multi-line change, text sed cannot quote) becomes a `str_replace` of
the changed lines with just enough context to be unique in the file.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Literal

_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")
_TOKEN = re.compile(r"\w+|\s+|[^\w\s]+")
_MAX_CONTEXT_LINES = 6
_LONG_FRAGMENT = 12
"""A literal fragment longer than this is replaced by a fixed regex where one fits (negation, swapped args)."""
_ARG = r"[^,() ][^,()]*"
# (python pattern, python replacement, sed BRE pattern, sed replacement): edits of a fixed shape that copy little.
_REGEX_EDITS = (
    (rf"\(({_ARG}), ({_ARG})\)", r"(\2, \1)", rf"(\({_ARG}\), \({_ARG}\))", r"(\2, \1)"),
    (rf"({_ARG}), ({_ARG})", r"\2, \1", rf"\({_ARG}\), \({_ARG}\)", r"\2, \1"),
    (r"not \((.*)\):", r"\1:", r"not (\(.*\)):", r"\1:"),
    (r"not \((.*)\) else", r"\1 else", r"not (\(.*\)) else", r"\1 else"),
)
_MAX_OCCURRENCE = 3

# Operator flips for plausible wrong edits (recovery traces): a space on each side keeps them token-aligned.
OPERATOR_FLIPS: dict[str, str] = {
    " < ": " <= ",
    " <= ": " < ",
    " > ": " >= ",
    " >= ": " > ",
    " == ": " != ",
    " != ": " == ",
    " + ": " - ",
    " - ": " + ",
}


class NoFixPlan(Exception):
    """The diff cannot be turned into an oracle edit; `reason` is a short counter key."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Hunk:
    """One hunk of a one-file diff, as seen from the broken file: '-' lines are broken, '+' lines fixed."""

    file: str
    start: int
    """1-based line in the broken file where the hunk starts."""
    lines: tuple[tuple[str, str], ...]
    """(tag, text) with tag ' ', '-' or '+'; text without its newline."""


@dataclass(frozen=True)
class FixPlan:
    """The edit that fixes the broken file, and the lines to look at first."""

    file: str
    kind: Literal["sed", "str_replace"]
    line: int
    """1-based line of the first broken line (sed: the line the substitution addresses)."""
    last_line: int
    old: str
    new: str
    sed_expr: str = ""
    """A regex `s/.../.../K` used instead of the literal OLD/NEW when that copies much less."""

    def view_command(self, context: int) -> str:
        first, last = max(1, self.line - context), self.last_line + context
        return f"cat -n {shlex.quote(self.file)} | sed -n {first},{last}p"

    def sed_command(self) -> str:
        if self.sed_expr:
            return f"sed -i '{self.line}{self.sed_expr}' {shlex.quote(self.file)}"
        return sed_substitution(self.line, self.old, self.new, self.file)


def sed_substitution(line: int, old: str, new: str, file: str) -> str:
    """`sed -i 'Ns/OLD/NEW/' FILE` replacing the first literal `old` on line N with `new`."""
    old_re = re.sub(r"([\\/.*\[\]^$])", r"\\\1", old)
    new_re = re.sub(r"([\\/&])", r"\\\1", new)
    return f"sed -i '{line}s/{old_re}/{new_re}/' {shlex.quote(file)}"


def regex_substitution(broken: str, fixed: str) -> str:
    """A fixed-shape `s/REGEX/REPL/K` turning the broken line into the fixed one (checked here), or ''."""
    for pattern, replacement, sed_pattern, sed_replacement in _REGEX_EDITS:
        for occurrence, match in enumerate(re.finditer(pattern, broken), start=1):
            if occurrence > _MAX_OCCURRENCE:
                break
            if broken[: match.start()] + match.expand(replacement) + broken[match.end() :] == fixed:
                flag = "" if occurrence == 1 else str(occurrence)
                return f"s/{sed_pattern}/{sed_replacement}/{flag}"
    return ""


def sed_quotable(text: str) -> bool:
    """Whether text can sit inside a single-quoted one-line sed script."""
    return "'" not in text and "\n" not in text


def parse_fix_hunks(diff: str, diff_is_bug: bool) -> list[Hunk]:
    """The hunks of a unified diff as a fix of the broken file (a bug diff is inverted)."""
    hunks: list[Hunk] = []
    file = ""
    current: list[tuple[str, str]] | None = None
    start = 0

    def flush() -> None:
        if current is not None:
            hunks.append(Hunk(file, start, tuple(current)))

    for raw in diff.splitlines():
        if raw.startswith("+++ "):
            flush()
            current = None
            name = raw[4:].split("\t")[0].strip()
            file = name[2:] if name.startswith("b/") else name
        elif match := _HUNK_HEADER.match(raw):
            flush()
            current = []
            start = int(match.group(2) if diff_is_bug else match.group(1))
        elif current is not None and raw[:1] in (" ", "-", "+"):
            tag = raw[0]
            if diff_is_bug and tag != " ":
                tag = "+" if tag == "-" else "-"
            current.append((tag, raw[1:]))
        elif current is not None and raw == "":
            current.append((" ", ""))  # a blank context line whose leading space was stripped
    flush()
    return hunks


def _boundaries(text: str) -> set[int]:
    return {0, len(text)} | {m.start() for m in _TOKEN.finditer(text)}


def _tokens(text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in _TOKEN.finditer(text)]


def sed_fragments(broken: str, fixed: str) -> tuple[int, str, str] | None:
    """(offset, OLD, NEW): the smallest token-aligned change turning the broken line into the fixed one.

    OLD's first occurrence in the broken line is at offset (sed replaces the first match), neither side is
    blank, and substituting gives the fixed line exactly; None when no such fragment exists.
    """
    if broken == fixed:
        return None
    prefix = 0
    while prefix < min(len(broken), len(fixed)) and broken[prefix] == fixed[prefix]:
        prefix += 1
    suffix = 0
    while (
        suffix < min(len(broken), len(fixed)) - prefix
        and broken[len(broken) - 1 - suffix] == fixed[len(fixed) - 1 - suffix]
    ):
        suffix += 1
    broken_bounds, fixed_bounds = _boundaries(broken), _boundaries(fixed)
    lo = max(i for i in range(prefix + 1) if i in broken_bounds and i in fixed_bounds)
    tail = max(s for s in range(suffix + 1) if len(broken) - s in broken_bounds and len(fixed) - s in fixed_bounds)
    tokens = _tokens(broken)
    while True:
        old, new = broken[lo : len(broken) - tail], fixed[lo : len(fixed) - tail]
        if old.strip() and new.strip() and broken.find(old) == lo:
            lo, tail = _trimmed(broken, fixed, lo, tail)
            return _spaced(broken, fixed, lo, tail) or (
                lo,
                broken[lo : len(broken) - tail],
                fixed[lo : len(fixed) - tail],
            )
        left = [t for t in tokens if t[1] == lo]
        right = [t for t in tokens if t[0] == len(broken) - tail]
        if not left and not right:
            return None
        # Grow towards punctuation and spaces before identifiers: identifiers are what a small model miscopies.
        options = [(_cost(broken[a:b]), "left", a) for a, b in left] + [
            (_cost(broken[a:b]), "right", len(broken) - b) for a, b in right
        ]
        _, side, value = min(options)
        if side == "left":
            lo = value
        else:
            tail = value


def _trimmed(broken: str, fixed: str, lo: int, tail: int) -> tuple[int, int]:
    """Drop whitespace that both sides of a fragment start or end with, while it stays valid."""
    while True:
        old, new = broken[lo : len(broken) - tail], fixed[lo : len(fixed) - tail]
        shared_head = old[:1].isspace() and old[:1] == new[:1] and old[1:].strip() and new[1:].strip()
        if shared_head and broken.find(old[1:]) == lo + 1:
            lo += 1
            continue
        shared_tail = old[-1:].isspace() and old[-1:] == new[-1:] and old[:-1].strip() and new[:-1].strip()
        if shared_tail and broken.find(old[:-1]) == lo:
            tail += 1
            continue
        return lo, tail


def _spaced(broken: str, fixed: str, lo: int, tail: int) -> tuple[int, str, str] | None:
    """An operator fragment with the spaces around it (`' <= '` -> `' < '`), when still first on its line."""
    old, new = broken[lo : len(broken) - tail], fixed[lo : len(fixed) - tail]
    operator = re.compile(r"[^\w\s]+")
    if not (operator.fullmatch(old) and operator.fullmatch(new)) or lo == 0 or tail == 0:
        return None
    if broken[lo - 1] != " " or broken[len(broken) - tail] != " ":
        return None
    old, new = f" {old} ", f" {new} "
    return (lo - 1, old, new) if broken.find(old) == lo - 1 else None


def _cost(token: str) -> tuple[int, int]:
    return (1 if re.fullmatch(r"\w+", token) else 0, len(token))


def plan_fix(diff: str, diff_is_bug: bool, broken_source: str) -> FixPlan:
    """The oracle's edit for a one-file, one-hunk diff; raises NoFixPlan (with a reason) otherwise."""
    hunks = parse_fix_hunks(diff, diff_is_bug)
    if not hunks:
        raise NoFixPlan("empty_diff")
    if len({h.file for h in hunks}) > 1:
        raise NoFixPlan("multi_file")
    if len(hunks) > 1:
        raise NoFixPlan("multi_hunk")
    hunk = hunks[0]
    changed = [i for i, (tag, _) in enumerate(hunk.lines) if tag != " "]
    first, last = changed[0], changed[-1]
    broken_before = sum(1 for tag, _ in hunk.lines[:first] if tag != "+")
    line = hunk.start + broken_before
    region = hunk.lines[first : last + 1]
    removed = [text for tag, text in region if tag != "+"]
    added = [text for tag, text in region if tag != "-"]
    last_line = line + max(len(removed), 1) - 1
    lines = broken_source.splitlines()
    if lines[line - 1 : line - 1 + len(removed)] != removed:
        raise NoFixPlan("diff_does_not_match_file")
    if len(removed) == 1 and len(added) == 1:
        found = sed_fragments(removed[0], added[0])
        if found is not None and sed_quotable(found[1]) and sed_quotable(found[2]):
            expr = regex_substitution(removed[0], added[0]) if len(found[1]) > _LONG_FRAGMENT else ""
            return FixPlan(hunk.file, "sed", line, last_line, found[1], found[2], expr)
    return _str_replace_plan(hunk.file, lines, line, removed, added, last_line, broken_source)


def _str_replace_plan(
    file: str,
    lines: list[str],
    line: int,
    removed: list[str],
    added: list[str],
    last_line: int,
    broken_source: str,
) -> FixPlan:
    """Changed lines plus the fewest neighbouring lines (below first, then above) that make them unique."""
    above, below = 0, 0
    start = line - 1  # 0-based index of the first removed line (or of the insertion point)
    for _ in range(2 * _MAX_CONTEXT_LINES + 1):
        before = lines[start - above : start]
        after = lines[start + len(removed) : start + len(removed) + below]
        old = "\n".join([*before, *removed, *after])
        new = "\n".join([*before, *added, *after])
        offset = len("\n".join(lines[: start - above])) + (1 if start - above > 0 else 0)
        if old.strip() and broken_source.count(old) == 1 and broken_source.find(old) == offset:
            return FixPlan(file, "str_replace", line, last_line, old, new)
        if below <= above and start + len(removed) + below < len(lines):
            below += 1
        elif start - above > 0:
            above += 1
        else:
            below += 1
    raise NoFixPlan("no_unique_context")


def wrong_edits(broken_source: str, plan: FixPlan, window: int) -> list[tuple[int, str, str]]:
    """Plausible wrong single-operator edits near the bug: (line, OLD, NEW), each exactly undoable by sed.

    Neighbouring lines within `window`, and for a sed fix the bug line's other operators (the wrong one of
    two operators on a line); never the fix itself.
    """
    lines = broken_source.splitlines()
    found = []
    first, last = max(1, plan.line - window), min(len(lines), plan.last_line + window)
    for number in range(first, last + 1):
        text = lines[number - 1]
        in_fix = plan.line <= number <= plan.last_line
        if in_fix and plan.kind != "sed":
            continue
        for old, new in OPERATOR_FLIPS.items():
            at = text.find(old)
            if at < 0:
                continue
            wrong = text[:at] + new + text[at + len(old) :]
            if wrong.find(new) != at or wrong.replace(new, old, 1) != text:
                continue  # `sed s/NEW/OLD/` would not undo it exactly
            if in_fix:
                fix_at = text.find(plan.old)
                if at < fix_at + len(plan.old) and fix_at < at + len(old):
                    continue  # overlaps the real fix
            found.append((number, old, new))
    return found
