"""reverse_patch undoes a diff exactly, checked by git itself on generated file versions."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from swerl.data.diffs import reverse_patch, unified_diff

LINES = st.lists(st.sampled_from(["a", "b", "-- c", "++ d", "--- e", "+++ f", "@@ g", "", " h"]), max_size=8)


def _text(lines: list[str], final_newline: bool) -> str:
    return "\n".join(lines) + ("\n" if final_newline and lines else "")


@settings(max_examples=40, deadline=None)
@given(LINES, st.booleans(), LINES, st.booleans())
def test_reverse_patch_undoes_the_patch_under_git_apply(
    before: list[str], before_nl: bool, after: list[str], after_nl: bool
) -> None:
    old, new = _text(before, before_nl), _text(after, after_nl)
    patch = unified_diff("f.txt", old, new)
    if not patch or not old:
        return  # nothing to undo; new files are covered by git's own header handling elsewhere
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "f.txt").write_text(old)
        (root / "bug.patch").write_text(patch)
        (root / "fix.patch").write_text(reverse_patch(patch))
        subprocess.run(["git", "init", "-q"], cwd=root, check=True)
        subprocess.run(["git", "apply", "bug.patch"], cwd=root, check=True, capture_output=True)
        assert (root / "f.txt").read_text() == new
        applied = subprocess.run(["git", "apply", "fix.patch"], cwd=root, capture_output=True, text=True)
        assert applied.returncode == 0, applied.stderr
        assert (root / "f.txt").read_text() == old
    assert reverse_patch(reverse_patch(patch)) == patch
