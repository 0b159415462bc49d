"""One stage-3 unit's parameters: gathered together into one flat buffer, freed together (``ParamUnit``).

The unit is gathered as a whole, one all-gather per layout bucket into one flat full-size buffer. While it is
gathered its parameters are views of that buffer; otherwise the buffer's storage is resized to 0 (views autograd
saved stay valid and see the values again once re-gathered) and each parameter's ``.data`` is a 0-element
placeholder, so reading a parameter outside forward shows an empty tensor instead of touching freed memory. Its
state is ``ParamState`` (SHARDED -> GATHERING -> UNSHARDED -> SHARDED), mirrored on each ``ZeroParam``. When to gather
and free is the gatherer's (``zero/stage3/gatherer.py``).

Under parameter offload a unit's shard lives in host memory: a gather first copies it to a transient
device shard (on the offload side stream, ordered before the all-gather by an event), so a prefetch
overlaps both the copy and the all-gather with the current unit's compute.
"""

from __future__ import annotations

from itertools import pairwise

import torch
from torch import nn

from zerobench.distributed import collectives as C
from zerobench.metrics.comm import CommLedger
from zerobench.zero.layout import BucketSlot
from zerobench.zero.param import ParamState, ZeroParam
from zerobench.zero.storage.allocator import Allocator, PlainAllocator


class ParamUnit:
    """The parameters of one module, gathered and freed together."""

    def __init__(
        self,
        module: nn.Module,
        buckets: list[BucketSlot],
        zparams: list[ZeroParam],
        shards: list[torch.Tensor],
        group: C.Group,
        ledger: CommLedger | None,
        device: torch.device | None = None,
        transfer=None,
        allocator: Allocator | None = None,
    ):
        """``buckets``: consecutive layout buckets; ``shards``: this rank's shard of each. ``transfer`` (a
        ``Transfer``, ``zero/offload/host.py``) marks the shards as host memory (parameter offload)."""
        self.allocator = allocator if allocator is not None else PlainAllocator()
        self.module, self.buckets, self.zparams, self.shards = module, buckets, zparams, shards
        self.group, self.ledger, self.transfer = group, ledger, transfer
        self.staging: torch.Tensor | None = None
        self.complete: set[int] = set()
        start = buckets[0].start
        for prev, b in pairwise(buckets):
            assert b.start == prev.end, "a unit's buckets must be consecutive"
        dtype = shards[0].dtype
        device = shards[0].device if device is None else device
        self._new_buffer(buckets[-1].end - start, dtype, device)
        self.nbytes = self.full.untyped_storage().nbytes()
        self.held = 0
        """Device bytes this unit holds now (its gathered buffer and any parameter-offload staging)."""
        self.placeholder = torch.empty(0, dtype=dtype, device=device)
        self.param_ids = frozenset(id(zp.param) for zp in zparams)
        self.works: list = []
        self.state = ParamState.UNSHARDED
        self.edit_mark: tuple[int, ...] | None = None
        """Its parameters' versions once gathered on demand, outside the model's forward (a call of one of its
        modules); ``free`` compares it, and a change since (an in-place edit of a parameter, which the shard and
        the fp32 master never see) is kept in ``lost_edit`` for the next ``step()`` to refuse."""
        self.lost_edit: list[str] = []
        self.free_mark: tuple[int, ...] | None = None
        """Its parameters' versions when last freed: an in-place edit while sharded (``nn.init``, ``.zero_()``,
        ``reset_parameters()``) reaches only the empty placeholder, and moves these (``edited_while_sharded``)."""
        self.backward_task: int | None = None
        """The autograd graph task this unit was gathered for in backward (None since its last forward): a second
        backward through a retained graph (``retain_graph=True``, two losses) is a new task and gathers again."""
        self.free()

    def versions(self) -> tuple[int, ...]:
        """Its parameters' version counters (an in-place edit of one moves its own)."""
        return tuple(zp.param._version for zp in self.zparams)

    def edited(self) -> list[str]:
        """The names of its parameters changed in place since it was gathered on demand (``edit_mark``)."""
        if self.edit_mark is None:
            return []
        return [zp.name for zp, v, mark in zip(self.zparams, self.versions(), self.edit_mark) if v != mark]

    def edited_while_sharded(self) -> list[str]:
        """The names of its parameters changed in place since it was freed (``free_mark``), while sharded."""
        if self.free_mark is None or self.state is not ParamState.SHARDED:
            return []
        return [zp.name for zp, v, mark in zip(self.zparams, self.versions(), self.free_mark) if v != mark]

    def _refuse_edits(self) -> None:
        """Before a gather, which replaces each placeholder and an edit made to it with it: one line naming the
        parameters changed in place while partitioned. One whose ``.data`` was assigned or re-set instead is left to
        ``finish_gather``'s own messages, which say so."""
        cdata = self.placeholder.untyped_storage()._cdata
        on_placeholder = {zp.name for zp in self.zparams if zp.param.untyped_storage()._cdata == cdata}
        edited = [n for n in self.edited_while_sharded() if n in on_placeholder]
        if edited:
            raise RuntimeError(
                f"ZeRO stage 3: {', '.join(edited[:3])}{' ...' if len(edited) > 3 else ''} changed in place while "
                "partitioned (outside engine.gathered_params()): the change reached only an empty placeholder and "
                "would be lost; change parameters inside `with engine.gathered_params(modifier_rank=0):`"
            )

    def expect_copy(self, param) -> None:
        """``param``'s placeholder is about to take one copy that is no edit: a ``load_state_dict`` whose value the
        shards took already (``zero/state/module_state.py``) has torch copy an empty tensor into it next. An edit made
        to it before is replaced by that value, so it is forgotten too."""
        if self.free_mark is not None and self.state is ParamState.SHARDED:
            now = self.versions()
            self.free_mark = tuple(
                v + 1 if zp.param is param else m for zp, v, m in zip(self.zparams, now, self.free_mark)
            )

    def _new_buffer(self, numel: int, dtype: torch.dtype, device: torch.device) -> None:
        """A new full-size buffer, and the bucket and parameter views of it."""
        start = self.buckets[0].start
        self.full = torch.empty(numel, dtype=dtype, device=device)
        self.bucket_views = [self.full[b.start - start : b.end - start] for b in self.buckets]
        self.views = [self.full[zp.slot.start - start : zp.slot.end - start].view(zp.slot.shape) for zp in self.zparams]

    def _set_state(self, state: ParamState) -> None:
        self.state = state
        for zp in self.zparams:
            zp.state = state

    def start_gather(self) -> None:
        if self.state is not ParamState.SHARDED:
            return
        self._refuse_edits()
        self.allocator.resize(self.full, self.nbytes)
        self.held = self.nbytes
        srcs = self.shards
        if self.transfer is not None:  # host shards -> one transient device buffer, then the gathers
            self.staging = torch.empty(sum(s.numel() for s in srcs), dtype=self.full.dtype, device=self.full.device)
            srcs = list(self.staging.split([s.numel() for s in self.shards]))
            self.held += self.staging.untyped_storage().nbytes()
            event = None
            for dst, src in zip(srcs, self.shards):
                event = self.transfer.copy(dst, src, track=False)
            self.transfer.wait_event(event)
        self.works = [
            C.all_gather(out, src, self.group, self.ledger, "param", async_op=True)
            for out, src in zip(self.bucket_views, srcs)
        ]
        self._set_state(ParamState.GATHERING)

    def finish_gather(self) -> None:
        self.start_gather()
        if self.state is ParamState.GATHERING:
            for work in self.works:
                if work is not None:
                    work.wait()
            self.works = []
            self.staging = None
            self.held = self.nbytes
            placeholder = self.placeholder.untyped_storage()._cdata
            for zp, view in zip(self.zparams, self.views):
                if zp.param.dtype is not view.dtype:  # a submodule's .half() after apply_zero: refused, not undone
                    raise zp.converted(f"is {zp.param.dtype}", view.dtype)
                if zp.param.numel():  # .data assigned while freed: the gather would silently replace it
                    raise RuntimeError(
                        f"parameter {zp.name!r} was assigned .data (shape {tuple(zp.param.shape)}) while stage 3 held "
                        "it partitioned, and the gather would replace those values: assign inside "
                        "engine.gathered_params(modifier_rank=0), or load them with load_state_dict"
                    )
                if zp.param.untyped_storage()._cdata != placeholder:
                    # set_() while freed: a parametrization's right_inverse ran on the empty placeholder, so the
                    # values it would have transformed are gathered untransformed
                    raise RuntimeError(
                        f"parameter {zp.name!r} was re-set (set_(), e.g. by register_parametrization's right_inverse) "
                        "while stage 3 held it partitioned: what it computed from was the empty placeholder; do "
                        "it before apply_zero, or inside engine.gathered_params(modifier_rank=0)"
                    )
                zp.param.data = view
            self._set_state(ParamState.UNSHARDED)

    @torch.no_grad()
    def reattach(self, keep: bool = True) -> None:
        """While gathered: take back a parameter whose ``.data`` was assigned (inside ``gathered_params``): its values
        into its view of the gathered buffer and the view put back, so that what the context's exit broadcasts and
        writes back is what the model holds (``keep=False``: the view put back, the values discarded)."""
        if self.state is not ParamState.UNSHARDED:
            return
        for zp, view in zip(self.zparams, self.views):
            data = zp.param.data
            if data.shape == view.shape and (data.numel() == 0 or data.data_ptr() == view.data_ptr()):
                continue
            if keep:
                zp.check_assigned(data, view)
                view.copy_(data)
            zp.param.data = view

    def free(self, keep_values: bool = False) -> None:
        """Free the gathered buffer: its storage is resized to 0 in place, so views autograd saved see the values
        again once re-gathered. ``keep_values`` (leaving ``gathered_params``): the storage is left to whatever
        outside still views it -- a ``state_dict()`` taken inside the context, to be saved after it -- and the unit
        gathers into a new buffer next time, as DeepSpeed's freeing rebinds ``param.data`` and leaves tensors
        taken earlier their values. Resized in place, those tensors would point at freed memory (a crash when
        read, or a file of the right keys and no data when saved). Nothing outside: the old storage is freed."""
        if self.state is ParamState.GATHERING:
            self.finish_gather()
        if self.edit_mark is not None and not keep_values:  # (leaving gathered_params: written back already)
            self.lost_edit += self.edited()
        self.edit_mark = None
        for zp in self.zparams:
            zp.param.data = self.placeholder
        self.free_mark = self.versions()
        if keep_values and self.full.untyped_storage().nbytes():
            numel, dtype, device = self.full.numel(), self.full.dtype, self.full.device
            self.full = self.bucket_views = self.views = None  # dropped first: unshared, it is freed before the next
            self._new_buffer(numel, dtype, device)
        self.allocator.resize(self.full, 0)
        self.held = 0
        self.complete.clear()
        self._set_state(ParamState.SHARDED)
