"""Stage 3 (P_os+g+p): parameters partitioned, gathered per module just in time, freed right after.

Each *unit* (every transformer block, plus the root module for the embeddings and final norm) owns one
bucket of the layout. Its parameters are views of one flat full-size buffer whose storage exists only
while the unit is gathered (the storage is resized to 0 otherwise, so the views stay valid for autograd's
saved tensors). The scheduler gathers a unit before its forward and again before its backward (a hook on
the unit's output gradient), prefetching the next unit in execution order; it frees a unit after its
forward and as soon as its gradients have been handed to the reduce-scatter. The root stays gathered for
the whole forward (the tied LM head reuses the embedding) and again for the whole backward, so every
parameter is gathered twice per step: with the reduce-scatter, 3Ψ of traffic, as the paper counts.

Under parameter offload a unit's shard lives in host memory: a gather first copies it to a transient
device shard (on the offload side stream, ordered before the all-gather by an event), so a prefetch
overlaps both the copy and the all-gather with the current unit's compute.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from zerobench.distributed import collectives as C
from zerobench.metrics.comm import CommLedger
from zerobench.metrics.memory import resize_storage
from zerobench.zero.layout import BucketSlot
from zerobench.zero.param import ParamState, ZeroParam


class ParamUnit:
    """The parameters of one module, gathered and freed together."""

    def __init__(
        self,
        module: nn.Module,
        bucket: BucketSlot,
        zparams: list[ZeroParam],
        local: torch.Tensor,
        group: C.Group,
        ledger: CommLedger | None,
        device: torch.device | None = None,
        transfer=None,
    ):
        """``transfer`` (an ``offload.Transfer``) marks ``local`` as host memory (parameter offload)."""
        self.module, self.bucket, self.zparams, self.local = module, bucket, zparams, local
        self.group, self.ledger, self.transfer = group, ledger, transfer
        self.staging: torch.Tensor | None = None
        device = local.device if device is None else device
        self.full = torch.empty(bucket.numel, dtype=local.dtype, device=device)
        self.nbytes = self.full.untyped_storage().nbytes()
        for zp in zparams:
            s = zp.slot
            zp.param.data = self.full[s.start - bucket.start : s.end - bucket.start].view(s.shape)
        self.work = None
        self.state = ParamState.UNSHARDED
        self.in_backward = False
        self.free()

    def _set_state(self, state: ParamState) -> None:
        self.state = state
        for zp in self.zparams:
            zp.state = state

    def start_gather(self) -> None:
        if self.state is not ParamState.SHARDED:
            return
        resize_storage(self.full, self.nbytes)
        src = self.local
        if self.transfer is not None:  # host shard -> transient device shard, then the gather
            self.staging = src = torch.empty(self.local.numel(), dtype=self.local.dtype, device=self.full.device)
            self.transfer.wait_event(self.transfer.copy(src, self.local, track=False))
        self.work = C.all_gather(self.full, src, self.group, self.ledger, "param", async_op=True)
        self._set_state(ParamState.GATHERING)

    def wait(self) -> None:
        self.start_gather()
        if self.state is ParamState.GATHERING:
            if self.work is not None:
                self.work.wait()
            self.work = None
            self.staging = None
            self._set_state(ParamState.UNSHARDED)

    def free(self) -> None:
        if self.state is ParamState.GATHERING:
            self.wait()
        resize_storage(self.full, 0)
        self._set_state(ParamState.SHARDED)


class Stage3Scheduler:
    """Installs the module hooks that gather, prefetch and free units around forward and backward."""

    def __init__(self, root: ParamUnit, blocks: list[ParamUnit], prefetch: bool):
        self.root, self.blocks, self.prefetch = root, blocks, prefetch
        self.by_bucket = {u.bucket.index: u for u in [root, *blocks]}
        self.handles = []
        self.peak_gathered_bytes = 0
        """Most device bytes of gathered parameters (and parameter-offload staging) held at once."""
        for i, unit in enumerate([root, *blocks]):
            m = unit.module
            self.handles.append(m.register_forward_pre_hook(partial(self._pre_forward, i)))
            self.handles.append(m.register_forward_hook(partial(self._post_forward, i)))

    @property
    def order(self) -> list[ParamUnit]:
        return [self.root, *self.blocks]

    def _pre_forward(self, i: int, module, args) -> None:
        unit = self.order[i]
        if i == 0:
            for u in self.order:
                u.in_backward = False
        unit.wait()
        if self.prefetch and i + 1 < len(self.order):
            self.order[i + 1].start_gather()
        self._note_gathered()

    def _post_forward(self, i: int, module, args, output) -> None:
        unit = self.order[i]
        unit.free()
        if torch.is_grad_enabled():
            for t in tree_flatten(output)[0]:
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(partial(self._pre_backward, i))

    def _pre_backward(self, i: int, grad: torch.Tensor) -> None:
        unit = self.order[i]
        if unit.in_backward:
            return
        unit.in_backward = True
        unit.wait()
        # Backward runs root (LM head) first, then blocks last to first.
        nxt = len(self.blocks) if i == 0 else i - 1
        if self.prefetch and nxt >= 1:
            self.order[nxt].start_gather()
        self._note_gathered()

    def _note_gathered(self) -> None:
        held = sum(u.full.untyped_storage().nbytes() for u in self.order)
        held += sum(u.staging.untyped_storage().nbytes() for u in self.order if u.staging is not None)
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, held)

    def on_bucket_reduced(self, bucket: int) -> None:
        """The unit's gradients were handed to the reduce-scatter: its parameters can go."""
        self.by_bucket[bucket].free()

    def gathered_tensors(self) -> list[torch.Tensor]:
        out = [u.full for u in self.order if u.full.untyped_storage().nbytes()]
        return out + [u.staging for u in self.order if u.staging is not None]
