"""Seeded synthetic token data: reproducible, learnable, and identical however the batch is split.

Sequences follow a fixed random sparse bigram process (each token has ``branching`` possible successors),
so the loss falls from ln(V) toward ln(branching) as a model learns it. Sample ``i`` of the global batch at
step ``t`` depends only on (seed, t, i): any split over data-parallel ranks and micro-batches sees exactly
the samples of a single-process run of the same global batch.
"""

from __future__ import annotations

import torch

STRIDE = 10_007
"""Samples a step's seeds are spaced by: sample ``i`` of step ``t`` is drawn from a generator seeded with
``seed * 1,000,003 + t * STRIDE + i mod STRIDE``, as every recorded run drew the first ``STRIDE`` of a step."""


def sample_stream(seed: int, step: int, index: int) -> tuple[int, int]:
    """(generator seed, draws to skip) of sample ``index`` of step ``step``. Seeding by ``index`` itself made sample
    ``STRIDE + i`` of a step sample ``i`` of the next (a global batch over 10,007 sequences repeated samples every
    step), and torch's CPU generator keeps only a seed's low 32 bits, so no larger offset could set it apart. Each
    further block of ``STRIDE`` samples instead continues the stream of its step's sample ``i mod STRIDE`` past the
    draws of the blocks before it: different draws, and the first block's values as every recorded run drew them."""
    block, i = divmod(index, STRIDE)
    return seed * 1_000_003 + step * STRIDE + i, block


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
            g_seed, skip = sample_stream(self.seed, step, start + j)
            g = torch.Generator().manual_seed(g_seed)
            for _ in range(skip + 1):  # the last draw is this sample's
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


def data_source(cfg) -> SyntheticTokens:
    """The synthetic data of a run (a ``TrainConfig``): tokens of ``cfg.data_vocab`` where the model's vocabulary
    was padded for TP, so that every TP degree trains on the same samples as a single-process run."""
    return SyntheticTokens(cfg.data_vocab or cfg.model.vocab, cfg.model.seq, seed=cfg.seed)
