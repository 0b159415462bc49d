"""Collectives as plain functions taking their group; each call is recorded in a ``CommLedger``.

A ``Group`` names a process group so ledgers can say which dimension (``dp``, ``tp``) traffic is on.
Async calls return the ``Work`` handle; the caller owns waiting on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from zerobench.metrics.comm import CommLedger

# torch >= 2.13 renamed the tensor-in/tensor-out collectives; keep working on older releases.
_reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
_all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


@dataclass(frozen=True)
class Group:
    """A process group with a name, its size and this process's rank in it."""

    pg: dist.ProcessGroup | None
    name: str
    size: int
    rank: int

    @classmethod
    def of(cls, pg: dist.ProcessGroup | None, name: str) -> "Group":
        return cls(pg, name, dist.get_world_size(pg), dist.get_rank(pg))


def _record(ledger: CommLedger | None, op: str, group: Group, full: torch.Tensor, tag: str) -> None:
    if ledger is not None:
        ledger.record(op, group.name, group.size, full.numel(), full.numel() * full.element_size(), tag)


def all_reduce(
    t: torch.Tensor,
    group: Group,
    ledger: CommLedger | None = None,
    tag: str = "",
    op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
    async_op: bool = False,
):
    _record(ledger, "all_reduce", group, t, tag)
    if group.size == 1:
        return None
    return dist.all_reduce(t, op=op, group=group.pg, async_op=async_op)


def reduce_scatter(
    out: torch.Tensor,
    inp: torch.Tensor,
    group: Group,
    ledger: CommLedger | None = None,
    tag: str = "",
    async_op: bool = False,
):
    """Sum ``inp`` (the full tensor) over the group; this rank receives its ``1/size`` chunk in ``out``."""
    _record(ledger, "reduce_scatter", group, inp, tag)
    if group.size == 1:
        if out.data_ptr() != inp.data_ptr():
            out.copy_(inp)
        return None
    return _reduce_scatter(out, inp, group=group.pg, async_op=async_op)


def all_gather(
    out: torch.Tensor,
    inp: torch.Tensor,
    group: Group,
    ledger: CommLedger | None = None,
    tag: str = "",
    async_op: bool = False,
):
    """Concatenate every rank's ``inp`` into ``out`` (the full tensor); ``inp`` may be a view of ``out``."""
    _record(ledger, "all_gather", group, out, tag)
    if group.size == 1:
        if out.data_ptr() != inp.data_ptr():
            out.copy_(inp)
        return None
    return _all_gather(out, inp, group=group.pg, async_op=async_op)
