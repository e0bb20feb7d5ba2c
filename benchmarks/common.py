"""What the benchmarks share: a text corpus from the local standard library and the CPU demo's tiny model.

Each benchmark runs as a script (`python benchmarks/NAME.py`), which puts this folder on sys.path, so
`from common import ...` finds this module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

SWERL_ROOT_VARIABLE = "SWERL_BENCH_ROOT"
"""run_worker's environment variable: the folder whose `swerl` a worker imports instead of this checkout's."""


def _use_swerl_from(root: str) -> None:
    """Import `swerl` from root: before the editable install's finder (which precedes PYTHONPATH) and sys.path."""
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
    sys.path.insert(0, root)


if os.environ.get(SWERL_ROOT_VARIABLE):  # before the swerl imports below
    _use_swerl_from(os.environ[SWERL_ROOT_VARIABLE])

from transformers import PreTrainedModel, PreTrainedTokenizerBase  # noqa: E402

from swerl.model.loading import build_tiny_model, save_model_and_tokenizer  # noqa: E402
from swerl.model.tokenizer import train_tokenizer  # noqa: E402


def stdlib_texts(max_bytes: int) -> list[str]:
    """Python files of the local standard library, up to max_bytes in all."""
    texts, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(errors="ignore")
        texts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return texts


def demo_model(tokenizer: PreTrainedTokenizerBase, max_positions: int = 4096) -> PreTrainedModel:
    """The CPU demo's size of tiny Qwen3 (hidden 256, 4 layers, FFN 768: ~4.5M parameters with a 4096-token
    vocabulary), the same initial weights on every call (seed 0), float32."""
    return build_tiny_model(
        tokenizer,
        hidden_size=256,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=768,
        max_position_embeddings=max_positions,
        seed=0,
    )


def build_demo_model(out: Path, corpus_bytes: int = 3_000_000, max_positions: int = 4096) -> Path:
    """demo_model with a BPE of 4096 tokens trained on stdlib source, saved with its tokenizer in `out`."""
    tokenizer = train_tokenizer(stdlib_texts(corpus_bytes), vocab_size=4096, out_dir=out)
    model = demo_model(tokenizer, max_positions)
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, vocab {len(tokenizer)}")
    return save_model_and_tokenizer(model, tokenizer, out)


def materialise_ref(ref: str, out: Path) -> Path:
    """The `swerl` package of git commit `ref` (of the repository this file is in), extracted under `out`; returns
    the folder for run_worker's swerl_root."""
    repository = Path(__file__).resolve().parent.parent
    archive = subprocess.run(
        ["git", "-C", str(repository), "archive", "--format=tar", ref, "swerl"],
        check=True,
        capture_output=True,
    ).stdout
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def run_worker(script: Path, swerl_root: Path | None, arguments: list[str]) -> dict[str, Any]:
    """Run `script --worker ...` in a fresh interpreter (swerl from swerl_root when given, else this checkout) and
    return the JSON object its last stdout line holds."""
    environment = {key: value for key, value in os.environ.items() if key != SWERL_ROOT_VARIABLE}
    if swerl_root is not None:
        environment[SWERL_ROOT_VARIABLE] = str(swerl_root)
    result = subprocess.run(
        [sys.executable, str(script), "--worker", *arguments],
        env=environment,
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))
