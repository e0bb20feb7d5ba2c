"""Evaluation of checkpoints beside asynchronous GRPO training (grpo.mode async, grpo.eval.every > 0).

Every eval_every trainer steps, the weights the trainer just exported for the engine are hard-linked into the
stage's work folder (the trainer prunes its own exports) and evaluated on the held-out split: the evaluate
stage's stratified subset of grpo.eval.tasks tasks (the same saved subset an evaluate stage of that size uses),
grpo.eval.attempts attempts per task, through swerl.stages.evaluate.evaluate_model. The evaluation has its own
engine (open_engine on the linked checkpoint, concurrency grpo.eval.concurrency) and its own sandbox pool (at most
grpo.eval.concurrency sandboxes, no warm ones), and runs on a thread of its own with its own event loop: neither
the trainer nor the rollout manager waits for it, and its blocking parts (model load, bootstrap) never stall the
rollouts' event loop.

At most one evaluation runs; one that comes due while another runs is skipped and counted (`eval/skipped`). A
finished one logs `eval/*` (pass@1 with its CI, tasks, missing, pass@k, wall time) at the trainer step it
evaluated and joins the report. When training ends, a running evaluation is awaited (grpo.eval.at_end wait, the
default) or cancelled (cancel); a crashed training always cancels it. Either way its engine and sandbox pool are
closed before the stage goes on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from swerl.config.agent import AgentConfig
from swerl.config.engine import EngineConfig
from swerl.config.evaluate import EvaluateConfig
from swerl.config.grpo import GRPOConfig
from swerl.data.schema import TaskInstance
from swerl.eval.stratify import Subset
from swerl.stages.common import input_manifest, load_tasks
from swerl.stages.evaluate import EvaluateStage, evaluate_model, load_or_draw_subset, summarize
from swerl.stages.runner import StageContext

CANCEL_TIMEOUT_S = 120.0
"""How long a cancelled evaluation may take to close its engine and sandboxes before it is abandoned."""


def link_checkpoint(source: Path, target: Path) -> Path:
    """A private copy of an exported checkpoint: hard links (exports are never modified once renamed into
    place), or a plain copy where links are refused."""
    if target.exists():
        shutil.rmtree(target)
    try:
        shutil.copytree(source, target, copy_function=os.link)
    except OSError:
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)
    return target


def checkpoint_evaluator(
    ctx: StageContext, g: GRPOConfig, agent: AgentConfig, engine: EngineConfig
) -> CheckpointEvaluator | None:
    """The evaluator of an async GRPO stage (None when grpo.eval.every is 0); checks its inputs before training."""
    if g.eval.every == 0:
        return None
    if engine.launch.urls:
        raise ValueError(
            "grpo.eval.every needs an engine of its own, but engine.launch.urls points at running engines (the "
            "rollouts'); leave engine.launch.urls empty or set grpo.eval.every to 0"
        )
    curate = input_manifest(ctx, "curate")
    held_out = load_tasks(ctx.store, curate, "eval.parquet")
    if not held_out:
        raise ValueError(f"grpo.eval.every: the curate stage ({curate.uri}) produced no held-out tasks")
    if g.eval.tasks > len(held_out):
        raise ValueError(
            f"grpo.eval.tasks ({g.eval.tasks}) is larger than the {len(held_out)} held-out tasks of {curate.uri}: "
            f"lower it to at most {len(held_out)}"
        )
    pool = agent.sandbox.pool.model_copy(update={"max_concurrent": g.eval.concurrency, "warm_size": 0})
    cfg = EvaluateStage(
        evaluate=EvaluateConfig(
            max_tasks=g.eval.tasks,
            attempts=g.eval.attempts,
            temperature=g.eval.temperature,
            concurrency=g.eval.concurrency,
            grader=g.eval.grader,
        ),
        agent=agent.model_copy(update={"sandbox": agent.sandbox.model_copy(update={"pool": pool})}),
        # its own servers never take the rollouts' ports
        engine=engine.model_copy(update={"launch": engine.launch.model_copy(update={"base_port": 0})}),
    )
    subset, subset_uri = load_or_draw_subset(ctx.store, held_out, cfg.evaluate, ctx.seed)
    return CheckpointEvaluator(ctx, g.eval.every, cfg, subset.select(held_out), subset, subset_uri)


class CheckpointEvaluator:
    """Starts, skips, logs and closes the evaluations of one stage (see the module docstring)."""

    def __init__(
        self,
        ctx: StageContext,
        every: int,
        cfg: EvaluateStage,
        tasks: list[TaskInstance],
        subset: Subset,
        subset_uri: str,
    ) -> None:
        self.ctx, self.every, self.cfg, self.tasks = ctx, every, cfg, tasks
        self.subset, self.subset_uri = subset, subset_uri
        self.root = ctx.workdir / "eval_checkpoints"
        self.entries: list[dict[str, Any]] = []
        self.skipped: list[int] = []
        self.cancelled: list[int] = []
        self.errors: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="swerl-grpo-eval")
        self._cancel = threading.Event()
        self._inner: tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def after_export(self, export: Path, step: int) -> None:
        """The trainer exported (and the engine loaded) step's weights: start an evaluation when one is due."""
        if step % self.every != 0:
            return
        if self.running:
            self.skipped.append(step)
            self.ctx.log.info("grpo eval: step %d skipped, an evaluation is still running", step)
            self.ctx.log_metrics({"eval/skipped": float(len(self.skipped))}, step=step)
            return
        path = link_checkpoint(export, self.root / f"step_{step:08d}")
        self._cancel.clear()
        self._task = asyncio.create_task(self._run(step, path), name=f"grpo-eval-{step}")

    async def _run(self, step: int, path: Path) -> None:
        loop = asyncio.get_running_loop()
        try:
            entry = await loop.run_in_executor(self._executor, self._thread_main, step, path)
        except Exception as exc:  # noqa: BLE001 - an evaluation never fails training; it is reported
            self.errors.append({"step": step, "error": f"{type(exc).__name__}: {exc}"})
            self.ctx.log.warning("grpo eval: evaluation of step %d failed: %s", step, exc)
            return
        finally:
            shutil.rmtree(path, ignore_errors=True)
        if entry is None:
            self.cancelled.append(step)
            self.ctx.log.info("grpo eval: evaluation of step %d cancelled", step)
            return
        self.entries.append(entry)
        metrics = {
            f"eval/{key.replace('@', '_at_')}": float(entry[key])
            for key in ("pass@1", "ci_low", "ci_high", "tasks", "missing", "wall_s")
        }
        metrics |= {f"eval/pass_at_{row['k']}": float(row["value"]) for row in entry["pass@k"]}
        self.ctx.log_metrics(metrics, step=step)
        self.ctx.log.info(
            "grpo eval: step %d pass@1 %.3f [%.3f, %.3f] over %d tasks (%d missing), %.0f s",
            step,
            entry["pass@1"],
            entry["ci_low"],
            entry["ci_high"],
            entry["tasks"],
            entry["missing"],
            entry["wall_s"],
        )

    def _thread_main(self, step: int, path: Path) -> dict[str, Any] | None:
        """On the evaluation's thread: its own event loop; None when it was cancelled."""
        try:
            return asyncio.run(self._evaluate(step, path))
        except asyncio.CancelledError:
            return None
        finally:
            self._inner = None

    async def _evaluate(self, step: int, path: Path) -> dict[str, Any]:
        task = asyncio.current_task()
        assert task is not None
        self._inner = (asyncio.get_running_loop(), task)
        if self._cancel.is_set():  # cancelled before this loop could be reached
            raise asyncio.CancelledError
        started_at, started = time.time(), time.monotonic()
        counts: dict[str, int] = {}
        trajectories, _ = await evaluate_model(path, self.tasks, self.cfg, self.ctx.seed, counts)
        summary = summarize(trajectories, self.tasks, self.cfg.evaluate, self.ctx.seed, self.subset)
        keep = (
            "pass@1",
            "ci_low",
            "ci_high",
            "tasks",
            "attempts",
            "missing",
            "pass@k",
            "statuses",
            "tasks_any_resolved",
            "turns_mean",
            "malformed_calls_mean",
        )
        return {
            "step": step,
            **{k: summary[k] for k in keep if k in summary},
            "failures": counts,
            "attempts_per_task": self.cfg.evaluate.attempts,
            "started_at": started_at,
            "finished_at": time.time(),
            "wall_s": time.monotonic() - started,
        }

    def _cancel_inner(self) -> None:
        self._cancel.set()
        inner = self._inner
        if inner is not None:
            loop, task = inner
            with contextlib.suppress(RuntimeError):  # its loop already closed: the evaluation is over
                loop.call_soon_threadsafe(task.cancel)

    async def close(self, cancel: bool) -> None:
        """Await (cancel False) or cancel the running evaluation; its engine and sandboxes are closed when this
        returns (a cancelled one that does not close within CANCEL_TIMEOUT_S is abandoned with a warning)."""
        task = self._task
        if task is not None and not task.done():
            step = task.get_name().rsplit("-", 1)[-1]
            if cancel:
                self.ctx.log.info("grpo eval: cancelling the evaluation of step %s", step)
                self._cancel_inner()
            else:
                self.ctx.log.info("grpo eval: training done, waiting for the evaluation of step %s", step)
            try:
                await asyncio.wait_for(asyncio.shield(task), CANCEL_TIMEOUT_S if cancel else None)
            except TimeoutError:
                self.ctx.log.warning(
                    "grpo eval: the cancelled evaluation of step %s did not end in %.0f s", step, CANCEL_TIMEOUT_S
                )
        self._executor.shutdown(wait=False, cancel_futures=True)

    def report(self) -> dict[str, Any]:
        return {
            "every": self.every,
            "subset": self.subset_uri,
            "task_ids": [t.instance_id for t in self.tasks],
            "evaluated": self.entries,
            "skipped": self.skipped,
            "cancelled": self.cancelled,
            "errors": self.errors,
        }

    def summary_line(self) -> str:
        done = ", ".join(f"step {e['step']} pass@1 {e['pass@1']:.2f} (n={e['tasks']})" for e in self.entries)
        extra = [
            f"{len(v)} {name}"
            for name, v in (("skipped", self.skipped), ("cancelled", self.cancelled), ("failed", self.errors))
            if v
        ]
        return (done or "none finished") + (f"; {', '.join(extra)}" if extra else "")
