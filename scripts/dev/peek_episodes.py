"""Run a model on a few tasks and print the episodes (development aid)."""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import random
from collections import Counter
from pathlib import Path

from swerl.config import load_config
from swerl.data.taskio import tasks_from_parquet
from swerl.stages.evaluate import EvaluateStage, evaluate_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("tasks", help="a parquet file of tasks")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--attempts", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--show", type=int, default=3)
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()
    cfg = load_config("configs/local.yaml", args.set)
    tasks = tasks_from_parquet(Path(glob.glob(args.tasks)[0]).read_bytes())
    tasks = random.Random(0).sample(tasks, min(args.n, len(tasks)))
    stage = EvaluateStage(
        evaluate=cfg.evaluate.model_copy(update={"attempts": args.attempts, "temperature": args.temperature}),
        agent=cfg.agent,
        engine=cfg.engine,
    )
    trajectories, _ = asyncio.run(evaluate_model(Path(glob.glob(args.model)[0]), tasks, stage, 0, {}))
    print(Counter(t.status.value for t in trajectories), "resolved", sum(t.reward == 1.0 for t in trajectories))
    by_id = {t.instance_id: t for t in tasks}
    for t in trajectories[: args.show]:
        print("=" * 30, t.task_id, t.status.value, by_id[t.task_id].modifier)
        print(by_id[t.task_id].patch)
        for m in t.messages[1:]:
            print("--", m["role"])
            print(m["content"][:600])
    print(json.dumps([t.status.value for t in trajectories]))


if __name__ == "__main__":
    main()
