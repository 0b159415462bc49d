"""Cross-entropy over vocabulary-parallel logits, without ever gathering the full ``[N, V]`` logits.

Each rank holds logits for ``V / tp`` classes. Three all-reduces over the TP group (the row max, the
target's logit, the sum of exponentials) give the exact loss; the gradient is the local slice of
``softmax - onehot``. Same algorithm as Megatron-LM's ``vocab_parallel_cross_entropy``.
"""

from __future__ import annotations

import torch
from torch import nn

from zerobench.distributed import collectives as C
from zerobench.distributed.collectives import Group
from zerobench.metrics.comm import CommLedger


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, group: Group, ledger):
        logits = logits.float()
        vp = logits.shape[-1]
        start = group.rank * vp
        mx = logits.max(dim=-1).values
        C.all_reduce(mx, group, ledger, "mp_ce", op=torch.distributed.ReduceOp.MAX)
        shifted = logits - mx.unsqueeze(-1)
        outside = (target < start) | (target >= start + vp)
        local_t = (target - start).masked_fill(outside, 0)
        picked = shifted.gather(-1, local_t.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        C.all_reduce(picked, group, ledger, "mp_ce")
        exp = shifted.exp()
        total = exp.sum(dim=-1)
        C.all_reduce(total, group, ledger, "mp_ce")
        loss = total.log() - picked
        exp.div_(total.unsqueeze(-1))
        ctx.save_for_backward(exp, local_t, outside)
        return loss

    @staticmethod
    def backward(ctx, g):
        softmax, local_t, outside = ctx.saved_tensors
        grad = softmax.clone()
        grad.scatter_add_(-1, local_t.unsqueeze(-1), -(~outside).to(grad.dtype).unsqueeze(-1))
        return grad * g.unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor, group: Group, ledger: CommLedger | None = None
) -> torch.Tensor:
    """Per-token loss ``[N]`` from logits ``[N, V/tp]`` (this rank's vocabulary slice)."""
    return _VocabParallelCE.apply(logits, target, group, ledger)


class VocabParallelLMLoss(nn.Module):
    """Drop-in for the plain model's ``LMLoss``: mean token loss from vocabulary-parallel logits."""

    def __init__(self, group: Group, ledger: CommLedger | None = None):
        super().__init__()
        self.group, self.ledger = group, ledger

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        flat = logits.reshape(-1, logits.shape[-1])
        return vocab_parallel_cross_entropy(flat, targets.reshape(-1), self.group, self.ledger).mean()
