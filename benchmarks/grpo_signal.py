"""Groups with reward signal per 100 rolled episodes: the committed sampling against today's baseline, side by side.

    nice -n 19 .venv/bin/python benchmarks/grpo_signal.py --store file://runs/store [--episodes 240]
        [--new grpo.rollout.probe_attempts=1 ...]

Needs a store a `make run` (or `swerl run configs/local.yaml`) wrote: its newest curate stage (training tasks) and
SFT model (the policy GRPO starts from). Two rollout managers run at the same time on one local engine serving
that model, each with half of grpo.rollout.max_in_flight, on the real agent loop, bubblewrap sandboxes and grader:

- baseline: whole groups of 8 attempts in the seeded task order, no probe, no replay (the sampling before issue 22);
- config (with --arms baseline,config,new): the config's grpo.rollout as committed, no overrides;
- new: the config's grpo.rollout (configs/local.yaml unless --config), with any --new overrides.

No training happens (the policy is fixed), so the comparison is of the sampling alone; both arms see the same
machine load (with three arms each gets a third of max_in_flight). Each arm stops opening groups after --episodes
episodes have started and reports, over its finished groups: groups with signal (mixed valid rewards) per 100 episodes
rolled, the share of groups with signal, and the episodes spent per group with signal. Prints the ratios new / baseline
(and new / config, config / baseline).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from swerl.agent.episode import run_episode
from swerl.config import load_config
from swerl.data.schema import TaskInstance
from swerl.engine.base import Engine, SamplingParams
from swerl.engine.factory import open_engine
from swerl.model.loading import load_tokenizer
from swerl.rollout.curriculum import Curriculum, has_signal
from swerl.rollout.journal import FinishedGroup, RolloutJournal
from swerl.rollout.manager import RolloutManager
from swerl.stages.common import (
    episode_limits,
    episode_with_retries,
    get_dir,
    load_tasks,
    sandbox_pool,
    seeded_sample,
)
from swerl.stages.grpo_async import curriculum_for
from swerl.stages.runner import Manifest, read_manifest
from swerl.storage import Store
from swerl.trajectory import Trajectory


def newest_manifest(store: Store, stage: str) -> Manifest:
    manifests = [
        read_manifest(store, f"{rel}/manifest.json")
        for rel in store.list(f"stages/{stage}")
        if store.exists(f"{rel}/manifest.json")
    ]
    if not manifests:
        raise SystemExit(f"no {stage} stage in {store.uri('')}: run `make run` first (or pass --store)")
    return max(manifests, key=lambda m: m.attempt)


class Arm:
    """One sampler: a manager, its curriculum, and what it rolled."""

    def __init__(
        self,
        name: str,
        n: int,
        curriculum: Curriculum | None,
        in_flight: int,
        episodes: int,
        order: list[TaskInstance],
        episode: Any,
        engine: Engine,
    ) -> None:
        self.name, self.n, self.episodes = name, n, episodes
        self.manager: RolloutManager[TaskInstance] = RolloutManager(
            engine,
            episode,
            lambda index: order[index % len(order)],
            n_attempts=n,
            max_in_flight=in_flight,
            max_buffered_groups=1_000_000,
            journal=RolloutJournal(None, name),
            curriculum=curriculum,
        )
        self.groups: list[FinishedGroup] = []

    async def run(self) -> None:
        self.manager.start()
        while True:
            if self.manager.started >= self.episodes:
                self.manager.max_buffered_groups = 0  # open no new group; open ones finish
            if self.manager.started >= self.episodes and not self.manager.in_flight and not self.manager.buffer:
                break
            try:
                self.groups.append(await self.manager.get(time.monotonic() + 5))
            except TimeoutError:
                continue
        await self.manager.close()

    def report(self) -> dict[str, float]:
        signal = sum(has_signal(t.reward for t in g.trajectories) for g in self.groups)
        episodes = sum(len(g.attempts) for g in self.groups)
        return {
            "groups": len(self.groups),
            "episodes": episodes,
            "signal_groups": signal,
            "signal_per_100_episodes": 100.0 * signal / max(episodes, 1),
            "signal_share": signal / max(len(self.groups), 1),
            "episodes_per_signal_group": episodes / max(signal, 1),
            "stopped_early": sum(g.stopped_early for g in self.groups),
            "success_rate": sum(t.reward or 0.0 for g in self.groups for t in g.trajectories) / max(episodes, 1),
        }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    cfg = load_config(Path(args.config), args.new)
    committed = load_config(Path(args.config)).grpo.rollout
    g = cfg.grpo
    names = args.arms.split(",")
    if sorted(names) not in (["baseline", "new"], ["baseline", "config", "new"]):
        raise SystemExit(f"--arms must be baseline,new or baseline,config,new, got {args.arms!r}")
    store = Store(args.store)
    tasks = load_tasks(store, newest_manifest(store, "curate"), "train.parquet")
    order = seeded_sample(tasks, len(tasks), f"grpo:{cfg.run.seed}:{g.schedule.task_seed_offset}")
    work = Path(tempfile.mkdtemp(prefix="grpo-signal-"))
    model_dir = get_dir(store, newest_manifest(store, "sft"), "model", work / "model")
    tokenizer = load_tokenizer(model_dir)
    limits = episode_limits(cfg.agent)
    sampling = SamplingParams(
        max_new_tokens=cfg.agent.max_new_tokens_per_turn, temperature=g.rollout.temperature, top_p=g.rollout.top_p
    )
    provider = sandbox_pool(cfg.agent.sandbox, git_baseline=True)
    counts: dict[str, int] = {}
    in_flight = max(1, g.rollout.max_in_flight // len(names))
    async with (
        provider,
        open_engine(
            cfg.engine,
            model_dir,
            seed=cfg.run.seed,
            weight_version=0,
            concurrency=2 * in_flight,
            log_dir=work / "engines",
        ) as engine,
    ):

        async def episode(engine: Engine, task: TaskInstance, *, attempt: int, group_id: str) -> Trajectory:
            async def once(retry: int) -> Trajectory:
                return await run_episode(
                    task,
                    engine,
                    provider,
                    tokenizer,
                    limits,
                    sampling,
                    attempt=attempt,
                    group_id=group_id,
                    rid=f"{group_id}/{attempt}/{retry}",
                )

            return await episode_with_retries(once, cfg.agent.infra_retries, counts)

        r = g.rollout
        arms = {
            "baseline": Arm("baseline", args.baseline_attempts, None, in_flight, args.episodes, order, episode, engine),
            "config": Arm(
                "config",
                committed.attempts_per_task,
                curriculum_for(committed, order, cfg.run.seed),
                in_flight,
                args.episodes,
                order,
                episode,
                engine,
            ),
            "new": Arm(
                "new",
                r.attempts_per_task,
                curriculum_for(r, order, cfg.run.seed),
                in_flight,
                args.episodes,
                order,
                episode,
                engine,
            ),
        }
        arms = {name: arms[name] for name in names}
        started = time.monotonic()
        await asyncio.gather(*(arm.run() for arm in arms.values()))
        wall = time.monotonic() - started
    reports = {name: arm.report() for name, arm in arms.items()}
    for name, arm in arms.items():
        curriculum = arm.manager.curriculum
        if curriculum is not None:
            reports[name] |= curriculum.stats()
    base, new = reports["baseline"], reports["new"]

    def ratio(a: dict[str, float], b: dict[str, float]) -> float:
        return a["signal_per_100_episodes"] / max(b["signal_per_100_episodes"], 1e-9)

    extra = {}
    if "config" in reports:
        extra = {
            "ratio_new_vs_config": ratio(new, reports["config"]),
            "ratio_config_vs_baseline": ratio(reports["config"], base),
        }
    return {
        "config": args.config,
        "overrides": args.new,
        "episodes_per_arm": args.episodes,
        "wall_s": round(wall, 1),
        "new_rollout": r.model_dump(
            include={
                "attempts_per_task",
                "probe_attempts",
                "replay_share",
                "max_visits",
                "stratify_by",
                "stratum_floor",
                "stratum_prior",
            }
        ),
        "baseline_attempts": args.baseline_attempts,
        "reports": reports,
        "infra": counts,
        "ratio_signal_per_100_episodes": ratio(new, base),
        **extra,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", default="file://runs/store", help="a store `make run` wrote")
    parser.add_argument("--config", default="configs/local.yaml")
    parser.add_argument("--new", action="append", default=[], help="override for the new arm (KEY=VALUE), repeatable")
    parser.add_argument("--episodes", type=int, default=240, help="episodes each arm starts")
    parser.add_argument("--baseline-attempts", type=int, default=8, help="the baseline's group size")
    parser.add_argument("--arms", default="baseline,new", help="baseline,new or baseline,config,new")
    parser.add_argument("--out", help="write the JSON result here too")
    args = parser.parse_args(argv)
    result = asyncio.run(main_async(args))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    b, n = result["reports"]["baseline"], result["reports"]["new"]
    print(
        f"groups with signal per 100 episodes: baseline {b['signal_per_100_episodes']:.1f} "
        f"({b['signal_groups']} of {b['groups']} groups, {b['episodes']} episodes), new "
        f"{n['signal_per_100_episodes']:.1f} ({n['signal_groups']} of {n['groups']}, {n['episodes']} episodes): "
        f"{result['ratio_signal_per_100_episodes']:.2f}x",
        file=sys.stderr,
    )
    if "config" in result["reports"]:
        c = result["reports"]["config"]
        print(
            f"config (committed) {c['signal_per_100_episodes']:.1f} ({c['signal_groups']} of {c['groups']}, "
            f"{c['episodes']} episodes): new / config {result['ratio_new_vs_config']:.2f}x, config / baseline "
            f"{result['ratio_config_vs_baseline']:.2f}x",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
