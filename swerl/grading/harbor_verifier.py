"""Running a Harbor task's verifier: tests/test.sh in a sandbox of the task's image, and the reward it wrote.

The task's format, its image and its reference solution are swerl.data.harbor's; the run and the reward's parsing
are grading (swerl.grading.grader.grade_patch calls run_verifier after the attempt's patch is applied in a fresh
sandbox).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from swerl.data.harbor import GONE, NO_PERSISTENT_TMP, REWARD_DIR, RUN_DIR, HarborTask, copy_into
from swerl.errors import InfraError
from swerl.sandbox.base import Sandbox

_OUTLIVED = 86
"""Exit status of the verifier run when processes outlived tests/test.sh (see run_verifier)."""
_FAILED = 87
"""Exit status of the verifier run when tests/test.sh itself exited non-zero."""


@dataclass(frozen=True)
class VerifierRun:
    """What one run of tests/test.sh left: its reward (None: no reward file), where that came from, how it ended."""

    reward: float | None
    reward_file: str | None
    exit_code: int
    """0, or _FAILED (test.sh exited non-zero), or _OUTLIVED (processes outlived it), or a kill's status."""
    timed_out: bool
    outlived: bool
    output: str
    duration_s: float


# Runs test.sh from memory (bash re-reads a script file as it goes: code under test could rewrite the rest of a
# file), then counts the sandbox user's processes still alive besides this shell, its parent, PID 1 and PID 1's
# `sleep 60` (builtins only: no process is forked to look). The exit status is the only verdict: code under test can
# print anything.
_VERIFY = r"""
script="$(cat /tests/test.sh)" || exit 90
bash -c "$script" /tests/test.sh
code=$?
echo "swerl: tests/test.sh exited $code"
alive=0
for dir in /proc/[0-9]*; do
  pid=${dir#/proc/}
  if [ "$pid" = 1 ] || [ "$pid" = $$ ] || [ "$pid" = $PPID ]; then continue; fi
  read -r stat 2>/dev/null < "$dir/stat" || continue
  rest=${stat##*) }
  [ "${rest%% *}" = Z ] && continue
  fields=(${rest})
  if [ "${fields[1]}" = 1 ]; then  # the sandbox's PID 1 keeps one `sleep 60` running: not the run's
    mapfile -d '' argv 2>/dev/null < "$dir/cmdline"
    [ "${#argv[@]}" = 2 ] && [ "${argv[0]}" = sleep ] && [ "${argv[1]}" = 60 ] && continue
  fi
  alive=$((alive + 1))
done
[ $alive -eq 0 ] || { echo "swerl: $alive processes outlived tests/test.sh"; exit @OUTLIVED@; }
[ $code -eq 0 ] || exit @FAILED@
exit 0
"""


def parse_reward(text: str, name: str) -> float:
    """The reward in reward.txt (a number) or reward.json ({"reward": x, ...}); ValueError saying what is wrong."""
    if name.endswith(".json"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{name} is not JSON: {exc}") from None
        if not isinstance(data, dict) or "reward" not in data:
            raise ValueError(f'{name} has no "reward" key: {text[:200]!r}')
        value = data["reward"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f'{name}: "reward" must be a number, got {value!r}')
    else:
        try:
            value = float(text.strip())
        except ValueError:
            raise ValueError(f"{name} does not hold a number: {text[:200]!r}") from None
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name}: reward {value!r} is not a number in [0, 1]")
    return float(value)


async def run_verifier(sandbox: Sandbox, harbor: HarborTask, timeout_s: float | None = None) -> VerifierRun:
    """Run the task's tests/test.sh in `sandbox` (the attempt already in /workspace) and read the reward.

    tests/ is copied in now (read-only; the agent never had it), the reward directory is created empty right
    before, test.sh runs from the image's WORKDIR (a symlink to /workspace) with the verifier timeout, and the
    reward is read in a separate command, after the sandbox killed every process the run left. reward.txt wins over
    reward.json. An unreadable reward raises InfraError(verifier_failed); the caller decides what a missing one
    means (see swerl.grading.grader.grade_patch)."""
    await copy_into(sandbox, harbor.tests_dir, f"{RUN_DIR}/tests")
    prepared = await sandbox.exec(
        f"test -f {RUN_DIR}/tests/test.sh || exit {GONE}; "
        f"rm -rf {RUN_DIR}/logs && mkdir -p {REWARD_DIR} {RUN_DIR}/logs/agent",
        60.0,
    )
    if prepared.exit_code == GONE:
        raise InfraError("verifier_failed", f"{harbor.root}: {NO_PERSISTENT_TMP}")
    if prepared.exit_code != 0:
        raise InfraError("verifier_failed", f"cannot create {REWARD_DIR}: {prepared.output[-500:]}")
    timeout = timeout_s if timeout_s is not None else harbor.verifier_timeout_s
    script = _VERIFY.replace("@OUTLIVED@", str(_OUTLIVED)).replace("@FAILED@", str(_FAILED))
    result = await sandbox.exec(script, timeout=timeout, cwd=harbor.workdir)
    reward: float | None = None
    found: str | None = None
    for name in ("reward.txt", "reward.json"):
        listing = await sandbox.exec(f"test -f {REWARD_DIR}/{name}", 60.0)
        if listing.exit_code != 0:
            continue
        text = await sandbox.read_file(f"{REWARD_DIR}/{name}")
        try:
            reward = parse_reward(text, name)
        except ValueError as exc:
            if result.timed_out:  # a half-written reward after a timeout: the timeout decides
                break
            raise InfraError("verifier_failed", f"{harbor.root}: /logs/verifier/{exc}") from None
        found = name
        break
    return VerifierRun(
        reward=reward,
        reward_file=found,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        outlived=result.exit_code == _OUTLIVED,
        output=result.output,
        duration_s=result.duration_s,
    )
