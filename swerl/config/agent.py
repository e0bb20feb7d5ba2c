"""The caps of one agent episode (oracle traces, GRPO rollouts and evaluation share them)."""

from __future__ import annotations

from pydantic import Field

from swerl.config.base import StrictModel
from swerl.config.sandbox import SandboxLimits


class AgentConfig(StrictModel):
    """Every cap of an agent episode (oracle traces, GRPO rollouts and evaluation share them)."""

    max_turns: int = Field(12, ge=1, le=10_000)
    """Assistant turns before the episode ends with status turn_cap."""
    max_trajectory_tokens: int = Field(2048, ge=64, le=1_048_576)
    """Prompt + all turns + observations; past it the episode ends with status length_cap."""
    max_new_tokens_per_turn: int = Field(128, ge=1, le=1_048_576)
    """Most tokens sampled in one assistant turn."""
    max_malformed_calls: int = Field(3, ge=1, le=10_000)
    """Consecutive malformed tool calls before the episode ends (status malformed); each one is counted."""
    command_timeout_s: float = Field(30.0, gt=0, le=86400)
    """Wall clock of one command the agent runs; a timeout is an observation, not an infra error."""
    max_observation_chars: int = Field(2000, ge=100, le=10_000_000)
    """A tool output longer than this is cut in the middle (head and tail kept)."""
    max_command_bytes: int = Field(65_536, ge=256, le=126_976)
    """A bash command longer than this (UTF-8 bytes) is refused with an error observation, not run: one argv
    string cannot exceed Linux's 128 KiB (MAX_ARG_STRLEN), so a longer one would fail to start as if the sandbox
    had broken."""
    max_edit_bytes: int = Field(1_048_576, ge=1024, le=1 << 30)
    """str_replace's `old` and `new` together, and the file it edits, at most this many UTF-8 bytes; more is an
    error observation."""
    test_timeout_s: float = Field(60.0, gt=0, le=86400)
    """Wall clock of the grading test run after the episode."""
    episode_timeout_s: float = Field(600.0, gt=0, le=7 * 86400)
    """Wall clock of the agent's turns (sandbox start and grading excluded)."""
    infra_retries: int = Field(2, ge=0, le=100)
    """Times an episode that ended in an infrastructure error is rerun before it is reported as missing."""
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits)
    """Limits of every episode sandbox."""
