"""What the benchmarks share: a text corpus from the local standard library and the CPU demo's tiny model.

Each benchmark runs as a script (`python benchmarks/NAME.py`), which puts this folder on sys.path, so
`from common import ...` finds this module.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swerl.model.loading import build_tiny_model, save_model_and_tokenizer
from swerl.model.tokenizer import train_tokenizer


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
    print(
        f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, vocab {len(tokenizer)}"
    )
    return save_model_and_tokenizer(model, tokenizer, out)
