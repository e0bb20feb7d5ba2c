"""The oracle's fix planning (pure): inverting a task diff into short sed edits or a str_replace, checked by
applying every planned edit to every bug the shipped repositories' modifiers can make, with the real GNU sed."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest

from swerl.agent.fixplan import (
    NoFixPlan,
    parse_fix_hunks,
    plan_fix,
    regex_substitution,
    sed_fragments,
    sed_substitution,
    wrong_edits,
)
from swerl.data.bugs import MODIFIERS, apply_edit, candidates, find_edits
from swerl.data.diffs import unified_diff
from swerl.data.repos import builtin_repo, source_files


@pytest.mark.parametrize(
    ("broken", "fixed", "old", "new"),
    [
        ("    if a <= b:", "    if a < b:", " <= ", " < "),
        ("    return x - y", "    return x + y", " - ", " + "),
        ("    for i in range(n - 1):", "    for i in range(n):", " - 1):", "):"),
        ("    return items[1]", "    return items[0]", "1", "0"),
        ("    if not x:", "    if x:", "not x", "x"),
    ],
)
def test_sed_fragments_are_short_and_exact(broken: str, fixed: str, old: str, new: str) -> None:
    offset, got_old, got_new = sed_fragments(broken, fixed) or (0, "", "")
    assert (got_old, got_new) == (old, new)
    assert broken.find(got_old) == offset  # sed replaces the first match: it must be this one
    assert broken[:offset] + got_new + broken[offset + len(got_old) :] == fixed


def test_fixed_regexes_for_negation_and_swapped_arguments() -> None:
    assert regex_substitution("    if not (a > b or c):", "    if a > b or c:") == r"s/not (\(.*\)):/\1:/"
    swap = regex_substitution("    return f(x, g(y), b, a)", "    return f(x, g(y), a, b)")
    assert swap == r"s/\([^,() ][^,()]*\), \([^,() ][^,()]*\)/\2, \1/2"
    assert regex_substitution("a = 1", "b = 2") == ""


def test_sed_substitution_escapes_regex_and_replacement(tmp_path: Path) -> None:
    target = tmp_path / "m.py"
    target.write_text("x = a[0] * b / c & d\n")
    command = sed_substitution(1, "[0] * b /", "[1] & b /", "m.py")
    subprocess.run(["bash", "-c", command], cwd=tmp_path, check=True)
    assert target.read_text() == "x = a[1] & b / c & d\n"


def test_a_bug_diff_is_inverted_and_multi_file_diffs_are_refused() -> None:
    clean = "def f(a, b):\n    return a + b\n"
    broken = "def f(a, b):\n    return a - b\n"
    bug = unified_diff("pkg/m.py", clean, broken)
    (hunk,) = parse_fix_hunks(bug, diff_is_bug=True)
    assert hunk.file == "pkg/m.py" and ("-", "    return a - b") in hunk.lines
    plan = plan_fix(bug, True, broken)
    assert (plan.kind, plan.line, plan.old, plan.new) == ("sed", 2, " - ", " + ")
    assert plan.sed_command() == "sed -i '2s/ - / + /' pkg/m.py"
    assert plan.view_command(3) == "cat -n pkg/m.py | sed -n 1,5p"
    fix = unified_diff("pkg/m.py", broken, clean)  # SWE-bench convention: the patch is the fix
    assert plan_fix(fix, False, broken) == plan
    with pytest.raises(NoFixPlan, match="multi_file"):
        plan_fix(bug + unified_diff("pkg/n.py", clean, broken), True, broken)


def test_every_shipped_bug_gets_a_plan_that_fixes_it_with_real_sed(tmp_path: Path) -> None:
    """All bugs the modifiers make in a shipped repository: the planned edit restores the clean file."""
    kinds: Counter[str] = Counter()
    for repo in ("intervals",):
        spec = builtin_repo(repo)
        for rel in source_files(spec.path):
            clean = (spec.path / rel).read_text()
            for modifier in MODIFIERS:
                for candidate, edit in zip(
                    candidates(modifier, rel.as_posix(), clean), find_edits(modifier, clean), strict=True
                ):
                    broken = apply_edit(clean, edit)
                    plan = plan_fix(candidate.bug_patch, True, broken)
                    kinds[plan.kind] += 1
                    if plan.kind == "str_replace":
                        assert broken.count(plan.old) == 1
                        assert broken.replace(plan.old, plan.new) == clean
                        continue
                    target = tmp_path / "m.py"
                    target.write_text(broken)
                    subprocess.run(
                        ["bash", "-c", plan.sed_command().replace(rel.as_posix(), "m.py")],
                        cwd=tmp_path,
                        check=True,
                    )
                    assert target.read_text() == clean, (modifier, plan)
                    for line, old, new in wrong_edits(broken, plan, 3):
                        text = broken.splitlines()[line - 1]
                        assert text.replace(old, new, 1).replace(new, old, 1) == text
    assert kinds["sed"] > kinds["str_replace"] > 0


def test_enclosing_function_finds_the_innermost_def_holding_a_line() -> None:
    from swerl.agent.oracle import enclosing_function

    source = "def a(x):\n    return x\n\n\ndef b(y):\n    def inner():\n        return 1\n    return inner()\n"
    assert enclosing_function(source, 2) == "a"
    assert enclosing_function(source, 7) == "inner"
    assert enclosing_function(source, 8) == "b"
    assert enclosing_function(source, 3) is None  # between functions
    assert enclosing_function("def broken(:\n", 1) is None  # unparseable: no guess
