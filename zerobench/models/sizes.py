"""Named model sizes, the exact parameter count, FLOPs per token, and Megatron's vocabulary padding.

``num_params`` is the closed form of the parameter count of ``zerobench.models.gpt.GPT`` (tested to equal
the module's count exactly). ``flops_per_token`` follows the Megatron-LM count (Narayanan et al., SC21,
Appendix; the ZeRO paper reports throughput the same way): per token and transformer block the forward
pass does 24h^2 matmul FLOPs (QKV 6h^2, attention output 2h^2, MLP 16h^2) plus 4sh for the attention
scores and their product with V (causal masking not discounted); the LM head does 2Vh. Backward costs
twice the forward; activation recomputation repeats the forward of every block once more.
"""

from __future__ import annotations

from zerobench.models.config import GPTConfig

PRESETS: dict[str, GPTConfig] = {
    # Runs a handful of steps in seconds on 2 CPU cores.
    "tiny": GPTConfig(layers=2, hidden=64, heads=4, vocab=512, seq=64),
    # Large enough that model states dominate memory in ledger tests (Psi ~ 1.2M).
    "mini": GPTConfig(layers=4, hidden=128, heads=4, vocab=8192, seq=128),
    # ~98M parameters (GPT-2-small-like body, 16K vocabulary).
    "small": GPTConfig(layers=12, hidden=768, heads=12, vocab=16384, seq=512),
}


def preset(name: str) -> GPTConfig:
    from zerobench.config import ConfigError

    if name not in PRESETS:
        raise ConfigError(f"unknown model preset {name!r}: choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def num_params(cfg: GPTConfig) -> int:
    """Exact parameter count: embeddings + L blocks of (12h^2 + 13h) + final LayerNorm (head tied)."""
    h = cfg.hidden
    return cfg.vocab * h + cfg.seq * h + cfg.layers * (12 * h * h + 13 * h) + 2 * h


def params_per_mp_rank(cfg: GPTConfig, mp: int) -> int:
    """Exact parameters held by one MP rank (Megatron split; LayerNorms, position embedding and
    row-parallel biases replicated)."""
    h = cfg.hidden
    per_block = 12 * h * h // mp + 7 * h // mp + 6 * h
    return cfg.vocab * h // mp + cfg.seq * h + cfg.layers * per_block + 2 * h


def flops_per_token(cfg: GPTConfig, seq: int | None = None, recompute: bool = False) -> float:
    """Training FLOPs per token (forward + backward, plus one block forward more with recompute)."""
    s = cfg.seq if seq is None else seq
    h, L, V = cfg.hidden, cfg.layers, cfg.vocab
    block_fwd = 24 * h * h + 4 * s * h
    block_passes = 4 if recompute else 3
    return float(L * block_fwd * block_passes + 3 * 2 * V * h)


def padded_vocab(vocab: int, mp: int, multiple: int = 128) -> int:
    """Megatron-LM's ``make_vocab_size_divisible_by`` padding (multiple x MP)."""
    m = multiple * mp
    return -(-vocab // m) * m
