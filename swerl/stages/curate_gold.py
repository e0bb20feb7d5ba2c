"""Gold checks of loaded rows (`curate.gold_check`): a published SWE-bench-style row is kept only if, in its own
image and through swerl's one grader (`grade_patch`, as training reward and evaluation grade), its reference fix
resolves it (RESOLVED_FULL) and the empty patch does not.

A row whose reference fix does not resolve it would pay reward 0 to every correct attempt; a row whose empty patch
already passes would pay reward 1 for doing nothing. Both are dropped and counted by cause (`gold_unresolved`,
`gold_does_not_apply`, `empty_resolved`; a row with two causes counts under both). Only rows whose image is on the
Docker engine are checked (nothing is pulled); the others are kept and counted as unchecked. A check that fails
for the infrastructure (InfraError: a sandbox that did not start, a test patch that does not apply) says nothing
about the row: it is kept and counted apart by the error's cause.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from swerl.config.data import CurateConfig
from swerl.data.environments import image_environment, is_image_reference
from swerl.data.schema import TaskInstance
from swerl.errors import InfraError
from swerl.grading.grader import RESOLVED_FULL, grade_patch
from swerl.sandbox.base import SandboxProvider
from swerl.sandbox.pool import release_provider
from swerl.stages.common import run_async, sandbox_provider
from swerl.stages.runner import StageContext

DETAIL_ROWS = 200
"""Rows of the report's per-row table (dropped and infra rows first)."""


@dataclass
class GoldCheckResult:
    """The rows kept and the report section (curate_report.json's `gold_check`)."""

    kept: list[TaskInstance]
    report: dict[str, Any] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """MLflow metrics: gold_check.checked / kept / no_image, gold_check.dropped.CAUSE, gold_check.infra.CAUSE."""
        r = self.report
        if not r.get("enabled"):
            return {}
        out = {f"gold_check.{k}": float(r[k]) for k in ("checked", "dropped", "no_image", "infra_errors")}
        out |= {f"gold_check.dropped.{cause}": float(n) for cause, n in r["causes"].items()}
        out |= {f"gold_check.infra.{cause}": float(n) for cause, n in r["infra_causes"].items()}
        return out


def docker_image(task: TaskInstance) -> str | None:
    """The Docker image a fix-kind (SWE-bench-style) task runs in, or None for any other task."""
    if task.patch_kind != "fix" or task.verifier is not None or not is_image_reference(task.image):
        return None
    try:
        return image_environment(task.image).image
    except ValueError:
        return None


def present_images(names: set[str]) -> set[str]:
    """The names among `names` the local Docker engine has (inspected only; no engine: none)."""
    try:
        import docker
        import docker.errors

        client = docker.from_env(timeout=60)
    except Exception:  # noqa: BLE001 - no SDK or no engine: no image is present to check with
        return set()
    found = set()
    try:
        for name in sorted(names):
            try:
                client.images.get(name)
                found.add(name)
            except docker.errors.ImageNotFound:
                pass
    except Exception:  # noqa: BLE001 - the engine does not answer: none of its images can be checked with
        return set()
    finally:
        client.close()
    return found


async def check_row(provider: SandboxProvider, task: TaskInstance, timeout_s: float) -> dict[str, Any]:
    """Grade the row's reference fix and the empty patch; {instance_id, gold, empty, causes} or {.., infra}."""
    row: dict[str, Any] = {"instance_id": task.instance_id}
    try:
        gold = await grade_patch(provider, task, task.patch, timeout_s)
        empty = await grade_patch(provider, task, "", timeout_s)
    except InfraError as exc:
        return row | {"infra": exc.cause, "detail": exc.message[-300:]}
    causes = []
    if gold.status == "PATCH_APPLY_FAILED":
        causes.append("gold_does_not_apply")
    elif gold.status != RESOLVED_FULL:
        causes.append("gold_unresolved")
    if empty.status == RESOLVED_FULL:
        causes.append("empty_resolved")
    return row | {"gold": gold.status, "empty": empty.status, "causes": causes}


def gold_check(cfg: CurateConfig, ctx: StageContext, tasks: list[TaskInstance]) -> GoldCheckResult:
    """The loaded `tasks` less the rows whose gold check failed, and the report (see the module docstring)."""
    if not cfg.gold_check:
        return GoldCheckResult(list(tasks), {"enabled": False})
    images = {t.instance_id: image for t in tasks if (image := docker_image(t))}
    present = present_images(set(images.values())) if images else set()
    checked = [t for t in tasks if images.get(t.instance_id) in present]
    rows: list[dict[str, Any]] = []
    if checked:
        ctx.log.info(
            "curate: gold check of %d loaded rows in their images (%d without one on the engine)",
            len(checked),
            len(images) - len(checked),
        )
        provider = sandbox_provider(cfg.sandbox, git_baseline=True)
        gate = asyncio.Semaphore(cfg.validation_workers)

        async def one(task: TaskInstance) -> dict[str, Any]:
            async with gate:
                return await check_row(provider, task, cfg.sandbox.timeout_s)

        async def every() -> list[dict[str, Any]]:
            return list(await asyncio.gather(*(one(t) for t in checked)))

        try:
            rows = run_async(every())
        finally:
            release_provider(provider)
    dropped = {r["instance_id"] for r in rows if r.get("causes")}
    causes = Counter(c for r in rows for c in r.get("causes", []))
    infra = Counter(r["infra"] for r in rows if "infra" in r)
    for r in rows:
        if r.get("causes"):
            ctx.log.warning(
                "curate: gold check dropped %s: %s (gold %s, empty %s)",
                r["instance_id"],
                ", ".join(r["causes"]),
                r["gold"],
                r["empty"],
            )
    shown = sorted(rows, key=lambda r: (not r.get("causes") and "infra" not in r, r["instance_id"]))
    report = {
        "enabled": True,
        "checked": len(checked),
        "kept_checked": len(checked) - len(dropped),
        "dropped": len(dropped),
        "causes": dict(sorted(causes.items())),
        "infra_errors": sum(infra.values()),
        "infra_causes": dict(sorted(infra.items())),
        "no_image": len(images) - len(checked),
        "not_image_rows": len(tasks) - len(images),
        "rows": shown[:DETAIL_ROWS],
    }
    return GoldCheckResult([t for t in tasks if t.instance_id not in dropped], report)
