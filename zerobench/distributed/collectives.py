"""Collectives as plain functions taking their group; each call is recorded in a ``CommLedger``.

A ``Group`` names a process group so ledgers can say which dimension (``dp``, ``tp``) traffic is on.
Async calls return the ``Work`` handle; the caller owns waiting on it.

On gloo (CPU), ``reduce_scatter`` and ``all_gather`` are built from gloo's fast primitives, because gloo's own
reduce-scatter and all-gather take about twice the time of an all-reduce of the same tensor (25M fp32 elements on 2
processes): reduce-scatter is an all-reduce whose local chunk is kept, and all-gather one broadcast per rank. NCCL
keeps the native collectives. The ledger records the logical collective (ZeRO §7's accounting), whatever carries it.
A ``Group`` made with ``native=True`` keeps gloo's native ones (the launcher sets it from
``ZEROBENCH_GLOO_NATIVE=1``; nothing here reads the environment).
"""

from __future__ import annotations

from collections.abc import Callable
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
    native: bool = False
    """Use the backend's own reduce-scatter/all-gather even on gloo (else composed from faster ones)."""

    @classmethod
    def of(cls, pg: dist.ProcessGroup | None, name: str, native: bool = False) -> Group:
        return cls(pg, name, dist.get_world_size(pg), dist.get_rank(pg), native)

    @classmethod
    def coerce(cls, group, name: str, what: str = "group") -> Group:
        """``group`` as a ``Group``, from what torch's own APIs take for a process group: a ``Group``; a
        ``torch.distributed.ProcessGroup`` (``dist.group.WORLD``, ``dist.new_group(...)``); ``None`` for the
        default (world) group, as DDP's and FSDP's ``process_group=None``; or a one-dimensional ``DeviceMesh``.
        Anything else, or ``None`` before ``init_process_group``, is a one-line ``ConfigError``."""
        from zerobench.config import ConfigError

        if isinstance(group, Group):
            return group
        if group is None or isinstance(group, dist.ProcessGroup):
            if not dist.is_available() or not dist.is_initialized():
                raise ConfigError(
                    f"{what}: torch.distributed is not initialised: call "
                    "torch.distributed.init_process_group (gloo on CPU, nccl on GPUs) or run under "
                    "torchrun before building the engine"
                )
            return cls.of(group, name)
        from torch.distributed.device_mesh import DeviceMesh

        if isinstance(group, DeviceMesh):
            if group.ndim != 1:
                raise ConfigError(
                    f"{what}: a {group.ndim}-D DeviceMesh names no single group: pass its "
                    f"data-parallel dimension (mesh['dp']) or that dimension's process group"
                )
            return cls.of(group.get_group(), name)
        raise ConfigError(
            f"{what}: expected a torch.distributed ProcessGroup, a 1-D DeviceMesh, "
            f"zerobench's Group or None (the default group), got {type(group).__name__}"
        )


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


class _Works:
    """Several async works and a completion step, as one handle (``wait``/``is_completed``)."""

    def __init__(self, works: list, then: Callable[[], None] | None = None):
        self.works, self.then = works, then

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)

    def wait(self) -> bool:
        for w in self.works:
            w.wait()
        if self.then is not None:
            self.then()
            self.then = None
        return True


def composes(group: Group) -> bool:
    """Whether reduce-scatter/all-gather over ``group`` (contiguous tensors) are built from gloo's all-reduce/broadcast
    (see module docstring): a reduce-scatter is then an all-reduce of the whole tensor."""
    return not group.native and dist.get_backend(group.pg) == "gloo"


def _composed(group: Group, *tensors: torch.Tensor) -> bool:
    return all(t.is_contiguous() for t in tensors) and composes(group)


def _finish(work, then: Callable[[], None] | None, async_op: bool):
    handle = _Works([work] if not isinstance(work, list) else work, then)
    if async_op:
        return handle
    handle.wait()
    return None


def reduce_scatter(
    out: torch.Tensor,
    inp: torch.Tensor,
    group: Group,
    ledger: CommLedger | None = None,
    tag: str = "",
    async_op: bool = False,
    inp_is_scratch: bool = False,
):
    """Sum ``inp`` (the full tensor) over the group; this rank receives its ``1/size`` chunk in ``out``.

    ``inp_is_scratch``: the caller no longer needs ``inp``'s values, so it may be reduced in place.
    """
    _record(ledger, "reduce_scatter", group, inp, tag)
    if group.size == 1:
        if out.data_ptr() != inp.data_ptr():
            out.copy_(inp)
        return None
    if _composed(group, out, inp):
        n = out.numel()
        work_in = inp.view(-1) if inp_is_scratch else inp.reshape(-1).clone()
        mine = work_in[group.rank * n : (group.rank + 1) * n]
        w = dist.all_reduce(work_in, group=group.pg, async_op=True)
        then = None if mine.data_ptr() == out.data_ptr() else (lambda: out.view(-1).copy_(mine))
        return _finish(w, then, async_op)
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
    if _composed(group, out, inp):
        n = inp.numel()
        flat = out.view(-1)
        mine = flat[group.rank * n : (group.rank + 1) * n]
        if mine.data_ptr() != inp.data_ptr():
            mine.copy_(inp.view(-1))
        pg = group.pg or dist.group.WORLD
        works = [
            dist.broadcast(flat[r * n : (r + 1) * n], src=dist.get_global_rank(pg, r), group=pg, async_op=True)
            for r in range(group.size)
        ]
        return _finish(works, None, async_op)
    return _all_gather(out, inp, group=group.pg, async_op=async_op)
