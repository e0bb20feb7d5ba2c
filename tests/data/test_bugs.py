"""Procedural bug modifiers on literal source: sites, edits that keep every other line, diffs that apply."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from swerl.data.bugs import MODIFIERS, apply_edit, candidates, find_edits
from swerl.data.diffs import changed_files, unified_diff

SOURCE = '''"""Module doc."""
LIMIT = 3 < 4  # module level: never a site


def clamp(xs, n):
    """Docstring."""
    total = 0
    for i in range(1, n):  # keep this comment
        if xs[i] <= total and i not in (1, 2):
            total += xs[i] * 2
        else:
            total = max(total, xs[-1])
    if not xs:
        return None
    return total - 1 if n != 0 else xs[0:n]
'''


def mutate(modifier: str, source: str = SOURCE) -> list[str]:
    return [apply_edit(source, e) for e in find_edits(modifier, source)]


def changed_lines(before: str, after: str) -> list[tuple[str, str]]:
    a, b = before.splitlines(), after.splitlines()
    assert len(a) == len(b), "same line count expected"
    return [(x, y) for x, y in zip(a, b, strict=True) if x != y]


def test_flip_comparison_sites_and_edits():
    mutated = mutate("flip_comparison")
    assert [changed_lines(SOURCE, m) for m in mutated] == [
        [("        if xs[i] <= total and i not in (1, 2):", "        if xs[i] < total and i not in (1, 2):")],
        [("        if xs[i] <= total and i not in (1, 2):", "        if xs[i] <= total and i in (1, 2):")],
        [("    return total - 1 if n != 0 else xs[0:n]", "    return total - 1 if n == 0 else xs[0:n]")],
    ]


@pytest.mark.parametrize(
    "before,after",
    [
        ("a < b", "a <= b"),
        ("a >= b", "a > b"),
        ("a == b", "a != b"),
        ("a is None", "a is not None"),
        ("a is not None", "a is None"),
        ("a in b", "a not in b"),
        ("a > b", "a >= b"),
    ],
)
def test_flip_comparison_operator_table(before, after):
    src = f"def f(a, b):\n    return {before}\n"
    assert mutate("flip_comparison", src) == [f"def f(a, b):\n    return {after}\n"]


def test_swap_binop():
    mutated = mutate("swap_binop")
    assert [changed_lines(SOURCE, m)[0][1].strip() for m in mutated] == [
        "total -= xs[i] * 2",
        "total += xs[i] / 2",
        "return total + 1 if n != 0 else xs[0:n]",
    ]


def test_swap_binop_skips_string_building():
    src = "def f(a):\n    return 'x' + a + '%s' % a\n"
    assert mutate("swap_binop", src) == []


def test_negate_condition():
    mutated = mutate("negate_condition")
    assert [changed_lines(SOURCE, m)[0][1].strip() for m in mutated] == [
        "if not (xs[i] <= total and i not in (1, 2)):",
        "if xs:",
        "return total - 1 if not (n != 0) else xs[0:n]",
    ]


def test_drop_condition_removes_guard_and_else():
    mutated = mutate("drop_condition")
    assert len(mutated) == 2
    else_removed, guard_removed = mutated
    assert "else:" not in else_removed and "total = max(total, xs[-1])" not in else_removed
    assert "if not xs:" not in guard_removed and "return None" not in guard_removed
    for m in mutated:
        ast.parse(m)


def test_drop_condition_leaves_pass_in_emptied_block():
    src = "def f(x):\n    if x:\n        if x > 1:\n            return 2\n    return 1\n"
    first = mutate("drop_condition", src)
    assert "def f(x):\n    if x:\n        pass\n    return 1\n" in first


def test_off_by_one():
    mutated = mutate("off_by_one")
    assert [changed_lines(SOURCE, m)[0][1].strip() for m in mutated] == [
        "for i in range(2, n):  # keep this comment",
        "for i in range(1, n - 1):  # keep this comment",
        "total = max(total, xs[-2])",
        "return total - 1 if n != 0 else xs[1:n]",
        "return total - 1 if n != 0 else xs[0:n - 1]",
    ]


def test_remove_statement_skips_docstrings_and_keeps_blocks_valid():
    mutated = mutate("remove_statement")
    assert len(mutated) == 5
    assert all('"""Docstring."""' in m for m in mutated)
    assert any("        pass\n" in m for m in mutated)  # `return None` was alone in its block
    for m in mutated:
        ast.parse(m)


def test_swap_call_args():
    mutated = mutate("swap_call_args")
    assert [changed_lines(SOURCE, m)[0][1].strip() for m in mutated] == [
        "for i in range(n, 1):  # keep this comment",
        "total = max(xs[-1], total)",
    ]


def test_every_modifier_touches_only_its_line_span():
    for modifier in MODIFIERS:
        for edit in find_edits(modifier, SOURCE):
            mutated = apply_edit(SOURCE, edit)
            before, after = SOURCE[: edit.start], mutated[: edit.start]
            assert before == after
            assert SOURCE[edit.end :] == mutated[edit.start + len(edit.text) :]


def test_module_level_code_is_never_a_site():
    assert all(e.line != 2 for m in MODIFIERS for e in find_edits(m, SOURCE))


def test_non_ascii_columns():
    src = 'def f(a):\n    s = "héllo wörld"; return len(s) < a\n'
    assert mutate("flip_comparison", src) == ['def f(a):\n    s = "héllo wörld"; return len(s) <= a\n']


def test_unknown_modifier_and_bad_source():
    with pytest.raises(ValueError, match="unknown bug modifier"):
        find_edits("nope", SOURCE)
    with pytest.raises(ValueError, match="cannot parse"):
        find_edits("flip_comparison", "def f(:\n")


def test_sites_are_deterministic():
    first = [candidates(m, "pkg/m.py", SOURCE) for m in MODIFIERS]
    assert first == [candidates(m, "pkg/m.py", SOURCE) for m in MODIFIERS]


def test_candidate_diffs_apply_and_revert(tmp_path: Path):
    (tmp_path / "pkg").mkdir()
    target = tmp_path / "pkg" / "m.py"
    for modifier in MODIFIERS:
        for cand in candidates(modifier, "pkg/m.py", SOURCE):
            assert changed_files(cand.bug_patch) == ["pkg/m.py"]
            target.write_text(SOURCE)
            subprocess.run(["git", "apply", "-"], input=cand.bug_patch, text=True, cwd=tmp_path, check=True)
            bugged = target.read_text()
            assert bugged != SOURCE
            subprocess.run(["patch", "-p1", "-s"], input=cand.fix_patch, text=True, cwd=tmp_path, check=True)
            assert target.read_text() == SOURCE, (modifier, cand.description)


def test_diff_of_file_without_final_newline_applies(tmp_path: Path):
    before, after = "a = 1\nb = 2", "a = 1\nb = 3"
    (tmp_path / "f.py").write_text(before)
    diff = unified_diff("f.py", before, after)
    assert "\\ No newline at end of file" in diff
    subprocess.run(["git", "apply", "-"], input=diff, text=True, cwd=tmp_path, check=True)
    assert (tmp_path / "f.py").read_text() == after
    assert unified_diff("f.py", before, before) == ""
