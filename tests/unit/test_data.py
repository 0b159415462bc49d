"""Synthetic data is reproducible and independent of how the global batch is split."""

from __future__ import annotations

import torch

from zerobench.train.data import SyntheticTokens


def test_any_split_sees_the_same_samples():
    d = SyntheticTokens(100, 16, seed=3)
    x, y = d.samples(5, 0, 8)
    parts = [d.micro_batch(5, r, 2, m, 2) for m in range(2) for r in range(2)]
    # micro m, rank r -> samples (m*2 + r)*2 ...
    assert torch.equal(torch.cat([p[0] for p in parts]), x)
    assert torch.equal(y[:, :-1], x[:, 1:])


def test_seeded_and_step_dependent():
    a, b = SyntheticTokens(100, 16, seed=3), SyntheticTokens(100, 16, seed=3)
    assert torch.equal(a.samples(1, 0, 4)[0], b.samples(1, 0, 4)[0])
    assert not torch.equal(a.samples(1, 0, 4)[0], a.samples(2, 0, 4)[0])
    assert int(a.samples(0, 0, 4)[0].max()) < 100
