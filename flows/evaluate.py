"""Scheduled evaluation: evaluate every checkpoint in the store that has no evaluation yet.

`swerl serve` registers this flow as a deployment on the cron schedule `serve.eval_cron`. Each pending checkpoint
(swerl.stages.schedule) is evaluated by the evaluate stage on the same saved stratified subset as every other
checkpoint of its run; a checkpoint that fails (e.g. does not load) does not stop the others, but fails the run.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from flows.pipeline import run_config, run_name, swerl_logs
from swerl.config import PipelineConfig
from swerl.pipeline import open_session, store_for
from swerl.stages.schedule import pending_evaluations, schedule_report
from tasks.stages import evaluate_checkpoint_task

log = logging.getLogger("swerl.flows.evaluate")


@flow(name="swerl-evaluate", flow_run_name=run_name)
def evaluate(config: PipelineConfig | None = None) -> dict[str, Any]:
    """Find checkpoints not evaluated yet and evaluate each on the saved stratified subset.

    Args:
        config: the pipeline's config (from a deployment, the keys given are merged onto the deployment's config).
    """
    run_id = flow_run.get_id()
    with swerl_logs(run_id):
        return _evaluate(run_config(config), run_id)


def _evaluate(config: PipelineConfig, run_id: str | None) -> dict[str, Any]:
    store = store_for(config)
    pending, problems = pending_evaluations(store)
    for problem in problems:
        log.warning("not evaluated: %s", problem)
    done: list[tuple[Any, str]] = []
    failed: list[str] = []
    if pending:
        log.info("%d checkpoint(s) await evaluation: %s", len(pending), [p.label for p in pending])
        with open_session(config, flow_run_id=run_id) as session:
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
        log.info("no checkpoint in %s awaits evaluation", store.root_uri)
    report = schedule_report(done, problems, store.root_uri)
    create_markdown_artifact(key="scheduled-evaluation", markdown=report, description="scheduled evaluation")
    if failed:
        raise RuntimeError(f"evaluation failed for {failed}; see the run's logs and the scheduled-evaluation report")
    return {"store": store.root_uri, "evaluated": [p.checkpoint.uri for p, _ in done], "problems": problems}
