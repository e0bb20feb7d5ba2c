"""Crash safety of the asynchronous GRPO stage: SIGKILL at random points, rerun, compare the books.

The GRPO stage runs for real in a subprocess (`python tests/stages/test_grpo_async_crash.py ...`): a tiny Qwen3 in the
local engine, real bubblewrap sandboxes on clean micro repositories, real grading, a file:// store and a sqlite
MLflow. Nothing is faked; the only injected fault is the SIGKILL. The inputs (a curate manifest with the tasks and
an sft manifest with the tiny model) are written by literal stage functions.

Seed 3 runs with the probe, replay and strata curriculum (swerl.rollout.curriculum): its plans and outcomes are
journaled too, and a probe-stopped group's one attempt is all it ever has.

After each rerun the final checkpoint's ledger must show: every step consumed exactly B trained groups, no group
consumed twice (nothing trained twice), every consumed group's attempts are in the journal (nothing finished lost),
and the data position covers every group in the journal.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from swerl.config.agent import AgentConfig
from swerl.config.engine import EngineConfig
from swerl.config.grpo import GRPOConfig
from swerl.rollout.manager import parse_group_id
from swerl.stages.runner import Manifest, StageContext, StageResult, run_stage
from swerl.storage import Store
from swerl.tracking import Tracker

ROOT = Path(__file__).resolve().parents[2]
STEPS, B, N = 3, 2, 2
GRPO = GRPOConfig.model_validate(
    {
        "mode": "async",
        "threads": 1,
        "schedule": {"steps": STEPS, "tasks_per_step": B, "checkpoint_every": 1},
        "rollout": {"attempts_per_task": N, "max_in_flight": 4, "max_staleness": 1, "max_extra_groups_per_step": 1},
        "algorithm": {"lr": 1e-3},
    }
)
AGENT = AgentConfig(
    max_turns=2,
    max_trajectory_tokens=512,
    max_new_tokens_per_turn=16,
    max_malformed_calls=1,
    command_timeout_s=20,
    test_timeout_s=30,
    infra_retries=1,
)
ENGINE = EngineConfig.model_validate({"max_batch_size": 4, "max_context_tokens": 512, "local": {"threads": 1}})


def stores(root: Path) -> tuple[Store, Tracker]:
    return Store(f"file://{root}/store"), Tracker(f"sqlite:///{root}/mlflow.db", "grpo-crash")


def make_inputs(root: Path) -> list[Manifest]:
    """curate (clean micro tasks) and sft (a tiny untrained model) manifests, written by literal stages."""
    from benchmarks.grpo_async import clean_micro_tasks, emulation_tokenizer
    from swerl.data.taskio import tasks_to_parquet
    from swerl.model.loading import save_model_and_tokenizer
    from swerl.stages.common import put_dir
    from tests.tiny_models import SMALL, tiny_qwen3

    def curate(cfg: Any, ctx: StageContext) -> StageResult:
        ctx.write_artifact("train.parquet", tasks_to_parquet(clean_micro_tasks(6)))
        ctx.write_artifact("eval.parquet", tasks_to_parquet([]))
        return StageResult()

    def sft(cfg: Any, ctx: StageContext) -> StageResult:
        tokenizer = emulation_tokenizer(ctx.workdir / "tokenizer")
        model = tiny_qwen3(tokenizer, 512, shape=SMALL)
        put_dir(ctx, "model", save_model_and_tokenizer(model, tokenizer, ctx.workdir / "model"))
        return StageResult()

    store, tracker = stores(root)
    made = []
    for name, fn in (("curate", curate), ("sft", sft)):
        made.append(run_stage(name, fn, ENGINE, store=store, tracker=tracker, parent=None).manifest)
    return made


def child(root: Path, stage: str, trainer_process: bool) -> None:
    """The GRPO process: run the stage to completion (resuming whatever a killed run left)."""
    from swerl.stages.grpo import GRPOStage, run_grpo

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    store, tracker = stores(root)
    inputs = [Manifest.model_validate_json((root / f"{name}.json").read_text()) for name in ("curate", "sft")]
    g = GRPO.model_copy(update={"trainer_process": trainer_process})
    if curriculum_of(stage):
        g = g.model_copy(update={"rollout": g.rollout.model_copy(update=CURRICULUM)})
    run_stage(
        stage,
        run_grpo,
        GRPOStage(grpo=g, agent=AGENT, engine=ENGINE),
        store=store,
        tracker=tracker,
        parent=None,
        inputs=inputs,
    )


ATTEMPT_ENTRY = re.compile(r"^r(\d+)-a(\d+)\.json$")
CURRICULUM = {
    "probe_attempts": 1,
    "replay_share": 0.5,
    "max_visits": 3,
    "stratify_by": "modifier",
    "stratum_floor": 0.3,
}


def curriculum_of(stage: str) -> bool:
    return stage.endswith("-3")


def trainer_process_of(stage: str) -> bool:
    """Seed 1's stage trains in a process of its own (grpo.trainer_process): its crash must not leave it behind."""
    return stage.endswith("-1")


def spawn(root: Path, stage: str) -> subprocess.Popen[bytes]:
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    log = open(root / f"{stage}.log", "ab")  # noqa: SIM115 - the child writes it
    return subprocess.Popen(
        [sys.executable, __file__, str(root), stage, str(int(trainer_process_of(stage)))],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def gone(pid: int) -> bool:
    """The process has ended (a zombie left to an init that does not reap counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def run_to_end(root: Path, stage: str) -> None:
    process = spawn(root, stage)
    assert process.wait(timeout=600) == 0, (root / f"{stage}.log").read_text()[-3000:]


def check_books(root: Path, stage: str) -> dict[str, Any]:
    """The final report and journal of a finished stage; asserts nothing was lost or trained twice."""
    store, _ = stores(root)
    [key] = [rel.rsplit("/", 1)[-1] for rel in store.list(f"stages/{stage}")]
    manifest = json.loads(store.read_bytes(f"stages/{stage}/{key}/manifest.json"))
    report = json.loads(store.read_bytes(store.rel_of(manifest["artifacts"]["grpo_report.json"]["uri"])))
    assert report["steps"] == STEPS and report["mode"] == "async"
    ledger = report["ledger"]
    seqs = [seq for seq, _, _ in ledger]
    assert len(seqs) == len(set(seqs)), "a group was consumed twice"
    trained = Counter(step for _, step, reason in ledger if reason == "trained")
    assert trained == {step: B for step in range(1, STEPS + 1)}, trained
    journal: dict[int, set[tuple[int, int]]] = {}
    plans = 0
    for folder in store.list(f"stages/{stage}/{key}/rollouts"):
        seq = int(folder.rsplit("/g", 1)[1])
        names = [name.rsplit("/", 1)[1] for name in store.list(folder)]
        plans += "plan.json" in names
        matches = map(ATTEMPT_ENTRY.match, names)
        journal[seq] = {(int(m[1]), int(m[2])) for m in matches if m}
    # a plan per group, written before its attempts
    assert plans == (len(journal) if curriculum_of(stage) else 0)
    reasons = {seq: reason for seq, _, reason in ledger}
    # every consumed group's attempts were persisted (one generation complete; a probe's one)
    for seq in seqs:
        generations = Counter(generation for generation, _ in journal.get(seq, set()))
        size = CURRICULUM["probe_attempts"] if reasons[seq] == "probe_stopped" else N
        assert size in generations.values(), (seq, reasons[seq], journal.get(seq))
    assert max(journal) < report["data_position"]
    # The trainer's account of what it scored survives the crashes too: every step's, only its trained groups'
    # attempts, each one journaled.
    scored = report["scored_attempts"]
    assert sorted(map(int, scored)) == list(range(1, STEPS + 1)), sorted(scored)
    for step, pairs in scored.items():
        steps_groups = {seq for seq, at, reason in ledger if at == int(step) and reason == "trained"}
        for group, attempt in pairs:
            seq, _ = parse_group_id(group)
            assert seq in steps_groups and attempt in {a for _, a in journal[seq]}, (step, group, attempt)
    return report


def kill_during(root: Path, stage: str, k: int, rng: random.Random) -> str:
    """Start the stage and SIGKILL it at a random point of its loop: a random delay after it logged step k (k = 0:
    its first log line from the rollout loop). Returns where it was killed."""
    marker = "grpo async: data position" if k == 0 else f"grpo async step {k}/{STEPS}"
    process = spawn(root, stage)
    log = root / f"{stage}.log"
    deadline = time.monotonic() + 300
    while marker not in log.read_text(errors="replace"):
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    time.sleep(rng.uniform(0.0, 2.0))
    assert process.poll() is None, "the stage ended before the kill"
    process.kill()  # SIGKILL: no cleanup, no final checkpoint
    process.wait()
    if trainer_process_of(stage):
        [pid] = re.findall(r"grpo: trainer in process (\d+)", log.read_text(errors="replace"))
        # the child's parent watch polls every second; on a loaded machine its thread can wait several seconds for
        # the CPU, so the guard is generous: what is asserted is that it exits, not how fast
        deadline = time.monotonic() + 60
        while not gone(int(pid)):
            assert time.monotonic() < deadline, f"the trainer process {pid} outlived its killed stage"
            time.sleep(0.1)
    return marker


@pytest.mark.slow
def test_sigkill_at_random_points_loses_nothing_and_trains_nothing_twice(tmp_path: Path) -> None:
    os.environ.setdefault("SWERL_CACHE_DIR", str(tmp_path / "swerl-cache"))
    for manifest in make_inputs(tmp_path):
        (tmp_path / f"{manifest.stage}.json").write_text(manifest.model_dump_json())
    resumed = []
    # killed during step 1, 2 and 3 (a random time into it); seed 1 with the trainer in a process of its own, seed 3
    # (during step 1) with the probe, replay and strata curriculum
    for seed in (0, 1, 2, 3):
        stage = f"grpo-crash-{seed}"
        where = kill_during(tmp_path, stage, seed % STEPS, random.Random(seed))
        run_to_end(tmp_path, stage)
        report = check_books(tmp_path, stage)
        print(
            f"{stage}: killed after {where!r}; resumed from {report['resumed']}, {report['resume']}, "
            f"data position {report['data_position']}"
        )
        resumed.append(report["resume"])
    # The reruns really picked up a killed run's rollouts (not only its checkpoints) at least once.
    assert any(counts["reloaded_groups"] + counts["partial_groups"] > 0 for counts in resumed), resumed


if __name__ == "__main__":
    child(Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1")
