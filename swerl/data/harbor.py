"""Harbor tasks: a directory in Harbor's task format as a swerl task source, and swerl tasks written out in it.

A Harbor task directory holds:

    task.toml               [metadata] (free-form), [verifier] timeout_sec, [agent] timeout_sec,
                            [environment] build_timeout_sec / cpus / memory_mb / storage_mb
    instruction.md          what the agent is told (the problem statement)
    environment/Dockerfile  the task's image; its WORKDIR is the repository the agent works in
    tests/test.sh           the verifier: runs after the agent, writes /logs/verifier/reward.txt (a number) or
                            /logs/verifier/reward.json ({"reward": x, ...})
    solution/solve.sh       a reference solution (optional)

`load_harbor_task` reads one into a `TaskInstance` (whose `verifier` names the directory and whose `image` is
`docker://swerl-harbor:<content hash of environment/>`) and a `HarborTask`; `build_harbor_image` builds that
image offline (network "none", never pulling: every FROM image must already be on the engine);
`run_verifier` (swerl.grading.harbor_verifier) runs tests/test.sh in a sandbox of that image
(swerl.grading.grader.grade_patch calls it, after the attempt's patch is applied in a fresh sandbox);
`export_harbor_task` writes a swerl task as a Harbor task.

Paths. swerl's containers have a read-only root file system (writable: /workspace and /tmp), so the image build
appends one layer making /logs, /tests and /solution symlinks into RUN_DIR (/tmp/swerl-harbor, on the sandbox's
private tmpfs). The verifier, its helpers and the solution are copied there only for the run that needs them: an
agent never sees tests/ or solution/.
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swerl.data.environments import resolve_environment
from swerl.data.repos import is_test_file
from swerl.data.schema import TaskInstance
from swerl.errors import InfraError
from swerl.sandbox.base import WORKSPACE, Sandbox
from swerl.sandbox.images import BASE_IMAGE, build_offline, env_digest

HARBOR_SCHEME = "harbor://"
VERIFIER_TEST_ID = "tests/test.sh"
"""The one FAIL_TO_PASS id of a Harbor task: its verifier is its test (it "passes" iff the reward is 1). Not a
test a test command could run, on purpose: a grader that does not dispatch on `TaskInstance.verifier` finds no such
test and scores 0, where an empty list would pass everything."""
IMAGE_REPOSITORY = "swerl-harbor"
IMAGE_RECIPE_VERSION = 1
"""Part of every Harbor image's tag: bump it when the appended layer (_RUN_DIR_LAYER) changes."""
RUN_DIR = "/tmp/swerl-harbor"
"""Where /logs, /tests and /solution point inside swerl's sandboxes (the image links them here)."""
REWARD_DIR = f"{RUN_DIR}/logs/verifier"
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
"""Harbor's default [verifier] timeout_sec."""
_RUN_DIR_LAYER = (
    "\n# swerl: /logs, /tests and /solution live on the sandbox's writable /tmp\nUSER root\n"
    f"RUN rm -rf /logs /tests /solution && ln -s {RUN_DIR}/logs /logs && ln -s {RUN_DIR}/tests /tests "
    f"&& ln -s {RUN_DIR}/solution /solution\n"
)
GONE = 88
"""Exit status of the verifier's preparation (swerl.grading.harbor_verifier) or the solution's run when the
tests/ or solution/ just copied in are gone again."""
NO_PERSISTENT_TMP = (
    "tests/ copied into the sandbox's /tmp was gone at the next command: this sandbox does not keep /tmp between "
    "commands (the local backend's bubblewrap runtime), and a Harbor verifier needs it (its tests, /logs and the "
    "reward live there). Run Harbor tasks on the docker backend or on the local backend's supervisor runtime "
    "(sandbox.runtime: supervisor, as root)"
)


class HarborFormatError(ValueError):
    """A Harbor task directory that swerl cannot read; the message names the file and, where one, the key."""


class SolutionFailed(InfraError):
    """solution/solve.sh exited non-zero or timed out (cause verifier_failed): a property of the task, which curate
    tells apart from a sandbox failure."""


@dataclass(frozen=True)
class HarborTask:
    """A Harbor task directory as read (task.toml's settings swerl uses, the rest kept as read)."""

    root: Path
    name: str
    instruction: str
    workdir: str
    """The Dockerfile's last WORKDIR (the repository); the built image's own WORKDIR is what sandboxes use."""
    verifier_timeout_s: float = DEFAULT_VERIFIER_TIMEOUT_S
    agent_timeout_s: float | None = None
    build_timeout_s: float | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    has_solution: bool = False

    @property
    def environment_dir(self) -> Path:
        return self.root / "environment"

    @property
    def tests_dir(self) -> Path:
        return self.root / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.root / "solution"

    @property
    def image_tag(self) -> str:
        """swerl-harbor:<hash of environment/ (paths, modes, bytes) and the appended layer's recipe>."""
        return f"{IMAGE_REPOSITORY}:{env_digest(self.environment_dir, f'harbor-v{IMAGE_RECIPE_VERSION}')}"


# ----------------------------------------------------------------------------------------------------------------
# Loading


def _number(table: dict[str, Any], key: str, where: str, positive: bool = True) -> float | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise HarborFormatError(f"{where}: `{key}` must be a number, got {value!r}")
    if positive and value <= 0:
        raise HarborFormatError(f"{where}: `{key}` must be > 0, got {value!r}")
    return float(value)


def _table(config: dict[str, Any], name: str, path: Path) -> dict[str, Any]:
    value = config.get(name, {})
    if not isinstance(value, dict):
        raise HarborFormatError(f"{path}: `{name}` must be a table ([{name}]), got {type(value).__name__}")
    return value


def dockerfile_workdir(dockerfile: Path) -> str:
    """The last WORKDIR of the Dockerfile's final stage (an absolute path); HarborFormatError if there is none."""
    text = dockerfile.read_text()
    joined = re.sub(r"\\\n", " ", text)  # line continuations
    workdir: str | None = None
    for line in joined.splitlines():
        words = line.strip().split(None, 1)
        if not words or words[0].startswith("#"):
            continue
        instruction = words[0].upper()
        if instruction == "FROM":
            workdir = None  # a new stage starts with its base image's WORKDIR, which swerl does not read here
        elif instruction == "WORKDIR" and len(words) == 2:
            value = words[1].strip().strip('"')
            workdir = value if value.startswith("/") or workdir is None else f"{workdir.rstrip('/')}/{value}"
    if workdir is None:
        raise HarborFormatError(
            f"{dockerfile}: no WORKDIR in the final stage: swerl needs it to know where the repository is"
        )
    if not workdir.startswith("/") or workdir.rstrip("/") == "":
        raise HarborFormatError(f"{dockerfile}: WORKDIR {workdir!r} must be an absolute path other than /")
    return workdir


def dockerfile_bases(dockerfile: Path) -> list[str]:
    """The images the Dockerfile's stages start FROM (other stages and `scratch` left out)."""
    stages: set[str] = set()
    bases: list[str] = []
    for line in re.sub(r"\\\n", " ", dockerfile.read_text()).splitlines():
        words = line.split()
        if not words or words[0].upper() != "FROM":
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if not args:
            raise HarborFormatError(f"{dockerfile}: a FROM line names no image: {line.strip()!r}")
        image = args[0]
        if "$" in image:
            raise HarborFormatError(
                f"{dockerfile}: FROM {image} uses a build argument: swerl builds offline and must check that the "
                "base image is on the engine before building"
            )
        if image not in stages and image != "scratch":
            bases.append(image)
        if len(args) >= 3 and args[1].upper() == "AS":
            stages.add(args[2])
    return bases


def load_harbor_task(
    task_dir: str | Path, *, split: str | None = None, reference_patch: str = ""
) -> tuple[TaskInstance, HarborTask]:
    """Read a Harbor task directory (no Docker needed); HarborFormatError names the file and key at fault.

    The TaskInstance: instance_id `harbor__<directory name>`, the instruction as problem statement, image
    `docker://swerl-harbor:<hash>` (build it with build_harbor_image before starting sandboxes), base_commit that
    hash, verifier `harbor://<absolute directory>`, FAIL_TO_PASS [VERIFIER_TEST_ID], a fix-kind patch that is
    `reference_patch` (empty unless given: harbor_reference_patch makes it from solution/solve.sh).
    """
    # Over 60 lines: task.toml's sections read in one place, each error naming its file and key.
    root = Path(task_dir).resolve()
    if not root.is_dir():
        raise HarborFormatError(f"{root}: not a directory")
    for rel in ("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh"):
        if not (root / rel).is_file():
            raise HarborFormatError(f"{root / rel}: missing (a Harbor task needs {rel})")
    toml_path = root / "task.toml"
    try:
        config = tomllib.loads(toml_path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise HarborFormatError(f"{toml_path}: not valid TOML: {exc}") from None
    metadata = _table(config, "metadata", toml_path)
    verifier = _table(config, "verifier", toml_path)
    agent = _table(config, "agent", toml_path)
    environment = _table(config, "environment", toml_path)
    difficulty = metadata.get("difficulty")
    if difficulty is not None and not isinstance(difficulty, str):
        raise HarborFormatError(f"{toml_path}: [metadata] `difficulty` must be a string, got {difficulty!r}")
    memory = _number(environment, "memory_mb", f"{toml_path} [environment]")
    instruction = (root / "instruction.md").read_text()
    if not instruction.strip():
        raise HarborFormatError(f"{root / 'instruction.md'}: empty (it is the agent's problem statement)")
    harbor = HarborTask(
        root=root,
        name=root.name,
        instruction=instruction,
        workdir=dockerfile_workdir(root / "environment/Dockerfile"),
        verifier_timeout_s=_number(verifier, "timeout_sec", f"{toml_path} [verifier]") or DEFAULT_VERIFIER_TIMEOUT_S,
        agent_timeout_s=_number(agent, "timeout_sec", f"{toml_path} [agent]"),
        build_timeout_s=_number(environment, "build_timeout_sec", f"{toml_path} [environment]"),
        cpus=_number(environment, "cpus", f"{toml_path} [environment]"),
        memory_mb=int(memory) if memory is not None else None,
        metadata=dict(metadata),
        has_solution=(root / "solution/solve.sh").is_file(),
    )
    dockerfile_bases(root / "environment/Dockerfile")  # a FROM swerl cannot check offline is an error now
    task = TaskInstance(
        instance_id=f"harbor__{root.name}",
        repo=f"harbor/{root.name}",
        base_commit=harbor.image_tag.split(":", 1)[1],
        problem_statement=instruction,
        patch=reference_patch,
        patch_kind="fix",
        FAIL_TO_PASS=[VERIFIER_TEST_ID],
        image=f"docker://{harbor.image_tag}",
        difficulty=difficulty,
        source=str(root),
        split=split,
        verifier=f"{HARBOR_SCHEME}{root}",
    )
    return task, harbor


def harbor_task_dirs(path: str | Path) -> list[Path]:
    """A `curate.harbor` entry as Harbor task directories: the directory itself when it holds task.toml, else its
    subdirectories that do (sorted by name); HarborFormatError naming the path when it is neither."""
    root = Path(path).expanduser()
    if not root.exists():
        raise HarborFormatError(f"{root}: no such directory (a Harbor task or a folder of Harbor task directories)")
    if not root.is_dir():
        raise HarborFormatError(f"{root}: not a directory (a Harbor task or a folder of Harbor task directories)")
    if (root / "task.toml").is_file():
        return [root.resolve()]
    found = sorted(d.resolve() for d in root.iterdir() if d.is_dir() and (d / "task.toml").is_file())
    if not found:
        raise HarborFormatError(
            f"{root}: neither a Harbor task (no task.toml) nor a folder of Harbor task directories (no "
            "subdirectory holds a task.toml)"
        )
    return found


def harbor_content_digest(task_dir: Path) -> str:
    """A content hash of a whole task directory (task.toml, instruction, environment/, tests/, solution/: paths,
    modes, bytes): what curate's stage key holds, so that any change to a task reruns curate."""
    return env_digest(task_dir, f"harbor-task-v{IMAGE_RECIPE_VERSION}")


def harbor_task_of(task: TaskInstance) -> HarborTask:
    """The Harbor task a TaskInstance's `verifier` names; InfraError(verifier_failed) if it cannot be read."""
    if not task.verifier or not task.verifier.startswith(HARBOR_SCHEME):
        raise ValueError(f"task {task.instance_id}: verifier {task.verifier!r} is not {HARBOR_SCHEME}DIR")
    try:
        return load_harbor_task(task.verifier[len(HARBOR_SCHEME) :])[1]
    except (HarborFormatError, OSError) as exc:
        raise InfraError("verifier_failed", f"task {task.instance_id}: {exc}") from exc


# ----------------------------------------------------------------------------------------------------------------
# The image


def build_harbor_image(harbor: HarborTask, client: Any = None) -> str:
    """Build (or reuse, by tag) the task's image from environment/Dockerfile with _RUN_DIR_LAYER appended; network
    "none", never pulling. Returns the tag; InfraError(image_missing) with the build's last error line."""
    import docker
    import docker.errors

    tag = harbor.image_tag
    own = client is None
    if client is None:
        kwargs = {"timeout": int(harbor.build_timeout_s)} if harbor.build_timeout_s else {}
        client = docker.from_env(**kwargs)
    try:
        try:
            client.images.get(tag)
            return tag
        except docker.errors.ImageNotFound:
            pass
        dockerfile = harbor.environment_dir / "Dockerfile"
        for base in dockerfile_bases(dockerfile):
            try:
                client.images.get(base)
            except docker.errors.ImageNotFound:
                raise InfraError(
                    "image_missing",
                    f"{dockerfile}: base image {base} is not on this Docker engine (swerl never pulls: load it first)",
                ) from None
        text = dockerfile.read_text()
        recipe = (text if text.endswith("\n") else text + "\n") + _RUN_DIR_LAYER
        labels = {"org.swerl.image": "harbor", "org.swerl.harbor.task": str(harbor.root)}
        try:
            build_offline(client, tag, recipe, labels, trees={".": harbor.environment_dir}, what=f"from {dockerfile}")
        except (RuntimeError, docker.errors.APIError) as exc:
            raise InfraError(
                "image_missing",
                str(exc) if isinstance(exc, RuntimeError) else f"building {tag} from {dockerfile} failed: {exc}",
            ) from exc
        return tag
    finally:
        if own:
            client.close()


# ----------------------------------------------------------------------------------------------------------------
# Running the verifier (and the reference solution) in a sandbox of the task's image


def _packed(directory: Path) -> str:
    """A directory as a base64 tar.gz (what travels into a sandbox through write_file, which takes text)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(directory, arcname=".")
    return base64.b64encode(buffer.getvalue()).decode()


async def copy_into(sandbox: Sandbox, directory: Path, target: str) -> None:
    """Copy a host directory to `target` (under RUN_DIR) in the sandbox, replacing what was there, read-only."""
    staging = f".swerl-harbor-{target.rsplit('/', 1)[-1]}.b64"
    await sandbox.write_file(staging, _packed(directory))
    script = (
        f"set -e; rm -rf {shlex.quote(target)}; mkdir -p {shlex.quote(target)}; "
        f"base64 -d {WORKSPACE}/{staging} | tar -xz -C {shlex.quote(target)}; rm -f {WORKSPACE}/{staging}; "
        f"chmod -R a-w {shlex.quote(target)}"
    )
    result = await sandbox.exec(script, timeout=60.0)
    if result.exit_code != 0:
        raise InfraError("verifier_failed", f"cannot copy {directory} to {target}: {result.output[-500:]}")


async def run_solution(sandbox: Sandbox, harbor: HarborTask, timeout_s: float = 600.0) -> None:
    """Run solution/solve.sh in `sandbox` from the WORKDIR (solution/ copied to /solution first);
    InfraError(verifier_failed) if the task has none or it fails."""
    if not harbor.has_solution:
        raise InfraError("verifier_failed", f"{harbor.root}: no solution/solve.sh")
    await copy_into(sandbox, harbor.solution_dir, f"{RUN_DIR}/solution")
    gone = "swerl: /solution is gone"
    result = await sandbox.exec(
        f"test -f /solution/solve.sh || {{ echo '{gone}'; exit {GONE}; }}; bash /solution/solve.sh",
        timeout=timeout_s,
        cwd=harbor.workdir,
    )
    if result.exit_code == GONE and result.output.strip() == gone:
        raise InfraError("verifier_failed", f"{harbor.root}: {NO_PERSISTENT_TMP.replace('tests/', 'solution/')}")
    if result.exit_code != 0 or result.timed_out:
        raise SolutionFailed(
            "verifier_failed",
            f"{harbor.root}: solution/solve.sh failed ({result.exit_code}): {result.output[-500:]}",
        )


async def harbor_reference_patch(sandbox: Sandbox, harbor: HarborTask, timeout_s: float = 600.0) -> str:
    """The diff solution/solve.sh makes to the repository, run in `sandbox` (fresh, of the task's image): what
    `load_harbor_task(..., reference_patch=...)` takes, so the oracle and curate can replay the solution."""
    git = "git -c user.name=swerl -c user.email=swerl@localhost -c init.defaultBranch=main -c core.hooksPath=/dev/null"
    base = await sandbox.exec(
        f"[ -d .git ] || {{ {git} init -q && {git} add -A && {git} commit -q --no-verify -m start; }}", 120.0
    )
    if base.exit_code != 0:
        raise InfraError("verifier_failed", f"cannot record the starting state: {base.output[-500:]}")
    await run_solution(sandbox, harbor, timeout_s)
    diff = await sandbox.exec(f"{git} add -A && {git} diff --cached --no-color --binary HEAD", 120.0)
    if diff.exit_code != 0:
        raise InfraError("verifier_failed", f"cannot diff the solution: {diff.output[-500:]}")
    return diff.output


# ----------------------------------------------------------------------------------------------------------------
# Export: a swerl task as a Harbor task directory


EXPORT_WORKDIR = "/testbed"

_CHECK = '''"""Run the task's tests and write the reward (generated by swerl's export_harbor_task)."""
import json, re, subprocess, sys

spec = json.load(open("/tests/tests.json"))
ids = spec["FAIL_TO_PASS"] + spec["PASS_TO_PASS"]
run = subprocess.run(spec["command"] + ids, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                     timeout=spec["timeout_s"])
sys.stdout.write(run.stdout)
status = {}
for line in run.stdout.splitlines():
    m = re.match(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\\S+)", line)
    if m:
        status[m.group(2)] = m.group(1)
ok = run.returncode == 0 and all(status.get(t) in ("PASSED", "XPASS") for t in ids)
open("/logs/verifier/reward.txt", "w").write("1\\n" if ok else "0\\n")
print("reward", int(ok))
'''


def _git_apply(directory: Path, patch: str, reverse: bool = False) -> None:
    """Apply a diff to a plain directory (a throwaway git repository, so git applies it relative to it)."""
    git = ["git", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q"], cwd=directory, check=True)
    try:
        args = [*git, "apply", "--whitespace=nowarn", *(["-R"] if reverse else []), "-"]
        done = subprocess.run(args, cwd=directory, input=patch, text=True, capture_output=True)
        if done.returncode != 0:
            raise ValueError(f"the patch does not apply to {directory}: {done.stderr.strip()[-500:]}")
    finally:
        shutil.rmtree(directory / ".git", ignore_errors=True)


def _copy_repo(source: Path, target: Path) -> None:
    shutil.copytree(
        source,
        target,
        symlinks=True,
        ignore=shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".pytest_cache"),
    )


def export_harbor_task(
    task: TaskInstance,
    out_dir: str | Path,
    *,
    base_image: str = BASE_IMAGE,
    python: str = "python3",
    test_timeout_s: float = 600.0,
) -> Path:
    """Write a swerl task with a repository on disk (local:// or micro://) as a Harbor task directory.

    environment/Dockerfile FROM `base_image` copies the repository in its starting state (bug applied for a
    bug-kind task) to /testbed; tests/ holds the task's test files as the task has them (test.sh copies them over
    the repository first), tests.json (the test command and ids) and check.py, which runs them and writes
    reward.txt (1 iff the command exits 0 and every FAIL_TO_PASS and PASS_TO_PASS test printed PASSED);
    solution/solve.sh applies the reference fix (a bug-kind task's patch reversed). A test.sh that crashes
    writes no reward (a crashed verifier is not reward 0). `base_image` must hold what the test command needs
    (swerl-base has no pytest: micro tasks' run_tests.py needs none)."""
    # Over 60 lines: the format's files written in its order: environment, instruction, tests, solution.
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty")
    source = resolve_environment(task.image, task.base_commit)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="swerl-export-") as tmp:
        start = Path(tmp) / "start"
        _copy_repo(source, start)
        if task.patch_kind == "bug":
            _git_apply(start, task.patch)
        graded = Path(tmp) / "graded"  # the test files as grading has them: the start, test_patch applied
        _copy_repo(start, graded)
        if task.test_patch:
            _git_apply(graded, task.test_patch)
        env = out / "environment"
        _copy_repo(start, env / "repo")
        tests_repo = out / "tests" / "repo"
        for path in sorted(graded.rglob("*")):
            rel = path.relative_to(graded)
            if path.is_file() and not path.is_symlink() and is_test_file(rel):
                (tests_repo / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, tests_repo / rel)
    (env / "Dockerfile").write_text(f"FROM {base_image}\nCOPY repo/ {EXPORT_WORKDIR}/\nWORKDIR {EXPORT_WORKDIR}\n")
    (out / "instruction.md").write_text(task.problem_statement.rstrip() + "\n")
    command = shlex.split(task.test_cmd) if task.test_cmd.strip() else [python, "-m", "pytest", "-rA"]
    if command and command[0] == "python":
        command[0] = python
    spec = {
        "command": command,
        "FAIL_TO_PASS": list(task.FAIL_TO_PASS),
        "PASS_TO_PASS": list(task.PASS_TO_PASS),
        "timeout_s": test_timeout_s,
    }
    (out / "tests" / "tests.json").write_text(json.dumps(spec, indent=1) + "\n")
    (out / "tests" / "check.py").write_text(_CHECK)
    restore = f"cp -R /tests/repo/. {EXPORT_WORKDIR}/\n" if tests_repo.is_dir() else ""
    (out / "tests" / "test.sh").write_text(
        "#!/bin/bash\n"
        f"# The verifier of swerl task {task.instance_id}: its tests as the task has them, then check.py writes the\n"
        "# reward. Any failure before that leaves no reward file: a crashed verifier, never a score.\n"
        "set -eu\nmkdir -p /logs/verifier\nrm -f /logs/verifier/reward.txt /logs/verifier/reward.json\n"
        f"cd {EXPORT_WORKDIR}\n{restore}{python} /tests/check.py\n"
    )
    fix_args = "-R " if task.patch_kind == "bug" else ""
    patch = task.patch if task.patch.endswith("\n") else task.patch + "\n"
    marker = "SWERL_REFERENCE_FIX_END"
    if marker in patch:
        raise ValueError(f"task {task.instance_id}: its patch contains {marker}")
    (out / "solution").mkdir()
    (out / "solution" / "solve.sh").write_text(
        f"#!/bin/bash\n# The reference fix of swerl task {task.instance_id}.\nset -eu\ncd {EXPORT_WORKDIR}\n"
        f"git apply --whitespace=nowarn {fix_args}- <<'{marker}'\n{patch}{marker}\n"
    )
    for script in (out / "tests" / "test.sh", out / "solution" / "solve.sh"):
        script.chmod(0o755)
    tags = [t for t in ("swerl", task.modifier, task.split) if t]
    (out / "task.toml").write_text(
        'version = "1.0"\n\n[metadata]\n'
        f'author_name = "swerl"\ndifficulty = {json.dumps(task.difficulty or "unknown")}\n'
        f'category = "software-engineering"\ntags = {json.dumps(tags)}\n'
        f"swerl_instance_id = {json.dumps(task.instance_id)}\nswerl_source = {json.dumps(task.source)}\n\n"
        f"[verifier]\ntimeout_sec = {float(test_timeout_s) + 60.0}\n\n[agent]\ntimeout_sec = 1800.0\n\n"
        "[environment]\nbuild_timeout_sec = 600.0\ncpus = 1\nmemory_mb = 2048\n"
    )
    return out
