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


def test_a_global_batch_over_10007_sequences_repeats_no_sample():
    """Sample 10,007 + i of a step was sample i of the next: a global batch of 10,240 retrained 233 samples every
    step. The first 10,007 samples of every step keep the streams every recorded run drew."""
    from zerobench.train.data import STRIDE, sample_stream

    assert sample_stream(3, 5, 17) == (3 * 1_000_003 + 5 * STRIDE + 17, 0)  # as recorded
    d = SyntheticTokens(100, 16, seed=3)
    later = d.samples(0, STRIDE, 3)[0]  # samples 10,007-10,009 of step 0
    assert not any(torch.equal(later[k], d.samples(1, k, 1)[0][0]) for k in range(3))
    assert not any(torch.equal(later[k], d.samples(0, k, 1)[0][0]) for k in range(3))
    assert torch.equal(d.samples(0, STRIDE + 1, 1)[0][0], later[1])  # still any split's same sample
