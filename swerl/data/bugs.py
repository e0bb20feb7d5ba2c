"""Procedural bug modifiers on the Python AST (after SWE-smith's bug_gen/procedural).

Each modifier enumerates candidate sites in a module, in source order, and turns one site into a text edit
of just that node's span: every other character of the file is kept as written (the file is never
re-rendered with ast.unparse). Only code inside functions is touched, since module-level edits break imports
rather than behaviour. An edit is kept only if the result still parses and differs from the original.
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from swerl.data.diffs import unified_diff


@dataclass(frozen=True)
class Edit:
    """Replace source[start:end] (character offsets) with `text`; `line` is where the bug shows."""

    start: int
    end: int
    text: str
    line: int
    description: str


@dataclass(frozen=True)
class BugCandidate:
    """One applicable bug: the diff that introduces it and the diff that fixes it."""

    modifier: str
    file: str
    line: int
    site: int
    description: str
    bug_patch: str
    fix_patch: str


class _Source:
    """Source text with ast positions (1-based lines, UTF-8 byte columns) mapped to character offsets."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col_bytes: int) -> int:
        line = self.lines[lineno - 1] if lineno - 1 < len(self.lines) else ""
        return self.starts[lineno - 1] + len(line.encode()[:col_bytes].decode(errors="replace"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return (
            self.offset(node.lineno, node.col_offset),  # type: ignore[attr-defined]
            self.offset(node.end_lineno, node.end_col_offset),  # type: ignore[attr-defined]
        )

    def segment(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.text[start:end]

    def line_span(self, first: int, last: int) -> tuple[int, int]:
        """Offsets covering whole lines first..last (1-based, inclusive), newline included."""
        return self.starts[first - 1], self.starts[last]

    def owns_lines(self, node: ast.stmt) -> bool:
        """Whether `node` alone occupies its lines (no `a; b`, nothing before it on its first line)."""
        start, end = self.span(node)
        head = self.text[self.starts[node.lineno - 1] : start]
        tail = self.text[end : self.starts[node.end_lineno]]  # type: ignore[index]
        return not head.strip() and (not tail.strip() or tail.strip().startswith("#"))

    def indent(self, lineno: int) -> str:
        line = self.lines[lineno - 1]
        return line[: len(line) - len(line.lstrip())]


def _function_nodes(tree: ast.Module) -> Iterator[ast.AST]:
    """Every node inside a function body, in source order."""
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    seen: set[int] = set()
    found = []
    for fn in functions:
        for stmt in fn.body:
            for node in ast.walk(stmt):
                if id(node) not in seen and hasattr(node, "lineno"):
                    seen.add(id(node))
                    found.append(node)
    found.sort(key=lambda n: (n.lineno, n.col_offset, -n.end_lineno, -n.end_col_offset))  # type: ignore[attr-defined]
    return iter(found)


def _operator_edit(src: _Source, gap_start: int, gap_end: int, pattern: str, new: str, line: int) -> Edit | None:
    """Replace the operator token found between two operands (outside comments)."""
    gap = src.text[gap_start:gap_end]
    for match in re.finditer(pattern, gap):
        before = gap[: match.start()]
        if "#" in before.rsplit("\n", 1)[-1]:
            continue
        old = match.group(0)
        return Edit(gap_start + match.start(), gap_start + match.end(), new, line, f"`{old}` -> `{new}`")
    return None


_COMPARE_SWAP: dict[type, tuple[str, str]] = {
    ast.Lt: (r"<(?!=)", "<="),
    ast.LtE: (r"<=", "<"),
    ast.Gt: (r">(?!=)", ">="),
    ast.GtE: (r">=", ">"),
    ast.Eq: (r"==", "!="),
    ast.NotEq: (r"!=", "=="),
    ast.In: (r"(?<![\w])in(?![\w])", "not in"),
    ast.NotIn: (r"not\s+in", "in"),
    ast.Is: (r"is(?!\s+not\b)", "is not"),
    ast.IsNot: (r"is\s+not", "is"),
}


def flip_comparison(src: _Source, tree: ast.Module) -> list[Edit]:
    """`a < b` -> `a <= b`, `==` <-> `!=`, `in` <-> `not in`, `is` <-> `is not`, ..."""
    edits = []
    for node in _function_nodes(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            pattern, new = _COMPARE_SWAP[type(op)]
            edit = _operator_edit(
                src, src.span(operands[i])[1], src.span(operands[i + 1])[0], pattern, new, node.lineno
            )
            if edit:
                edits.append(edit)
    return edits


_BINOP_SWAP: dict[type, tuple[str, str]] = {
    ast.Add: (r"\+", "-"),
    ast.Sub: (r"-", "+"),
    ast.Mult: (r"\*(?!\*)", "/"),
    ast.Div: (r"/(?!/)", "*"),
    ast.FloorDiv: (r"//", "/"),
    ast.Mod: (r"%", "//"),
    ast.Pow: (r"\*\*", "*"),
    ast.LShift: (r"<<", ">>"),
    ast.RShift: (r">>", "<<"),
    ast.BitAnd: (r"&", "|"),
    ast.BitOr: (r"\|", "&"),
    ast.BitXor: (r"\^", "|"),
}


def _is_text(node: ast.AST) -> bool:
    """Whether an expression is visibly a string (a literal, an f-string, or built from one)."""
    if isinstance(node, ast.BinOp):
        return _is_text(node.left) or _is_text(node.right)
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str | bytes))


def swap_binop(src: _Source, tree: ast.Module) -> list[Edit]:
    """`+` <-> `-`, `*` <-> `/`, `//` -> `/`, `%` -> `//`, ... (also in augmented assignments)."""
    edits = []
    for node in _function_nodes(tree):
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAP:
            if _is_text(node.left) or _is_text(node.right):  # string concatenation / %-formatting
                continue
            pattern, new = _BINOP_SWAP[type(node.op)]
            edit = _operator_edit(src, src.span(node.left)[1], src.span(node.right)[0], pattern, new, node.lineno)
        elif isinstance(node, ast.AugAssign) and type(node.op) in _BINOP_SWAP and not _is_text(node.value):
            pattern, new = _BINOP_SWAP[type(node.op)]
            edit = _operator_edit(
                src, src.span(node.target)[1], src.span(node.value)[0], pattern + "=", new + "=", node.lineno
            )
        else:
            continue
        if edit:
            edits.append(edit)
    return edits


_ATOMIC = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant)


def negate_condition(src: _Source, tree: ast.Module) -> list[Edit]:
    """`if x:` -> `if not x:` (and back), for if / elif / while / conditional expressions."""
    edits = []
    for node in _function_nodes(tree):
        if not isinstance(node, ast.If | ast.While | ast.IfExp):
            continue
        test = node.test
        start, end = src.span(test)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            new = src.segment(test.operand)
            if not isinstance(test.operand, _ATOMIC):
                new = f"({new})"
        else:
            text = src.segment(test)
            new = f"not {text}" if isinstance(test, _ATOMIC) else f"not ({text})"
        edits.append(Edit(start, end, new, test.lineno, "condition negated"))
    return edits


def _blocks(tree: ast.Module) -> Iterator[list[ast.stmt]]:
    """Every statement list inside a function (bodies, else / finally branches), in source order."""
    seen: set[int] = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(fn):
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt) and id(block) not in seen:
                    seen.add(id(block))
                    yield block


def _delete_lines(src: _Source, stmt: ast.stmt, block: list[ast.stmt], description: str) -> Edit:
    """Delete a statement's lines, leaving `pass` if its block would otherwise be empty."""
    start, end = src.line_span(stmt.lineno, stmt.end_lineno or stmt.lineno)
    text = src.indent(stmt.lineno) + "pass\n" if len(block) == 1 else ""
    return Edit(start, end, text, stmt.lineno, description)


def drop_condition(src: _Source, tree: ast.Module) -> list[Edit]:
    """Remove an if-guard that has no else (the edge case goes unhandled), or the else branch of an if."""
    edits = []
    for block in _blocks(tree):
        for stmt in block:
            if not isinstance(stmt, ast.If) or not src.owns_lines(stmt):
                continue
            if not stmt.orelse:
                edits.append(_delete_lines(src, stmt, block, "if-guard removed"))
                continue
            else_line = stmt.orelse[0].lineno - 1
            # Only a plain `else:` on its own line; an elif chain is left to the other modifiers.
            if src.lines[else_line - 1].strip() == "else:":
                start, end = src.line_span(else_line, stmt.orelse[-1].end_lineno or else_line)
                edits.append(Edit(start, end, "", else_line, "else branch removed"))
    return edits


def _int_value(node: ast.expr) -> int | None:
    """The value of an integer literal (`3`, `-1`), else None."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_value(node.operand)
        return -inner if inner is not None else None
    return None


def _shifted(src: _Source, node: ast.expr, delta: int) -> str:
    """`node` moved by `delta`: a literal changes value, any other expression gets `+ 1` / `- 1`."""
    value = _int_value(node)
    if value is not None:
        return str(value + delta)
    text = src.segment(node)
    if not isinstance(node, ast.Name | ast.Attribute | ast.Call | ast.Subscript | ast.BinOp):
        text = f"({text})"
    return f"{text} {'+' if delta > 0 else '-'} {abs(delta)}"


def off_by_one(src: _Source, tree: ast.Module) -> list[Edit]:
    """range() bounds, slice bounds and integer-literal indices moved by one."""
    targets: list[tuple[ast.expr, int]] = []
    for node in _function_nodes(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
            args = node.args
            if any(isinstance(a, ast.Starred) for a in args) or not 1 <= len(args) <= 3:
                continue
            targets += [(args[0], -1)] if len(args) == 1 else [(args[0], +1), (args[1], -1)]
        elif isinstance(node, ast.Subscript):
            index = node.slice
            if isinstance(index, ast.Slice):
                targets += [(b, d) for b, d in ((index.lower, +1), (index.upper, -1)) if b is not None]
            elif (value := _int_value(index)) is not None:
                targets.append((index, -1 if value < 0 else +1))  # x[0] -> x[1], x[-1] -> x[-2]
    edits = []
    for node, delta in targets:
        start, end = src.span(node)
        new = _shifted(src, node, delta)
        edits.append(Edit(start, end, new, node.lineno, f"`{src.segment(node)}` -> `{new}`"))
    return edits


_REMOVABLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Raise, ast.Return)


def remove_statement(src: _Source, tree: ast.Module) -> list[Edit]:
    """Delete one assignment, call, raise or return statement inside a function."""
    edits = []
    for block in _blocks(tree):
        for stmt in block:
            if not isinstance(stmt, _REMOVABLE) or not src.owns_lines(stmt):
                continue
            if isinstance(stmt, ast.Expr) and not isinstance(stmt.value, ast.Call | ast.Await):
                continue  # docstrings and bare expressions change nothing
            if isinstance(stmt, ast.AnnAssign) and stmt.value is None:
                continue
            edits.append(_delete_lines(src, stmt, block, f"{type(stmt).__name__.lower()} removed"))
    return edits


def swap_call_args(src: _Source, tree: ast.Module) -> list[Edit]:
    """`f(a, b)` -> `f(b, a)` for each adjacent pair of distinct positional arguments."""
    edits = []
    for node in _function_nodes(tree):
        if not isinstance(node, ast.Call) or any(isinstance(a, ast.Starred) for a in node.args):
            continue
        for left, right in zip(node.args, node.args[1:], strict=False):
            (ls, le), (rs, re_) = src.span(left), src.span(right)
            a, sep, b = src.text[ls:le], src.text[le:rs], src.text[rs:re_]
            if a != b and "#" not in sep:
                edits.append(Edit(ls, re_, b + sep + a, left.lineno, f"arguments `{a}` and `{b}` swapped"))
    return edits


Modifier = Callable[[_Source, ast.Module], list[Edit]]

MODIFIERS: dict[str, Modifier] = {
    "flip_comparison": flip_comparison,
    "swap_binop": swap_binop,
    "negate_condition": negate_condition,
    "drop_condition": drop_condition,
    "off_by_one": off_by_one,
    "remove_statement": remove_statement,
    "swap_call_args": swap_call_args,
}


def apply_edit(source: str, edit: Edit) -> str:
    """The source with one edit applied."""
    return source[: edit.start] + edit.text + source[edit.end :]


def find_edits(modifier: str, source: str) -> list[Edit]:
    """Every valid edit `modifier` can make to `source`, in source order (the site index is the position)."""
    if modifier not in MODIFIERS:
        raise ValueError(f"unknown bug modifier {modifier!r}; known: {sorted(MODIFIERS)}")
    try:
        with warnings.catch_warnings():  # old code's invalid escapes are not our concern here
            warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))
            tree = ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"cannot parse source: {exc}") from None
    src = _Source(source)
    valid, seen = [], set()
    for edit in sorted(MODIFIERS[modifier](src, tree), key=lambda e: (e.start, e.end, e.text)):
        mutated = apply_edit(source, edit)
        if mutated == source or (edit.start, edit.end, edit.text) in seen:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))
                ast.parse(mutated)
        except SyntaxError:
            continue
        seen.add((edit.start, edit.end, edit.text))
        valid.append(edit)
    return valid


def candidates(modifier: str, path: str, source: str) -> list[BugCandidate]:
    """Every bug `modifier` can put into the file at repo-relative `path`, with bug and fix diffs."""
    found = []
    for site, edit in enumerate(find_edits(modifier, source)):
        mutated = apply_edit(source, edit)
        found.append(
            BugCandidate(
                modifier=modifier,
                file=path,
                line=edit.line,
                site=site,
                description=edit.description,
                bug_patch=unified_diff(path, source, mutated),
                fix_patch=unified_diff(path, mutated, source),
            )
        )
    return found
