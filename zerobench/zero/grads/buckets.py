"""Gradient buckets and the bucket group that owns their communication.

Gradients arrive parameter by parameter during backward (post-accumulate-grad hooks). Each bucket counts the
parameters still missing; once complete, its collective starts asynchronously, overlapping the rest of backward.
Buckets start strictly in index order, so every rank issues the same collectives in the same order even when the
ranks' graphs differ. At the end of backward a bucket still missing gradients (parameters unused on this rank)
gets zeros for them and starts too; which parameters were unused in the window is recorded for the engine, which
refuses them unless unused parameters are allowed. Gradients accumulate until ``zero()``, as ``torch.optim`` sees
``.grad``: a second backward window without ``zero()`` adds to the reduced gradients of the first.

How a group keeps and reduces gradients is its ``SyncMode``, one per ZeRO stage:

- ``ALL_REDUCE`` (stage 0), ``REDUCE_SCATTER_FULL`` (stage 1): a persistent full gradient buffer accumulates
  micro-batches. Each parameter's ``.grad`` *is* its view of it (``attach_grad_views``; DDP's
  ``gradient_as_bucket_view``): autograd accumulates in place, the hook only counts (``grad_landed``). ``zero()``
  sets ``.grad`` to None (the next gradient is copied into its view, put back) or zeroes the buffer. On the
  synchronising micro-batch a bucket is all-reduced (stage 0) or reduce-scattered in place into this rank's shard
  (stage 1). A new window on top of reduced gradients first keeps one copy of them (stage 0: rank 0's; stage 1:
  each rank's shard) and zeros the rest.
- ``REDUCE_SCATTER_STAGED`` (stages 2, 3): each micro-batch's gradients go into a transient staging bucket
  (``zero/grads/staging.py``, the group's ``staging``), reduce-scattered into this rank's gradient partition and
  freed once the collective is seen complete (checked whenever a gradient lands); at most ``max_inflight`` are
  being reduced at once (0: each is waited for as it starts, ``ZeroConfig.overlap_comm`` off). The partition is
  held per bucket (``BucketShards``): a shard from its first reduce-scatter in the window until ``zero()``.

Each bucket moves FILLING -> REDUCING -> DONE (``BucketState``); a collective in flight is an ``Inflight``. With a
``sink`` (optimizer offload) every reduced shard is handed to it once final -- at stages 2-3 into a transient
device shard instead of a device partition, since the partition lives on the host.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from zerobench.distributed import collectives as C
from zerobench.metrics.comm import CommLedger
from zerobench.zero.config import MAX_INFLIGHT
from zerobench.zero.grads.staging import StagingBuckets
from zerobench.zero.layout import PartitionLayout
from zerobench.zero.param import GradState, ZeroParam
from zerobench.zero.storage.buffer import BucketShards, FullBuffer


class GradBucketGroup:
    """Owns every gradient bucket of one layout and their reduction over the DP group."""

    def __init__(
        self,
        layout: PartitionLayout,
        zparams: list[ZeroParam],
        group: C.Group,
        ledger: CommLedger | None,
        grad_dtype: torch.dtype,
        device: torch.device,
        mode: SyncMode,
        max_inflight: int = MAX_INFLIGHT,
        sink: Callable[[int, torch.Tensor, bool], None] | None = None,
        unused_flags: bool = False,
    ):
        """``sink(bucket, shard, accumulate)`` receives every final reduced shard (optimizer offload). ``unused_flags``:
        stage 0's last all-reduce carries every rank's flag "a parameter got no gradient" (``self.full.tail``)."""
        self.layout, self.zparams, self.group, self.ledger = layout, zparams, group, ledger
        self.grad_dtype, self.device, self.mode = grad_dtype, device, mode
        self.keep_full = mode is not SyncMode.REDUCE_SCATTER_STAGED
        """A persistent full gradient buffer accumulates micro-batches (stages 0-1)."""
        self.max_inflight = max_inflight
        tail = group.size if unused_flags and mode is SyncMode.ALL_REDUCE and layout.buckets else 0
        self.full: FullBuffer | None = FullBuffer(layout, grad_dtype, device, tail) if self.keep_full else None
        self.views = [self.full.param_view(zp.slot.index) for zp in zparams] if self.keep_full else []
        """Stages 0-1: each parameter's gradient view of the full buffer (its ``.grad``)."""
        self.view_ptrs = [v.data_ptr() for v in self.views]
        """Where each view's data is: ``p.grad.data = t`` re-points the view object itself off the buffer."""
        self.sink = sink
        self.local: BucketShards | None = None if self.keep_full or sink else BucketShards(layout, grad_dtype, device)
        self.staging = StagingBuckets(layout, grad_dtype, device)
        self.staging_buffers = self.staging.buffers
        """Stages 2-3: the staging buckets in flight (``zero/grads/staging.py``)."""
        self.inflight: deque[Inflight] = deque()
        self.state = [BucketState.FILLING] * len(layout.buckets)
        self.pending = [len(b.params) for b in layout.buckets]
        self.next_start = 0
        self.sync = True
        self.first_micro = True
        self.pre_scale: float | None = None
        """What a plain backward's gradients are multiplied by before their collective (None: already scaled)."""
        self.reduced = False
        """Whether the buffers hold reduced gradients since the last ``zero()``."""
        self.zeroed = False
        """Whether the window was opened by ``zero(set_to_none=False)`` over gradients that existed (a window reduced
        or zeroed so before it): torch's ``.grad`` is then zeros, not None, and ``torch.optim`` steps such zeros
        (momentum and weight decay move the parameters). Over none (after ``set_to_none``, or before any backward)
        ``.grad`` stays None, as torch's ``zero_grad`` leaves a None ``.grad`` alone."""
        self.seen, self.seen_count = [False] * len(zparams), 0
        self.landed_now = [False] * len(zparams)  # landed in this backward pass (``_land_once``)
        self.unused: list[int] = []
        """Parameters (indices) that got no gradient in the last synchronised window on this rank."""
        self.on_bucket_complete: Callable[[int], None] | None = None
        """Called with a bucket whose gradients have all landed, before they are staged (stage 3 frees the unit)."""

    def free_on_complete(self, callback: Callable[[int], None], buckets: frozenset[int]) -> None:
        """Stage 3: ``callback`` frees a unit's parameters when its last bucket, one of ``buckets``, completes; those
        buckets' held gradients are staged only then (``StagingBuckets.deferred``)."""
        self.on_bucket_complete, self.staging.deferred = callback, buckets

    # -- micro-batch lifecycle -------------------------------------------------------------------
    def begin_micro(self, sync: bool, first_in_window: bool, pre_scale: float | None = None) -> None:
        """``pre_scale``: what this micro-batch's gradients are multiplied by before their collective, for what the
        loss did not carry: a plain ``loss.backward()``'s 1 / (N x ``grad_accum_steps``), or under fp16 the 1 / N of
        ``engine.backward`` (its loss carries the whole loss scale); None when the loss carried it all."""
        self.sync = sync or not self.keep_full  # partitioned grads are reduced every micro-batch
        self.pre_scale = pre_scale
        if first_in_window:
            self.seen = [False] * len(self.zparams)
            self.seen_count = 0
            if self.keep_full and self.reduced:  # new gradients summed onto reduced ones: keep one copy of those
                self.full.keep_one_copy(
                    self.group.rank,
                    self.mode is SyncMode.ALL_REDUCE,
                    1.0 if self.pre_scale is None else 1.0 / self.pre_scale,
                )
        self.first_micro = not self.reduced  # partitions: overwrite until something was reduced into them
        self.state = [BucketState.FILLING] * len(self.layout.buckets)
        self.pending = [len(b.params) for b in self.layout.buckets]
        self.landed_now = [False] * len(self.zparams)
        self.next_start = 0
        if not self.keep_full:
            self.staging.begin_micro()

    def attach_grad_views(self) -> None:
        """Stages 0-1: point every parameter's ``.grad`` at its view of the full gradient buffer."""
        for zp, view in zip(self.zparams, self.views):
            zp.param.grad = view

    def owns_grad(self, i: int, grad: torch.Tensor) -> bool:
        """Whether ``grad`` is parameter ``i``'s view of the buffer, still over the buffer's memory in its layout
        (``p.grad.data = t`` moves the view object itself, even onto a transposed alias of its own memory)."""
        return grad is self.views[i] and grad.data_ptr() == self.view_ptrs[i] and grad.is_contiguous()

    @torch.no_grad()  # a create_graph gradient's value, not its history: the buffer stays a plain tensor
    def restore_view(self, i: int, value: torch.Tensor | None) -> None:
        """Parameter ``i``'s ``.grad`` becomes its view of the buffer again (made anew: an assignment to
        ``.grad.data`` moved the old one off it), holding ``value`` (None: zeros)."""
        view = self.full.param_view(i)
        if value is None:
            view.zero_()
        elif not (value.data_ptr() == view.data_ptr() and value.stride() == view.stride()):
            if value.untyped_storage().data_ptr() == self.full.data.untyped_storage().data_ptr():
                value = value.clone()  # an alias of the buffer in another layout (p.grad = p.grad.t())
            view.copy_(value)
        self.views[i] = view
        self.zparams[i].param.grad = view

    def _rebuild_moved_views(self) -> None:
        """Views an assignment to ``.grad.data`` moved off the buffer, made anew (before they are re-attached)."""
        for i, view in enumerate(self.views):
            if view.data_ptr() != self.view_ptrs[i] or not view.is_contiguous():
                self.views[i] = self.full.param_view(i)

    def grad_landed(self, zp: ZeroParam, param: torch.Tensor) -> None:
        """Stages 0-1, from the post-accumulate-grad hook: autograd has accumulated into ``param.grad``,
        normally the view itself. If ``.grad`` was replaced (or its ``.data``), it holds the parameter's whole
        gradient as torch defines it (set to None: the new one alone; to another tensor, or ``create_graph``: that
        sum), so its value replaces the view's and the view is put back; another dtype (a module's ``.half()``) is
        refused."""
        self._land_once(zp)
        i, grad = zp.slot.index, param.grad
        if not self.owns_grad(i, grad) or grad.dtype is not self.grad_dtype:
            zp.check_grad(grad, self.grad_dtype)
            self.restore_view(i, grad)
        self._landed(zp)

    def add_grad(self, zp: ZeroParam, grad: torch.Tensor) -> None:
        """Stages 2-3, from the parameter's post-accumulate-grad hook: into its staging bucket
        (``zero/grads/staging.py``)."""
        self._land_once(zp)
        zp.check_grad(grad, self.grad_dtype)
        if self.inflight:  # free the staging buffers of collectives already finished
            self._finish_reduces(block=False)
        # with one still running, a large bucket's gradients are held (``StagingBuckets.land``)
        self.staging.land(zp.slot, grad, self.pre_scale, busy=bool(self.inflight))
        self._landed(zp)

    def _land_once(self, zp: ZeroParam) -> None:
        """Refuse a parameter's second gradient in one pass (a re-entrant recompute's own backward), as DDP does."""
        if self.landed_now[zp.slot.index]:
            raise RuntimeError(
                f"parameter {zp.name!r} received its gradient twice in one backward pass: it is used in more than "
                "one re-entrant checkpointed region (a shared module or tied weights across checkpointed blocks, a "
                "block checkpointed twice), each running a backward of its own; use "
                "torch.utils.checkpoint(..., use_reentrant=False) there, or keep its call outside them"
            )
        self.landed_now[zp.slot.index] = True

    def _landed(self, zp: ZeroParam) -> None:
        slot = zp.slot
        zp.grad_state = GradState.ACCUMULATED
        if not self.seen[slot.index]:
            self.seen[slot.index] = True
            self.seen_count += 1
        self.pending[slot.bucket] -= 1
        if self.pending[slot.bucket] == 0 and self.sync:
            self._start_ready()

    def _start_ready(self) -> None:
        """Start every complete bucket from ``next_start`` on, in index order."""
        while self.next_start < len(self.pending) and self.pending[self.next_start] == 0:
            self._start_reduce(self.next_start)
            self.next_start += 1

    def _start_reduce(self, bucket: int) -> None:
        assert self.state[bucket] is BucketState.FILLING, f"bucket {bucket} started twice ({self.state[bucket]})"
        self.state[bucket] = BucketState.REDUCING
        if self.on_bucket_complete is not None:  # first: what it frees is not held beside the staging copy
            self.on_bucket_complete(bucket)
        g = self.group
        if self.keep_full:
            view = self.full.bucket_view(bucket)
            if self.pre_scale is not None:
                view.mul_(self.pre_scale)
            if self.mode is SyncMode.ALL_REDUCE:
                if bucket == len(self.layout.buckets) - 1 and self.full.tail.numel():  # all started: flags known
                    view = self.full.with_flag(g.rank, self.seen_count < len(self.zparams))
                work = C.all_reduce(view, g, self.ledger, "grad", async_op=True)
            else:
                out = self.full.shard_view(bucket, g.rank)
                work = C.reduce_scatter(out, view, g, self.ledger, "grad", async_op=True, inp_is_scratch=True)
            self.inflight.append(Inflight(bucket, work, None, None, None))
        else:
            if self.staging.must_wait(bucket):  # its gradients were held: the collective in flight finishes first
                self._finish_reduces(block=True)
            staging = self.staging.pop(bucket)
            if self.local is None:  # offload: a transient device shard, handed to the sink when reduced
                shard = self.layout.buckets[bucket].shard_numel
                out, acc = torch.empty(shard, dtype=self.grad_dtype, device=self.device), None
            elif self.first_micro:
                out, acc = self.local.take(bucket), None
            else:
                acc = self.local.get(bucket)
                out = torch.empty_like(acc)
            work = C.reduce_scatter(out, staging, g, self.ledger, "grad", async_op=True, inp_is_scratch=True)
            self.inflight.append(Inflight(bucket, work, staging, out, acc, self.first_micro))
        self._finish_reduces(block=False)

    def _finish_reduces(self, block: bool) -> None:
        """Finish completed collectives (all of them if ``block``), freeing their staging buffers."""
        while self.inflight:
            head = self.inflight[0]
            over = len(self.inflight) > self.max_inflight
            done = head.work is None or head.work.is_completed()
            if not (block or over or done):
                return
            if head.work is not None:
                head.work.wait()
            if head.staging is not None:
                self.staging.release(head.bucket, head.staging)
            if head.accumulate_into is not None:
                head.accumulate_into.add_(head.out)
            if self.sink is not None:
                if self.keep_full:  # stage 1: the window's sum is already in the full buffer
                    self.sink(head.bucket, self.full.shard_view(head.bucket, self.group.rank), False)
                else:
                    self.sink(head.bucket, head.out, not head.first)
            assert self.state[head.bucket] is BucketState.REDUCING, (head.bucket, self.state[head.bucket])
            self.state[head.bucket] = BucketState.DONE
            self.inflight.popleft()

    def wait_inflight(self) -> None:
        """Finish every collective in flight now (stages 2-3: before autograd allocates a large tied parameter's
        second gradient, ``zero/grads/staging.py``)."""
        if self.inflight:
            self._finish_reduces(block=True)

    def finish(self, on_started: Callable[[list[int]], None] | None = None) -> None:
        """End of a micro-batch's backward: start the buckets still missing gradients (zeros for the
        parameters unused on this rank), record the window's unused ones, call ``on_started(unused)`` (a
        synchronised window: every bucket started, none waited for yet), and wait for every bucket."""
        if self.sync:
            self.complete(range(self.next_start, len(self.pending)))
            self.unused = (
                [] if self.seen_count == len(self.zparams) else [i for i, seen in enumerate(self.seen) if not seen]
            )
            if on_started is not None:
                on_started(self.unused)
        self._finish_reduces(block=True)
        if self.sync:
            self.reduced = True

    def complete(self, buckets) -> None:
        """Zeros for the gradients ``buckets`` still miss (parameters unused on this rank: at the end of backward, or a
        stage-3 unit this rank skipped, ``zero/stage3/skipped.py``); complete buckets then start in index order."""
        for b in buckets:
            if self.pending[b]:
                self._fill_missing(b)
                self.pending[b] = 0
        self._start_ready()

    def _fill_missing(self, bucket: int) -> None:
        """Zeros where this bucket has no gradient yet (staging buckets start as zeros)."""
        b = self.layout.buckets[bucket]
        if not self.keep_full:
            self.staging.fill_missing(bucket)
            return
        for i in b.params:
            if self.zparams[i].grad_state is GradState.NONE:
                self.restore_view(i, None)

    def _has_grad(self) -> bool:
        """Whether torch's ``.grad`` would exist now: since a backward, or zeros kept so; at stages 0-1 only where some
        ``.grad`` is not None (set to None by hand, torch's ``zero_grad`` leaves it None)."""
        had = self.reduced or self.zeroed or any(zp.grad_state is not GradState.NONE for zp in self.zparams)
        return had and (not self.keep_full or any(zp.param.grad is not None for zp in self.zparams))

    def zero(self, set_to_none: bool = True) -> None:
        """Start a new window. Stages 0-1, as ``torch.optim``: ``.grad`` None (no memset; the next gradient is
        copied into its view instead of added to zeros), or the buffer zeroed (``set_to_none=False``)."""
        self.zeroed = not set_to_none and self._has_grad()
        for zp in self.zparams:
            zp.grad_state = GradState.NONE
        self.reduced = False
        if self.keep_full and set_to_none:
            for zp in self.zparams:
                zp.param.grad = None
        elif self.keep_full:
            self.full.data.zero_()
            self._rebuild_moved_views()
            self.attach_grad_views()
        elif self.local is not None:  # stages 2-3: released; the next window's reduce-scatters write anew
            self.local.release()

    @property
    def unused_flags(self) -> torch.Tensor | None:
        """Stage 0: every rank's unused flag, summed by the last bucket's all-reduce (read once it has finished);
        None where the flags do not ride (stages 1-3, or ``unused_flags`` off)."""
        return self.full.tail if self.full is not None and self.full.tail.numel() else None

    # -- views the optimizer needs -----------------------------------------------------------------
    def shard_views(self) -> list[torch.Tensor]:
        """This rank's reduced gradient shard of every bucket (averaged over ranks)."""
        if self.keep_full:
            return [
                self.full.shard_view(b.index, self.group.rank if self.layout.shards > 1 else 0)
                for b in self.layout.buckets
            ]
        if self.local is None:
            raise RuntimeError(
                "gradient shards live on the host under optimizer offload: use the engine's grad_chunks()"
            )
        return self.local.views()

    def tensors(self) -> dict[str, list[torch.Tensor]]:
        """The gradient tensors held now and the transient staging buffers."""
        held = [self.full.data] if self.full is not None else self.local.held() if self.local is not None else []
        return {"grads": held, "comm_buffers": list(self.staging_buffers.values()) + self.staging.held_tensors()}

    def grad_bytes(self) -> int:
        """Device bytes of the gradients while held (stages 2-3: from backward until ``zero()``)."""
        if self.full is not None:
            return self.full.data.untyped_storage().nbytes()
        return self.local.nbytes() if self.local is not None else 0


class SyncMode(enum.Enum):
    """How a bucket group keeps and reduces gradients."""

    ALL_REDUCE = "all_reduce"
    """Stage 0: a full gradient buffer, each bucket all-reduced."""
    REDUCE_SCATTER_FULL = "reduce_scatter_full"
    """Stage 1: a full gradient buffer, each bucket reduce-scattered in place into this rank's shard."""
    REDUCE_SCATTER_STAGED = "reduce_scatter_staged"
    """Stages 2-3: transient staging buckets reduce-scattered into this rank's gradient partition."""

    @classmethod
    def for_stage(cls, stage: int) -> SyncMode:
        return cls.ALL_REDUCE if stage == 0 else cls.REDUCE_SCATTER_FULL if stage == 1 else cls.REDUCE_SCATTER_STAGED


class BucketState(enum.Enum):
    """FILLING -> REDUCING (collective started) -> DONE (collective finished); FILLING again as the next
    micro-batch begins (``begin_micro``)."""

    FILLING = "filling"
    REDUCING = "reducing"
    DONE = "done"


@dataclass
class Inflight:
    """A bucket's collective in flight: its work, staging buffer, output and where the output is added."""

    bucket: int
    work: object
    staging: torch.Tensor | None
    out: torch.Tensor | None
    accumulate_into: torch.Tensor | None
    first: bool = True
