"""The vocabulary-parallel embedding and loss at TP 2 against single-process torch, where torch has a rule for a
row or a batch: ``padding_idx`` (its row's gradient stays 0) and a batch whose targets are all ignored (loss NaN,
gradients 0).

Before, the embedding dropped ``padding_idx``: with ``nn.Embedding(10, 4, padding_idx=p)`` the padding row took the
sum of its tokens' output gradients where torch's stays 0. And ``VocabParallelLMLoss`` divided by the count of kept
targets after masking: with every target -100 that is 0/0, so every logit's gradient was NaN where
``F.cross_entropy``'s are 0."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers.dist import run_distributed

pytestmark = pytest.mark.dist


def _embedding(rank: int, world: int, pad: int) -> dict:
    from torch import nn

    from zerobench.distributed.collectives import Group
    from zerobench.parallel.layers import VocabParallelEmbedding, shard_rows

    group = Group.of(None, "tp")
    torch.manual_seed(0)
    full = nn.Embedding(10, 4, padding_idx=pad)
    tokens = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [pad, 4, pad, 5, 9, pad, 0, 5, pad, 1]])
    g = torch.randn(2, 10, 4)
    ref = full(tokens)
    (ref * g).sum().backward()
    layer = VocabParallelEmbedding(full, group)
    out = layer(tokens)
    (out * g).sum().backward()
    want = shard_rows(full.weight.grad, group)
    local_pad = pad - layer.start
    return {
        "forward_equal": torch.equal(out, ref),
        "grad_equal": torch.equal(layer.weight.grad, want),
        "pad_row": layer.weight.grad[local_pad].tolist() if 0 <= local_pad < layer.per_rank else None,
        "ref_pad_row": full.weight.grad[pad].tolist(),
        "others_nonzero": bool((want.abs().sum(-1) > 0).sum() >= layer.per_rank - 1),
    }


@pytest.mark.parametrize("pad", [2, 5])
def test_padding_idx_row_gets_no_gradient_as_torchs(pad):
    """Row 5 is local row 0 of rank 1, the row every token outside that rank's slice is looked up at."""
    results = run_distributed(_embedding, 2, pad, timeout=120)
    for r in results:
        assert r["forward_equal"] and r["grad_equal"], r
        assert r["ref_pad_row"] == [0.0, 0.0, 0.0, 0.0] and r["others_nonzero"], r
    assert [r["pad_row"] for r in results] == ([[0.0] * 4, None] if pad < 5 else [None, [0.0] * 4])


def _all_ignored(rank: int, world: int) -> dict:
    import torch.nn.functional as F

    from zerobench.distributed.collectives import Group
    from zerobench.parallel.cross_entropy import VocabParallelLMLoss

    group = Group.of(None, "tp")
    torch.manual_seed(0)
    logits = torch.randn(12, 16) * 3
    out = {}
    partial = torch.tensor([0, 7, 8, 15, -100, 3, 9, -100, 12, 1, 8, 7])
    for case, targets in (("all", torch.full((12,), -100)), ("partial", partial)):
        full = logits.clone().requires_grad_(True)
        ref = F.cross_entropy(full, targets)
        ref.backward()
        local = logits.chunk(2, -1)[rank].clone().requires_grad_(True)
        loss = VocabParallelLMLoss(group)(local.view(3, 4, 8), targets.view(3, 4))
        loss.backward()
        want = full.grad.chunk(2, -1)[rank]
        out[case] = {
            "loss": (ref.item(), loss.item()),
            "grad_abs_max": (want.abs().max().item(), local.grad.abs().max().item()),
            "grad_err": (local.grad - want).abs().max().item(),
        }
    return out


def test_all_ignored_targets_give_nan_loss_and_zero_gradients_as_torchs():
    for r in run_distributed(_all_ignored, 2, timeout=120):
        ref, got = r["all"]["loss"]
        assert math.isnan(ref) and math.isnan(got), r
        assert r["all"]["grad_abs_max"] == (0.0, 0.0), r
        ref, got = r["partial"]["loss"]
        assert got == pytest.approx(ref, rel=1e-6) and r["partial"]["grad_err"] <= 1e-7, r
