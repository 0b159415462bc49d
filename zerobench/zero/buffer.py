"""Flat buffers laid out by a ``PartitionLayout``, and the views the engine takes of them.

A *full* buffer spans the whole padded flat layout (stage 0-2 parameters, stage 0-1 gradients); a
*local* buffer is one rank's shards of every bucket, concatenated (fp32 master, Adam states, stage 2-3
gradient partitions, stage 3 parameter partitions).
"""

from __future__ import annotations

import torch

from zerobench.zero.layout import PartitionLayout


class FullBuffer:
    """The whole flat layout in one tensor."""

    def __init__(self, layout: PartitionLayout, dtype: torch.dtype, device: torch.device):
        self.layout = layout
        self.data = torch.zeros(layout.numel, dtype=dtype, device=device)

    def param_view(self, index: int) -> torch.Tensor:
        s = self.layout.params[index]
        return self.data[s.start : s.end].view(s.shape)

    def bucket_view(self, bucket: int) -> torch.Tensor:
        b = self.layout.buckets[bucket]
        return self.data[b.start : b.end]

    def shard_view(self, bucket: int, rank: int) -> torch.Tensor:
        lo, hi = self.layout.buckets[bucket].shard(rank)
        return self.data[lo:hi]


class LocalBuffer:
    """One rank's shard of every bucket, concatenated in bucket order."""

    def __init__(self, layout: PartitionLayout, dtype: torch.dtype, device: torch.device,
                 data: torch.Tensor | None = None):
        """``data``: wrap an existing flat tensor of ``layout.shard_numel`` elements (e.g. host memory)."""
        self.layout = layout
        self.data = torch.zeros(layout.shard_numel, dtype=dtype, device=device) if data is None else data

    def bucket_view(self, bucket: int) -> torch.Tensor:
        off = self.layout.local_offset(bucket)
        return self.data[off : off + self.layout.buckets[bucket].shard_numel]

    def bucket_views(self) -> list[torch.Tensor]:
        return [self.bucket_view(b.index) for b in self.layout.buckets]
