"""Model sizes of the paper's evaluation (facts from its appendix tables) and Megatron vocabulary padding.

Sequence length 1024 and the GPT-2 vocabulary (50257) as the paper states for its GPT-2-style models (evaluation, §10). Megatron-LM
pads the vocabulary to a multiple of 128 x MP so the embedding splits evenly; so does zerobench.
"""

from __future__ import annotations

from zerobench.models.config import GPTConfig
from zerobench.models.sizes import padded_vocab

GPT2_VOCAB = 50257
PAPER_SEQ = 1024

# name: (layers, hidden, heads) — Fig 2 ZeRO rows, Fig 3 (60B/75 layers), Fig 4 DP-only rows.
PAPER_SIZES: dict[str, tuple[int, int, int]] = {
    "1.5B": (48, 1600, 16),
    "8B": (72, 3072, 24),
    "20B": (98, 4096, 32),
    "40B": (88, 6144, 32),
    "60B": (132, 6144, 32),
    "80B": (100, 8192, 64),
    "100B": (125, 8192, 64),
    "120B": (150, 8192, 64),
    "140B": (175, 8192, 64),
    "170B": (212, 8192, 64),
    "fig3-60B": (75, 8192, 32),
    "fig4-1.5B": (34, 1920, 16),
    "fig4-2.5B": (54, 1920, 16),
    "fig4-4B": (64, 2304, 24),
    "fig4-6B": (52, 3072, 24),
    "fig4-8B": (72, 3072, 24),
    "fig4-10B": (50, 4096, 32),
    "fig4-11B": (54, 4096, 32),
    "fig4-12B": (58, 4096, 32),
    "fig4-13B": (62, 4096, 32),
    "fig4-ddp-1.16B": (24, 1920, 16),
    "fig4-ddp-1.38B": (40, 1536, 16),
}


def paper_model(name: str, mp: int = 1, vocab: int = GPT2_VOCAB, seq: int = PAPER_SEQ) -> GPTConfig:
    from zerobench.config import ConfigError

    if name not in PAPER_SIZES:
        raise ConfigError(f"unknown paper model size {name!r}: choose one of {', '.join(PAPER_SIZES)}")
    layers, hidden, heads = PAPER_SIZES[name]
    return GPTConfig(layers=layers, hidden=hidden, heads=heads, vocab=padded_vocab(vocab, mp), seq=seq)
