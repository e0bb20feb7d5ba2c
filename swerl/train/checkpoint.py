"""Trainer checkpoints: an HF model directory plus the state that makes a resumed run continue exactly.

Layout of one checkpoint, `<checkpoint_dir>/step_00000040/`:
    config.json, model.safetensors, ...   save_pretrained: later stages and the engine load it with from_pretrained
    tokenizer.json, ...                   when a tokenizer is given, so load_model_and_tokenizer works on it
    trainer_state.pt                      optimizer state, RNG states (python, numpy, torch), TrainerState
    trainer_state.json                    the TrainerState in readable form (what a person or a stage inspects)
    sharded/, rng_rank<r>.pt              FSDP2 ranks only: model and optimizer shards (torch.distributed.checkpoint)
                                          and each rank's RNG states; trainer_state.pt then holds no optimizer

A checkpoint is written into a temporary sibling directory and renamed into place, so a directory named
`step_*` is always complete: a crash mid-write leaves only a `.tmp-*` directory, which is ignored and removed by
the next save. Only the newest `keep_last` checkpoints are kept.

A checkpoint damaged after the fact (a truncated weights or state file, a disk error) is found by
`verify_checkpoint`; `latest_intact_checkpoint` then falls back to the newest intact one, saying so in the log, and
`load_checkpoint` raises CheckpointCorrupt naming the directory instead of a raw unpickling error.
`CheckpointMirror` keeps checkpoints in a store (COMPLETE marker last), restores the newest intact one and keeps
only the newest N plus those a published result references.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import re
import shutil
import struct
import uuid
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swerl.model.tokenizer import save_tokenizer
from swerl.storage import CorruptStoreFile, Store
from swerl.train.distributed import (
    DCP_DIR,
    RankContext,
    full_state_dict,
    is_sharded,
    load_sharded,
    save_sharded,
)

_log = logging.getLogger("swerl.checkpoint")
COMPLETE_MARKER = "COMPLETE"
LEDGER_FILE = "rollout_ledger.json"


class CheckpointCorrupt(ValueError):
    """A checkpoint directory that exists but cannot be loaded; names the directory and what is wrong."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"damaged checkpoint {path}: {reason}")


STATE_FILE = "trainer_state.pt"
STATE_JSON = "trainer_state.json"
RANK_RNG_FILE = "rng_rank{rank:05d}.pt"
"""A sharded checkpoint's RNG states of one rank (rank 0's are also in STATE_FILE)."""
_STEP_DIR = re.compile(r"^step_(\d{8})$")
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


@dataclass(frozen=True)
class StreamPosition:
    """What a checkpoint remembers of where the data stream is: the next example (an epoch and an index into that
    epoch's order) and which stream it is (a resume on other data is refused). The SFT trainer keeps its own; the
    GRPO stage hands its task-stream position to the trainer's `save`."""

    epoch: int  # pass over the data the next example comes from
    example_index: int  # index into that epoch's (shuffled) order of the next example not yet used
    num_examples: int  # examples (tasks) in one epoch
    data_fingerprint: str = ""  # hash of the kept examples' tokens and masks (SFT); "" where there is none


@dataclass(frozen=True)
class TrainerState:
    """Where a run stands after `step` optimizer steps; the data position is the next example to pack. Flat, as
    it is written to trainer_state.pt/.json (`position` and `at` give its StreamPosition part)."""

    step: int  # optimizer steps done; also the scheduler position (the lr is a pure function of it)
    epoch: int  # pass over the data the next example comes from
    example_index: int  # index into that epoch's shuffled order of the next example not yet packed
    shuffle_seed: int  # the order of epoch e is a permutation drawn from (shuffle_seed, e)
    num_examples: int  # examples kept after preparation: a resume on other data is refused
    data_fingerprint: str  # hash of the kept examples' tokens and masks

    @classmethod
    def at(cls, step: int, seed: int, position: StreamPosition) -> TrainerState:
        """The state of a trainer seeded with `seed` after `step` steps, its data stream at `position`."""
        return cls(
            step,
            position.epoch,
            position.example_index,
            seed,
            position.num_examples,
            position.data_fingerprint,
        )

    @property
    def position(self) -> StreamPosition:
        return StreamPosition(self.epoch, self.example_index, self.num_examples, self.data_fingerprint)


def check_seed(state: TrainerState, seed: int, path: str | Path) -> None:
    """A checkpoint resumes only the run it was trained in: its seed (which drew every data order) must be this
    one's."""
    if state.shuffle_seed != seed:
        raise ValueError(f"checkpoint {path} was trained with seed {state.shuffle_seed}, this run has {seed}")


def capture_rng_state() -> dict[str, Any]:
    """The global RNG states a training step may consume (dropout, sampling): python, numpy and torch CPU/CUDA."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore what capture_rng_state returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}"


def list_checkpoints(checkpoint_dir: str | Path) -> list[Path]:
    """Complete checkpoints under checkpoint_dir, oldest first (temporary directories are not listed)."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    found = [path for path in root.iterdir() if path.is_dir() and _STEP_DIR.match(path.name)]
    return sorted(found, key=lambda path: path.name)


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The newest complete and intact checkpoint under checkpoint_dir (damaged newer ones are logged), or None."""
    return latest_intact_checkpoint(checkpoint_dir)


def save_checkpoint(
    checkpoint_dir: str | Path,
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    tokenizer: PreTrainedTokenizerBase | None = None,
    keep_last: int = 2,
    ranks: RankContext | None = None,
) -> Path:
    """Write a checkpoint atomically (temp dir + rename) and prune all but the newest keep_last; returns its path.

    With `ranks` and a sharded (FSDP2) model every rank calls it together and the optimizer state stays sharded
    (see _save_sharded_checkpoint)."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    if ranks is not None and is_sharded(model):
        return _save_sharded_checkpoint(checkpoint_dir, model, optimizer, state, tokenizer, keep_last, ranks)
    root = Path(checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # left by a crash mid-write
        shutil.rmtree(stale, ignore_errors=True)
    final = root / checkpoint_name(state.step)
    temp = root / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    model.save_pretrained(temp, safe_serialization=True)
    if tokenizer is not None:
        save_tokenizer(tokenizer, temp)
    torch.save(
        {"trainer_state": asdict(state), "optimizer": optimizer.state_dict(), "rng": capture_rng_state()},
        temp / STATE_FILE,
    )
    return _publish(temp, final, state, keep_last)


def _publish(temp: Path, final: Path, state: TrainerState, keep_last: int) -> Path:
    """The readable state last, then the atomic rename, then pruning to the newest keep_last."""
    (temp / STATE_JSON).write_text(json.dumps(asdict(state), indent=2) + "\n")
    if final.exists():  # the same step saved again (e.g. a resumed run that ends where it started)
        shutil.rmtree(final)
    temp.rename(final)
    for old in list_checkpoints(final.parent)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _save_sharded_checkpoint(
    checkpoint_dir: str | Path,
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    tokenizer: PreTrainedTokenizerBase | None,
    keep_last: int,
    ranks: RankContext,
) -> Path:
    """The same layout written by every rank of an FSDP2 trainer (collective: all ranks call it together).

    Model and optimizer go in `sharded/` (torch.distributed.checkpoint: each rank writes its own shards), each
    rank's RNG states in `rng_rank<r>.pt`; rank 0 adds the full model in HF format (gathered, so later stages and
    engines load the folder as they load any other) and trainer_state.pt without an optimizer (marked sharded).
    The temporary directory is named by rank 0 and renamed by it after every rank has written.
    """
    with sharded_checkpoint(
        checkpoint_dir, state, keep_last, ranks.is_main, ranks.broadcast_object, ranks.barrier
    ) as temp:
        save_sharded(temp, model, optimizer)
        torch.save(capture_rng_state(), temp / RANK_RNG_FILE.format(rank=ranks.rank))
        weights = full_state_dict(model, ranks)  # collective
        if ranks.is_main:
            model.save_pretrained(temp, state_dict=weights, safe_serialization=True)
            if tokenizer is not None:
                save_tokenizer(tokenizer, temp)
            payload = {
                "trainer_state": asdict(state),
                "optimizer": None,
                "sharded": ranks.world_size,
                "rng": capture_rng_state(),
            }
            torch.save(payload, temp / STATE_FILE)
    return Path(checkpoint_dir) / checkpoint_name(state.step)


@contextlib.contextmanager
def sharded_checkpoint(
    checkpoint_dir: str | Path,
    state: TrainerState,
    keep_last: int,
    is_main: bool,
    share: Callable[[Any], Any],
    barrier: Callable[[], None],
    subdirs: Iterable[str] = (),
) -> Iterator[Path]:
    """A checkpoint every rank of a sharded trainer writes together (FSDP2 here, megatron's backend too).

    Rank 0 removes stale temporaries and makes the temporary folder (and `subdirs` in it); `share` hands its name
    to every rank (a broadcast: also the barrier after which the folder exists); each rank writes its part in the
    with-block; after `barrier` (every rank's part is on disk) rank 0 publishes it (the readable state, the rename,
    pruning to keep_last), and a last barrier holds every rank until the checkpoint is in place.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    root = Path(checkpoint_dir)
    final = root / checkpoint_name(state.step)
    name = None
    if is_main:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        name = f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        (root / name).mkdir()
        for sub in subdirs:
            (root / name / sub).mkdir(parents=True)
    temp = root / str(share(name))
    yield temp
    barrier()
    if is_main:
        _publish(temp, final, state, keep_last)
    barrier()


def check_checkpoint_dir(path: str | Path) -> Path:
    """Raise FileNotFoundError naming what a checkpoint directory lacks (model config, weights, trainer state)."""
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint {directory} is not a directory")
    missing = []
    if not (directory / "config.json").is_file():
        missing.append("model config (config.json)")
    if not any((directory / name).is_file() for name in _WEIGHT_FILES):
        missing.append(f"model weights (one of {', '.join(_WEIGHT_FILES)})")
    if not (directory / STATE_FILE).is_file():
        missing.append(f"trainer state ({STATE_FILE})")
    if missing:
        raise FileNotFoundError(f"checkpoint {directory} is missing: {'; '.join(missing)}")
    return directory


def _check_safetensors(path: Path) -> None:
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ValueError(f"{path.name} is truncated (no header)")
        (length,) = struct.unpack("<Q", head)
        header = json.loads(fh.read(length))
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if path.stat().st_size < 8 + length + end:
        raise ValueError(f"{path.name} is truncated ({path.stat().st_size} bytes, needs {8 + length + end})")


def verify_checkpoint(path: str | Path) -> Path:
    """Raise CheckpointCorrupt unless the checkpoint's files are whole (weights, trainer state, ledger)."""
    directory = Path(path)
    try:
        check_checkpoint_dir(directory)
        json.loads((directory / "config.json").read_text())
        json.loads((directory / STATE_JSON).read_text()) if (directory / STATE_JSON).exists() else None
        for weights in sorted(directory.glob("*.safetensors")):
            _check_safetensors(weights)
        with zipfile.ZipFile(directory / STATE_FILE) as archive:  # torch.save writes a zip archive
            bad = archive.testzip()
            if bad is not None:
                raise ValueError(f"{STATE_FILE} member {bad} fails its CRC")
        if (directory / LEDGER_FILE).exists():
            json.loads((directory / LEDGER_FILE).read_text())
        if (directory / DCP_DIR).exists() and not (directory / DCP_DIR / ".metadata").is_file():
            raise ValueError(f"{DCP_DIR}/ has no .metadata (the shards' index)")
    except CheckpointCorrupt:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to read means the checkpoint is damaged
        raise CheckpointCorrupt(directory, f"{type(exc).__name__}: {exc}") from exc
    return directory


def latest_intact_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The newest checkpoint that verifies; damaged newer ones are logged (which one, and which is used)."""
    damaged: list[str] = []
    for candidate in reversed(list_checkpoints(checkpoint_dir)):
        try:
            verify_checkpoint(candidate)
        except CheckpointCorrupt as exc:
            damaged.append(str(exc))
            continue
        if damaged:
            _log.warning("%s; resuming from the newest intact checkpoint %s", "; ".join(damaged), candidate)
        return candidate
    if damaged:
        _log.warning("%s; no intact checkpoint is left, starting afresh", "; ".join(damaged))
    return None


def load_checkpoint(
    path: str | Path,
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer | None = None,
    ranks: RankContext | None = None,
) -> TrainerState:
    """Load a checkpoint (see _load_checkpoint); CheckpointCorrupt naming the directory if it is damaged. With
    `ranks` and a sharded model every rank calls it together."""
    try:
        if ranks is not None and is_sharded(model):
            return _load_sharded_checkpoint(Path(path), model, optimizer, ranks)
        return _load_checkpoint(path, model, optimizer)
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001
        try:
            verify_checkpoint(path)
        except CheckpointCorrupt as corrupt:
            raise corrupt from exc
        raise


def _load_checkpoint(
    path: str | Path, model: PreTrainedModel, optimizer: torch.optim.Optimizer | None = None
) -> TrainerState:
    """Load weights into model, state into optimizer, restore the global RNGs; returns the TrainerState.

    Load before the first step, into the same model architecture the checkpoint was written from. The weights go
    into the existing parameters (their identity is kept, so an optimizer built on them stays valid).
    """
    directory = check_checkpoint_dir(path)
    loaded = type(model).from_pretrained(directory, local_files_only=True, dtype=model.dtype)
    # strict: a checkpoint of another architecture fails here instead of training half-initialised.
    model.load_state_dict(loaded.state_dict(), strict=True)
    del loaded
    # weights_only=False: the RNG states hold python tuples and numpy arrays; this is our own file.
    payload = torch.load(directory / STATE_FILE, map_location="cpu", weights_only=False)
    if optimizer is not None:
        if payload.get("sharded"):
            raise ValueError(
                f"checkpoint {directory} holds its optimizer state sharded over {payload['sharded']} ranks: "
                "resume it with the distributed trainer (grpo/sft.distributed.backend fsdp2)"
            )
        optimizer.load_state_dict(payload["optimizer"])
    restore_rng_state(payload["rng"])
    return TrainerState(**payload["trainer_state"])


def _load_sharded_checkpoint(
    directory: Path, model: PreTrainedModel, optimizer: torch.optim.Optimizer | None, ranks: RankContext
) -> TrainerState:
    """Every rank: its shards of model and optimizer state (DCP reshards across world sizes) and its RNG states."""
    check_checkpoint_dir(directory)
    if not (directory / DCP_DIR).is_dir():
        raise ValueError(f"checkpoint {directory} has no {DCP_DIR}/ folder: it was not written by sharded ranks")
    load_sharded(directory, model, optimizer)
    payload = torch.load(directory / STATE_FILE, map_location="cpu", weights_only=False)
    rng = directory / RANK_RNG_FILE.format(rank=ranks.rank)
    # a checkpoint of fewer ranks has no RNG states for the extra ranks: they keep their seeding
    if rng.is_file():
        restore_rng_state(torch.load(rng, map_location="cpu", weights_only=False))
    return TrainerState(**payload["trainer_state"])


class CheckpointMirror:
    """Checkpoints mirrored to a store under `prefix/step_N/`, a COMPLETE marker (the file list) written last.

    `restore_latest` downloads the newest checkpoint that is complete and intact, falling back past damaged ones
    (a marker that is not a file list, a missing or truncated file) with a warning naming each; `sync` uploads
    new local checkpoints and then keeps only the newest `keep` in the store, plus the names in `protect` (what a
    published result references). A pruned folder loses its marker first, so it never counts as complete.
    """

    def __init__(self, store: Store, prefix: str, local_root: Path, keep: int = 2, protect: Iterable[str] = ()) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.store = store
        self.prefix = prefix.strip("/")
        self.local_root = Path(local_root)
        self.keep = keep
        self.protect = set(protect)
        self.uploaded: set[str] = set()
        self.damaged: list[str] = []

    def _names(self) -> list[str]:
        names = [rel.rsplit("/", 1)[-1] for rel in self.store.list(self.prefix)]
        return sorted(n for n in names if _STEP_DIR.match(n))

    def complete(self) -> list[str]:
        """Names of the folders whose COMPLETE marker exists, oldest first."""
        return [n for n in self._names() if self.store.exists(f"{self.prefix}/{n}/{COMPLETE_MARKER}")]

    def _files(self, name: str) -> list[str]:
        def parse(data: bytes) -> list[str]:
            files = json.loads(data)
            if not isinstance(files, list) or not all(isinstance(f, str) for f in files) or not files:
                raise ValueError("not a non-empty list of file names")
            return files

        return self.store.read_parsed(f"{self.prefix}/{name}/{COMPLETE_MARKER}", parse, "COMPLETE marker")

    def restore(self, name: str) -> Path:
        """Download the complete checkpoint `name` into local_root and verify it (what a later GRPO phase starts
        from); CorruptStoreFile, CheckpointCorrupt or FileNotFoundError naming it when it is not intact."""
        if not self.store.exists(f"{self.prefix}/{name}/{COMPLETE_MARKER}"):
            raise FileNotFoundError(
                f"checkpoint {self.store.uri(f'{self.prefix}/{name}')} has no "
                f"{COMPLETE_MARKER} marker: it is incomplete or was pruned"
            )
        target = self.local_root / name
        for rel in self._files(name):
            self.store.get_file(f"{self.prefix}/{name}/{rel}", target / rel)
        verify_checkpoint(target)
        return target

    def restore_latest(self) -> Path | None:
        """Download the newest intact complete checkpoint into local_root; None when there is none."""
        for name in reversed(self.complete()):
            target = self.local_root / name
            try:
                self.restore(name)
            except (CorruptStoreFile, CheckpointCorrupt, FileNotFoundError) as exc:
                shutil.rmtree(target, ignore_errors=True)
                self.damaged.append(self.store.uri(f"{self.prefix}/{name}"))
                _log.warning(
                    "checkpoint %s is damaged (%s); trying an older one", self.store.uri(f"{self.prefix}/{name}"), exc
                )
                continue
            if self.damaged:
                _log.warning(
                    "resuming from checkpoint %s instead of the damaged %s",
                    self.store.uri(f"{self.prefix}/{name}"),
                    ", ".join(self.damaged),
                )
            self.uploaded.add(name)
            return target
        if self.damaged:
            _log.warning(
                "no intact checkpoint under %s (damaged: %s): starting afresh",
                self.store.uri(self.prefix),
                ", ".join(self.damaged),
            )
        return None

    def sync(self) -> list[str]:
        """Upload local checkpoint folders not uploaded yet (marker last), then prune; returns the new names."""
        done = []
        for folder in sorted(p for p in self.local_root.glob("step_*") if p.is_dir() and _STEP_DIR.match(p.name)):
            if folder.name in self.uploaded:
                continue
            files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
            for rel in files:
                self.store.put_file(folder / rel, f"{self.prefix}/{folder.name}/{rel}")
            self.store.write_bytes(f"{self.prefix}/{folder.name}/{COMPLETE_MARKER}", json.dumps(files).encode())
            self.uploaded.add(folder.name)
            done.append(folder.name)
        self.prune()
        return done

    def prune(self) -> list[str]:
        """Remove store checkpoints beyond the newest `keep` complete ones, except protected ones."""
        complete = self.complete()
        keep = set(complete[-self.keep :]) | self.protect
        newest = complete[-1] if complete else ""
        removed = []
        for name in self._names():
            # an incomplete folder newer than every complete one may be an upload in progress: left alone
            if name in keep or (name not in complete and name > newest):
                continue
            self.store.remove(f"{self.prefix}/{name}/{COMPLETE_MARKER}")
            self.store.remove(f"{self.prefix}/{name}", recursive=True)
            self.uploaded.discard(name)
            removed.append(name)
        return removed
