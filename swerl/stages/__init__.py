"""Stage functions: plain `fn(stage_config, ctx) -> StageResult`, wrapped by tasks/ for Prefect."""
