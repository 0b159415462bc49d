"""A ``.grad`` assigned by the user since the engine's backward (``p.grad = g``), or set with no backward at all.

torch's optimizers step whatever ``.grad`` holds, so code written for them changes gradients by assignment:
gradient surgery, ``p.grad = torch.autograd.grad(...)``, DeepSpeed's own tests setting ``.grad`` by hand before
``step()``. The engine steps its gradient buffers, which such a ``.grad`` no longer is, so the assignment would
be ignored without a word. Before anything reads the reduced gradient (the step, clipping, a scaler's unscale,
``safe_get_full_grad``), ``adopt_replaced`` settles it:

- Where each ``.grad`` is the whole gradient the step reads (stage 0, and stage 1 on one DP rank, without optimizer
  offload: ``.grad`` is a view of the full buffer), an assigned tensor is taken into the buffer and the view put
  back, so the step trains on what ``.grad`` says, as torch's optimizer would. Under fp16 ``.grad`` is times the
  loss scale, as DeepSpeed's fp16 optimizer reads it. At stage 0 on several ranks an assigned ``.grad`` must be the
  same on every rank, as under DDP: each replica steps its own.
- A window with no backward since ``zero_grad()`` steps where torch's optimizer would, on what ``.grad`` holds:
  after ``zero_grad(set_to_none=False)`` (zeros, momentum and weight decay still move the parameters; zeros at
  stages 2-3 too), or where a ``.grad`` was assigned or written in place. A ``.grad`` left None counts as zero (the
  fused step has no per-parameter skip; DeepSpeed's fp16 optimizer counts None as zero too). Otherwise (every
  ``.grad`` None, or the views untouched since the engine was built, where torch's would be None) it does not step.
  Under offload the views' shards go to the host first. On several DP ranks such a ``.grad`` is its rank's alone,
  never averaged, so the replicas would step apart: the ranks of the DP and TP groups agree on whether any set one
  (one all-reduce, from the step, clipping and a scaler's unscale) and all refuse in one line if one did, or if some
  would step and others not. A reader on some ranks alone (``safe_get_full_grad``) reads what the step would train
  on (``unsettled_gradient``) and settles nothing.
- Everywhere else an assignment is refused in one line naming the parameter: at stages 2-3 the step reads this
  rank's reduced gradient partition and keeps no ``.grad``; at stage 1 on several ranks the ``.grad`` views hold the
  reduced gradient only in this rank's shard; under offload the gradient went to the host during backward.
  ``safe_set_full_grad`` (DeepSpeed's name) sets a parameter's reduced gradient at every stage.
- A ``.grad`` set to None after backward is refused too: torch's optimizers skip such a parameter, which the
  fused step cannot, and stepping it with the gradient ``.grad`` no longer shows would be a silent difference.

What cannot be seen: element-wise changes in place after backward (``p.grad.mul_(...)``) need nothing at stages
0-1 without offload (they change the view itself); under offload they come too late. An assignment to
``p.grad.data``, which moves the view object itself off the buffer, is caught by where its data is and its layout.
"""

from __future__ import annotations

import torch

from zerobench.distributed import collectives as C
from zerobench.zero.param import GradState
from zerobench.zero.protocols import Engine

SET_FULL_GRAD = "zerobench.zero.compat.deepspeed.tensor_fragment.safe_set_full_grad"
"""Where a gradient can be set at every stage (DeepSpeed's ``safe_set_full_grad``); named, never imported."""


def adopt_replaced(engine: Engine, caller: str, collective: bool = True) -> None:
    """Take assigned ``.grad`` tensors into the engine's gradient buffer where that is what ``.grad`` means, or
    refuse them in one line (see the module docstring). Nothing happens when every ``.grad`` is the engine's.
    ``collective``: every rank of the DP and TP groups calls this (the step, clipping, a scaler's unscale); a reader
    called on some ranks alone (``safe_get_full_grad``) passes False, and then settles a window with no backward
    only where the rank has no peers."""
    grads = engine.grads
    if not grads.keep_full:  # stages 2-3: .grad is None between backward and step, always
        stray = next((zp for zp in grads.zparams if zp.param.grad is not None), None)
        if stray is not None:
            raise _refused(
                caller,
                stray.name,
                "assigned (p.grad = ...)",
                f"at stage {engine.stage} the step reads this rank's reduced gradient partition and keeps no .grad",
                fix=f"set it with {SET_FULL_GRAD}(param, value) between backward and step",
            )
        if not grads.reduced and _settles(engine, collective, grads.zeroed, [], caller, ""):
            _take_as_reduced(grads)  # zero_grad(set_to_none=False) and no backward: zeros, stepped
        return
    assigned, nulled, kept = _sort(grads)
    if grads.reduced and nulled:
        raise RuntimeError(
            f"{caller}: the .grad of parameter {grads.zparams[nulled[0]].name!r} was set to None after backward; "
            "torch's optimizers skip such a parameter, which the engine's fused step cannot (a zero gradient still "
            "moves it by momentum and weight decay): freeze it before apply_zero (requires_grad_(False)), or zero "
            "its gradient in place (p.grad.zero_()) if that is what you mean"
        )
    if not grads.reduced:
        _no_backward(engine, caller, assigned, kept, collective)
        return
    if not assigned:  # the engine's own reduced gradients, the views perhaps changed in place
        return
    _check_whole(engine, caller, grads.zparams[assigned[0]].name)
    with torch.no_grad():
        for i in assigned:
            grads.zparams[i].check_grad(grads.zparams[i].param.grad, grads.grad_dtype)
            grads.restore_view(i, grads.zparams[i].param.grad)


def _no_backward(engine: Engine, caller: str, assigned: list[int], kept: list[int], collective: bool) -> None:
    """Stages 0-1, a window with no backward since ``zero_grad()``: it steps on what ``.grad`` holds where torch's
    optimizer would step, that is where some ``.grad`` is not None and holds a gradient: after
    ``zero_grad(set_to_none=False)`` (zeros, or values written in place), or where one was assigned or written.
    Otherwise (every ``.grad`` None, or the views untouched since the engine was built, where torch's would be None)
    nothing steps."""
    grads = engine.grads
    written, steps = _would_step(grads, assigned, kept)
    how = "assigned (p.grad = ...)" if assigned else "written in place"
    if not _settles(engine, collective, steps, written, caller, how):
        return
    if assigned:
        _check_whole(engine, caller, grads.zparams[assigned[0]].name, after_backward=False)
    with torch.no_grad():
        for i in assigned:
            grads.zparams[i].check_grad(grads.zparams[i].param.grad, grads.grad_dtype)
            grads.restore_view(i, grads.zparams[i].param.grad)
    _take_as_reduced(grads)  # under offload the views' shards go to the host, as a backward's would


def _would_step(grads, assigned: list[int], kept: list[int]) -> tuple[list[int], bool]:
    """Stages 0-1, a window with no backward: (the first parameter whose ``.grad`` was set by hand, assigned or
    written in place, as a list of at most one; whether this rank would step), with one read back from the device."""
    written = assigned[:1]
    if not written and kept:
        nonzero = torch.stack([grads.views[i].any() for i in kept]).tolist()
        written = [i for i, c in zip(kept, nonzero) if c][:1]
    return written, bool(written) or (grads.zeroed and bool(kept))


def _settles(engine: Engine, collective: bool, steps: bool, written: list[int], caller: str, how: str) -> bool:
    """Whether a window with no backward steps (``steps``, this rank's answer), agreed by every rank that meets in
    the step's collectives. With DP peers a ``.grad`` set with no backward (``written``) is its rank's alone, never
    averaged, so the replicas would step apart: every rank refuses in one line if any set one, and if the ranks'
    answers differ. One all-reduce over the DP and TP groups, only where the caller is collective; a reader on some
    ranks alone settles nothing that has peers (it refuses what it sees here; ``unsettled_gradient`` reads the
    rest)."""
    peers = [g for g in (engine.group, engine.tp_group) if g is not None and g.size > 1]
    dp = engine.group.size
    if not peers:
        return steps
    if not collective:
        if written and dp > 1:
            raise _set_alone(engine, caller, written, how, None)
        return False
    nobody = 1 << 62
    # one MIN all-reduce carries: the lowest rank that set a .grad with DP peers, whether any rank steps, whether all do
    mine = [engine.global_rank if written and dp > 1 else nobody, -int(steps), int(steps)]
    agreed = torch.tensor(mine, dtype=torch.int64, device=engine.device)
    for g in peers:
        C.all_reduce(agreed, g, engine.ledger, "no_backward", op=torch.distributed.ReduceOp.MIN)
    at, any_steps, all_step = agreed.tolist()
    if at != nobody:
        raise _set_alone(engine, caller, written if dp > 1 else [], how, at)
    if -any_steps != all_step:
        raise RuntimeError(
            f"{caller}: with no backward in this window, some ranks hold a gradient to step (a .grad kept by "
            "zero_grad(set_to_none=False), or set by hand) and others none, so some would step and others not: "
            "clear the gradients alike on every rank (zero_grad with the same set_to_none)"
        )
    return steps


def _set_alone(engine: Engine, caller: str, written: list[int], how: str, at: int | None) -> RuntimeError:
    """The refusal of a ``.grad`` set with no backward on several DP ranks: this rank's, or rank ``at``'s."""
    n = engine.group.size
    if written:
        return _refused(
            caller,
            engine.grads.zparams[written[0]].name,
            f"{how} with no backward in this window",
            f"it is this rank's alone, never averaged over the {n} DP ranks",
            then="the replicas would step apart",
            fix="compute it with a backward through the engine",
        )
    return RuntimeError(
        f"{caller}: a .grad was set with no backward in this window on rank {at}, never averaged over the {n} DP "
        "ranks, so the replicas would step apart: compute it with a backward through the engine"
    )


@torch.no_grad()
def _take_as_reduced(grads) -> None:
    """A window with no backward that steps all the same: what ``.grad`` holds at stages 0-1 (a view left None
    counts as zero), zeros at stages 2-3, becomes the window's reduced gradient where the step reads it (under
    offload, the host's copy), as a backward would have made it."""
    if grads.keep_full:
        for i, zp in enumerate(grads.zparams):
            if zp.param.grad is None:
                grads.restore_view(i, None)
            zp.grad_state = GradState.ACCUMULATED  # a backward next sums onto them, as onto .grad
        if grads.sink is not None:
            rank = grads.group.rank if grads.layout.shards > 1 else 0
            for b in grads.layout.buckets:
                grads.sink(b.index, grads.full.shard_view(b.index, rank), False)
    elif grads.sink is not None:
        most = max((b.shard_numel for b in grads.layout.buckets), default=0)
        zeros = torch.zeros(most, dtype=grads.grad_dtype, device=grads.device)
        for b in grads.layout.buckets:
            grads.sink(b.index, zeros[: b.shard_numel], False)
    else:
        grads.local.views()  # every bucket's shard held, as zeros
    grads.reduced = True


@torch.no_grad()
def unsettled_gradient(engine: Engine, i: int) -> torch.Tensor | None:
    """Parameter ``i``'s gradient in a window with no backward that a reader on some ranks alone cannot settle
    (``adopt_replaced(collective=False)`` with peers): what the step would train on, read without changing anything
    (the loss scale still in it), or None where it would not step. At stages 0-1 that is ``.grad`` (None counts as
    zero) where this rank would step: a ``.grad`` set by hand with no DP peers, or the zeros ``zero_grad(
    set_to_none=False)`` kept; at stages 2-3 the zeros ``zero_grad(set_to_none=False)`` kept."""
    grads, zp = engine.grads, engine.grads.zparams[i]
    shape = zp.slot.shape
    if not grads.keep_full:
        return torch.zeros(shape, dtype=torch.float32, device=engine.device) if grads.zeroed else None
    assigned, _, kept = _sort(grads)
    if not _would_step(grads, assigned, kept)[1]:
        return None
    g = zp.param.grad
    return torch.zeros(shape, dtype=torch.float32, device=engine.device) if g is None else g.detach().float().clone()


def _sort(grads) -> tuple[list[int], list[int], list[int]]:
    """Stages 0-1: the parameters whose ``.grad`` was assigned, is None, or is still the engine's view."""
    assigned, nulled, kept = [], [], []
    for i, zp in enumerate(grads.zparams):
        grad = zp.param.grad
        if grad is None:
            nulled.append(i)
        elif grads.owns_grad(i, grad):
            kept.append(i)
        else:
            assigned.append(i)
    return assigned, nulled, kept


def _check_whole(engine: Engine, caller: str, name: str, after_backward: bool = True) -> None:
    """Refuse, naming parameter ``name``, a ``.grad`` to take where it is not the whole gradient the step reads.
    With no backward in the window (``after_backward=False``) the host copy under offload is made from ``.grad``."""
    how = "assigned (p.grad = ...)"
    if engine.grads_sharded:
        raise _refused(
            caller,
            name,
            how,
            f"at stage 1 on {engine.group.size} ranks the step reads the gradient this rank reduced into its shard, "
            "which .grad holds only in part",
            fix=f"change it element-wise in place (p.grad.mul_(...)), or set it with {SET_FULL_GRAD}(param, value)",
        )
    if engine.storage.host is not None and after_backward:
        raise _refused(
            caller,
            name,
            how,
            "under optimizer offload the gradient went to the host during backward",
            fix=f"set it with {SET_FULL_GRAD}(param, value) between backward and step",
        )


def _refused(
    caller: str, name: str, how: str, why: str, fix: str, then: str = "the step would ignore it"
) -> RuntimeError:
    return RuntimeError(f"{caller}: the .grad of parameter {name!r} was {how}, but {why}, so {then}: {fix}")
