"""Micro repositories' function templates and the files each one ships, apart from their generator (micro.py).

Each template is one or more functions with {slot} names (words) and constants; the generator (micro.py)
picks templates by position, fills the slots from the split's words and writes the tests. `run_tests.py`
(RUN_TESTS), tests/conftest.py and the tests' `check` helper are the same text in every repository. A change here
changes the generated files: bump micro.GENERATOR_VERSION.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Any

RUN_TESTS = """\
import ast
import importlib.util
import os
import signal
import sys


def timeout(signum, frame):
    raise TimeoutError("test ran over 1s")


def describe(exc):
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text.splitlines()[0][:160]


def collect():
    tests, broken = {}, {}
    for name in sorted(os.listdir("tests") if os.path.isdir("tests") else []):
        if name.startswith("test_") and name.endswith(".py"):
            path = f"tests/{name}"
            try:
                with open(path) as f:
                    tree = ast.parse(f.read())
            except Exception as exc:
                broken[path] = describe(exc)
                continue
            for node in tree.body:
                if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                    tests[f"{path}::{node.name}"] = path
    return tests, broken


def load(path, modules):
    if path not in modules:
        signal.alarm(1)
        try:
            spec = importlib.util.spec_from_file_location(path[:-3].replace("/", "."), path)
            modules[path] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(modules[path])
        except Exception as exc:
            modules[path] = describe(exc)
        finally:
            signal.alarm(0)
    return modules[path]


def run(module, name):
    signal.alarm(1)
    try:
        getattr(module, name)()
    except Exception as exc:
        return "FAILED", describe(exc)
    finally:
        signal.alarm(0)
    return "PASSED", ""


def main(args):
    quiet = "-q" in args
    args = [a for a in args if a != "-q"]
    os.chdir(os.path.dirname(os.path.abspath(__file__)))
    signal.signal(signal.SIGALRM, timeout)
    tests, broken = collect()
    modules = {}
    lines = [("ERROR", f"{path} - {message}") for path, message in broken.items()]
    for arg in args or list(tests):
        selected = [t for t in tests if t == arg or t.startswith(arg + "::")]
        if not selected:
            lines.append(("ERROR", f"{arg} - not found"))
        for node in selected:
            module = load(tests[node], modules)
            if isinstance(module, str):
                status, message = "ERROR", module
            else:
                status, message = run(module, node.split("::")[1])
            lines.append((status, f"{node} - {message}" if message else node))
    counts = {"failed": 0, "passed": 0, "errors": 0}
    for status, text in lines:
        counts[{"PASSED": "passed", "FAILED": "failed"}.get(status, "errors")] += 1
        if not (quiet and status == "PASSED"):
            print(status, text)
    totals = [f"{n} {k[:-1] if n == 1 and k == 'errors' else k}" for k, n in counts.items() if n]
    print(", ".join(totals) or "no tests ran")
    return 1 if counts["failed"] or counts["errors"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
"""
"""The harness: `python run_tests.py [NODE_ID ...]`, one `STATUS node[ - message]` line per test, then totals."""

CONFTEST = """\
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
"""
"""tests/conftest.py: makes `from mod import ...` work under a plain `pytest` as well as `python -m pytest`."""

CHECK = """\
def check(actual, expected):
    if actual != expected:
        raise AssertionError(f"got {actual!r}, expected {expected!r}")
"""


ArgSpec = tuple[Any, ...]
"""("int", lo, hi) | ("list", lo, hi, min_len, max_len) | ("bool",)."""


@dataclass(frozen=True)
class Template:
    """One or more functions with {slot} names: lowercase slots are words, uppercase ones constants."""

    name: str
    code: str
    consts: tuple[tuple[str, int, int], ...]
    args: dict[str, tuple[ArgSpec, ...]]
    """Function slot -> the argument specs its tests draw from (every function of the template is tested)."""

    @property
    def slots(self) -> list[str]:
        seen: list[str] = []
        for _, field, _, _ in string.Formatter().parse(self.code):
            if field and field not in seen:
                seen.append(field)
        return seen

    @property
    def functions(self) -> int:
        return len(self.args)


def _t(name: str, code: str, args: dict[str, tuple[ArgSpec, ...]], **consts: tuple[int, int]) -> Template:
    return Template(name, code.strip("\n") + "\n", tuple((k, lo, hi) for k, (lo, hi) in consts.items()), args)


_I = "int"
_L = "list"
_B = ("bool",)

TEMPLATES: tuple[Template, ...] = (
    _t(
        "clamp",
        """
def {f}({x}, {lo}, {hi}):
    if {x} < {lo}:
        return {lo}
    if {x} >= {hi}:
        return {hi} - 1
    return {x}
""",
        {"f": ((_I, -3, 12), (_I, 0, 4), (_I, 5, 9))},
    ),
    _t(
        "range_side",
        """
def {f}({x}, {lo}, {hi}):
    if {x} < {lo}:
        return -1
    if {x} > {hi}:
        return 1
    return 0
""",
        {"f": ((_I, -2, 10), (_I, 0, 3), (_I, 4, 7))},
    ),
    _t(
        "sign",
        """
def {f}({x}):
    if {x} > 0:
        return 1
    if {x} < 0:
        return -1
    return 0
""",
        {"f": ((_I, -3, 3),)},
    ),
    _t(
        "larger_bonus",
        """
def {f}({a}, {b}):
    if {a} >= {b}:
        return {a} + {K}
    return {b}
""",
        {"f": ((_I, 0, 9), (_I, 0, 9))},
        K=(1, 5),
    ),
    _t(
        "in_range",
        """
def {f}({x}, {lo}, {hi}):
    return {lo} <= {x} < {hi}
""",
        {"f": ((_I, -2, 10), (_I, 0, 3), (_I, 4, 8))},
    ),
    _t(
        "outside",
        """
def {f}({x}, {limit}):
    if {x} < 0 or {x} > {limit}:
        return False
    return True
""",
        {"f": ((_I, -3, 10), (_I, 0, 7))},
    ),
    _t(
        "linear",
        """
def {f}({a}, {b}):
    return {a} + {b} * {K}
""",
        {"f": ((_I, -5, 10), (_I, -5, 10))},
        K=(2, 5),
    ),
    _t(
        "diff_div",
        """
def {f}({a}, {b}):
    return ({a} - {b}) // {K}
""",
        {"f": ((_I, 0, 20), (_I, 0, 20))},
        K=(2, 4),
    ),
    _t(
        "scale_sub",
        """
def {f}({a}, {b}):
    {t} = {a} * {K}
    return {t} - {b}
""",
        {"f": ((_I, -4, 9), (_I, -4, 9))},
        K=(2, 6),
    ),
    _t(
        "sum_first",
        """
def {f}({n}):
    {total} = 0
    for {i} in range(1, {n} + 1):
        {total} += {i}
    return {total}
""",
        {"f": ((_I, 0, 8),)},
    ),
    _t(
        "count_above",
        """
def {f}({items}, {limit}):
    {count} = 0
    for {item} in {items}:
        if {item} > {limit}:
            {count} += 1
    return {count}
""",
        {"f": ((_L, 0, 9, 0, 6), (_I, 0, 9))},
    ),
    _t(
        "factorial",
        """
def {f}({n}):
    {result} = 1
    for {i} in range(2, {n} + 1):
        {result} *= {i}
    return {result}
""",
        {"f": ((_I, 0, 6),)},
    ),
    _t(
        "rotate",
        """
def {f}({items}):
    return {items}[{K}:] + {items}[:{K}]
""",
        {"f": ((_L, 0, 9, 0, 6),)},
        K=(1, 3),
    ),
    _t(
        "last_or_default",
        """
def {f}({items}):
    if not {items}:
        return {K}
    return {items}[-1]
""",
        {"f": ((_L, 0, 9, 0, 5),)},
        K=(0, 9),
    ),
    _t(
        "first_k",
        """
def {f}({items}, {k}):
    return {items}[:{k}]
""",
        {"f": ((_L, 0, 9, 0, 6), (_I, 0, 5))},
    ),
    _t(
        "trim",
        """
def {f}({items}):
    return {items}[1:-1]
""",
        {"f": ((_L, 0, 9, 0, 6),)},
    ),
    _t(
        "shifted_total",
        """
def {h}({value}, {step}):
    return {value} - {step}


def {f}({items}):
    {total} = 0
    for {item} in {items}:
        {total} += {item}
    return {h}({total}, {K})
""",
        {"h": ((_I, -5, 20), (_I, -5, 9)), "f": ((_L, 0, 9, 0, 5),)},
        K=(1, 9),
    ),
    _t(
        "weighted_pick",
        """
def {h}({value}, {factor}):
    return {value} * {K} + {factor}


def {f}({x}, {y}):
    if {x} > {y}:
        return {h}({x}, {y})
    return {h}({y}, 0)
""",
        {"h": ((_I, -3, 9), (_I, -3, 9)), "f": ((_I, 0, 9), (_I, 0, 9))},
        K=(2, 5),
    ),
    _t(
        "percent",
        """
def {h}({part}, {whole}):
    if {whole} == 0:
        return 0
    return {part} * 100 // {whole}


def {f}({items}, {goal}):
    return {h}(sum({items}), {goal})
""",
        {"h": ((_I, 0, 9), (_I, 0, 9)), "f": ((_L, 0, 9, 0, 4), (_I, 0, 15))},
    ),
    _t(
        "offset",
        """
def {h}({base}, {step}):
    return {base} + {step} * {K}


def {f}({start}, {count}):
    if {count} < 0:
        return 0
    return {h}({start}, {count})
""",
        {"h": ((_I, -5, 9), (_I, -3, 9)), "f": ((_I, -5, 9), (_I, -2, 6))},
        K=(2, 4),
    ),
    _t(
        "halvings",
        """
def {f}({x}):
    {steps} = 0
    while {x} > 1:
        {x} = {x} // 2
        {steps} += 1
    return {steps}
""",
        {"f": ((_I, 0, 40),)},
    ),
    _t(
        "digit_sum",
        """
def {f}({n}):
    {total} = 0
    while {n} > 0:
        {total} += {n} % 10
        {n} = {n} // 10
    return {total}
""",
        {"f": ((_I, 0, 999),)},
    ),
    _t(
        "count_multiples",
        """
def {f}({items}):
    {count} = 0
    for {item} in {items}:
        if {item} % {K} == 0:
            {count} += 1
    return {count}
""",
        {"f": ((_L, 0, 12, 0, 6),)},
        K=(2, 3),
    ),
    _t(
        "max_item",
        """
def {f}({items}):
    {best} = {items}[0]
    for {item} in {items}[1:]:
        if {item} > {best}:
            {best} = {item}
    return {best}
""",
        {"f": ((_L, 0, 9, 1, 6),)},
    ),
    _t(
        "argmax",
        """
def {f}({items}):
    {best} = 0
    for {i} in range(1, len({items})):
        if {items}[{i}] > {items}[{best}]:
            {best} = {i}
    return {best}
""",
        {"f": ((_L, 0, 4, 1, 6),)},
    ),
    _t(
        "index_of",
        """
def {f}({items}, {target}):
    for {i} in range(len({items})):
        if {items}[{i}] == {target}:
            return {i}
    return -1
""",
        {"f": ((_L, 0, 5, 0, 6), (_I, 0, 5))},
    ),
    _t(
        "grow",
        """
def {f}({x}, {n}):
    for _ in range({n}):
        {x} = {x} * {K}
    return {x}
""",
        {"f": ((_I, -3, 5), (_I, 0, 4))},
        K=(2, 3),
    ),
    _t(
        "sum_range",
        """
def {f}({lo}, {hi}):
    {total} = 0
    for {i} in range({lo}, {hi}):
        {total} += {i} * {K}
    return {total}
""",
        {"f": ((_I, 0, 5), (_I, 0, 9))},
        K=(2, 3),
    ),
    _t(
        "countdown",
        """
def {f}({n}, {step}):
    {count} = 0
    while {n} > 0:
        {n} -= {step}
        {count} += 1
    return {count}
""",
        {"f": ((_I, 0, 12), (_I, 1, 4))},
    ),
    _t(
        "tiered",
        """
def {f}({x}):
    if {x} < {K}:
        return {x} * 2
    if {x} < {K2}:
        return {x} + {K3}
    return {x} - {K3}
""",
        {"f": ((_I, 0, 12),)},
        K=(2, 4),
        K2=(6, 9),
        K3=(1, 5),
    ),
    _t(
        "discount",
        """
def {f}({price}, {flag}):
    if not {flag}:
        return {price}
    return {price} - {price} // {K}
""",
        {"f": ((_I, 0, 40), _B)},
        K=(2, 5),
    ),
    _t(
        "fee",
        """
def {f}({total}, {limit}):
    if {total} >= {limit}:
        return 0
    return {limit} - {total} + {K}
""",
        {"f": ((_I, 0, 12), (_I, 0, 12))},
        K=(1, 5),
    ),
)
"""The function templates, in a fixed order (the generator draws by position)."""

TEMPLATE_NAMES: tuple[str, ...] = tuple(t.name for t in TEMPLATES)

PLAIN_TEMPLATES: tuple[Template, ...] = (
    _t(
        "total",
        """
def {f}({items}):
    return sum({items})
""",
        {"f": ((_L, 0, 9, 0, 5),)},
    ),
    _t(
        "biggest",
        """
def {f}({items}):
    return max({items})
""",
        {"f": ((_L, 0, 9, 1, 5),)},
    ),
    _t(
        "size",
        """
def {f}({items}):
    return len({items})
""",
        {"f": ((_L, 0, 9, 0, 5),)},
    ),
    _t(
        "ordered",
        """
def {f}({items}):
    return sorted({items})
""",
        {"f": ((_L, 0, 9, 0, 5),)},
    ),
    _t(
        "magnitude",
        """
def {f}({x}):
    return abs({x})
""",
        {"f": ((_I, -9, 9),)},
    ),
    _t(
        "backwards",
        """
def {f}({items}):
    return list(reversed({items}))
""",
        {"f": ((_L, 0, 9, 0, 5),)},
    ),
)
"""Functions without a site for any modifier: the second function of a module, whose tests stay passing (the
task's PASS_TO_PASS) wherever the bug is."""
