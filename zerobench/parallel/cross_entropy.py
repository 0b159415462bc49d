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


IGNORE_INDEX = -100
"""``F.cross_entropy``'s default ``ignore_index``: a target the loss leaves out (padding, a prompt's tokens)."""


class VocabParallelLMLoss(nn.Module):
    """Drop-in for the plain model's ``LMLoss`` (``F.cross_entropy``'s mean): the mean token loss from
    vocabulary-parallel logits over the targets that are not ``IGNORE_INDEX``, which add neither loss nor gradient
    (no such target: loss NaN and every gradient 0, as torch's). A target outside the vocabulary is an error, as
    torch's, raised without a host sync on the GPU (``torch._assert_async``)."""

    def __init__(self, group: Group, ledger: CommLedger | None = None):
        super().__init__()
        self.group, self.ledger = group, ledger

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        flat = logits.reshape(-1, logits.shape[-1])
        t = targets.reshape(-1)
        keep = t != IGNORE_INDEX
        vocab = flat.shape[-1] * self.group.size
        torch._assert_async(
            ((t >= 0) & (t < vocab) | ~keep).all(),
            f"a target is outside the vocabulary [0, {vocab}) and is not the ignore index {IGNORE_INDEX}",
        )
        per_token = vocab_parallel_cross_entropy(flat, t.masked_fill(~keep, 0), self.group, self.ledger)
        count = keep.sum()
        mean = (per_token * keep).sum() / count.clamp(min=1)
        return torch.where(count > 0, mean, torch.full_like(mean, float("nan")))  # NaN, yet zero gradients
