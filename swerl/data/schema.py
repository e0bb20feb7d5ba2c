"""TaskInstance: one software-engineering task, in the SWE-smith / SWE-bench shape.

`patch` follows the source's convention and `patch_kind` says which it is: SWE-smith rows (and swerl's own
synthesized tasks) carry the BUG diff, applied to the clean repository to set the task up; SWE-bench rows carry
the reference FIX, and the repository at `base_commit` is already broken.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

PatchKind = Literal["bug", "fix"]

_SWESMITH_REPO = re.compile(r"^swesmith/(?P<owner>[^/]+?)__(?P<name>.+?)(?:\.(?P<commit>[0-9a-f]{7,40}))?$")


def normalize_repo(repo: str) -> str:
    """'swesmith/Owner__Name.abc1234', 'https://github.com/owner/name.git', 'owner/name' -> 'owner/name'."""
    text = repo.strip()
    text = re.sub(r"^(https?://)?(www\.)?github\.com/", "", text)
    text = re.sub(r"\.git$", "", text).strip("/")
    match = _SWESMITH_REPO.match(text)
    if match:
        text = f"{match.group('owner')}/{match.group('name')}"
    elif "/" not in text and "__" in text:  # SWE-bench instance-style 'owner__name'
        text = text.replace("__", "/", 1)
    return text.lower()


def parse_test_list(value: Any) -> list[str]:
    """A list of test ids from a list or a JSON-encoded list (as the hub publishes them); None -> []."""
    if value is None:
        return []
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return []
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a JSON list of test ids: {text[:80]!r} ({exc.msg})") from None
        except (ValueError, RecursionError) as exc:  # an integer over the digit limit, absurd nesting
            detail = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:80]
            raise ValueError(f"not a JSON list of test ids: {text[:80]!r} ({detail})") from None
    if hasattr(value, "tolist"):  # numpy / pyarrow arrays read from parquet
        value = value.tolist()
    if not isinstance(value, list | tuple):
        raise ValueError(f"expected a list of test ids, got {type(value).__name__}")
    for item in value:
        if not isinstance(item, str) or not item:
            raise ValueError(f"test ids must be non-empty strings, got {item!r}")
    return list(value)


class TaskInstance(BaseModel):
    """One task: a repository state, a problem statement, and the tests that decide success."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_id: str = Field(min_length=1)
    """Unique id, e.g. 'owner__repo.abc123.func_pm_ctrl_invert_if__x1y2' or 'django__django-11099'."""
    repo: str = Field(min_length=1)
    """Repository as published: 'owner/name' (SWE-bench) or 'swesmith/owner__name.commit' (SWE-smith)."""
    base_commit: str
    """Commit (or content hash, for swerl's shipped repos) of the repository the patch applies to."""
    problem_statement: str
    """The issue text the agent sees; never mentions the patch."""
    patch: str
    """Unified diff; the bug (patch_kind='bug') or the reference fix (patch_kind='fix'). Required, but for a
    fix-kind task with a `verifier`: a Harbor task's reference solution is a script (solution/solve.sh), empty
    here until swerl.data.harbor.harbor_reference_patch records the diff it makes."""
    patch_kind: PatchKind
    """Which of the two `patch` is: SWE-smith and swerl tasks carry the bug, SWE-bench the fix."""
    test_patch: str = ""
    """Diff adding/updating the tests that decide the task (SWE-bench); empty when the tests are in the repo."""
    FAIL_TO_PASS: list[str] = Field(min_length=1)
    """Tests failing at the task's start and passing once solved."""
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    """Tests passing before and after; a solution must not break them."""
    image: str = ""
    """Environment reference: a docker image name, local://repos/NAME (shipped) or micro://SPLIT/SEED/INDEX."""
    test_cmd: str = ""
    """Shell command run in /workspace whose output has pytest `-rA` style summary lines; node ids are appended.
    Empty means the default pytest command."""
    version: str | None = None
    """The source's version of the repository's environment (SWE-bench's `version`, e.g. '3.0'): with `repo` it
    picks the harness's test command where the source keeps a table of them."""
    eval_script: str | None = None
    """The source's own evaluation script (SWE-bench 5, SWE-rebench and SWE-bench Pro rows publish one): it
    restores the test files, applies the test patch and runs the test command between SWE-bench's START/END
    markers. The grader runs that command (swerl.grading.harness.harness_for)."""
    log_parser: str | None = None
    """The name (in swebench's PARSER_REGISTRY, e.g. 'parse_log_pytest') of the parser the source reads this
    task's logs with, where its rows name one (SWE-bench 5's `log_parser`, SWE-rebench's
    `install_config.log_parser`); None: swebench's parser for the repository."""
    difficulty: str | None = None
    """Difficulty bucket where the source publishes one (SWE-bench Verified: '<15 min fix', ...)."""
    source: str = Field(min_length=1)
    """Where the task came from: 'swerl-synth', a hub id, or a local file path."""
    split: str | None = None
    """Split the task was read from or assigned to (train / eval)."""
    modifier: str | None = None
    """Procedural modifier that made the bug (synthesized tasks only)."""
    verifier: str | None = None
    """A script that decides the reward instead of the test command: `harbor:///ABS/TASK_DIR` (a Harbor task's
    tests/test.sh, swerl.data.harbor; graded by swerl.grading.grader.grade_patch). Such a task's FAIL_TO_PASS is
    the one id swerl.data.harbor.VERIFIER_TEST_ID: a grader that does not know verifiers finds no such test and
    scores 0 (fail closed)."""

    @model_validator(mode="after")
    def _patch_required(self) -> TaskInstance:
        if not self.patch and not (self.verifier and self.patch_kind == "fix"):
            raise ValueError("patch must be a non-empty diff (only a fix-kind task with a verifier may omit it)")
        return self

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _test_list(cls, value: Any) -> list[str]:
        return parse_test_list(value)

    @property
    def repo_key(self) -> str:
        """Normalised 'owner/name' (lowercase) whatever the source's repo spelling."""
        return normalize_repo(self.repo)
