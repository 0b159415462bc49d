"""``engine.gathered_params()``: the model's full parameters in a context, and what happens to changes made there.

Inside the context every trained parameter holds its full value: stage 3 gathers every unit (a DP
collective) and frees them again on exit; at stages 0-2 the parameters are the replica already. Changes
made inside (``p.mul_(0.5)``, ``model.apply(init_fn)``, copying in pretrained weights) are kept by default,
as FSDP's ``summon_full_params(writeback=True)`` keeps them:

- each rank writes its own shard's changed elements into the fp32 master (the optimizer's source of
  truth) and, at stage 3, into its parameter shard. Only elements whose low-precision value changed are
  written, so under bf16/fp16 an untouched parameter keeps its full-precision master. This needs no
  collective: with every rank making the same change (the usual case) the replicas agree at once, and
  otherwise each replica takes the owner's values at the next step's all-gather;
- ``modifier_rank=r`` first broadcasts DP rank ``r``'s values of every parameter (frozen ones too) to the
  group, as DeepSpeed's ``GatheredParameters(modifier_rank=r)``: the other ranks' changes are dropped and
  every rank keeps rank ``r``'s. It is a collective at every stage. Values rank ``r`` loaded with
  ``load_state_dict`` inside (HF's ZeRO-3 loading: rank 0 alone loads) are then sent at full precision and
  written into every rank's master, as a load on every rank writes them: under bf16/fp16 the broadcast alone
  would give the other ranks' masters the rounded values, and none where the rounded value did not change;
- ``writeback=False`` discards the changes: stage 3 frees the gathered values; at stages 0-2, where the
  parameters are the replica itself, the replica (and the frozen parameters) are copied on entry and put back
  on exit.

``GatheredParameters(params, modifier_rank=None)`` is DeepSpeed's module-level form
(``zerobench.zero.GatheredParameters``, as ``deepspeed.zero.GatheredParameters``): it enters ``gathered_params`` of
every engine whose model holds one of ``params``, trained or frozen (found by the parameter, ``zero/registry.py``),
which gathers that engine's whole model. As DeepSpeed's, without ``modifier_rank`` changes made inside are discarded,
with it DP rank ``modifier_rank``'s are kept everywhere, frozen parameters' too (DeepSpeed partitions them at stage 3,
so a list of frozen ones alone, pretrained weights loaded into a frozen part on one rank, reaches every rank);
parameters of no engine's model are left as they are, and ``enabled=False`` does nothing.

Contexts nest: an inner one writes back or discards its own changes and leaves the outer one gathered. An
exception inside the context exits as a normal exit does, ``modifier_rank``'s broadcast included (as DeepSpeed's):
the ranks stay paired in their collectives even where only some of them raised, and the parameters and the
master never disagree. Without the context, at stage 3 the parameters are 0-element
placeholders outside forward; at stages 0-2 an in-place change is taken in by the next step
(``ParamStorage.adopt_edits``; under offload found by the shard's signature, ``zero/storage/signature.py``).
"""

from __future__ import annotations

from contextlib import ExitStack

import torch
import torch.distributed as dist

from zerobench.config import ConfigError
from zerobench.zero.protocols import Engine
from zerobench.zero.registry import holder
from zerobench.zero.replicas import broadcast_tensors
from zerobench.zero.state.module_state import segments_by_param, write_segments
from zerobench.zero.state.shards import segment_view


class GatheredParams:
    """The context manager ``ZeroEngine.gathered_params`` returns (see the module docstring)."""

    def __init__(self, engine: Engine, writeback: bool = True, modifier_rank: int | None = None):
        size = engine.group.size
        if modifier_rank is not None and (
            isinstance(modifier_rank, bool) or not isinstance(modifier_rank, int) or not 0 <= modifier_rank < size
        ):
            raise ConfigError(
                f"gathered_params(modifier_rank={modifier_rank!r}): expected a DP rank, an int in "
                f"[0, {size}), or None (each rank keeps its own changes)"
            )
        if modifier_rank is not None and not writeback:
            raise ConfigError(
                "gathered_params(writeback=False, modifier_rank=...): modifier_rank keeps that rank's "
                "changes, writeback=False discards them: pass one of the two"
            )
        self.engine, self.writeback, self.modifier_rank = engine, writeback, modifier_rank
        self.loaded: dict[int, torch.Tensor] = {}
        """Parameter index -> the full value ``load_state_dict`` loaded into it inside (``modifier_rank`` only)."""
        self._saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._nested = False

    def __enter__(self) -> None:
        e, s = self.engine, self.engine.gatherer
        self._nested = s is not None and s.reading  # inside another one: gathered already, and left so on exit
        if not self.writeback:  # what a discard puts back (stage 3's trained parameters come back from the shards)
            kept = [p.data for _, p in e.frozen]
            kept += [e.storage.replica.data] if s is None else [u.full for u in s.units] if self._nested else []
            self._saved = [(t, t.clone()) for t in kept]
        if s is not None and not self._nested:
            for u in s.units:
                u.start_gather()
            for u in s.units:
                u.finish_gather()
            s.reading = True
        e._gathered_open.append(self)  # once entered: a gather that raised leaves no open context behind

    @torch.no_grad()
    def __exit__(self, exc_type, exc, tb) -> None:
        e = self.engine
        try:
            # a parameter whose .data was assigned inside goes back into the buffers first: what is broadcast and
            # written back is what the model holds (discarded with the rest under writeback=False)
            e.storage.reattach(self.writeback)
            for unit in e.gatherer.units if e.gatherer is not None else []:
                unit.reattach(self.writeback)
            if self._saved:
                for t, copy in self._saved:
                    t.copy_(copy)
            elif self.writeback:
                shared = self.modifier_rank is not None and e.group.size > 1
                if shared:
                    self._broadcast(exc_type is not None)
                write_back(e)
                if shared:
                    self._broadcast_loaded(exc_type is not None)
        finally:
            self._saved, self.loaded = [], {}
            if self in e._gathered_open:
                e._gathered_open.remove(self)
            s = e.gatherer
            if s is not None and not self._nested:
                s.reading = False
                s.reshard_all(keep_values=True)  # a state dict taken inside keeps its values after the exit

    def _broadcast(self, raised: bool) -> None:
        """``modifier_rank``'s values to the group, also when the body raised (as DeepSpeed's ``__exit__``): a rank
        that raised and skipped it would leave its peers' broadcast to pair with its next collective. When the body
        raised, a broadcast that fails too (the group is broken) does not replace the body's exception."""
        try:
            broadcast_tensors(full_values(self.engine), self.engine.group, self.modifier_rank)
        except Exception:
            if not raised:
                raise

    def _broadcast_loaded(self, raised: bool) -> None:
        """The values ``modifier_rank`` loaded inside, at full precision, into every rank's master (after
        ``write_back``, which took only their rounding): which parameters, then each value. Every rank takes part,
        also when the body raised, as in ``_broadcast``."""
        e = self.engine
        try:
            pg = e.group.pg or dist.group.WORLD
            src = dist.get_global_rank(pg, self.modifier_rank)
            dev = full_values(e)[0].device
            mine = sorted(self.loaded) if e.group.rank == self.modifier_rank else []
            count = torch.tensor([len(mine)], dtype=torch.int64, device=dev)
            dist.broadcast(count, src=src, group=pg)
            if not int(count.item()):
                return
            which = (
                torch.tensor(mine, dtype=torch.int64, device=dev)
                if mine
                else torch.empty(int(count.item()), dtype=torch.int64, device=dev)
            )
            dist.broadcast(which, src=src, group=pg)
            segments = segments_by_param(e)
            for i in which.tolist():
                shape = e.zparams[i].slot.shape
                if mine:
                    value = self.loaded[i].to(device=dev, dtype=torch.float32).reshape(shape).contiguous()
                else:
                    value = torch.empty(shape, dtype=torch.float32, device=dev)
                dist.broadcast(value, src=src, group=pg)
                write_segments(e, segments.get(i, ()), value)
        except Exception:
            if not raised:
                raise


def full_values(engine: Engine) -> list[torch.Tensor]:
    """Every parameter's full storage while gathered: the replica (stages 0-2) or each unit's gathered buffer
    (stage 3), then the frozen parameters, which the model holds whole."""
    trained = [u.full for u in engine.gatherer.units] if engine.gatherer is not None else [engine.storage.replica.data]
    return trained + [p.data for _, p in engine.frozen]


@torch.no_grad()
def write_back(engine: Engine) -> None:
    """Write this rank's changed elements of the (gathered) parameters into its master and parameter shard."""
    st, layout, stage3 = engine.storage, engine.layout, engine.gatherer is not None
    if not stage3 and st.master is st.shards:  # fp32 at stages 0-2: the parameters are the master
        return
    st.rewritten()
    for seg in layout.segments(engine.rank_in_shards):
        new = engine.zparams[seg.param].param.detach().reshape(-1)[seg.param_start : seg.param_end]
        shard = segment_view(st.shards, layout, seg)
        master = segment_view(st.master, layout, seg)
        if master is shard or master.data_ptr() == shard.data_ptr():  # fp32 stage 3: the shard is the master
            shard.copy_(new)
            continue
        # What the parameter held before the context: the shard (stage 3), or the master's rounding (0-2).
        before = shard.to(master.device) if stage3 else master.to(shard.dtype)
        value = new.to(master.device)
        master.copy_(torch.where(value != before, value.to(master.dtype), master))
        if stage3:
            shard.copy_(new)


class GatheredParameters:
    """DeepSpeed's ``GatheredParameters`` (see the module docstring). ``fwd_module`` is DeepSpeed's hook for parameters
    used outside their module's forward; the engine gathers whole units, so it is accepted and not needed."""

    def __init__(self, params, modifier_rank: int | None = None, fwd_module=None, enabled: bool = True):
        del fwd_module
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        engines = list({id(e): e for e in map(holder, params) if e is not None}.values()) if enabled else []
        self._contexts = [
            GatheredParams(e, writeback=modifier_rank is not None, modifier_rank=modifier_rank) for e in engines
        ]
        self._stack = ExitStack()

    def __enter__(self) -> None:
        with ExitStack() as stack:
            for ctx in self._contexts:
                stack.enter_context(ctx)
            self._stack = stack.pop_all()

    def __exit__(self, exc_type, exc, tb) -> bool:
        return self._stack.__exit__(exc_type, exc, tb)


def check_outside(engine: Engine, caller: str, undone: str, note: str = "") -> None:
    """One line, before anything changes, where an open ``gathered_params()`` context would undo ``caller``'s writes
    (``undone``: "the step's", "the loaded ones") at its exit: at stage 3 any (the units hold the values gathered for
    it, which its exit writes back over them), and at any stage one that discards its changes (``writeback=False``,
    DeepSpeed's ``GatheredParameters`` with no ``modifier_rank``: its exit puts back the values it saved). The contexts
    are entered on every rank, so every rank refuses alike. ``note``: what may run inside instead."""
    open_ = engine._gathered_open
    if not open_:
        return
    tail = f" ({note})" if note else ""
    if engine.gatherer is not None:
        raise RuntimeError(
            f"{caller} inside gathered_params() at stage 3: the units hold the values gathered for the context, "
            f"which its exit would write back over {undone}: call {caller} after the context exits{tail}"
        )
    if any(not g.writeback for g in open_):
        raise RuntimeError(
            f"{caller} inside gathered_params(writeback=False) (DeepSpeed's GatheredParameters with no "
            f"modifier_rank): its exit puts back the values it saved, undoing {undone}: call "
            f"{caller} after the context exits"
        )
