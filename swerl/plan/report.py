"""The plan as it is printed: its lines, memory lines and checks, and how sizes and GPUs are written."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from swerl.plan.architecture import Architecture

GIB = 2**30
"""Bytes in a GiB: every memory figure of the plan is in GiB (GB = 10^9 only where the recipe's figure is)."""


@dataclass(frozen=True)
class PlanCheck:
    name: str
    ok: bool
    detail: str


@dataclass
class MemoryLine:
    """What one GPU (or a node's host) holds, by item, against its budget."""

    where: str
    who: str
    items: dict[str, int]
    budget: float
    budget_text: str
    extra: str = ""

    @property
    def total(self) -> int:
        return sum(self.items.values())

    @property
    def ok(self) -> bool:
        return self.total <= self.budget

    def text(self) -> str:
        parts = " + ".join(f"{name} {size_text(value)}" for name, value in self.items.items() if value)
        margin = self.budget - self.total
        verdict = f"ok, {size_text(margin)} to spare" if margin >= 0 else f"OVER by {size_text(-margin)}"
        line = f"{self.where} ({self.who}): {parts or 'nothing'} = {size_text(self.total)} of {self.budget_text}: "
        return line + verdict + (f"; {self.extra}" if self.extra else "")

    def shortfall(self) -> str:
        return (
            f"{self.where} ({self.who}) needs {size_text(self.total)} but has {self.budget_text}: "
            f"{size_text(self.total - self.budget)} short"
        )

    def fits(self) -> str:
        return f"{self.where} ({self.who}): {size_text(self.total)} of {self.budget_text}"


@dataclass
class Plan:
    source: str
    arch: Architecture
    cluster: str
    placement: list[str] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)
    gpu_memory: list[MemoryLine] = field(default_factory=list)
    host_memory: list[MemoryLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checks: list[PlanCheck] = field(default_factory=list)
    model_lines: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failed(self) -> list[PlanCheck]:
        return [c for c in self.checks if not c.ok]

    def text(self) -> str:
        lines = [f"plan of {self.source}", "model:"] + [f"  {line}" for line in self.model_lines]
        lines += [f"cluster: {self.cluster}", "placement:"] + [f"  {line}" for line in self.placement]
        lines += ["processes and ports:"] + [f"  {line}" for line in self.processes]
        lines.append("memory per GPU:")
        lines += [f"  {m.text()}" for m in self.gpu_memory] or ["  no GPU (cluster.gpus_per_node is 0)"]
        lines += ["host memory per node (peak stage):"] + [f"  {m.text()}" for m in self.host_memory]
        if self.notes:
            lines += ["notes:"] + [f"  - {note}" for note in self.notes]
        lines += ["checks:"] + [f"  {'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}" for c in self.checks]
        failed = [c.name for c in self.failed]
        lines.append(f"plan: {'refused: ' + ', '.join(failed) if failed else 'ok'}")
        return "\n".join(lines)

    def refusal(self) -> str:
        """The failed checks, one per line (what `swerl run` prints when it refuses)."""
        return "swerl plan refuses this config:\n  " + "\n  ".join(f"{c.name}: {c.detail}" for c in self.failed)


def size_text(value: float) -> str:
    if abs(value) >= GIB / 10:
        return f"{value / GIB:,.1f} GiB"
    return f"{value / 2**20:,.1f} MiB"


def count_text(n: int) -> str:
    if n >= 10**9:
        return f"{n / 1e9:,.2f} B"
    return f"{n / 1e6:,.2f} M" if n >= 10**6 else f"{n:,}"


def decimal_text(value: float) -> str:
    """Bytes in decimal units (GB = 10^9), as the recipe states its KV-cache figure."""
    return f"{value / 1e9:,.2f} GB" if value >= 10**8 else f"{value / 1e6:,.2f} MB"


def each_gpu(gpus: Sequence[int]) -> str:
    return "; each GPU" if len(gpus) > 1 else ""


def span_text(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def where_text(gpus: Sequence[int], per_node: int) -> str:
    """GPUs (global indices) as "node N GPU a-b", one run per node."""
    runs: list[str] = []
    for node in sorted({g // per_node for g in gpus}):
        local = [g % per_node for g in gpus if g // per_node == node]
        runs.append(f"node {node} GPU {span_text(min(local), max(local))}")
    return ", ".join(runs)
