"""Seeded synthetic token data: reproducible, learnable, and identical however the batch is split.

Sequences follow a fixed random sparse bigram process (each token has ``branching`` possible successors),
so the loss falls from ln(V) toward ln(branching) as a model learns it. Sample ``i`` of the global batch at
step ``t`` depends only on (seed, t, i): any split over data-parallel ranks and micro-batches sees exactly
the samples of a single-process run of the same global batch.
"""

from __future__ import annotations

import torch


class SyntheticTokens:
    """Global batch ``step`` is samples ``0..global_batch-1``; ranks take contiguous slices."""

    def __init__(self, vocab: int, seq: int, seed: int = 1234, branching: int = 4):
        self.vocab, self.seq, self.seed, self.branching = vocab, seq, seed, branching
        g = torch.Generator().manual_seed(seed)
        self.successors = torch.randint(0, vocab, (vocab, branching), generator=g)

    def samples(self, step: int, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets ``[count, seq]`` for samples ``start..start+count-1``."""
        first = torch.empty(count, dtype=torch.long)
        choices = torch.empty(count, self.seq, dtype=torch.long)
        for j in range(count):
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 10_007 + start + j)
            first[j] = torch.randint(0, self.vocab, (1,), generator=g)
            choices[j] = torch.randint(0, self.branching, (self.seq,), generator=g)
        tokens = torch.empty(count, self.seq + 1, dtype=torch.long)
        tokens[:, 0] = first
        for t in range(self.seq):
            tokens[:, t + 1] = self.successors[tokens[:, t], choices[:, t]]
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def micro_batch(
        self, step: int, dp_rank: int, dp_size: int, micro: int, micro_batch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Micro-batch ``micro`` of ``dp_rank`` at ``step`` (global batch = dp_size*accum*micro_batch)."""
        return self.samples(step, (micro * dp_size + dp_rank) * micro_batch, micro_batch)
