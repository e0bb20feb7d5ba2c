"""Smoke-run traces -> sft -> grpo -> evaluate on a given pair of task files (development aid, not a test)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from pydantic import BaseModel

from swerl.config import load_config
from swerl.pipeline import open_session
from swerl.stages.common import put_dir
from swerl.stages.evaluate import EvaluateStage, run_evaluate
from swerl.stages.grpo import GRPOStage, run_grpo
from swerl.stages.runner import StageContext, StageResult
from swerl.stages.sft import SFTStage, run_sft
from swerl.stages.traces import TracesStage, run_traces


class LiteralModel(BaseModel):
    model: str


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="configs/local.yaml")
    parser.add_argument("--tasks", type=Path, required=True, help="folder with train.parquet and eval.parquet")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--stages", default="traces,sft,grpo,evaluate")
    parser.add_argument("--sft-model", type=Path, help="use this model folder as the SFT stage's output")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stdout)
    for noisy in ("httpx", "alembic", "mlflow"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    cfg = load_config(args.config, args.set)

    def literal_curate(_: object, ctx: StageContext) -> StageResult:
        for name in ("train.parquet", "eval.parquet"):
            ctx.write_artifact(name, (args.tasks / name).read_bytes())
        return StageResult(summary="literal tasks")

    wanted = args.stages.split(",")
    with open_session(cfg) as s:
        curate = s.run_stage("curate", literal_curate, cfg.curate).manifest
        if "sft" not in wanted:
            return
        if args.sft_model is not None:

            def literal_sft(_: object, ctx: StageContext) -> StageResult:
                put_dir(ctx, "model", args.sft_model)
                put_dir(ctx, "base", args.sft_model)
                return StageResult(summary=f"literal model {args.sft_model}")

            literal = LiteralModel(model=str(args.sft_model.resolve()))
            sft = s.run_stage("sft", literal_sft, literal, [curate]).manifest
        else:
            traces = s.run_stage(
                "traces", run_traces, TracesStage(traces=cfg.traces, agent=cfg.agent), [curate]
            ).manifest
            sft = s.run_stage(
                "sft",
                run_sft,
                SFTStage.build(sft=cfg.sft, agent=cfg.agent, engine=cfg.engine),
                [curate, traces],
            ).manifest
        if "grpo" not in wanted:
            return
        grpo = s.run_stage(
            "grpo", run_grpo, GRPOStage(grpo=cfg.grpo, agent=cfg.agent, engine=cfg.engine), [curate, sft]
        ).manifest
        if "evaluate" not in wanted:
            return
        s.run_stage(
            "evaluate",
            run_evaluate,
            EvaluateStage(evaluate=cfg.evaluate, agent=cfg.agent, engine=cfg.engine),
            [curate, sft, grpo],
        )
        print(s.summary())


if __name__ == "__main__":
    main()
