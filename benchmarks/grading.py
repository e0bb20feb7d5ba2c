"""What the sealed grader costs per attempt, against running the tests in the agent's open sandbox (the old grader).

    .venv/bin/python benchmarks/grading.py [--count 20] [--runtime auto]

The old grader ran the task's test command in the agent's own workspace after putting the test files back; the
sealed grader (swerl/grading/grader.py) starts a fresh sandbox of the task, applies the patch without its test
infrastructure and runs the sealed runner. Both are timed side by side, alternating, on the same micro task with
the honest fix, so the machine's load falls on both alike; the ratio is sealed / baseline wall time per attempt.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from swerl.config.sandbox import SandboxLimits  # noqa: E402
from swerl.data.micro import micro_repo_spec  # noqa: E402
from swerl.data.synth import synthesize_repo  # noqa: E402
from swerl.data.testrun import run_tests  # noqa: E402
from swerl.grading.grader import grade_patch, start_task_sandbox, workspace_patch  # noqa: E402
from swerl.stages.common import sandbox_provider  # noqa: E402

MODIFIERS = ("flip_comparison", "swap_binop", "negate_condition", "off_by_one", "swap_call_args")


async def main(count: int, runtime: str) -> None:
    provider = sandbox_provider(SandboxLimits(runtime=runtime), git_baseline=True)  # type: ignore[arg-type]
    found, _ = await synthesize_repo(
        micro_repo_spec("eval", 0, 0),
        provider,
        modifiers=MODIFIERS,
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
    task = found[0]
    sandbox = await start_task_sandbox(provider, task)
    await sandbox.write_file(".fix.patch", task.patch)
    await sandbox.exec("git apply -R .fix.patch && rm .fix.patch", timeout=30)
    fix = await workspace_patch(sandbox)
    assert fix
    tests = [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]
    baseline, sealed = [], []
    for _ in range(count):
        started = time.perf_counter()
        await run_tests(sandbox, 30, task.test_cmd, test_ids=tests)
        baseline.append(time.perf_counter() - started)
        started = time.perf_counter()
        graded = await grade_patch(provider, task, fix, 30)
        sealed.append(time.perf_counter() - started)
        assert graded.reward == 1.0, graded.status
    await sandbox.close()
    b, s = statistics.median(baseline), statistics.median(sealed)
    print(
        f"{count} attempts, runtime {runtime}: baseline (tests in the open agent sandbox) median {b * 1000:.0f} ms,"
        f" sealed grader (fresh sandbox + patch + sealed runner) median {s * 1000:.0f} ms, ratio {s / b:.2f}x"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--runtime", default="auto", choices=["auto", "supervisor", "bubblewrap"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="swerl-bench-") as cache:
        import os

        os.environ["SWERL_CACHE_DIR"] = cache
        asyncio.run(main(args.count, args.runtime))
