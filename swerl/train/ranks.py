"""N trainer ranks launched by a stage: one spawned process per rank, called together, answering as one trainer.

`RankGroup(factory, *args, config=DistributedConfig)` spawns `config.ranks` processes (swerl.train.trainer_process
children), each with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), and builds the trainer in each with `factory(*args)`; the factory joins the process group
(swerl.train.distributed.init_rank) and shards the model. A call (`call(method, ...)`) goes to every rank at once,
because every rank must take part in the collectives inside it, and returns rank 0's result. If one rank fails or
dies, the call raises that rank's error and every rank is stopped: the others would otherwise wait in a collective
until collective_timeout_s. A rank started by the group ends with it (the trainer process's parent watchdog).

`DistributedTrainer` is the GRPO trainer protocol over a RankGroup (train_step, export_weights, save, load, ...);
`SFTRanks` the stepped SFT trainer's (train_step, save, save_model). Ranks run on this node: a multi-node trainer
would start the same ranks with torchrun on every node (the factories read only the environment), which this
launcher does not do.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from swerl.config.train import DistributedConfig
from swerl.train.checkpoint import TrainerState
from swerl.train.sft import StepMetrics
from swerl.train.trainer_process import RemoteTrainer, TrainerProcess, TrainerProcessDied

logger = logging.getLogger(__name__)


def free_port(host: str) -> int:
    """A TCP port nobody listens on now (the rendezvous binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def rank_env(rank: int, world_size: int, master_addr: str, master_port: int) -> dict[str, str]:
    """torchrun's variables for one rank of a single-node group."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0",
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


def _as_rank(env: dict[str, str], factory: Callable[..., Any], *args: Any) -> Any:
    """In the child: take the rank's environment, then build the trainer (module level: spawn pickles it)."""
    os.environ.update(env)
    return factory(*args)


class RankGroup:
    """`config.ranks` trainer processes called together; rank 0's answers."""

    def __init__(self, factory: Callable[..., Any], *args: Any, config: DistributedConfig, wait: bool = True) -> None:
        self.world_size = config.ranks
        self.step = 0
        """rank 0's trainer step after the last call (the weight version it produced)."""
        port = config.master_port or free_port(config.master_addr)
        self.ranks: list[TrainerProcess] = []
        try:
            for rank in range(self.world_size):
                env = rank_env(rank, self.world_size, config.master_addr, port)
                self.ranks.append(
                    TrainerProcess(_as_rank, env, factory, *args, start_timeout_s=config.start_timeout_s, wait=False)
                )
        except BaseException:
            self.close(timeout_s=5)
            raise
        self._pool = concurrent.futures.ThreadPoolExecutor(self.world_size, thread_name_prefix="swerl-rank")
        logger.info(
            "trainer: %d %s ranks (pids %s), rendezvous %s:%d",
            self.world_size,
            config.group_backend,
            [r.pid for r in self.ranks],
            config.master_addr,
            port,
        )
        if wait:
            self.wait_started()

    def wait_started(self) -> None:
        """Until every rank built its trainer; a rank's failure to start is raised here (and stops the others)."""
        self.call("")

    @property
    def pids(self) -> list[int | None]:
        return [rank.pid for rank in self.ranks]

    @property
    def pid(self) -> int | None:
        return self.ranks[0].pid

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """`method(*args, **kwargs)` on every rank at once; rank 0's result. A failing rank stops them all."""
        futures = [self._pool.submit(self._on, rank, method, args, kwargs) for rank in self.ranks]
        done, _ = concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
        failed = [future for future in futures if future.done() and future.exception() is not None]
        if failed:
            index = futures.index(failed[0])
            self._kill_all()
            error = failed[0].exception()
            assert error is not None
            raise TrainerProcessDied(f"trainer rank {index} failed during {method}: {error}") from error
        result = futures[0].result()
        self.step = self.ranks[0].step
        return result

    @staticmethod
    def _on(rank: TrainerProcess, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if method == "":
            return rank.wait_started()
        return rank._call(method, *args, **kwargs)

    def _kill_all(self) -> None:
        for rank in self.ranks:
            rank._kill(timeout_s=10)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop every rank (asked first, killed after timeout_s); idempotent."""
        with concurrent.futures.ThreadPoolExecutor(max(1, len(self.ranks))) as pool:
            list(pool.map(lambda rank: rank.close(timeout_s), self.ranks))
        pool_ = getattr(self, "_pool", None)
        if pool_ is not None:
            pool_.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> RankGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DistributedTrainer(RankGroup, RemoteTrainer):
    """The GRPO stage's trainer (grpo_step.Trainer) served by FSDP2 (or Megatron) ranks."""

    def _invoke(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.call(method, *args, **kwargs)


class SFTRanks(RankGroup):
    """The SFT stage's stepped trainer (sft.SteppedTrainer) served by FSDP2 ranks."""

    def train_step(self) -> StepMetrics:
        metrics: StepMetrics = self.call("train_step")
        return metrics

    def save(self, checkpoint_dir: str | Path, keep_last: int = 2) -> Path:
        return Path(self.call("save", Path(checkpoint_dir), keep_last))

    def save_model(self, out_dir: str | Path) -> Path:
        return Path(self.call("save_model", Path(out_dir)))

    def trainer_state(self) -> TrainerState:
        state: TrainerState = self.call("trainer_state")
        return state
