"""Trainer checkpoints: an HF model directory plus the state that makes a resumed run continue exactly.

Layout of one checkpoint, `<checkpoint_dir>/step_00000040/`:
    config.json, model.safetensors, ...   save_pretrained: later stages and the engine load it with from_pretrained
    tokenizer.json, ...                   when a tokenizer is given, so load_model_and_tokenizer works on it
    trainer_state.pt                      optimizer state, RNG states (python, numpy, torch), TrainerState
    trainer_state.json                    the TrainerState in readable form (what a person or a stage inspects)

A checkpoint is written into a temporary sibling directory and renamed into place, so a directory named
`step_*` is always complete: a crash mid-write leaves only a `.tmp-*` directory, which is ignored and removed by
the next save. Only the newest `keep_last` checkpoints are kept.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swerl.model.tokenizer import save_tokenizer

STATE_FILE = "trainer_state.pt"
STATE_JSON = "trainer_state.json"
_STEP_DIR = re.compile(r"^step_(\d{8})$")
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


@dataclass(frozen=True)
class TrainerState:
    """Where a run stands after `step` optimizer steps; the data position is the next example to pack."""

    step: int  # optimizer steps done; also the scheduler position (the lr is a pure function of it)
    epoch: int  # pass over the data the next example comes from
    example_index: int  # index into that epoch's shuffled order of the next example not yet packed
    shuffle_seed: int  # the order of epoch e is a permutation drawn from (shuffle_seed, e)
    num_examples: int  # examples kept after preparation: a resume on other data is refused
    data_fingerprint: str  # hash of the kept examples' tokens and masks


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
    """The newest complete checkpoint under checkpoint_dir, or None."""
    found = list_checkpoints(checkpoint_dir)
    return found[-1] if found else None


def save_checkpoint(
    checkpoint_dir: str | Path,
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    tokenizer: PreTrainedTokenizerBase | None = None,
    keep_last: int = 2,
) -> Path:
    """Write a checkpoint atomically (temp dir + rename) and prune all but the newest keep_last; returns its path."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
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
    (temp / STATE_JSON).write_text(json.dumps(asdict(state), indent=2) + "\n")
    if final.exists():  # the same step saved again (e.g. a resumed run that ends where it started)
        shutil.rmtree(final)
    temp.rename(final)
    for old in list_checkpoints(root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


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


def load_checkpoint(
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
        optimizer.load_state_dict(payload["optimizer"])
    restore_rng_state(payload["rng"])
    return TrainerState(**payload["trainer_state"])
