"""Stage 3 (P_os+g+p): parameters partitioned, gathered per module just in time, freed right after.

Each *unit* (every transformer block, plus the root module for the embeddings and final norm) owns one or
more consecutive buckets of the layout (a unit larger than ``bucket_numel`` is cut into several, so its
gradients are reduce-scattered in bucket-sized pieces as backward produces them, and no staging buffer
exceeds the bucket size). The unit is gathered as a whole, one all-gather per bucket into one flat
full-size buffer, and freed once all of its buckets' gradients have landed, before they are staged and
reduce-scattered (as FSDP2 reshards before it reduce-scatters). While a
unit is gathered its parameters are views of that buffer;
otherwise that buffer's storage is resized to 0 (views autograd saved stay valid and see the values
again once re-gathered) and each parameter's ``.data`` is a 0-element placeholder, so reading a
parameter outside forward shows an empty tensor instead of touching freed memory. ``ZeroEngine.gathered_params``
(``zero/gathered.py``) gathers every unit for reading; ``state_dict()`` on a sharded module
is refused with a one-line error that says so. The scheduler gathers a unit before its forward and again before its backward (a hook on
the unit's output gradient), prefetching the next unit in execution order; it frees a unit after its
forward and as soon as its gradients have all landed. A forward that runs inside
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
from itertools import pairwise

import torch
from torch import nn

from zerobench.distributed import collectives as C
from zerobench.metrics.comm import CommLedger
from zerobench.zero.allocator import Allocator, PlainAllocator
from zerobench.zero.containers import tensors_in
from zerobench.zero.escaped import note_escaped_reads, refuse_returned
from zerobench.zero.layout import BucketSlot
from zerobench.zero.param import ParamState, ZeroParam


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
        """``buckets``: consecutive layout buckets; ``shards``: this rank's shard of each. ``transfer`` (an
        ``offload.Transfer``) marks the shards as host memory (parameter offload)."""
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
        self.full = torch.empty(buckets[-1].end - start, dtype=dtype, device=device)
        self.nbytes = self.full.untyped_storage().nbytes()
        self.held = 0
        """Device bytes this unit holds now (its gathered buffer and any parameter-offload staging)."""
        self.bucket_views = [self.full[b.start - start : b.end - start] for b in buckets]
        self.views = [self.full[zp.slot.start - start : zp.slot.end - start].view(zp.slot.shape) for zp in zparams]
        self.placeholder = torch.empty(0, dtype=dtype, device=device)
        self.param_ids = frozenset(id(zp.param) for zp in zparams)
        self.works: list = []
        self.state = ParamState.UNSHARDED
        self.backward_task: int | None = None
        """The autograd graph task this unit was gathered for in backward (None since its last forward): a second
        backward through a retained graph (``retain_graph=True``, two losses) is a new task and gathers again."""
        self.free()

    def _set_state(self, state: ParamState) -> None:
        self.state = state
        for zp in self.zparams:
            zp.state = state

    def start_gather(self) -> None:
        if self.state is not ParamState.SHARDED:
            return
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
        self.works = [C.all_gather(out, src, self.group, self.ledger, "param", async_op=True)
                      for out, src in zip(self.bucket_views, srcs)]
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
            for zp, view in zip(self.zparams, self.views):
                if zp.param.dtype is not view.dtype:  # a submodule's .half() after apply_zero: refused, not undone
                    raise zp.converted(f"is {zp.param.dtype}", view.dtype)
                zp.param.data = view
            self._set_state(ParamState.UNSHARDED)

    def free(self) -> None:
        if self.state is ParamState.GATHERING:
            self.finish_gather()
        for zp in self.zparams:
            zp.param.data = self.placeholder
        self.allocator.resize(self.full, 0)
        self.held = 0
        self.complete.clear()
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
        self.units = [u for u in self.order if u is not None]
        self.by_bucket = {b.index: u for u in self.units for b in u.buckets}
        self.handles = []
        self.reading = False
        self.peak_gathered_bytes = 0
        """Most device bytes of gathered parameters (and parameter-offload staging) held at once."""
        for i, m in enumerate(self.modules):
            self.handles.append(m.register_forward_pre_hook(partial(self._pre_forward, i)))
            self.handles.append(m.register_forward_hook(partial(self._post_forward, i)))
        self.handles.append(model.register_forward_hook(note_escaped_reads(self._freed), always_call=True))
        unit_of = {id(zp.param): u for u in self.units for zp in u.zparams}
        for name, m in model.named_modules():
            units = list({id(u): u for p in m.parameters(recurse=False) if (u := unit_of.get(id(p)))}.values())
            if units:
                self.handles.append(m.register_state_dict_pre_hook(partial(self._check_readable, name, units)))
            if root is not None and root in units and m is not model:  # called on its own: gather the root
                self.handles.append(m.register_forward_pre_hook(self._root_on_demand))

    @classmethod
    def build(cls, model: nn.Module, units: list[nn.Module], layout, zparams: list[ZeroParam], shards: list[torch.Tensor],
              group: C.Group, ledger: CommLedger | None, device: torch.device, transfer, prefetch: bool,
              allocator: Allocator | None = None):
        """One ``ParamUnit`` per unit over its layout buckets (unit 0 = the root, ``units[k - 1]`` = unit k),
        scheduled."""
        by_unit: dict[int, list[ZeroParam]] = {}
        for zp in zparams:
            by_unit.setdefault(layout.buckets[zp.slot.bucket].unit, []).append(zp)
        buckets: dict[int, list] = {}
        for b in layout.buckets:
            buckets.setdefault(b.unit, []).append(b)
        built = {
            u: ParamUnit(model if u == 0 else units[u - 1], bs, by_unit[u], [shards[b.index] for b in bs],
                         group, ledger, device, transfer, allocator)
            for u, bs in buckets.items()
        }
        return cls(model, built.get(0), [built[u] for u in range(1, len(units) + 1)], prefetch)

    def _pre_forward(self, i: int, module, args) -> None:
        unit = self.order[i]
        if _in_backward():  # a recompute: gather (its backward comes next), prefetch and free nothing
            if unit is not None:
                unit.backward_task = torch._C._current_graph_task_id()
                unit.finish_gather()
                self._note_gathered()
            return
        if i == 0:
            for u in self.units:
                u.backward_task = None
        if unit is not None:
            unit.backward_task = None  # a unit called on its own, outside the model's forward, starts a pass too
            unit.finish_gather()
        if self.prefetch and i + 1 < len(self.order):
            self.order[i + 1].start_gather()
        self._note_gathered()

    def _post_forward(self, i: int, module, args, output) -> None:
        unit = self.order[i]
        if _in_backward() or self.reading:
            return
        if unit is not None:
            if i and not isinstance(output, torch.Tensor):
                refuse_returned(unit.param_ids, unit.zparams, type(unit.module).__name__, output)
            unit.free()
        if i == 0:  # end of forward: a unit prefetched but not run (skipped on this rank) goes too
            for u in self.blocks:
                if u.state is not ParamState.SHARDED:
                    u.free()
        if torch.is_grad_enabled():
            for t in tensors_in(output):
                if t.requires_grad:
                    t.register_hook(partial(self._pre_backward, i))

    def _freed(self) -> dict[int, str]:
        """The parameters that are empty now (their unit not gathered), ``id -> name``."""
        return {id(zp.param): zp.name for u in self.units if u.state is not ParamState.UNSHARDED for zp in u.zparams}

    def _root_on_demand(self, module, args) -> None:
        """A module holding root parameters called outside the model's forward (``model.encoder(x)``, as
        DeepSpeed allows): gather the root unit. It stays gathered through that pass's backward and goes
        once its gradients are handed to their reduce-scatters, or at the next ``step()``."""
        if self.root.state is not ParamState.UNSHARDED:
            self.root.finish_gather()
            self._note_gathered()

    def _pre_backward(self, i: int, grad: torch.Tensor) -> None:
        unit = self.order[i]
        task = torch._C._current_graph_task_id()
        if unit is None or unit.backward_task == task:
            return
        unit.backward_task = task
        unit.finish_gather()
        # Backward runs root (LM head) first, then blocks last to first.
        nxt = len(self.blocks) if i == 0 else i - 1
        if self.prefetch and nxt >= 1:
            self.order[nxt].start_gather()
        self._note_gathered()

    def _note_gathered(self) -> None:
        held = sum(u.held for u in self.units)
        if held > self.peak_gathered_bytes:
            self.peak_gathered_bytes = held

    def on_bucket_complete(self, bucket: int) -> None:
        """Every gradient of ``bucket`` has landed; once all of its unit's buckets are complete, no node of this
        backward reads the unit's parameters again, and they go before the gradients are staged."""
        unit = self.by_bucket[bucket]
        unit.complete.add(bucket)
        if len(unit.complete) == len(unit.buckets):
            unit.free()

    def last_buckets(self) -> frozenset[int]:
        """Each unit's last bucket in backward: the one whose completion normally frees it."""
        return frozenset(max(b.index for b in u.buckets) for u in self.units if u.buckets)

    def reshard_all(self) -> None:
        """Free every unit (after an optimizer step: a gathered unit would hold pre-step values)."""
        for u in self.units:
            if u.state is not ParamState.SHARDED:
                u.free()

    def _check_readable(self, name: str, units: list[ParamUnit], module, prefix, keep_vars) -> None:
        if self.reading or all(u.state is ParamState.UNSHARDED for u in units):
            return
        raise RuntimeError(
            f"ZeRO stage 3 holds only this rank's shard of {name or 'the model'!r}'s parameters outside "
            "forward: read them inside `with engine.gathered_params():` (on every DP rank), or save with "
            "zerobench.zero.state_dict.save_checkpoint"
        )

    def gathered_tensors(self) -> list[torch.Tensor]:
        units = self.units
        out = [u.full for u in units if u.full.untyped_storage().nbytes()]
        return out + [u.staging for u in units if u.staging is not None]

