"""Unified diffs between two versions of one file, in the form `git apply` and `patch -p1` accept."""

from __future__ import annotations

import difflib
import re

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


def reverse_patch(diff: str) -> str:
    """The unified diff that undoes `diff` (what `git apply -R` applies): old and new sides swapped in every
    file header, hunk header and line. For a bug-kind task's patch this is the reference fix. Hunk bodies are
    read by their line counts, so a removed line that starts with '-- ' is never taken for a file header."""
    out: list[str] = []
    old_header = ""
    old_left = new_left = 0
    for line in diff.splitlines(keepends=True):
        if old_left > 0 or new_left > 0:  # inside a hunk
            sign = line[:1]
            if sign == "\\":
                out.append(line)
                continue
            old_left -= sign in (" ", "-", "\n")
            new_left -= sign in (" ", "+", "\n")
            out.append({"+": "-", "-": "+"}.get(sign, sign) + line[1:])
        elif line.startswith("@@ "):
            match = _HUNK.match(line)
            if match is None:
                raise ValueError(f"not a unified diff hunk header: {line.rstrip()!r}")
            old_start, old_count, new_start, new_count, rest = match.groups()
            old_left = 1 if old_count is None else int(old_count)
            new_left = 1 if new_count is None else int(new_count)
            old_range = old_start + ("" if old_count is None else f",{old_count}")
            new_range = new_start + ("" if new_count is None else f",{new_count}")
            out.append(f"@@ -{new_range} +{old_range} @@{rest}")
        elif line.startswith("--- "):
            old_header = line
        elif line.startswith("+++ "):
            out += ["--- " + _swap_side(line[4:], "a/"), "+++ " + _swap_side(old_header[4:], "b/")]
        elif line.startswith("diff --git "):
            parts = line.rstrip("\n").split(" ")
            out.append(" ".join([*parts[:2], _swap_side(parts[3], "a/"), _swap_side(parts[2], "b/")]) + "\n")
        elif line.startswith(("new file mode", "deleted file mode")):
            out.append(
                line.replace("new file", "deleted file", 1)
                if line.startswith("new")
                else line.replace("deleted file", "new file", 1)
            )
        else:
            out.append(line)
    return "".join(out)


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$", re.S)


def _swap_side(path: str, prefix: str) -> str:
    """'a/x' <-> 'b/x' ('/dev/null' kept): the path as the other side names it."""
    if path.startswith(("a/", "b/")):
        return prefix + path[2:]
    return path
