"""Scheduled evaluation: evaluate every checkpoint in the store that has no evaluation yet.

`swerl serve` registers this flow as a deployment on the cron schedule `serve.eval_cron`. Each pending checkpoint
(swerl.stages.schedule) is evaluated by the evaluate stage on the same saved stratified subset as every other
checkpoint of its run; a checkpoint that fails (e.g. does not load) does not stop the others, but fails the run.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from swerl.config import PipelineConfig
from swerl.pipeline import open_session, store_for
from swerl.stages.schedule import pending_evaluations, schedule_report
from tasks.stages import evaluate_checkpoint_task


@flow(name="swerl-evaluate", log_prints=True)
def evaluate(config: PipelineConfig | None = None) -> dict[str, Any]:
    """Find checkpoints not evaluated yet and evaluate each on the saved stratified subset."""
    config = config or PipelineConfig()
    logger = get_run_logger()
    store = store_for(config)
    pending, problems = pending_evaluations(store)
    for problem in problems:
        logger.warning("not evaluated: %s", problem)
    done: list[tuple[Any, str]] = []
    failed: list[str] = []
    if pending:
        logger.info("%d checkpoint(s) await evaluation: %s", len(pending), [p.label for p in pending])
        with open_session(config, flow_run_id=flow_run.get_id()) as session:
            for item in pending:
                state = evaluate_checkpoint_task(session, item.curate, item.checkpoint, return_state=True)
                if state.is_completed():
                    metrics = state.result().metrics
                    scores = {k: round(v, 4) for k, v in metrics.items() if k.endswith("/pass_at_1")}
                    done.append((item, f"evaluated: {scores}"))
                else:
                    failed.append(item.label)
                    done.append((item, f"FAILED: {state.message}"))
    else:
        logger.info("no checkpoint in %s awaits evaluation", store.root_uri)
    report = schedule_report(done, problems, store.root_uri)
    create_markdown_artifact(key="scheduled-evaluation", markdown=report, description="scheduled evaluation")
    if failed:
        raise RuntimeError(
            f"evaluation failed for {failed}; see the run's logs and the scheduled-evaluation report"
        )
    return {"store": store.root_uri, "evaluated": [p.checkpoint.uri for p, _ in done], "problems": problems}
