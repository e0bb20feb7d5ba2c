"""The GRPO trainer in a process of its own (grpo.trainer_process).

In the asynchronous loop the rollouts (agent loop, engine calls, sandbox bookkeeping: one event loop) keep running
while the trainer steps. With the trainer in a thread of the same interpreter, the two share the GIL: a small
model's forward and backward are thousands of small torch ops, each dispatched while holding it, so through a whole
update the event loop gets the interpreter back only at switch intervals, and rollouts slow down exactly when they
should be filling the next batch. The recipe runs trainer and rollouts on different machines; this is the same split
on one machine.

`TrainerProcess(factory, *args)` spawns a child that builds the trainer with `factory(*args)` (a module-level
function, so the child can import it) and then serves the trainer's methods: `train_step`, `export_weights`,
`save`, `load`, `save_model`, with `step` mirrored after every call. A call is one pickled request and one pickled
reply over a pipe; weights never cross it (exports and checkpoints are files the child writes, as before). The
child ends when the parent closes the pipe, when the parent process is gone (a watchdog on its parent pid: a
SIGKILLed run leaves no trainer behind), or on `close()`. An exception in the child is raised again in the caller;
a child that dies mid-call (killed, out of memory) raises TrainerProcessDied naming its exit code.
"""

from __future__ import annotations

import abc
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from swerl.train.checkpoint import StreamPosition, TrainerState
from swerl.trajectory import Trajectory

logger = logging.getLogger(__name__)

_PARENT_POLL_S = 0.5
"""How often the child checks that its parent is still alive."""


class TrainerProcessDied(RuntimeError):
    """The trainer's process ended while a call was outstanding (or before it)."""


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(_PARENT_POLL_S)
        if os.getppid() != parent:  # reparented: the run that spawned us is gone
            os._exit(1)


def _serve(
    conn: multiprocessing.connection.Connection,
    parent: int,
    factory: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    """The child: build the trainer, then answer (method, args, kwargs) requests until the pipe closes."""
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="parent-watch").start()
    try:
        trainer = factory(*args)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
        conn.send(("error", _portable(exc), 0))
        return
    conn.send(("ok", None, trainer.step))
    while True:
        try:
            method, call_args, call_kwargs = conn.recv()
        except (EOFError, OSError):
            return
        if method == "close":
            conn.send(("ok", None, trainer.step))
            return
        try:
            result = getattr(trainer, method)(*call_args, **call_kwargs)
        except BaseException as exc:  # noqa: BLE001
            conn.send(("error", _portable(exc), trainer.step))
            continue
        conn.send(("ok", result, trainer.step))


def _portable(exc: BaseException) -> BaseException:
    """The exception itself if it pickles, else a RuntimeError carrying its traceback text."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001
        text = "".join(traceback.format_exception(exc))
        return RuntimeError(f"trainer process: {type(exc).__name__}: {exc}\n{text}")
    return exc


class RemoteTrainer(abc.ABC):
    """The GRPO trainer's methods (grpo_step.Trainer) as calls to trainers elsewhere: `_invoke(method, ...)` is
    one process's pipe (TrainerProcess) or every rank's at once (swerl.train.ranks.DistributedTrainer)."""

    @abc.abstractmethod
    def _invoke(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call `method` on the trainer(s) and return (rank 0's) result."""

    def train_step(self, groups: Sequence[Sequence[Trajectory]]) -> dict[str, float]:
        # The conversation text is for traces and debugging, never for the loss: it does not cross the pipe.
        lean = [[t.model_copy(update={"messages": []}) for t in group] for group in groups]
        result: dict[str, float] = self._invoke("train_step", lean)
        return result

    def scored_attempts(self) -> list[tuple[str, int]]:
        return [(str(group), int(attempt)) for group, attempt in self._invoke("scored_attempts")]

    def export_weights(self, out_dir: str | Path, version: int | None = None) -> Path:
        return Path(self._invoke("export_weights", Path(out_dir), version))

    def save(self, checkpoint_dir: str | Path, position: StreamPosition, *, keep_last: int = 2) -> Path:
        return Path(self._invoke("save", Path(checkpoint_dir), position, keep_last=keep_last))

    def load(self, path: str | Path, *, optimizer: bool = True) -> TrainerState:
        state: TrainerState = self._invoke("load", Path(path), optimizer=optimizer)
        return state

    def weight_specs(self, dtype: str) -> list[Any]:
        """The trainer's weight_specs (TensorSpec list)."""
        return list(self._invoke("weight_specs", dtype))

    def open_weight_group(
        self,
        master_addr: str,
        master_port: int,
        world_size: int,
        backend: str,
        timeout_s: float,
        group_name: str,
        socket_ifname: str | None = None,
    ) -> None:
        self._invoke(
            "open_weight_group",
            master_addr,
            master_port,
            world_size,
            backend,
            timeout_s,
            group_name,
            socket_ifname,
        )

    def broadcast_weights(self, names: Sequence[str], dtype: str) -> int:
        return int(self._invoke("broadcast_weights", list(names), dtype))

    def save_model(self, out_dir: str | Path) -> Path:
        return Path(self._invoke("save_model", Path(out_dir)))


class TrainerProcess(RemoteTrainer):
    """A GRPOTrainer served by a spawned child process; the methods the GRPO loops call, with the same results."""

    def __init__(
        self, factory: Callable[..., Any], *args: Any, start_timeout_s: float = 600.0, wait: bool = True
    ) -> None:
        """Spawn the child; wait=False returns at once (the child imports and builds while the caller goes on, and
        the first call waits for it: its failure to start is raised there)."""
        context = multiprocessing.get_context("spawn")  # no fork of a process with threads and an event loop
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(child_conn, os.getpid(), factory, args), name="swerl-trainer", daemon=True
        )
        self._process.start()
        child_conn.close()
        self._lock = threading.Lock()  # one call at a time (the loops never overlap calls; this makes sure)
        self._start_timeout_s = start_timeout_s
        self._started = False
        self.step = 0
        if wait:
            with self._lock:
                self._await_start()

    def _await_start(self) -> None:
        """The child's first reply (it built the trainer); called under the lock."""
        if self._started:
            return
        try:
            if not self._conn.poll(self._start_timeout_s):
                raise TrainerProcessDied(f"the trainer process did not start within {self._start_timeout_s}s")
            self._reply("start")
        except BaseException:
            self._kill()
            raise
        self._started = True
        logger.info("trainer process %d started at step %d", self._process.pid, self.step)

    def wait_started(self) -> None:
        """Until the child built its trainer (raises its failure to start)."""
        with self._lock:
            self._await_start()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def _reply(self, method: str) -> Any:
        try:
            status, result, step = self._conn.recv()
        except (EOFError, OSError) as exc:
            self._process.join(5)
            raise TrainerProcessDied(
                f"the trainer process ended during {method} (exit code {self._process.exitcode})"
            ) from exc
        self.step = step
        if status == "error":
            raise result
        return result

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if not self._conn.closed:
                self._await_start()
            if self._conn.closed or not self._process.is_alive():
                raise TrainerProcessDied(
                    f"the trainer process is not running (exit code {self._process.exitcode}); cannot {method}"
                )
            try:
                self._conn.send((method, args, kwargs))
            except (BrokenPipeError, OSError) as exc:
                raise TrainerProcessDied(f"the trainer process ended before {method}") from exc
            return self._reply(method)

    def _invoke(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._call(method, *args, **kwargs)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the child (asked first, killed if it does not end within timeout_s); idempotent."""
        # A call still running in another thread (a cancelled step) holds the lock: then the child is killed.
        if self._process.is_alive() and self._lock.acquire(timeout=timeout_s):
            try:
                self._conn.send(("close", (), {}))
                if self._conn.poll(timeout_s):
                    self._conn.recv()
            except (EOFError, OSError):
                pass
            finally:
                self._lock.release()
            self._process.join(timeout_s)
        self._kill(timeout_s)

    def _kill(self, timeout_s: float = 30.0) -> None:
        if self._process.is_alive():
            self._process.kill()
            self._process.join(timeout_s)
        self._conn.close()

    def __enter__(self) -> TrainerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
