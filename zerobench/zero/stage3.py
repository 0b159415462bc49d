"""Stage 3 (P_os+g+p): parameters partitioned, gathered per module just in time, freed right after.

Each *unit* (every transformer block, plus the root module for the embeddings and final norm) owns one
bucket of the layout. While a unit is gathered its parameters are views of one flat full-size buffer;
otherwise that buffer's storage is resized to 0 (views autograd saved stay valid and see the values
again once re-gathered) and each parameter's ``.data`` is a 0-element placeholder, so reading a
parameter outside forward shows an empty tensor instead of touching freed memory. ``gathered()``
gathers every unit for reading (``ZeroEngine.gathered_params``); ``state_dict()`` on a sharded module
is refused with a one-line error that says so. The scheduler gathers a unit before its forward and again before its backward (a hook on
the unit's output gradient), prefetching the next unit in execution order; it frees a unit after its
forward and as soon as its gradients have been handed to the reduce-scatter. A forward that runs inside
backward is a recompute (the model's own ``torch.utils.checkpoint``): the unit is gathered for it and
nothing is prefetched or freed, and after every optimizer step all units are freed, so no unit carries
pre-step values into the next forward. The root stays gathered for
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
from zerobench.zero.allocator import Allocator, PlainAllocator
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
        allocator: Allocator | None = None,
    ):
        """``transfer`` (an ``offload.Transfer``) marks ``local`` as host memory (parameter offload)."""
        self.allocator = allocator if allocator is not None else PlainAllocator()
        self.module, self.bucket, self.zparams, self.local = module, bucket, zparams, local
        self.group, self.ledger, self.transfer = group, ledger, transfer
        self.staging: torch.Tensor | None = None
        device = local.device if device is None else device
        self.full = torch.empty(bucket.numel, dtype=local.dtype, device=device)
        self.nbytes = self.full.untyped_storage().nbytes()
        self.views = [
            self.full[zp.slot.start - bucket.start : zp.slot.end - bucket.start].view(zp.slot.shape)
            for zp in zparams
        ]
        self.placeholder = torch.empty(0, dtype=local.dtype, device=device)
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
        self.allocator.resize(self.full, self.nbytes)
        src = self.local
        if self.transfer is not None:  # host shard -> transient device shard, then the gather
            self.staging = src = torch.empty(self.local.numel(), dtype=self.local.dtype, device=self.full.device)
            self.transfer.wait_event(self.transfer.copy(src, self.local, track=False))
        self.work = C.all_gather(self.full, src, self.group, self.ledger, "param", async_op=True)
        self._set_state(ParamState.GATHERING)

    def finish_gather(self) -> None:
        self.start_gather()
        if self.state is ParamState.GATHERING:
            if self.work is not None:
                self.work.wait()
            self.work = None
            self.staging = None
            for zp, view in zip(self.zparams, self.views):
                zp.param.data = view
            self._set_state(ParamState.UNSHARDED)

    def free(self) -> None:
        if self.state is ParamState.GATHERING:
            self.finish_gather()
        for zp in self.zparams:
            zp.param.data = self.placeholder
        self.allocator.resize(self.full, 0)
        self._set_state(ParamState.SHARDED)


def _in_backward() -> bool:
    """Whether autograd's engine is running (a forward now is a checkpoint's recompute)."""
    return torch._C._current_graph_task_id() != -1


class Stage3Scheduler:
    """Installs the module hooks that gather, prefetch and free units around forward and backward."""

    def __init__(self, model: nn.Module, root: ParamUnit | None, blocks: list[ParamUnit], prefetch: bool):
        """``root`` (the model's own parameters, gathered for the whole pass) may be None: none are left."""
        self.root, self.blocks, self.prefetch = root, blocks, prefetch
        self.modules = [model, *(u.module for u in blocks)]
        self.order: list[ParamUnit | None] = [root, *blocks]
        self.by_bucket = {u.bucket.index: u for u in self.order if u is not None}
        self.handles = []
        self.reading = False
        self.peak_gathered_bytes = 0
        """Most device bytes of gathered parameters (and parameter-offload staging) held at once."""
        for i, m in enumerate(self.modules):
            self.handles.append(m.register_forward_pre_hook(partial(self._pre_forward, i)))
            self.handles.append(m.register_forward_hook(partial(self._post_forward, i)))
        unit_of = {id(zp.param): u for u in self.by_bucket.values() for zp in u.zparams}
        for name, m in model.named_modules():
            units = list({id(u): u for p in m.parameters(recurse=False) if (u := unit_of.get(id(p)))}.values())
            if units:
                self.handles.append(m.register_state_dict_pre_hook(partial(self._check_readable, name, units)))

    @classmethod
    def build(cls, model: nn.Module, units: list[nn.Module], layout, zparams: list[ZeroParam], shards: list[torch.Tensor],
              group: C.Group, ledger: CommLedger | None, device: torch.device, transfer, prefetch: bool,
              allocator: Allocator | None = None):
        """One ``ParamUnit`` per layout bucket (unit 0 = the root, ``units[k - 1]`` = unit k), scheduled."""
        by_unit: dict[int, list[ZeroParam]] = {}
        for zp in zparams:
            by_unit.setdefault(layout.buckets[zp.slot.bucket].unit, []).append(zp)
        built = {
            b.unit: ParamUnit(model if b.unit == 0 else units[b.unit - 1], b, by_unit[b.unit],
                              shards[b.index], group, ledger, device, transfer, allocator)
            for b in layout.buckets
        }
        return cls(model, built.get(0), [built[u] for u in range(1, len(units) + 1)], prefetch)

    def _pre_forward(self, i: int, module, args) -> None:
        unit = self.order[i]
        if _in_backward():  # a recompute: gather (its backward comes next), prefetch and free nothing
            if unit is not None:
                unit.in_backward = True
                unit.finish_gather()
                self._note_gathered()
            return
        if i == 0:
            for u in self.by_bucket.values():
                u.in_backward = False
        if unit is not None:
            unit.finish_gather()
        if self.prefetch and i + 1 < len(self.order):
            self.order[i + 1].start_gather()
        self._note_gathered()

    def _post_forward(self, i: int, module, args, output) -> None:
        unit = self.order[i]
        if _in_backward() or self.reading:
            return
        if unit is not None:
            unit.free()
        if i == 0:  # end of forward: a unit prefetched but not run (skipped on this rank) goes too
            for u in self.blocks:
                if u.state is not ParamState.SHARDED:
                    u.free()
        if torch.is_grad_enabled():
            for t in tree_flatten(output)[0]:
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(partial(self._pre_backward, i))

    def _pre_backward(self, i: int, grad: torch.Tensor) -> None:
        unit = self.order[i]
        if unit is None or unit.in_backward:
            return
        unit.in_backward = True
        unit.finish_gather()
        # Backward runs root (LM head) first, then blocks last to first.
        nxt = len(self.blocks) if i == 0 else i - 1
        if self.prefetch and nxt >= 1:
            self.order[nxt].start_gather()
        self._note_gathered()

    def _note_gathered(self) -> None:
        units = self.by_bucket.values()
        held = sum(u.full.untyped_storage().nbytes() for u in units)
        held += sum(u.staging.untyped_storage().nbytes() for u in units if u.staging is not None)
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, held)

    def on_bucket_reduced(self, bucket: int) -> None:
        """The unit's gradients were handed to the reduce-scatter: its parameters can go."""
        self.by_bucket[bucket].free()

    def reshard_all(self) -> None:
        """Free every unit (after an optimizer step: a gathered unit would hold pre-step values)."""
        for u in self.by_bucket.values():
            if u.state is not ParamState.SHARDED:
                u.free()

    def gathered(self):
        """Context: every unit gathered (collective over the DP group), freed again on exit."""
        return _Gathered(self)

    def _check_readable(self, name: str, units: list[ParamUnit], module, prefix, keep_vars) -> None:
        if self.reading or all(u.state is ParamState.UNSHARDED for u in units):
            return
        raise RuntimeError(
            f"ZeRO stage 3 holds only this rank's shard of {name or 'the model'!r}'s parameters outside "
            "forward: read them inside `with engine.gathered_params():` (on every DP rank), or save with "
            "zerobench.zero.state_dict.save_checkpoint"
        )

    def gathered_tensors(self) -> list[torch.Tensor]:
        units = self.by_bucket.values()
        out = [u.full for u in units if u.full.untyped_storage().nbytes()]
        return out + [u.staging for u in units if u.staging is not None]


class _Gathered:
    def __init__(self, scheduler: Stage3Scheduler):
        self.s = scheduler

    def __enter__(self) -> None:
        for u in self.s.by_bucket.values():
            u.start_gather()
        for u in self.s.by_bucket.values():
            u.finish_gather()
        self.s.reading = True

    def __exit__(self, *exc) -> None:
        self.s.reading = False
        self.s.reshard_all()
