"""Sandboxes: the Sandbox protocol and its backends (local bubblewrap; docker and e2b elsewhere)."""

from swerl.sandbox.base import ExecResult, Sandbox, SandboxProvider, SandboxResources
from swerl.sandbox.local import LocalSandbox, LocalSandboxProvider

__all__ = [
    "ExecResult",
    "LocalSandbox",
    "LocalSandboxProvider",
    "Sandbox",
    "SandboxProvider",
    "SandboxResources",
]
