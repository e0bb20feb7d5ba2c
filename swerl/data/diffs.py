"""Unified diffs between two versions of one file, in the form `git apply` and `patch -p1` accept."""

from __future__ import annotations

import difflib

NO_NEWLINE = "\\ No newline at end of file\n"


def unified_diff(path: str, before: str, after: str, context: int = 3) -> str:
    """A git-style unified diff of one repo-relative file (a/PATH -> b/PATH); '' when nothing changed."""
    if before == after:
        return ""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
        n=context,
    )
    out = [f"diff --git a/{path} b/{path}\n"]
    for line in lines:
        # difflib leaves a last line without its newline; git marks that explicitly.
        out.append(line if line.endswith("\n") else line + "\n" + NO_NEWLINE)
    return "".join(out)


def changed_files(diff: str) -> list[str]:
    """Repo-relative paths a unified diff touches (from its '+++ b/' lines)."""
    files = []
    for line in diff.splitlines():
        if line.startswith("+++ ") and line[4:].strip() != "/dev/null":
            name = line[4:].split("\t")[0].strip()
            files.append(name[2:] if name.startswith("b/") else name)
    return files
