"""Stages 2-3: the transient staging buckets a micro-batch's gradients are copied into before their
reduce-scatter. A staging bucket is allocated uninitialised when its first gradient lands; only its
padding (``PartitionLayout.padding``) is zeroed then, every parameter's range being written by its
gradient, or zeroed at the end of backward when none came (``fill_missing``) — no memset of whole buckets.
A bucket that is one parameter exactly (``PartitionLayout.sole_param``: an embedding, any parameter of
a bucket's size or more) is not copied at all: its gradient, which the engine's hook drops from ``.grad``,
is itself the bucket the reduce-scatter reads.
"""

from __future__ import annotations

import torch

from zerobench.zero.layout import ParamSlot, PartitionLayout


class StagingBuckets:
    """The staging buffers in flight, by bucket index, and which parameters this micro-batch wrote."""

    def __init__(self, layout: PartitionLayout, dtype: torch.dtype, device: torch.device):
        self.layout, self.dtype, self.device = layout, dtype, device
        self.buffers: dict[int, torch.Tensor] = {}
        self.padding = [layout.padding(b.index) for b in layout.buckets]
        self.sole = [layout.sole_param(b.index) is not None for b in layout.buckets]
        self.landed = [False] * len(layout.params)

    def begin_micro(self) -> None:
        self.landed = [False] * len(self.layout.params)

    def write(self, slot: ParamSlot, grad: torch.Tensor, scale: float | None = None) -> None:
        """Copy ``grad`` (times ``scale``, in the same pass) into its bucket, or take it as the bucket when it is
        the bucket's sole parameter (the caller hands it over: nothing else may read or write it afterwards)."""
        b = self.layout.buckets[slot.bucket]
        buf = self.buffers.get(b.index)
        if buf is None and self.sole[b.index] and self._as_is(grad):
            self.buffers[b.index] = grad.view(-1) if scale is None else grad.view(-1).mul_(scale)
            self.landed[slot.index] = True
            return
        if buf is None:
            buf = self.buffers[b.index] = torch.empty(b.numel, dtype=self.dtype, device=self.device)
            for lo, hi in self.padding[b.index]:
                buf[lo:hi].zero_()
        dst = buf[slot.start - b.start : slot.end - b.start].view(slot.shape)
        if scale is None:
            dst.copy_(grad)
        else:
            torch.mul(grad, scale, out=dst)
        self.landed[slot.index] = True

    def _as_is(self, grad: torch.Tensor) -> bool:
        return grad.dtype == self.dtype and grad.device == self.device and grad.is_contiguous()

    def fill_missing(self, bucket: int) -> None:
        """Zeros for every parameter of ``bucket`` without a gradient in this micro-batch."""
        b = self.layout.buckets[bucket]
        buf = self.buffers.get(bucket)
        if buf is None:
            self.buffers[bucket] = torch.zeros(b.numel, dtype=self.dtype, device=self.device)
            return
        for i in b.params:
            if not self.landed[i]:
                p = self.layout.params[i]
                buf[p.start - b.start : p.end - b.start].zero_()

    def pop(self, bucket: int) -> torch.Tensor:
        return self.buffers.pop(bucket)
