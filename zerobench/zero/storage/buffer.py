"""Flat buffers laid out by a ``PartitionLayout``, and the views the engine takes of them.

A *full* buffer spans the whole padded flat layout (stage 0-2 parameters, stage 0-1 gradients); a
*local* buffer is one rank's shards of every bucket, concatenated (fp32 master, Adam states, stage 3
parameter partitions); *bucket shards* are one rank's shards as separate tensors, each allocated when
first needed and all released together (stage 2-3 gradient partitions).
"""

from __future__ import annotations

import torch

from zerobench.zero.layout import PartitionLayout


class FullBuffer:
    """The whole flat layout in one tensor, and ``tail`` elements more right after it (stage 0's unused-parameter
    flags, carried by the last bucket's all-reduce: ``zero/grads/unused.py``)."""

    def __init__(self, layout: PartitionLayout, dtype: torch.dtype, device: torch.device, tail: int = 0):
        self.layout = layout
        self.storage = torch.zeros(layout.numel + tail, dtype=dtype, device=device)
        self.data = self.storage[: layout.numel]
        self.tail = self.storage[layout.numel :]

    def with_flag(self, rank: int, flag: bool) -> torch.Tensor:
        """The last bucket and the tail after it, one tensor for one all-reduce; the tail is zero but this rank's
        ``flag`` (1 or 0), so the sum holds every rank's."""
        self.tail.zero_()[rank] = float(flag)
        return self.storage[self.layout.buckets[-1].start :]

    def param_view(self, index: int) -> torch.Tensor:
        s = self.layout.params[index]
        return self.data[s.start : s.end].view(s.shape)

    def bucket_view(self, bucket: int) -> torch.Tensor:
        b = self.layout.buckets[bucket]
        return self.data[b.start : b.end]

    def shard_view(self, bucket: int, rank: int) -> torch.Tensor:
        lo, hi = self.layout.buckets[bucket].shard(rank)
        return self.data[lo:hi]

    def keep_one_copy(self, rank: int, whole_on_rank0: bool, times: float = 1.0) -> None:
        """Before summing new gradients over the group onto reduced ones, keep a single copy of the reduced
        ones (times ``times``): rank 0's whole buffer (``whole_on_rank0``: an all-reduce follows), else each
        rank's own shard of every bucket (a reduce-scatter follows); the rest is zeroed."""
        for b in self.layout.buckets:
            lo, hi = (b.start, b.end) if whole_on_rank0 else b.shard(rank)
            if whole_on_rank0 and rank != 0:
                lo = hi = b.end
            self.data[b.start : lo].zero_()
            self.data[hi : b.end].zero_()
            if times != 1 and hi > lo:
                self.data[lo:hi].mul_(times)


class LocalBuffer:
    """One rank's shard of every bucket, concatenated in bucket order."""

    def __init__(
        self, layout: PartitionLayout, dtype: torch.dtype, device: torch.device, data: torch.Tensor | None = None
    ):
        """``data``: wrap an existing flat tensor of ``layout.shard_numel`` elements (e.g. host memory)."""
        self.layout = layout
        self.data = torch.zeros(layout.shard_numel, dtype=dtype, device=device) if data is None else data

    def bucket_view(self, bucket: int) -> torch.Tensor:
        off = self.layout.local_offset(bucket)
        return self.data[off : off + self.layout.buckets[bucket].shard_numel]

    def bucket_views(self) -> list[torch.Tensor]:
        return [self.bucket_view(b.index) for b in self.layout.buckets]


class BucketShards:
    """One rank's shard of every bucket, each its own tensor: allocated when the bucket is first reduced
    in a window (``take``), all dropped by ``release()``. The stage 2-3 gradient partition lives here
    from a window's first reduce-scatter until ``zero_grad()``, as ``torch.optim`` drops ``.grad`` with
    ``set_to_none``: forward holds none of it, and backward only the buckets reduced so far."""

    def __init__(self, layout: PartitionLayout, dtype: torch.dtype, device: torch.device):
        self.layout, self.dtype, self.device = layout, dtype, device
        self.shards: list[torch.Tensor | None] = [None] * len(layout.buckets)

    def take(self, bucket: int) -> torch.Tensor:
        """The bucket's shard, allocated uninitialised if not held: the caller overwrites it."""
        t = self.shards[bucket]
        if t is None:
            t = self.shards[bucket] = torch.empty(
                self.layout.buckets[bucket].shard_numel, dtype=self.dtype, device=self.device
            )
        return t

    def get(self, bucket: int) -> torch.Tensor:
        t = self.shards[bucket]
        if t is None:
            raise RuntimeError(f"bucket {bucket}'s gradient shard is not held (released by zero_grad())")
        return t

    def views(self) -> list[torch.Tensor]:
        """Every bucket's shard; zeros for one not held (no gradient since ``release()``)."""
        for b in self.layout.buckets:
            if self.shards[b.index] is None:
                self.take(b.index).zero_()
        return list(self.shards)

    def held(self) -> list[torch.Tensor]:
        return [t for t in self.shards if t is not None]

    def nbytes(self) -> int:
        """Bytes of every shard together: what the partition takes while it is held."""
        return self.layout.shard_numel * self.dtype.itemsize

    def release(self) -> None:
        self.shards = [None] * len(self.shards)
