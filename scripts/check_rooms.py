"""Room sizes of the product code (issue 35), checked by `make lint` and by tests/repo/test_layout.py.

- No product module (swerl/, flows/, tasks/) over MAX_MODULE_LINES lines.
- No function over MAX_FUNCTION_LINES lines unless its body says why on one line starting with LONG_MARKER, among
  its first lines (after the docstring).
- At most MAX_FMT_SKIPS `# fmt: skip` markers in the whole tree: the formatter decides the layout.

    python scripts/check_rooms.py [ROOT]     # exit 1 and one line per breach
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 60
MAX_FMT_SKIPS = 20
LONG_MARKER = "# Over 60 lines"
PRODUCT = ("swerl", "flows", "tasks")
FORMATTED = ("swerl", "flows", "tasks", "tests", "benchmarks", "scripts")
# How many lines of a long function's body (after its docstring) may come before the marker.
MARKER_WITHIN = 3


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _body_start(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> int:
    """First line of the body after the docstring (1-based); without a docstring, the comment lines right above the
    first statement are the body's first lines too."""
    first = node.body[0]
    docstring = (
        isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    )
    if docstring and first.end_lineno is not None:
        return first.end_lineno + 1
    start = first.lineno
    while start - 1 > node.lineno and lines[start - 2].strip().startswith("#"):
        start -= 1
    return start


def module_breaches(path: Path, relative: str) -> list[str]:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    out = []
    if len(lines) > MAX_MODULE_LINES:
        out.append(f"{relative}: {len(lines)} lines (at most {MAX_MODULE_LINES}: split it along a seam)")
    for node in _functions(ast.parse(text, filename=relative)):
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length <= MAX_FUNCTION_LINES:
            continue
        start = _body_start(node, lines)
        head = lines[start - 1 : start - 1 + MARKER_WITHIN]
        if not any(line.strip().startswith(LONG_MARKER) for line in head):
            out.append(
                f"{relative}:{node.lineno}: {node.name} is {length} lines (over {MAX_FUNCTION_LINES}: split it, or "
                f"say why in a '{LONG_MARKER} ...' line at the top of its body)"
            )
    return out


def breaches(root: Path) -> list[str]:
    out: list[str] = []
    for package in PRODUCT:
        for path in sorted((root / package).rglob("*.py")):
            out.extend(module_breaches(path, str(path.relative_to(root))))
    skips = []
    for folder in FORMATTED:
        for path in sorted((root / folder).rglob("*.py")):
            count = path.read_text(encoding="utf-8").count("# fmt: skip")
            if count and path.resolve() != Path(__file__).resolve():
                skips.append((str(path.relative_to(root)), count))
    total = sum(count for _, count in skips)
    if total > MAX_FMT_SKIPS:
        worst = ", ".join(f"{name} {count}" for name, count in sorted(skips, key=lambda s: -s[1])[:5])
        out.append(f"{total} '# fmt: skip' markers (at most {MAX_FMT_SKIPS}; most in {worst})")
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    found = breaches(root)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
