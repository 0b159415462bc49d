"""Stages 2-3: the transient staging buckets a micro-batch's gradients are copied into before their reduce-scatter,
and the policy that keeps one large one in flight.

A staging bucket is allocated uninitialised when its first gradient lands; only its padding
(``PartitionLayout.padding``) is zeroed then, every parameter's range being written by its gradient, or zeroed at
the end of backward when none came (``fill_missing``): no memset of whole buckets. A bucket that is one parameter
exactly (``PartitionLayout.sole_param``: an embedding, any parameter of a bucket's size or more) is not copied at
all: its gradient, which the engine's hook drops from ``.grad``, is itself the bucket the reduce-scatter reads.

While a bucket's collective is in flight (``overlap_comm``), a gradient of a large bucket that has no staging
buffer yet is kept as autograd made it (``hold``) and copied in once that collective has finished (``flush``); a
bucket completed first waits for it (``must_wait``). So one large staging buffer is reduced at a time and the next
bucket's gradients are never in two places. A bucket under ``1 / SMALL_STAGING`` of the largest staged one (a unit's
remainder, the final norm) is staged at once: holding it would save little and could make backward wait. A
bucket whose start frees memory (a stage-3 unit's last: its parameters go before its staging copy) is
``deferred``: its held gradients stay held when the collective in flight finishes, so its staging buffer is
allocated after the unit is freed, not beside its parameters.

The same policy covers the one gradient autograd allocates itself: a parameter two modules own (a language
model's head tied to its token embedding) gets two gradients, and the second is a full-size dense tensor
allocated while the first is held. ``wait_before_tied_grads`` makes the collectives in flight finish before the
backward of each module owning such a parameter of a held-back bucket, so that tensor is never allocated beside a
bucket still being reduced (the step's peak otherwise). A module reused in two places (its parameters owned
once, used twice) is not seen here.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from zerobench.zero.interop.containers import tensors_in
from zerobench.zero.interop.tooling import eager
from zerobench.zero.layout import ParamSlot, PartitionLayout
from zerobench.zero.param import ZeroParam

SMALL_STAGING = 8
"""A bucket of at most 1/8 of the layout's largest staged one (a sole parameter is never staged: a vocabulary-sized
embedding does not count) is staged at once, even while another bucket's collective runs."""


def held_back(layout: PartitionLayout) -> list[bool]:
    """Per bucket: whether its gradients are held while another bucket's collective is in flight (``hold``); the
    simulator's replay reads the same list."""
    sole = [layout.sole_param(b.index) is not None for b in layout.buckets]
    largest = max((b.numel for b, s in zip(layout.buckets, sole) if not s), default=0)
    return [b.numel * SMALL_STAGING > largest for b in layout.buckets]


class StagingBuckets:
    """The staging buffers in flight, by bucket index, and which parameters this micro-batch wrote."""

    def __init__(self, layout: PartitionLayout, dtype: torch.dtype, device: torch.device):
        self.layout, self.dtype, self.device = layout, dtype, device
        self.buffers: dict[int, torch.Tensor] = {}
        self.padding = [layout.padding(b.index) for b in layout.buckets]
        self.sole = [layout.sole_param(b.index) is not None for b in layout.buckets]
        self.landed = [False] * len(layout.params)
        self.large = held_back(layout)
        self.held: dict[int, list[tuple[ParamSlot, torch.Tensor, float | None]]] = {}
        """Gradients kept as autograd made them, by bucket, until their staging buffer may be allocated."""
        self.deferred: frozenset[int] = frozenset()
        """Buckets whose held gradients are staged only when the bucket starts (set by stage 3: a unit's last)."""

    def begin_micro(self) -> None:
        self.landed = [False] * len(self.layout.params)
        self.held.clear()  # a backward that raised midway leaves gradients no later micro-batch may take

    def hold(self, slot: ParamSlot, grad: torch.Tensor, scale: float | None = None) -> None:
        """Another bucket's collective is in flight: keep ``grad`` (handed over, as to ``write``) until ``flush``
        if its bucket is large and has no staging buffer yet; else write it now."""
        if not self.large[slot.bucket] or slot.bucket in self.buffers:
            self.write(slot, grad, scale)
            return
        self.held.setdefault(slot.bucket, []).append((slot, grad, scale))
        self.landed[slot.index] = True

    def land(self, slot: ParamSlot, grad: torch.Tensor, scale: float | None, busy: bool) -> None:
        """A gradient landed (handed over, as to ``write``); ``busy``: another bucket's collective is in flight.
        Free of it, the held gradients of buckets not ``deferred`` are staged and ``grad`` is written, unless its
        bucket is deferred with gradients held: then it joins them."""
        if busy:
            self.hold(slot, grad, scale)
            return
        if self.held:
            for b in [b for b in self.held if b not in self.deferred]:
                self.flush(b)
            if slot.bucket in self.held:  # deferred: it joins them, as under a collective in flight
                self.hold(slot, grad, scale)
                return
        self.write(slot, grad, scale)

    def flush(self, bucket: int | None = None) -> None:
        """Copy the held gradients (of ``bucket``, or all) into their staging buffers, allocating them."""
        for b in [bucket] if bucket is not None else list(self.held):
            for slot, grad, scale in self.held.pop(b, ()):
                self.write(slot, grad, scale)

    def must_wait(self, bucket: int) -> bool:
        """Whether starting ``bucket`` needs a new staging buffer for held gradients (so the collective in flight
        is to finish first); not for a sole parameter reduced as it is."""
        held = self.held.get(bucket)
        if not held or bucket in self.buffers:
            return False
        return not (self.sole[bucket] and len(held) == 1 and self._as_is(held[0][1]))

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
        self.flush(bucket)
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
        self.flush(bucket)
        return self.buffers.pop(bucket)

    def release(self, bucket: int, buf: torch.Tensor) -> None:
        """``bucket``'s collective was waited for: free the staging buffer allocated for it now (``resize_(0)``),
        not when the last reference drops, which the communication library may hold a while longer (gloo's worker
        thread, NCCL's watchdog). A sole parameter's gradient reduced as it is was handed over, not allocated here:
        it goes when its reference does."""
        if not self.sole[bucket]:
            buf.untyped_storage().resize_(0)

    def held_tensors(self) -> list[torch.Tensor]:
        return [grad for items in self.held.values() for _, grad, _ in items]


def tied_owners(model: nn.Module, zparams: list[ZeroParam]) -> dict[int, list[nn.Module]]:
    """Per trained parameter (index into ``zparams``) owned directly by two or more modules: those modules."""
    owners: dict[int, list[nn.Module]] = {}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            owners.setdefault(id(p), []).append(m)
    return {i: owners[id(zp.param)] for i, zp in enumerate(zparams) if len(owners.get(id(zp.param), ())) > 1}


def wait_before_tied_grads(model: nn.Module, zparams: list[ZeroParam], grads) -> list[RemovableHandle]:
    """A forward hook on every owner of a large tied parameter: its output's gradient hook finishes the collectives
    in flight before that module's backward. None at stages 0-1 (no staging) or with ``overlap_comm`` off."""
    if grads.keep_full or grads.max_inflight == 0:
        return []
    large = grads.staging.large
    owners = weakref.WeakSet(
        m for i, ms in tied_owners(model, zparams).items() if large[zparams[i].slot.bucket] for m in ms
    )

    def wait(grad: torch.Tensor) -> None:
        grads.wait_inflight()

    def on_output(module: nn.Module, args, output) -> None:  # copy.deepcopy(model) shares it: act on owners only
        if module in owners and torch.is_grad_enabled():
            for t in tensors_in(output):
                if t.requires_grad:
                    t.register_hook(wait)

    return [m.register_forward_hook(eager(on_output)) for m in owners]
