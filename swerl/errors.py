"""The failure rule: infrastructure errors are never the policy's fault.

An InfraError is raised by sandbox, engine and storage code for anything the policy did not cause (a sandbox
that died or did not start, an engine 5xx or timeout, a missing image, a failed storage write). Callers count it
by `cause`, retry it where configured, and never score it as a wrong answer.
"""

from __future__ import annotations

INFRA_CAUSES: frozenset[str] = frozenset(
    {
        "start_timeout",
        "start_failed",
        "sandbox_died",
        "exec_unresponsive",
        "image_missing",
        "quota",
        "storage",
        "engine_timeout",
        "engine_http",
        "engine_unreachable",
        "verifier_failed",
    }
)


class InfraError(Exception):
    """An infrastructure failure with a named cause (one of INFRA_CAUSES)."""

    def __init__(self, cause: str, message: str = "") -> None:
        if cause not in INFRA_CAUSES:
            raise ValueError(f"unknown infrastructure-error cause {cause!r}; known: {sorted(INFRA_CAUSES)}")
        self.cause = cause
        self.message = message
        super().__init__(f"[{cause}] {message}" if message else cause)


class NoTasksError(RuntimeError):
    """Curation yielded no task from what it was configured with (repositories, Harbor tasks): the stage fails."""
