"""Harbor tasks (swerl.data.harbor): loading, the image, the verifier as swerl's grader, export and round trip.

The Docker tests build a hand-made Harbor task from the documented format (a tiny Python repository with a bug in
/app, a plain-python test script run by tests/test.sh: the base image has no pytest) and grade patches with the one
grader (swerl.grading.grader.grade_patch) in fresh Docker sandboxes. Red-team cases are patches whose code, run by
the verifier, tries to write the reward itself; the last case is a hack the format cannot block, kept as a test so
that the documentation stays true.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from swerl.data.harbor import (
    RUN_DIR,
    VERIFIER_TEST_ID,
    HarborFormatError,
    HarborTask,
    SolutionFailed,
    build_harbor_image,
    copy_into,
    export_harbor_task,
    harbor_reference_patch,
    load_harbor_task,
    run_solution,
)
from swerl.data.micro import micro_repo_spec
from swerl.data.schema import TaskInstance
from swerl.errors import InfraError
from swerl.grading.grader import RESOLVED_FULL, Grade, grade_patch, start_task_sandbox
from swerl.grading.harbor_verifier import run_verifier
from swerl.sandbox.base import SandboxProvider
from swerl.sandbox.images import BASE_IMAGE
from tests.sandbox_backends import docker_unavailable
from tests.sandbox_helpers import docker_provider

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
cd /app
if python3 /tests/test_calc.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
TEST_CALC = """import sys
sys.path.insert(0, "/app")
import calc
assert calc.add(2, 3) == 5, "add(2, 3) != 5"
print("ok")
"""
TASK_TOML = """version = "1.0"

[metadata]
author_name = "swerl tests"
difficulty = "easy"
category = "programming"
tags = ["python"]

[verifier]
timeout_sec = 30.0

[agent]
timeout_sec = 120.0

[environment]
build_timeout_sec = 300.0
cpus = 1
memory_mb = 1024
"""


def write_harbor_task(
    root: Path, *, test_sh: str = TEST_SH, toml: str = TASK_TOML, dockerfile: str | None = None
) -> Path:
    files = {
        "task.toml": toml,
        "instruction.md": "calc.add(2, 3) returns -1: it should add its arguments.\n",
        "environment/Dockerfile": dockerfile or f"FROM {BASE_IMAGE}\nCOPY repo/ /app/\nWORKDIR /app\n",
        "environment/repo/calc.py": BUGGY,
        "environment/repo/util.py": "VALUE = 1\n",
        "tests/test.sh": test_sh,
        "tests/test_calc.py": TEST_CALC,
        "solution/solve.sh": "#!/bin/bash\nset -e\ncd /app\nsed -i 's/a - b/a + b/' calc.py\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def diff_of(repo: Path, changes: dict[str, str]) -> str:
    """The git diff that turns `repo` into `repo` with `changes` (path -> new content) applied."""
    work = repo.parent / f"{repo.name}-diff"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(repo, work)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=work, check=True)
    subprocess.run([*git, "add", "-A"], cwd=work, check=True)
    subprocess.run([*git, "commit", "-qm", "start"], cwd=work, check=True)
    for rel, text in changes.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    subprocess.run([*git, "add", "-A"], cwd=work, check=True)
    out = subprocess.run([*git, "diff", "--cached", "HEAD"], cwd=work, check=True, capture_output=True, text=True)
    shutil.rmtree(work)
    return out.stdout


# ------------------------------------------------------------------------------------------------------------
# Loading (no Docker)


def test_load_reads_the_format(tmp_path: Path):
    task, harbor = load_harbor_task(write_harbor_task(tmp_path / "calc-add"))
    assert task.instance_id == "harbor__calc-add" and task.problem_statement.startswith("calc.add(2, 3)")
    assert task.image == f"docker://{harbor.image_tag}" and harbor.image_tag.startswith("swerl-harbor:")
    assert task.verifier == f"harbor://{tmp_path / 'calc-add'}" and task.FAIL_TO_PASS == [VERIFIER_TEST_ID]
    assert task.patch_kind == "fix" and task.patch == "" and task.difficulty == "easy"
    assert harbor.workdir == "/app" and harbor.verifier_timeout_s == 30.0 and harbor.memory_mb == 1024
    assert harbor.has_solution and harbor.metadata["tags"] == ["python"]
    # the tag is a content hash of environment/: a change there is a new image, elsewhere not
    before = harbor.image_tag
    (tmp_path / "calc-add/tests/test_calc.py").write_text(TEST_CALC + "\n")
    assert load_harbor_task(tmp_path / "calc-add")[1].image_tag == before
    (tmp_path / "calc-add/environment/repo/util.py").write_text("VALUE = 2\n")
    assert load_harbor_task(tmp_path / "calc-add")[1].image_tag != before


def test_the_agent_timeout_of_task_toml_caps_the_episode(tmp_path: Path):
    from swerl.agent.episode import episode_timeout

    task, harbor = load_harbor_task(write_harbor_task(tmp_path / "calc-add"))
    assert harbor.agent_timeout_s == 120.0
    assert (episode_timeout(task, 600.0), episode_timeout(task, 60.0)) == (120.0, 60.0)
    assert episode_timeout(task.model_copy(update={"verifier": None, "patch": "x"}), 600.0) == 600.0


def test_a_task_without_a_verifier_still_needs_a_patch():
    with pytest.raises(ValueError, match="patch must be a non-empty diff"):
        TaskInstance(
            instance_id="x",
            repo="a/b",
            base_commit="c",
            problem_statement="p",
            patch="",
            patch_kind="fix",
            FAIL_TO_PASS=["t"],
            source="s",
        )


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda root: (root / "tests/test.sh").unlink(), r"tests/test\.sh: missing"),
        (lambda root: (root / "instruction.md").unlink(), r"instruction\.md: missing"),
        (
            lambda root: (root / "task.toml").write_text("[verifier\ntimeout_sec = 1"),
            r"task\.toml: not valid TOML",
        ),
        (
            lambda root: (root / "task.toml").write_text('[verifier]\ntimeout_sec = "soon"\n'),
            r"task\.toml \[verifier\]: `timeout_sec` must be a number",
        ),
        (
            lambda root: (root / "task.toml").write_text('verifier = "x"\n'),
            r"task\.toml: `verifier` must be a table",
        ),
        (
            lambda root: (root / "task.toml").write_text("[environment]\nmemory_mb = -1\n"),
            r"\[environment\]: `memory_mb` must be > 0",
        ),
        (
            lambda root: (root / "environment/Dockerfile").write_text(f"FROM {BASE_IMAGE}\nCOPY repo/ /app/\n"),
            r"Dockerfile: no WORKDIR",
        ),
        (
            lambda root: (root / "environment/Dockerfile").write_text("ARG B\nFROM $B\nWORKDIR /app\n"),
            r"Dockerfile: FROM \$B uses a build argument",
        ),
    ],
)
def test_load_errors_name_the_file_and_key(tmp_path: Path, breakage, message: str):
    root = write_harbor_task(tmp_path / "t")
    breakage(root)
    with pytest.raises(HarborFormatError, match=message):
        load_harbor_task(root)


# ------------------------------------------------------------------------------------------------------------
# Docker: build, verify, red team


@pytest.fixture(scope="module")
def docker_ready() -> None:
    if reason := docker_unavailable():
        pytest.skip(reason)
    import docker

    client = docker.from_env()
    try:
        client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"{BASE_IMAGE} is not built (python -m swerl.sandbox.images base)")
    finally:
        client.close()


@pytest.fixture(scope="module")
def provider(docker_ready: None) -> Iterator[SandboxProvider]:
    made = docker_provider(api_threads=4)
    yield made
    made.close()


@pytest.fixture(scope="module")
def calc(tmp_path_factory: pytest.TempPathFactory, docker_ready: None) -> tuple[TaskInstance, HarborTask]:
    root = write_harbor_task(tmp_path_factory.mktemp("harbor") / "calc-add")
    task, harbor = load_harbor_task(root)
    assert build_harbor_image(harbor) == harbor.image_tag
    return task, harbor


def grade(provider: SandboxProvider, task: TaskInstance, patch: str) -> Grade:
    return asyncio.run(grade_patch(provider, task, patch, test_timeout_s=30))


def with_verifier(tmp_path: Path, test_sh: str, toml: str = TASK_TOML) -> TaskInstance:
    """The calc task with another tests/test.sh (environment/ unchanged: the same image)."""
    task, harbor = load_harbor_task(write_harbor_task(tmp_path / "calc-add", test_sh=test_sh, toml=toml))
    build_harbor_image(harbor)
    return task


@pytest.mark.docker
def test_empty_patch_scores_0_and_the_fix_scores_1(provider: SandboxProvider, calc):
    task, harbor = calc
    empty = grade(provider, task, "")
    assert (empty.reward, empty.status, empty.sealed) == (0.0, "RESOLVED_NO", False), empty.log
    fix = grade(provider, task, diff_of(harbor.environment_dir / "repo", {"calc.py": FIXED}))
    assert (fix.reward, fix.status) == (1.0, RESOLVED_FULL), fix.log
    assert fix.outcomes[VERIFIER_TEST_ID].status.value == "PASSED" and "reward 1.0 from reward.txt" in fix.detail
    assert build_harbor_image(harbor) == harbor.image_tag  # present: not rebuilt
    # evaluation's default verdict (swebench's) keeps the verifier's: its log is no pytest log to parse
    from swerl.grading.verdict import swebench_verdict

    assert (swebench_verdict(task, fix).resolved, swebench_verdict(task, empty).resolved) == (True, False)


@pytest.mark.docker
def test_build_failure_is_image_missing_with_the_last_error_line(tmp_path: Path, docker_ready: None):
    root = write_harbor_task(
        tmp_path / "broken",
        dockerfile=f"FROM {BASE_IMAGE}\nRUN echo swerl-build-broke >&2; exit 7\nWORKDIR /app\n",
    )
    with pytest.raises(InfraError) as info:
        build_harbor_image(load_harbor_task(root)[1])
    assert info.value.cause == "image_missing" and "returned a non-zero code: 7" in str(info.value)
    missing = write_harbor_task(tmp_path / "missing", dockerfile="FROM swerl-no-such:never\nWORKDIR /app\n")
    with pytest.raises(InfraError, match="swerl-no-such:never is not on this Docker engine"):
        build_harbor_image(load_harbor_task(missing)[1])


@pytest.mark.docker
@pytest.mark.parametrize(
    ("test_sh", "why"),
    [
        ("#!/bin/bash\necho verifier crashed; exit 3\n", "without writing"),
        (
            "#!/bin/bash\nmkdir -p /logs/verifier; echo maybe > /logs/verifier/reward.txt\n",
            "does not hold a number",
        ),
        (
            "#!/bin/bash\nmkdir -p /logs/verifier; echo '{\"score\": 1}' > /logs/verifier/reward.json\n",
            'no "reward"',
        ),
        ("#!/bin/bash\nmkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; exit 2\n", "not trusted"),
    ],
)
def test_a_crashed_verifier_is_infra_error_not_a_score(provider, calc, tmp_path: Path, test_sh: str, why: str):
    task = with_verifier(tmp_path, test_sh)
    with pytest.raises(InfraError) as info:
        grade(provider, task, "")
    assert info.value.cause == "verifier_failed" and why in str(info.value)


@pytest.mark.docker
def test_a_verifier_timeout_is_a_scored_failure(provider, calc, tmp_path: Path):
    toml = TASK_TOML.replace("timeout_sec = 30.0", "timeout_sec = 3.0")
    task = with_verifier(tmp_path, "#!/bin/bash\nsleep 60\n", toml)
    graded = grade(provider, task, "")
    assert (graded.reward, graded.status, graded.timed_out) == (0.0, "TIMEOUT", True)


@pytest.mark.docker
def test_reward_json_and_a_partial_reward(provider, calc, tmp_path: Path):
    test_sh = (
        '#!/bin/bash\nmkdir -p /logs/verifier\necho \'{"reward": 0.5, "tests": 2}\' > /logs/verifier/reward.json\n'
    )
    graded = grade(provider, with_verifier(tmp_path, test_sh), "")
    assert (graded.reward, graded.status) == (0.5, "RESOLVED_PARTIAL")


@pytest.mark.docker
def test_reference_patch_is_the_diff_solve_sh_makes_and_grades_1(provider: SandboxProvider, calc, tmp_path: Path):
    task, harbor = calc

    async def reference(harbor: HarborTask) -> str:
        sandbox = await start_task_sandbox(provider, task)
        try:
            return await harbor_reference_patch(sandbox, harbor, 60)
        finally:
            await sandbox.close()

    patch = asyncio.run(reference(harbor))
    changed = [line for line in patch.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed == ["-    return a - b", "+    return a + b"] and "diff --git a/calc.py b/calc.py" in patch, patch
    solved, _ = load_harbor_task(harbor.root, reference_patch=patch)
    assert solved.patch == patch and grade(provider, solved, patch).reward == 1.0
    # a solve.sh that fails is the task's failure (SolutionFailed), told apart from a sandbox failure
    broken = write_harbor_task(tmp_path / "calc-add")
    (broken / "solution/solve.sh").write_text("#!/bin/bash\necho no-fix-here; exit 3\n")
    with pytest.raises(SolutionFailed, match="solve.sh failed \\(3\\).*no-fix-here"):
        asyncio.run(reference(load_harbor_task(broken)[1]))


@pytest.mark.docker
@pytest.mark.parametrize("runtime", ["supervisor", "bubblewrap"])
def test_local_backend_grades_on_supervisor_and_refuses_clearly_on_bubblewrap(calc, runtime: str):
    """The local backend runs the task over the image's exported root file system. The supervisor runtime keeps
    /tmp for the sandbox's life: the verifier grades as in Docker. Bubblewrap gives every command a fresh /tmp,
    where the verifier's tests and reward live: the grader says so instead of reporting a crashed verifier."""
    import os

    from tests.sandbox_helpers import local_provider

    if runtime == "supervisor" and os.geteuid() != 0:
        pytest.skip("the supervisor runtime needs root")
    task, harbor = calc
    local = local_provider(git_baseline=True, runtime=runtime)
    try:
        if runtime == "supervisor":
            assert grade(local, task, "").reward == 0.0
            fix = grade(local, task, diff_of(harbor.environment_dir / "repo", {"calc.py": FIXED}))
            assert (fix.reward, fix.status) == (1.0, RESOLVED_FULL), fix.log
            return
        with pytest.raises(InfraError, match="does not keep /tmp between commands") as info:
            grade(local, task, "")
        assert info.value.cause == "verifier_failed"
    finally:
        local.close()


# Each hack leaves calc.add wrong and tries to get reward 1 from the verifier anyway.
WRITE_AT_IMPORT = BUGGY + textwrap.dedent("""
    import os
    os.makedirs("/logs/verifier", exist_ok=True)
    open("/logs/verifier/reward.txt", "w").write("1")
""")
REWRITE_TEST_SH = BUGGY + textwrap.dedent("""
    import os
    try:  # bash reads a script file as it runs it: a line appended now runs after the current command
        os.chmod("/tests", 0o755)
        os.chmod("/tests/test.sh", 0o755)
        with open("/tests/test.sh", "a") as script:
            script.write("\\necho 1 > /logs/verifier/reward.txt\\n")
    except OSError as exc:
        print("rewrite failed", exc)
""")
DAEMON = BUGGY + textwrap.dedent("""
    import os, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            while True:
                try:
                    os.makedirs("/logs/verifier", exist_ok=True)
                    with open("/logs/verifier/.r", "w") as reward:  # atomic: never seen half-written
                        reward.write("1")
                    os.replace("/logs/verifier/.r", "/logs/verifier/reward.txt")
                except OSError:
                    pass
                time.sleep(0.005)
        os._exit(0)
""")
# write_reward_at_import is scored 0 by the verifier itself (test.sh writes its reward after the tests, the grader
# reads it after test.sh): a regression case. The other two are real attacks that swerl's run of the verifier blocks
# (test_red_team_hacks_are_real_attacks_without_the_protections).
HACKS = {
    "write_reward_at_import": {"calc.py": WRITE_AT_IMPORT},
    "rewrite_test_sh_at_import": {"calc.py": REWRITE_TEST_SH},
    "daemon_racing_the_verifier": {"calc.py": DAEMON},
}


@pytest.mark.docker
@pytest.mark.parametrize("hack", sorted(HACKS))
def test_red_team_hacks_score_0(provider: SandboxProvider, calc, hack: str):
    task, harbor = calc
    graded = grade(provider, task, diff_of(harbor.environment_dir / "repo", HACKS[hack]))
    assert graded.reward == 0.0, (hack, graded.status, graded.log)
    if hack == "daemon_racing_the_verifier":
        assert graded.status == "TAMPERED" and graded.tampered == ("processes outlived tests/test.sh",)


@pytest.mark.docker
def test_red_team_hacks_are_real_attacks_without_the_protections(provider: SandboxProvider, calc):
    """The same attacks against a verifier run naively (test.sh run from its file, the reward read while the daemon
    still runs) do get reward 1: the suite above is not passing because the hacks fail anyway."""
    task, harbor = calc

    async def naive(changes: dict[str, str], reseed: bool) -> str:
        sandbox = await start_task_sandbox(provider, task)
        try:
            patch = diff_of(harbor.environment_dir / "repo", changes)
            await sandbox.write_file(".p", patch)
            assert (await sandbox.exec("git apply .p && rm .p", 30)).exit_code == 0
            await copy_into(sandbox, harbor.tests_dir, f"{RUN_DIR}/tests")
            await sandbox.exec(f"mkdir -p {RUN_DIR}/logs/verifier", 30)
            await sandbox.exec("bash /tests/test.sh" + ("; sleep 0.5" if reseed else ""), 30, cwd="/app")
            return (await sandbox.read_file("/logs/verifier/reward.txt")).strip()
        finally:
            await sandbox.close()

    assert asyncio.run(naive(HACKS["rewrite_test_sh_at_import"], False)) == "1"
    assert asyncio.run(naive(HACKS["daemon_racing_the_verifier"], True)) == "1"


@pytest.mark.docker
def test_known_unblocked_an_early_exit_0_fools_a_verifier_that_trusts_exit_status(provider, calc):
    """What the format cannot block (docs/architecture.md "Harbor tasks"): code under test runs inside the verifier
    as the same user, so a verifier that trusts its test process's exit status is fooled by os._exit(0) at import.
    If this starts scoring 0, something now blocks it: update the documentation."""
    task, harbor = calc
    patch = diff_of(harbor.environment_dir / "repo", {"calc.py": BUGGY + "import os\nos._exit(0)\n"})
    assert grade(provider, task, patch).reward == 1.0


# ------------------------------------------------------------------------------------------------------------
# Export and the solve.sh / test.sh round trip


@pytest.fixture(scope="module")
def micro_task(micro_cache: object) -> TaskInstance:
    from swerl.data.synth import synthesize_repo
    from tests.sandbox_helpers import local_provider

    async def synthesize() -> TaskInstance:
        found, report = await synthesize_repo(
            micro_repo_spec("eval", 0, 0),
            local_provider(git_baseline=True),
            modifiers=("flip_comparison", "swap_binop", "off_by_one"),
            max_candidates=3,
            max_tasks=1,
            seed=0,
            workers=1,
            test_timeout_s=30,
            clean_runs=1,
            bugged_timeout_factor=5.0,
            min_bugged_timeout_s=10.0,
            shuffle_modifiers=True,
        )
        assert found, report.to_dict()
        return found[0]

    return asyncio.run(synthesize())


def test_export_writes_the_format(tmp_path: Path, micro_task: TaskInstance):
    out = export_harbor_task(micro_task, tmp_path / "exported")
    task, harbor = load_harbor_task(out)
    assert task.problem_statement.strip() == micro_task.problem_statement.strip()
    assert harbor.workdir == "/testbed" and harbor.has_solution
    assert (out / "tests/repo/run_tests.py").is_file() and (out / "environment/repo/run_tests.py").is_file()
    # the environment holds the bug: its source differs from the clean repository exactly where the patch says
    assert "git apply --whitespace=nowarn -R -" in (out / "solution/solve.sh").read_text()
    with pytest.raises(FileExistsError):
        export_harbor_task(micro_task, out)


@pytest.mark.docker
def test_exported_task_round_trips_through_solve_and_test(provider: SandboxProvider, tmp_path: Path, micro_task):
    out = export_harbor_task(micro_task, tmp_path / "exported")
    task, harbor = load_harbor_task(out)
    build_harbor_image(harbor)

    async def reward(solve: bool) -> float | None:
        sandbox = await start_task_sandbox(provider, task)
        try:
            if solve:
                await run_solution(sandbox, harbor)
            run = await run_verifier(sandbox, harbor)
            assert run.exit_code == 0 and not run.timed_out, run.output
            return run.reward
        finally:
            await sandbox.close()

    assert asyncio.run(reward(solve=False)) == 0.0
    assert asyncio.run(reward(solve=True)) == 1.0
