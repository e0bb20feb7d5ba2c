"""What the benchmarks share: a text corpus from the local standard library and the CPU demo's tiny model.

Each benchmark runs as a script (`python benchmarks/NAME.py`), which puts this folder on sys.path, so
`from common import ...` finds this module.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from swerl.train.model import build_tiny_model, save_model_and_tokenizer, train_tokenizer


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


def build_demo_model(out: Path, corpus_bytes: int = 3_000_000, max_positions: int = 4096) -> Path:
    """The CPU demo's size of tiny Qwen3 (BPE of 4096 tokens on stdlib source, hidden 256, 4 layers, FFN 768,
    ~4.5M parameters), saved with its tokenizer in `out`."""
    tokenizer = train_tokenizer(stdlib_texts(corpus_bytes), vocab_size=4096, out_dir=out)
    model = build_tiny_model(
        tokenizer,
        hidden_size=256,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=768,
        max_position_embeddings=max_positions,
    )
    print(
        f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, vocab {len(tokenizer)}"
    )
    return save_model_and_tokenizer(model, tokenizer, out)
