"""Prefect tasks: one checkpointed task per pipeline stage, each a thin wrapper over swerl."""
