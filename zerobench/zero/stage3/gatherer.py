"""Stage 3 (P_os+g+p): parameters partitioned, gathered per module just in time, freed right after.

Each *unit* (every transformer block, plus the root module for the embeddings and final norm) owns one or more
consecutive buckets of the layout (a unit larger than ``bucket_numel`` is cut into several, so its gradients are
reduce-scattered in bucket-sized pieces as backward produces them, and no staging buffer exceeds the bucket size). A
unit is gathered as a whole and freed as a whole (``zero/stage3/unit.py``), once all of its buckets' gradients have
landed and before they are staged and reduce-scattered, so its parameters are never held beside the staging copy.
``ZeroEngine.gathered_params`` (``zero/state/gathered.py``) gathers every unit for reading; ``state_dict()`` on a
sharded module is refused with a one-line error that says so.

The gatherer gathers a unit before its forward and again before its backward (a hook on the unit's output
gradient), prefetching the next unit in registration order (its reverse in backward); it frees a unit after its
forward and as soon as its gradients have all landed. A forward that runs inside backward is a recompute (the
model's own ``torch.utils.checkpoint``): the unit is gathered for it and nothing is prefetched or freed, and after
every optimizer step all units are freed, so no unit carries pre-step values into the next forward. A unit this
rank's forward skipped while others ran it (LayerDrop) is replayed where it would have run, so every rank issues
the same collectives (``zero/stage3/skipped.py``). The root stays gathered for the whole forward (the tied LM head
reuses the embedding) and again for the whole backward, so every parameter is gathered twice per step: with the
reduce-scatter, 3Ψ of traffic (ZeRO §7.2).
"""

from __future__ import annotations

import warnings
from functools import partial

import torch
from torch import nn

from zerobench.distributed import collectives as C
from zerobench.metrics.comm import CommLedger
from zerobench.zero.interop.containers import tensors_in
from zerobench.zero.interop.tooling import eager, labelled
from zerobench.zero.param import ParamState, ZeroParam
from zerobench.zero.stage3.escaped import note_escaped_reads, refuse_returned
from zerobench.zero.stage3.skipped import SkipTracker
from zerobench.zero.stage3.unit import ParamUnit
from zerobench.zero.storage.allocator import Allocator


def _in_backward() -> bool:
    """Whether autograd's engine is running (a forward now is a checkpoint's recompute)."""
    return torch._C._current_graph_task_id() != -1


class Stage3Gatherer:
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
        self.skips = SkipTracker(len(blocks))
        self._root_task: int | None = None
        self._complete = None
        self._warned = False
        for i, m in enumerate(self.modules):
            self.handles.append(m.register_forward_pre_hook(eager(partial(self._pre_forward, i)), prepend=True))
            self.handles.append(m.register_forward_hook(eager(partial(self._post_forward, i))))
        self.handles.append(model.register_forward_hook(eager(note_escaped_reads(self._freed)), always_call=True))
        unit_of = {id(zp.param): u for u in self.units for zp in u.zparams}
        for name, m in model.named_modules():
            units = list({id(u): u for p in m.parameters(recurse=False) if (u := unit_of.get(id(p)))}.values())
            if units:
                self.handles.append(m.register_state_dict_pre_hook(partial(self._check_readable, name, units)))
            if root is not None and root in units and m is not model:  # called on its own: gather the root
                self.handles.append(m.register_forward_pre_hook(eager(self._root_on_demand), prepend=True))

    @classmethod
    def build(
        cls,
        model: nn.Module,
        units: list[nn.Module],
        layout,
        zparams: list[ZeroParam],
        shards: list[torch.Tensor],
        group: C.Group,
        ledger: CommLedger | None,
        device: torch.device,
        transfer,
        prefetch: bool,
        allocator: Allocator | None = None,
    ):
        """One ``ParamUnit`` per unit over its layout buckets (unit 0 = the root, ``units[k - 1]`` = unit k), and
        the gatherer over them."""
        by_unit: dict[int, list[ZeroParam]] = {}
        for zp in zparams:
            by_unit.setdefault(layout.buckets[zp.slot.bucket].unit, []).append(zp)
        buckets: dict[int, list] = {}
        for b in layout.buckets:
            buckets.setdefault(b.unit, []).append(b)
        built = {
            u: ParamUnit(
                model if u == 0 else units[u - 1],
                bs,
                by_unit[u],
                [shards[b.index] for b in bs],
                group,
                ledger,
                device,
                transfer,
                allocator,
            )
            for u, bs in buckets.items()
        }
        return cls(model, built.get(0), [built[u] for u in range(1, len(units) + 1)], prefetch)

    @labelled("zerobench::pre_forward")
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
            if not self.reading:
                self.skips.begin_forward()
        elif not self.reading:
            # units this rank's forward skipped: their collectives first (``zero/stage3/skipped.py``)
            for j in self.skips.forward_unit(i, torch.is_grad_enabled()):
                self._replay_forward(j)
            if self.skips.out_of_order and not self._warned:
                self._warn_out_of_order(*self.skips.out_of_order)
        if unit is not None:
            unit.backward_task = None  # a unit called on its own, outside the model's forward, starts a pass too
        self._gather(unit, i + 1)
        self._note_gathered()

    @labelled("zerobench::post_forward")
    def _post_forward(self, i: int, module, args, output) -> None:
        unit = self.order[i]
        if _in_backward() or self.reading:
            return
        if unit is not None:
            if i and not isinstance(output, torch.Tensor):
                refuse_returned(unit.param_ids, unit.zparams, type(unit.module).__name__, output)
            unit.free()
        if i == 0:  # end of forward: the units skipped after the last one run are replayed; any still gathered goes
            for j in self.skips.end_forward():
                self._replay_forward(j)
            for u in self.blocks:
                if u.state is not ParamState.SHARDED:
                    u.free()
        if torch.is_grad_enabled():
            for t in tensors_in(output):
                if t.requires_grad:
                    t.register_hook(partial(self._pre_backward, i))

    def _warn_out_of_order(self, late: int, before: int) -> None:
        self._warned = True
        name = {id(m): n for n, m in self.modules[0].named_modules()}
        warnings.warn(
            f"ZeRO stage 3: the forward ran unit {name[id(self.modules[late])]!r} after {name[id(self.modules[before])]!r}, "
            "out of the units' order (apply_zero's units, default registration order): the prefetch gathers the "
            "wrong unit next, and a unit skipped on some ranks only cannot be replayed; pass apply_zero(units=[...]) "
            "in the order forward runs them",
            stacklevel=2,
        )

    def _gather(self, unit: ParamUnit | None, nxt: int) -> None:
        """``unit`` gathered (None: the root holds no parameter) and, when prefetching, unit ``nxt`` of ``order`` started
        (the next in forward, or in backward): what a unit's forward or backward issues, replayed alike for a skipped
        one."""
        if unit is not None:
            unit.finish_gather()
        if self.prefetch and 1 <= nxt < len(self.order):
            self.order[nxt].start_gather()

    def _replay_forward(self, j: int) -> None:
        """Unit ``j``, which this rank's forward skipped: the gather and prefetch its forward issues, then its free."""
        self._gather(self.order[j], j + 1)
        self.order[j].free()

    def _freed(self) -> dict[int, str]:
        """The parameters that are empty now (their unit not gathered), ``id -> name``."""
        return {id(zp.param): zp.name for u in self.units if u.state is not ParamState.UNSHARDED for zp in u.zparams}

    def _root_on_demand(self, module, args) -> None:
        """A module holding root parameters called outside the model's forward (``model.encoder(x)``, as
        DeepSpeed allows): gather the root unit. It stays gathered through that pass's backward and goes
        once its gradients are handed to their reduce-scatters, or at the next ``step()``."""
        if self.root.state is not ParamState.UNSHARDED:
            self.root.finish_gather()
            self.root.edit_mark = self.root.versions()
            self._note_gathered()

    def expect_copy(self, param) -> None:
        """The unit holding ``param`` expects one copy into its placeholder that is no edit (``ParamUnit.expect_copy``)."""
        for u in self.units:
            u.expect_copy(param)

    def check_edits(self, discard: bool = False) -> None:
        """Before a step: refuse, in one line and before anything changes, a parameter changed in place while its
        unit was gathered on demand (outside the model's forward): the change reached neither its shard nor the
        fp32 master, so the step would train on without it. ``discard``: forget such changes (a load replaces
        every value)."""
        sharded = [n for u in self.units for n in u.edited_while_sharded()]
        names = list(dict.fromkeys(n for u in self.units for n in [*u.lost_edit, *u.edited()]))
        for u in self.units:
            u.lost_edit = []
            if discard:
                u.edit_mark = None
                u.free_mark = u.versions() if u.free_mark is not None else None
        if sharded and not discard:
            raise RuntimeError(
                f"ZeRO stage 3: {', '.join(sharded[:3])}{' ...' if len(sharded) > 3 else ''} changed in place while "
                "partitioned (outside engine.gathered_params()): the change reached only an empty placeholder, so "
                "this step would lose it; change parameters inside `with engine.gathered_params(modifier_rank=0):`"
            )
        if names and not discard:
            raise RuntimeError(
                f"ZeRO stage 3: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''} changed in place while "
                "gathered outside the model's forward (a call of one of its modules): the change reached neither its "
                "shard nor the fp32 master, so this step would lose it; change parameters inside `with "
                "engine.gathered_params():`, which writes them back"
            )

    @labelled("zerobench::pre_backward")
    def _pre_backward(self, i: int, grad: torch.Tensor) -> None:
        unit = self.order[i]
        task = torch._C._current_graph_task_id()
        if i == 0:  # the model's backward begins: what it skipped is replayed as it goes, the rest at its end
            if self._root_task == task:
                return
            self._root_task = task
            self.skips.begin_backward(task)
            torch.autograd.Variable._execution_engine.queue_callback(partial(self._end_backward, task))
            if unit is None:
                return
        elif unit.backward_task == task:
            return
        else:
            for j in self.skips.backward_unit(i, task):
                self._replay_backward(j, task)
        unit.backward_task = task
        # Backward runs root (LM head) first, then blocks last to first.
        self._gather(unit, len(self.blocks) if i == 0 else i - 1)
        self._note_gathered()

    def _replay_backward(self, j: int, task: int) -> None:
        """Unit ``j``, which this rank's forward skipped: the gather and prefetch its backward issues and, in a backward
        pass (not ``torch.autograd.grad``), its buckets' reduce-scatters with zero gradients; then its free."""
        unit = self.order[j]
        unit.backward_task = task
        self._gather(unit, j - 1)
        if self._complete is not None:
            self._complete([b.index for b in unit.buckets])
        if not self.reading:
            unit.free()

    def _end_backward(self, task: int) -> None:
        """Autograd's callback at the end of the model's backward (queued before the pass's close)."""
        for j in self.skips.end_backward(task):
            self._replay_backward(j, task)

    def attach(self, grads, passes) -> None:
        """Drive the bucket group ``grads``: a unit is freed once its gradients have landed, and a skipped unit's
        buckets are completed while ``passes`` (``BackwardPasses``) has a backward pass open."""
        grads.free_on_complete(self.on_bucket_complete, self.last_buckets())

        def complete(buckets: list[int]) -> None:  # a function: copy.deepcopy(model) (an EMA copy) shares it, as
            if passes.is_open():  # the engine's other hooks, instead of copying the bucket group and its work in flight
                grads.complete(buckets)

        self._complete = complete

    def _note_gathered(self) -> None:
        held = sum(u.held for u in self.units)
        if held > self.peak_gathered_bytes:
            self.peak_gathered_bytes = held

    def on_bucket_complete(self, bucket: int) -> None:
        """Every gradient of ``bucket`` has landed; once all of its unit's buckets are complete, no node of this
        backward reads the unit's parameters again, and they go before the gradients are staged."""
        unit = self.by_bucket[bucket]
        unit.complete.add(bucket)
        if len(unit.complete) == len(unit.buckets) and not self.reading:  # inside gathered_params() it stays whole
            unit.free()

    def last_buckets(self) -> frozenset[int]:
        """Each unit's last bucket in backward: the one whose completion normally frees it."""
        return frozenset(max(b.index for b in u.buckets) for u in self.units if u.buckets)

    def reshard_all(self, keep_values: bool = False) -> None:
        """Free every unit (after an optimizer step: a gathered unit would hold pre-step values); ``keep_values``
        as ``ParamUnit.free``'s (leaving ``gathered_params``)."""
        for u in self.units:
            if u.state is not ParamState.SHARDED:
                u.free(keep_values)

    def _check_readable(self, name: str, units: list[ParamUnit], module, prefix, keep_vars) -> None:
        if self.reading or all(u.state is ParamState.UNSHARDED for u in units):
            return
        raise RuntimeError(
            f"ZeRO stage 3 holds only this rank's shard of {repr(name) if name else 'the model'}'s parameters outside "
            "forward: read them inside `with engine.gathered_params():` (on every DP rank), or save with "
            "zerobench.zero.state.checkpoint.save_sharded"
        )

    def gathered_tensors(self) -> list[torch.Tensor]:
        units = self.units
        out = [u.full for u in units if u.full.untyped_storage().nbytes()]
        return out + [u.staging for u in units if u.staging is not None]
