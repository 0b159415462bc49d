"""The GPT shape as a plain dataclass: importable without torch (suite parsing, planning, the sweep parent)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT model."""

    layers: int = 2
    """Number of transformer blocks (L)."""
    hidden: int = 64
    """Hidden size (h); the MLP is 4h wide."""
    heads: int = 4
    """Attention heads; must divide ``hidden``."""
    vocab: int = 512
    """Vocabulary size (V); the LM head is tied to the token embedding."""
    seq: int = 64
    """Maximum sequence length (s): size of the learned position embedding."""
    init_std: float = 0.02
    """Standard deviation of the normal init of linear and embedding weights."""
    dropout: float = 0.0
    """Dropout on attention probabilities and on both residual branches (0 disables)."""

    def validate(self) -> None:
        from zerobench.config import ConfigError

        for name in ("layers", "hidden", "heads", "vocab", "seq"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model {name} must be positive, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise ConfigError(
                f"hidden size {self.hidden} is not divisible by heads {self.heads}: "
                f"choose heads that divide hidden (e.g. {math.gcd(self.hidden, 64) or 1})"
            )
