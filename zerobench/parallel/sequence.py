"""Megatron sequence parallelism: the activations between tensor-parallel regions split along the sequence.

Outside the attention/MLP matmuls (LayerNorms, dropout, residual adds) every TP rank holds ``s / tp`` of the
sequence instead of all of it (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models", 2022). The all-reduce that leaves a row-parallel layer becomes a reduce-scatter along the sequence,
and the identity that enters a column-parallel layer becomes an all-gather along the sequence (and the
reverse in backward): the same bytes as Megatron TP, 1/tp of the activation memory in those regions.
Parameters used on a sequence shard (LayerNorms, row-parallel biases, the position embedding) then get
partial gradients on each TP rank; a hook on each sums them over TP before anything else sees them.
"""

from __future__ import annotations

import torch

from zerobench.config import ConfigError
from zerobench.distributed import collectives as C
from zerobench.metrics.comm import CommLedger


def _gather_seq(x: torch.Tensor, group: C.Group, ledger, tag: str) -> torch.Tensor:
    """[b, s/tp, ...] -> [b, s, ...]."""
    xt = x.transpose(0, 1).contiguous()
    out = torch.empty((xt.shape[0] * group.size, *xt.shape[1:]), dtype=x.dtype, device=x.device)
    C.all_gather(out, xt, group, ledger, tag)
    return out.transpose(0, 1)


def _split_evenly(s: int, group: C.Group) -> None:
    """Refuse a sequence TP does not divide on every rank alike, before a collective would see unequal shards."""
    if s % group.size:
        raise ConfigError(
            f"sequence parallelism: a sequence of {s} tokens is not divisible by TP degree {group.size}: pad or cut "
            f"the batch's sequences to a multiple of {group.size}"
        )


def _reduce_scatter_seq(x: torch.Tensor, group: C.Group, ledger, tag: str) -> torch.Tensor:
    """[b, s, ...] (partial sums) -> [b, s/tp, ...] (summed)."""
    _split_evenly(x.shape[1], group)
    xt = x.transpose(0, 1).contiguous()
    out = torch.empty((xt.shape[0] // group.size, *xt.shape[1:]), dtype=x.dtype, device=x.device)
    C.reduce_scatter(out, xt, group, ledger, tag)
    return out.transpose(0, 1)


class _GatherSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, ledger, tag):
        ctx.group, ctx.ledger, ctx.tag = group, ledger, tag
        return _gather_seq(x, group, ledger, tag)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter_seq(g, ctx.group, ctx.ledger, ctx.tag), None, None, None


class _ReduceScatterSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, ledger, tag):
        ctx.group, ctx.ledger, ctx.tag = group, ledger, tag
        return _reduce_scatter_seq(x, group, ledger, tag)

    @staticmethod
    def backward(ctx, g):
        return _gather_seq(g, ctx.group, ctx.ledger, ctx.tag), None, None, None


def gather_sequence(x: torch.Tensor, group: C.Group, ledger: CommLedger | None = None, tag: str = "mp") -> torch.Tensor:
    return x if group.size == 1 else _GatherSeq.apply(x, group, ledger, tag)


def reduce_scatter_sequence(
    x: torch.Tensor, group: C.Group, ledger: CommLedger | None = None, tag: str = "mp"
) -> torch.Tensor:
    return x if group.size == 1 else _ReduceScatterSeq.apply(x, group, ledger, tag)


def local_sequence(x: torch.Tensor, group: C.Group, dim: int) -> torch.Tensor:
    """This rank's slice of a replicated tensor along ``dim`` (no communication)."""
    _split_evenly(x.shape[dim], group)
    return x.chunk(group.size, dim=dim)[group.rank]


def sum_grad_over_tp(param: torch.nn.Parameter, group: C.Group, ledger: CommLedger | None = None):
    """Register a hook that all-reduces ``param``'s gradient over TP before it is accumulated."""

    def hook(g: torch.Tensor) -> torch.Tensor:
        g = g.contiguous().clone()
        C.all_reduce(g, group, ledger, "sp_grad")
        return g

    return param.register_hook(hook)
