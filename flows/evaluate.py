"""Scheduled evaluation: evaluate every checkpoint in the store that has no evaluation yet."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from swerl.config import PipelineConfig
from swerl.errors import StageNotBuiltError
from swerl.pipeline import pending_checkpoints, store_for


@flow(name="swerl-evaluate", log_prints=True)
def evaluate(config: PipelineConfig | None = None) -> dict[str, Any]:
    """Find checkpoints not evaluated yet and evaluate each on the saved stratified subset."""
    config = config or PipelineConfig()
    logger = get_run_logger()
    store = store_for(config)
    pending = pending_checkpoints(store)
    if not pending:
        logger.info("no checkpoint in %s awaits evaluation", store.root_uri)
        return {"store": store.root_uri, "evaluated": [], "pending": []}
    raise StageNotBuiltError(
        f"{len(pending)} checkpoint(s) await evaluation ({', '.join(pending)}), "
        "but the evaluation stage is not built yet in this version of swerl"
    )
