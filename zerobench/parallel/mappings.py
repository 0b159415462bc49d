"""The conjugate autograd operators of Megatron tensor parallelism, over an explicit TP group.

``copy_to_tp`` (f): identity forward, all-reduce of the gradient backward — enters a parallel region.
``reduce_from_tp`` (g): all-reduce forward, identity backward — leaves a row-parallel region.
``gather_from_tp`` / ``scatter_to_tp``: concatenate / split along the last dimension.
Every collective is recorded in the communication ledger under the group's name, tagged ``mp`` for the
transformer blocks' traffic (12*b*s*h per block in ZeRO §8's count) and ``mp_embed`` for the embedding and LM
head.
"""

from __future__ import annotations

import torch

from zerobench.distributed import collectives as C
from zerobench.metrics.comm import CommLedger


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, ledger, tag):
        ctx.group, ctx.ledger, ctx.tag = group, ledger, tag
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        C.all_reduce(g, ctx.group, ctx.ledger, ctx.tag)
        return g, None, None, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, ledger, tag):
        x = x.contiguous()
        C.all_reduce(x, group, ledger, tag)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None, None, None


def _split_last(x: torch.Tensor, group: C.Group) -> torch.Tensor:
    return x.chunk(group.size, dim=-1)[group.rank].contiguous()


def _gather_last(x: torch.Tensor, group: C.Group, ledger: CommLedger | None) -> torch.Tensor:
    x = x.contiguous()
    parts = torch.empty((group.size, *x.shape), dtype=x.dtype, device=x.device)
    C.all_gather(parts.view(-1), x.view(-1), group, ledger, "mp")
    return torch.cat(parts.unbind(0), dim=-1)


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, ledger):
        ctx.group = group
        return _gather_last(x, group, ledger)

    @staticmethod
    def backward(ctx, g):
        return _split_last(g, ctx.group), None, None


class _ScatterToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, ledger):
        ctx.group, ctx.ledger = group, ledger
        return _split_last(x, group)

    @staticmethod
    def backward(ctx, g):
        return _gather_last(g, ctx.group, ctx.ledger), None, None


def copy_to_tp(x: torch.Tensor, group: C.Group, ledger: CommLedger | None = None, tag: str = "mp") -> torch.Tensor:
    return x if group.size == 1 else _CopyToTP.apply(x, group, ledger, tag)


def reduce_from_tp(x: torch.Tensor, group: C.Group, ledger: CommLedger | None = None, tag: str = "mp") -> torch.Tensor:
    return x if group.size == 1 else _ReduceFromTP.apply(x, group, ledger, tag)


def gather_from_tp(x: torch.Tensor, group: C.Group, ledger: CommLedger | None = None) -> torch.Tensor:
    return x if group.size == 1 else _GatherFromTP.apply(x, group, ledger)


def scatter_to_tp(x: torch.Tensor, group: C.Group, ledger: CommLedger | None = None) -> torch.Tensor:
    return x if group.size == 1 else _ScatterToTP.apply(x, group, ledger)
