"""Every DP rank starts from the same model: its structure checked across the group, its values DP rank 0's.

ZeRO's collectives assume that every rank of the DP group built the same layout: the same parameters and
buffers in the same order, shapes and dtypes, and the same stage, bucket size, alignment, precision,
unused-parameter check and stage-3 prefetch. A rank that did not would issue collectives of other sizes
or in another order, which fails deep inside the backend or hangs. ``sync_replicas`` compares a
fingerprint of all that with one all-reduce and, where ranks differ, fails on every rank with one line
naming the first difference. It then broadcasts DP rank 0's parameters and buffers to the group, as DDP and
DeepSpeed do at construction, so ranks that seeded their initialisation differently still train one model
instead of drifting apart.

Nothing is done on a group of one, on the ``fake`` backend (dry runs of large worlds) or for an engine on the
meta device; a model built on the meta device for a real one is checked, and initialised later on every rank.
The broadcast is set-up, not a training step: it is not recorded in the comm ledger.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist
from torch import nn

from zerobench.config import ConfigError
from zerobench.distributed.collectives import Group
from zerobench.zero.config import ZeroConfig

BROADCAST_BYTES = 64 << 20
"""Tensors are broadcast in flat chunks of at most this many bytes (one per dtype and device)."""


def describe(model: nn.Module, trained: list[str], config: ZeroConfig) -> list[str]:
    """What must agree across DP ranks, one entry per line: the configuration that shapes the collectives,
    the trained parameters in layout order, then every parameter and buffer (broadcast in this order)."""
    c = config
    head = (
        f"ZeroConfig(stage={c.stage}, precision={c.precision.value}, bucket_numel={c.bucket_numel}, "
        f"param_align={c.param_align}, find_unused_parameters={c.find_unused_parameters}, prefetch={c.prefetch})"
    )
    out = [head]
    out += [f"trained parameter {name!r}" for name in trained]
    out += [
        f"parameter {n!r} {tuple(p.shape)} {str(p.dtype).removeprefix('torch.')}" for n, p in model.named_parameters()
    ]
    out += [f"buffer {n!r} {tuple(b.shape)} {str(b.dtype).removeprefix('torch.')}" for n, b in model.named_buffers()]
    return out


def first_difference(ref: list[str], other: list[str], rank: int) -> str:
    """Where rank ``rank``'s description first parts from DP rank 0's, in words."""
    for a, b in zip(ref, other):
        if a != b:
            return f"rank 0 has {a} where rank {rank} has {b}"
    n = min(len(ref), len(other))
    if len(ref) > n:
        return f"rank 0 has {ref[n]} where rank {rank} has nothing ({len(ref) - n} entries fewer)"
    return f"rank {rank} has {other[n]} where rank 0 has nothing ({len(other) - n} entries more)"


def _skip(group: Group, device: torch.device) -> bool:
    if group.size == 1 or not dist.is_initialized() or device.type == "meta":
        return True
    return dist.get_backend(group.pg) == "fake"


def sync_replicas(model: nn.Module, trained: list[str], config: ZeroConfig, group: Group, device: torch.device) -> None:
    """Check that every DP rank holds the same model and configuration (``ConfigError`` on every rank if
    not), then give every rank DP rank 0's parameter and buffer values."""
    if _skip(group, device):
        return
    desc = describe(model, trained, config)
    h = int.from_bytes(hashlib.blake2b("\n".join(desc).encode(), digest_size=7).digest(), "little")
    probe = torch.tensor([h, -h], dtype=torch.int64, device=device)
    dist.all_reduce(probe, op=dist.ReduceOp.MAX, group=group.pg)
    largest, neg_smallest = probe.tolist()
    if largest != -neg_smallest:
        every: list = [None] * group.size
        dist.all_gather_object(every, desc, group=group.pg)
        rank = next(r for r, d in enumerate(every) if d != every[0])
        raise ConfigError(
            f"DP rank {rank} was given another model or ZeRO config than DP rank 0 "
            f"({first_difference(every[0], every[rank], rank)}): build the same model and "
            f"ZeroConfig on every rank"
        )
    tensors = list(model.parameters()) + list(model.buffers())
    if not any(t.is_meta for t in tensors):  # a meta-built model is initialised alike on every rank later
        broadcast_tensors(tensors, group)


def _runs(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The tensors split into runs of one dtype and device, each at most ``BROADCAST_BYTES`` (or one tensor)."""
    by_kind: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        by_kind.setdefault((t.dtype, t.device), []).append(t)
    runs = []
    for same in by_kind.values():
        run, size = [], 0
        for t in same:
            if run and size + t.nbytes > BROADCAST_BYTES:
                runs.append(run)
                run, size = [], 0
            run.append(t)
            size += t.nbytes
        runs.append(run)
    return runs


@torch.no_grad()
def broadcast_tensors(tensors: list[torch.Tensor], group: Group, src: int = 0) -> None:
    """Give every rank of ``group`` DP rank ``src``'s values of ``tensors`` (in place, in flat runs)."""
    pg = group.pg or dist.group.WORLD
    for run in _runs(tensors):
        flat = torch.cat([t.reshape(-1) for t in run])
        dist.broadcast(
            flat.view(torch.uint8) if flat.dtype == torch.bool else flat, src=dist.get_global_rank(pg, src), group=pg
        )
        offset = 0
        for t in run:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
