"""GRPO in phases: each phase's effective grpo/agent/engine settings (the base settings with its changes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from swerl.config.agent import AgentConfig
from swerl.config.base import deep_merge
from swerl.config.engine import EngineConfig
from swerl.config.grpo import GRPOConfig, GRPOPhaseConfig, GRPOPhaseTasks

PHASE_SECTIONS = ("grpo", "agent", "engine")
"""Config sections a GRPO phase may change (each against the base settings, not the previous phase's)."""
PHASE_FIXED_KEYS: dict[str, str] = {
    "grpo.phases": "phases do not nest",
    "grpo.mode": "every phase continues the same loop's state (sync and async checkpoints differ)",
    "grpo.distributed": "every phase loads the previous phase's checkpoint, written by the same trainer layout",
    "grpo.schedule.steps": "a phase's own steps are grpo.phases[i].steps",
    "grpo.schedule.task_seed_offset": "one seeded data stream runs through all phases (use grpo.phases[i].tasks "
    "to choose tasks)",
}
"""Keys a phase may not change, and why."""


@dataclass(frozen=True)
class ResolvedPhase:
    """A GRPO phase with its effective settings (the base settings with its changes applied)."""

    index: int
    name: str
    stage: str
    """`grpo` for the single default phase (no grpo.phases), else `grpo-NAME`."""
    steps: int
    reset_optimizer: bool
    tasks: GRPOPhaseTasks | None
    grpo: GRPOConfig
    agent: AgentConfig
    engine: EngineConfig


def _flat_keys(data: dict[str, Any], prefix: str) -> list[str]:
    keys = []
    for key, value in data.items():
        path = f"{prefix}.{key}"
        keys.append(path)
        if isinstance(value, dict):
            keys += _flat_keys(value, path)
    return keys


def resolve_phases(grpo: GRPOConfig, agent: AgentConfig, engine: EngineConfig) -> list[ResolvedPhase]:
    """The GRPO phases in order, each with its effective grpo/agent/engine settings; without grpo.phases, one
    phase (stage `grpo`) with the base settings. ValueError naming the phase and key for bad input."""
    if grpo.phases is None:
        return [ResolvedPhase(0, "grpo", "grpo", grpo.schedule.steps, False, None, grpo, agent, engine)]
    if not grpo.phases:
        raise ValueError(
            "grpo.phases is an empty list: give at least one phase, or leave grpo.phases out for "
            "one phase with the base grpo settings"
        )
    seen: set[str] = set()
    out = []
    for i, phase in enumerate(grpo.phases):
        where = f"grpo.phases[{i}] ({phase.name})"
        if phase.name in seen:
            raise ValueError(f"{where}: name {phase.name!r} is used by an earlier phase; names must differ")
        seen.add(phase.name)
        out.append(_resolve_phase(i, phase, where, {"grpo": grpo, "agent": agent, "engine": engine}))
    return out


def _resolve_phase(index: int, phase: GRPOPhaseConfig, where: str, bases: dict[str, BaseModel]) -> ResolvedPhase:
    changes = {"grpo": phase.grpo, "agent": phase.agent, "engine": phase.engine}
    for section, body in changes.items():
        for key in _flat_keys(body, section):
            if key in PHASE_FIXED_KEYS:
                raise ValueError(f"{where}: {key} cannot change in a phase: {PHASE_FIXED_KEYS[key]}")
    models: dict[str, BaseModel] = {}
    for section, body in changes.items():
        base = bases[section].model_dump(mode="json", by_alias=True)
        if section == "grpo":
            base["phases"] = None
            base["schedule"]["steps"] = phase.steps
        cls = type(bases[section])
        try:
            models[section] = cls.model_validate(deep_merge(base, body))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join([section, *(str(p) for p in err['loc'])])}: {err['msg']}" for err in exc.errors()
            )
            raise ValueError(f"{where}: {problems}") from None
    g, agent, engine = models["grpo"], models["agent"], models["engine"]
    base_grpo = bases["grpo"]
    assert (
        isinstance(g, GRPOConfig)
        and isinstance(agent, AgentConfig)
        and isinstance(engine, EngineConfig)
        and isinstance(base_grpo, GRPOConfig)
    )
    if agent.max_trajectory_tokens > engine.max_context_tokens:
        raise ValueError(
            f"{where}: agent.max_trajectory_tokens ({agent.max_trajectory_tokens}) exceeds the phase's "
            f"engine.max_context_tokens ({engine.max_context_tokens}): a phase cannot loosen a cap beyond the "
            "engine's context"
        )
    if phase.tasks is not None and g.mode != "async":
        raise ValueError(f"{where}: tasks needs grpo.mode async (the sync loop takes B tasks in order)")
    if g.distributed.backend == "megatron" and index > 0:
        if phase.reset_optimizer:
            raise ValueError(f"{where}: reset_optimizer is not built for the megatron backend")
        if g.algorithm.lr != base_grpo.algorithm.lr or g.algorithm.weight_decay != base_grpo.algorithm.weight_decay:
            raise ValueError(
                f"{where}: grpo.algorithm.lr / weight_decay cannot change between phases with the "
                "megatron backend (its optimizer state carries them)"
            )
    return ResolvedPhase(
        index, phase.name, f"grpo-{phase.name}", phase.steps, phase.reset_optimizer, phase.tasks, g, agent, engine
    )
