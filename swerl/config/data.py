"""Tasks and traces: the curate stage's sources (repositories, datasets, micro repositories, Harbor) and the
traces stage's."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, field_validator

from swerl.config.base import StrictModel
from swerl.config.sandbox import SandboxLimits
from swerl.data.loaders import TaskSchema
from swerl.data.micro import GENERATOR_VERSION

ModifierName = Literal[
    "flip_comparison",
    "swap_binop",
    "negate_condition",
    "drop_condition",
    "off_by_one",
    "remove_statement",
    "swap_call_args",
]
ALL_MODIFIERS: list[ModifierName] = list(ModifierName.__args__)  # type: ignore[attr-defined]


class DatasetSource(StrictModel):
    """Published task rows: a hub dataset or a local file, read through `datasets` (swerl.data.loaders)."""

    schema_name: TaskSchema = Field(alias="schema")
    """Which schema the rows follow: swesmith, swebench (SWE-bench and SWE-bench 5 rows, with their version and
    eval_script), swebench_pro (ScaleAI/SWE-bench_Pro), swerebench (nebius/SWE-rebench), or swerl (the curate
    stage's train/eval.parquet: every task as swerl stored it, its environment included)."""
    path: str = Field(min_length=1)
    """A Hugging Face hub id (real use) or a local parquet/jsonl/json file."""
    split: str = "train"
    """Dataset split to read."""
    limit: int | None = Field(None, ge=1)
    """Read at most this many rows (None: all)."""
    revision: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
    """The hub dataset's revision (a commit sha, tag or branch) passed to `datasets.load_dataset(...,
    revision=...)`; part of the stage's key, so another revision reruns the stage. None: the hub's default branch,
    whose rows can change under an unchanged key (pin it). Refused for a local file (its contents are the file's)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class MicroSource(StrictModel):
    """Procedural micro repositories (swerl.data.micro): tiny modules whose eval split uses unseen identifiers."""

    train_repos: int = Field(ge=0, le=100_000)
    """Micro repositories generated from the train vocabulary; their tasks go to train.parquet."""
    eval_repos: int = Field(ge=0, le=100_000)
    """Micro repositories generated from the disjoint eval vocabulary; their tasks go to eval.parquet."""
    seed: int = Field(0, ge=0, le=2**31 - 1)
    """Generator seed: the same seed and index give byte-identical repositories on any machine."""
    generator_version: int = GENERATOR_VERSION
    """The generator's version (part of the curate key, so a new generator reruns curation); must be current."""

    @field_validator("generator_version")
    @classmethod
    def _current_generator(cls, v: int) -> int:
        if v != GENERATOR_VERSION:
            raise ValueError(f"micro generator version {v} is not this swerl's ({GENERATOR_VERSION})")
        return v


class RepoSource(StrictModel):
    """A real repository to curate tasks from, tested in a virtualenv of its own (never swerl's interpreter).

    Its clean tests that fail or cannot be collected are left out of the tasks (counted by reason), and every task
    is confirmed by the sealed grader: the reference fix graded resolved, the untouched bug unresolved."""

    path: str = Field(min_length=1, max_length=4096)
    """A directory, an sdist (.tar.gz, extracted into swerl's cache) or a git repository already on disk (a bare
    repository's path, or a file:// URL: cloned locally)."""
    name: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """Name in reports and task ids (None: the directory's, the sdist's or the git repository's name)."""
    install: list[Annotated[str, Field(min_length=1, max_length=500)]] = Field(default_factory=list, max_length=200)
    """Extra test requirements (pip specifiers, e.g. hypothesis, pytest-asyncio), installed into the
    repository's environment when it is built, with pytest and the repository's own dependencies."""
    test_cmd: str = Field("", max_length=10_000)
    """The repository's own test command printing pytest's `-rA` summary (empty: pytest)."""
    python_path: str | None = Field(None, max_length=500)
    """Directory, relative to the repository, whose packages are imported (e.g. "src"); None: "src" when the
    repository has a src/ directory holding a package, else the repository's root."""
    build_timeout_s: float = Field(1800.0, gt=0, le=86400)
    """How long building the repository's environment (pip) may take."""

    @field_validator("python_path")
    @classmethod
    def _relative(cls, value: str | None) -> str | None:
        if value is not None and (value.startswith("/") or ".." in Path(value).parts):
            raise ValueError(f"must be a path inside the repository, got {value!r}")
        return value


def _repo_entry_kind(value: Any) -> str:
    return "name" if isinstance(value, str) else "source"


RepoEntry = Annotated[
    Annotated[str, Tag("name")] | Annotated[RepoSource, Tag("source")], Discriminator(_repo_entry_kind)
]
"""A `curate.repos` entry: 'builtin', 'builtin:NAME', a directory path, or a RepoSource mapping."""


class CurateConfig(StrictModel):
    repos: list[RepoEntry] = Field(default_factory=lambda: list[str | RepoSource](["builtin"]))
    """Repositories to synthesize tasks from: 'builtin' (all shipped), 'builtin:NAME', a directory path (all tested
    with swerl's interpreter), or a mapping (RepoSource: a directory, sdist or git repository with its own test
    environment, `install`, `test_cmd` and `python_path`)."""
    datasets: list[DatasetSource] = Field(default_factory=list)
    """Published task datasets (SWE-smith / SWE-bench schema) to include as they are."""
    harbor: list[str] = Field(default_factory=list)
    """Harbor task directories, each a task or a folder of task directories: image built offline, reference patch
    from solution/solve.sh, kept iff its verifier gives that patch 1 and the empty patch 0 (needs sandbox.backend
    docker, or local on the supervisor runtime); eval iff eval_repos names harbor/NAME, NAME or harbor-category:CAT."""
    modifiers: list[ModifierName] = Field(default_factory=lambda: list(ALL_MODIFIERS), min_length=1)
    """Procedural bug modifiers to apply."""
    max_candidates_per_repo: int = Field(80, ge=1, le=1_000_000)
    """Bug candidates validated per repository (sampled by seed across modifiers)."""
    max_tasks_per_repo: int = Field(1_000_000, ge=1, le=1_000_000)
    """Valid tasks kept per repository."""
    eval_repos: list[str] = Field(default_factory=list)
    """Repositories held out for evaluation: their tasks go to eval.parquet, all others to train.parquet."""
    decontaminate: bool = True
    """Drop tasks from SWE-bench Verified repositories or whose problem statement matches an evaluation task."""
    decontamination_sets: list[DatasetSource] = Field(default_factory=list)
    """Evaluation datasets whose problem statements must not appear among training tasks."""
    validation_workers: int = Field(2, ge=1, le=4096)
    """Sandboxes running test suites at once during validation."""
    clean_runs: int = Field(2, ge=1, le=10)
    """Times the clean suite runs; a test must pass in every run (flaky tests never become F2P/P2P)."""
    bugged_timeout_factor: float = Field(5.0, ge=1.0, le=1000.0)
    """A bugged suite may run this many times the slowest clean run (a bug that loops costs seconds) ..."""
    min_bugged_timeout_s: float = Field(10.0, gt=0, le=86400)
    """... but never less than this, and never more than sandbox.timeout_s."""
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits)
    """Limits of each validation sandbox."""
    strict_rows: bool = False
    """Raise on the first malformed dataset row instead of rejecting and counting it."""
    micro: MicroSource | None = None
    """Micro repositories to synthesize tasks from as well (None: none); eval ones are held out whatever eval_repos
    says."""
    gold_check: bool = True
    """Check every loaded SWE-bench-style row (the fix as `patch`) whose image is on the Docker engine in that image,
    with swerl's grader, before keeping it: its reference fix must resolve it (RESOLVED_FULL) and the empty patch
    must not. A failing row is dropped and counted by cause in curate_report.json's `gold_check` (gold_unresolved,
    gold_does_not_apply, empty_resolved); rows without their image are kept, counted as unchecked; an
    infrastructure error is counted apart by cause and keeps the row (swerl/stages/curate_gold.py). Costs two
    graded test runs per checked row, `validation_workers` at a time, in `sandbox` sandboxes."""


class TracesConfig(StrictModel):
    """Agent traces for SFT: an oracle solving the training tasks, or a SWE-smith-trajectories dataset."""

    source: Literal["oracle", "dataset"] = "oracle"
    """oracle: solve the curated training tasks through the agent's tools; dataset: load `dataset`."""
    dataset: str | None = None
    """SWE-smith-trajectories rows (hub id or local jsonl/parquet/json) when source is dataset."""
    dataset_split: str = "train"
    """Split of `dataset` to read."""
    max_traces: int = Field(100_000, ge=1, le=100_000_000)
    """Most traces kept (oracle: tasks attempted, in seeded order)."""
    workers: int = Field(2, ge=1, le=4096)
    """Oracle episodes at once (each holds one sandbox)."""
    recovery_prob: float = Field(0.0, ge=0.0, le=1.0)
    """Share of oracle traces that first make a plausible wrong edit, see the tests fail, undo it and fix."""
    view_whole_file_lines: int = Field(40, ge=0, le=100_000)
    """The oracle views a file with this many lines or fewer whole (`cat -n FILE`), longer ones around the bug."""
    context_lines: int = Field(3, ge=0, le=1000)
    """Lines shown around the bug when the oracle views part of a file."""
    view_function_lines: int = Field(0, ge=0, le=100_000)
    """> 0: the oracle views the function the failing test names (`grep -n -A N-1 'def NAME(' FILE`), N lines."""
    test_command: str | None = None
    """What the oracle runs to see the failures; None: the task's own test command (pytest when it has none)."""
