"""Trajectory: the record of one agent episode, token-exact, as the GRPO trainer consumes it.

`token_ids` is the prompt followed by every turn exactly as the engine saw and sampled it (never re-tokenized).
The per-token arrays are aligned with it: `loss_mask` is 1 only on tokens the policy sampled, and those tokens
carry the log-prob under the policy that sampled them (`behaviour_logprobs`) and that policy's weight version
(`token_weight_versions`); every other token carries 0.0 and -1.
"""

from __future__ import annotations

import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EpisodeStatus(enum.StrEnum):
    """How an episode ended."""

    RESOLVED = "resolved"
    """Submitted, and the task's tests pass."""
    UNRESOLVED = "unresolved"
    """Submitted, and some FAIL_TO_PASS or PASS_TO_PASS test fails."""
    TURN_CAP = "turn_cap"
    """Ran out of turns before submitting (still graded: the reward comes from the tests)."""
    LENGTH_CAP = "length_cap"
    """Ran out of trajectory tokens before submitting (still graded)."""
    TIMEOUT = "timeout"
    """Ran out of wall-clock time before submitting (still graded)."""
    MALFORMED = "malformed"
    """Too many malformed tool calls in a row (still graded)."""
    INFRA_ERROR = "infra_error"
    """Sandbox or engine failed: not the policy's fault, never scored (reward None)."""


class PhaseTimings(BaseModel):
    """Wall-clock seconds spent per phase of one episode."""

    model_config = ConfigDict(extra="forbid")

    env_install_s: float = 0.0
    """Preparing the task's environment (repository materialized, image pulled) before the sandbox starts."""
    sandbox_start_s: float = 0.0
    llm_s: float = 0.0
    tools_s: float = 0.0
    """The agent's commands (exec) in the sandbox."""
    tests_s: float = 0.0
    total_s: float = 0.0
    sandbox_s: float = 0.0
    """Sandbox-seconds: from the start request to the end of close (what a cloud backend bills)."""


class Trajectory(BaseModel):
    """One episode: ids, aligned per-token arrays, outcome and timings (every number finite: a NaN reward or
    log-prob read back from a damaged row would reach the loss)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    task_id: str
    attempt: int = Field(0, ge=0)
    """Which try at this task within its group (retries after an infra error reuse the number)."""
    group_id: str = ""
    """The GRPO group this episode belongs to (its advantage baseline)."""
    status: EpisodeStatus
    reward: float | None
    """1.0 iff the task's tests pass at the end; None exactly when status is infra_error."""
    prompt_tokens: int = Field(0, ge=0)
    """How many leading token_ids are the prompt (system + user + generation prompt)."""
    token_ids: list[int] = Field(default_factory=list)  # (T,)
    loss_mask: list[int] = Field(default_factory=list)  # (T,) 1 on sampled tokens only
    behaviour_logprobs: list[float] = Field(default_factory=list)  # (T,) 0.0 where loss_mask is 0
    token_weight_versions: list[int] = Field(default_factory=list)  # (T,) -1 where loss_mask is 0
    num_turns: int = Field(0, ge=0)
    """Assistant turns sampled."""
    malformed_tool_calls: int = Field(0, ge=0)
    timings: PhaseTimings = Field(default_factory=PhaseTimings)
    infra_cause: str | None = None
    """InfraError cause when status is infra_error."""
    infra_message: str | None = None
    patch: str = ""
    """The agent's changes as a `git diff` against the task's starting state (caches excluded)."""
    grade_status: str = ""
    """The grader's status (swerl/grading/grader.py: RESOLVED_FULL, RESOLVED_NO, TAMPERED, INCOMPLETE, ...)."""
    dropped_paths: list[str] = Field(default_factory=list)
    """Test files and test infrastructure the patch touched, which grading took from the task instead."""
    tampered: list[str] = Field(default_factory=list)
    """Tampering with the test machinery the sealed runner saw (the attempt scored 0)."""
    messages: list[dict[str, Any]] = Field(default_factory=list)
    """The conversation as role/content dicts, for debugging and trace export (not for training)."""

    @model_validator(mode="after")
    def _aligned(self) -> Trajectory:
        length = len(self.token_ids)
        for name in ("loss_mask", "behaviour_logprobs", "token_weight_versions"):
            if len(getattr(self, name)) != length:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries, token_ids has {length}")
        if self.prompt_tokens > length:
            raise ValueError(f"prompt_tokens {self.prompt_tokens} exceeds the {length} token_ids")
        for index, (mask, logprob, version) in enumerate(
            zip(self.loss_mask, self.behaviour_logprobs, self.token_weight_versions, strict=True)
        ):
            if mask == 1:
                if version < 0 or logprob > 0.0:
                    raise ValueError(
                        f"sampled token {index} needs a weight version >= 0 and a log-prob <= 0, "
                        f"got {version} and {logprob}"
                    )
            elif mask == 0:
                if version != -1 or logprob != 0.0:
                    raise ValueError(f"non-sampled token {index} must carry version -1 and log-prob 0.0")
            else:
                raise ValueError(f"loss_mask[{index}] is {mask}, not 0 or 1")
        if any(self.loss_mask[: self.prompt_tokens]):
            raise ValueError("a prompt token is marked as sampled")
        if (self.status is EpisodeStatus.INFRA_ERROR) != (self.reward is None):
            raise ValueError(f"reward must be None exactly for infra_error episodes (status {self.status})")
        if self.status is EpisodeStatus.INFRA_ERROR and not self.infra_cause:
            raise ValueError("an infra_error episode needs its infra_cause")
        return self

    @property
    def sampled_tokens(self) -> int:
        """How many tokens the policy sampled."""
        return sum(self.loss_mask)
