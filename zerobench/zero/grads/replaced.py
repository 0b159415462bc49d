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
  same on every rank, as under DDP: each replica steps its own. A window with no backward since ``zero_grad()``
  in which some ``.grad`` was assigned trains on one rank on what ``.grad`` holds (the others' views, written in
  place or not), and a ``.grad`` left None counts as zero (the fused step has no per-parameter skip; DeepSpeed's
  fp16 optimizer counts None as zero too).
- Everywhere else an assignment is refused in one line naming the parameter: at stages 2-3 the step reads this
  rank's reduced gradient partition and keeps no ``.grad``; at stage 1 on several ranks the ``.grad`` views hold the
  reduced gradient only in this rank's shard; under offload the gradient went to the host during backward; and a
  ``.grad`` assigned with no backward on several DP ranks is this rank's alone, never averaged, so the replicas
  would step apart. ``safe_set_full_grad`` (DeepSpeed's name) sets a parameter's reduced gradient at every stage.
- A ``.grad`` set to None after backward is refused too: torch's optimizers skip such a parameter, which the
  fused step cannot, and stepping it with the gradient ``.grad`` no longer shows would be a silent difference.

What cannot be seen: element-wise changes in place (``p.grad.mul_(...)``) need nothing at stages 0-1 without offload
(they change the view itself); under offload they come too late, and in a window with no backward and no
assignment they cannot be told from the zeros ``zero_grad(set_to_none=False)`` left, so such a window does not step,
as one with no gradient. An assignment to ``p.grad.data``, which moves the view object itself off the buffer, is
caught by where its data is and its layout.
"""

from __future__ import annotations

import torch

from zerobench.zero.param import GradState
from zerobench.zero.protocols import Engine

SET_FULL_GRAD = "zerobench.zero.compat.deepspeed.tensor_fragment.safe_set_full_grad"
"""Where a gradient can be set at every stage (DeepSpeed's ``safe_set_full_grad``); named, never imported."""


def adopt_replaced(engine: Engine, caller: str) -> None:
    """Take assigned ``.grad`` tensors into the engine's gradient buffer where that is what ``.grad`` means, or
    refuse them in one line (see the module docstring). Nothing happens when every ``.grad`` is the engine's."""
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
        return
    assigned, nulled, kept = _sort(grads)
    if grads.reduced and nulled:
        raise RuntimeError(
            f"{caller}: the .grad of parameter {grads.zparams[nulled[0]].name!r} was set to None after backward; "
            "torch's optimizers skip such a parameter, which the engine's fused step cannot (a zero gradient still "
            "moves it by momentum and weight decay): freeze it before apply_zero (requires_grad_(False)), or zero "
            "its gradient in place (p.grad.zero_()) if that is what you mean"
        )
    # nothing assigned: the engine's own gradients (reduced), or none since zero_grad(); views written in place
    # with no backward cannot be told from the zeros zero_grad(set_to_none=False) left, and do not step
    if not assigned:
        return
    _check_whole(engine, caller, grads.zparams[assigned[0]].name)
    with torch.no_grad():
        for i in assigned:
            grads.zparams[i].check_grad(grads.zparams[i].param.grad, grads.grad_dtype)
            grads.restore_view(i, grads.zparams[i].param.grad)
        if not grads.reduced:  # a window with no backward: a .grad left None counts as zero
            for i in nulled:
                grads.restore_view(i, None)
            for i in (*assigned, *kept):  # a backward accumulated next must not zero them as unused
                grads.zparams[i].grad_state = GradState.ACCUMULATED
    grads.reduced = True


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


def _check_whole(engine: Engine, caller: str, name: str) -> None:
    """Refuse, naming parameter ``name``, a ``.grad`` to take where it is not the whole gradient the step reads."""
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
    if engine.storage.host is not None:
        raise _refused(
            caller,
            name,
            how,
            "under optimizer offload the gradient went to the host during backward",
            fix=f"set it with {SET_FULL_GRAD}(param, value) between backward and step",
        )
    if not engine.grads.reduced and engine.group.size > 1:
        raise _refused(
            caller,
            name,
            "assigned (p.grad = ...) with no backward in this window",
            f"it is this rank's alone, never averaged over the {engine.group.size} DP ranks",
            then="the replicas would step apart",
            fix="compute it with a backward through the engine",
        )


def _refused(
    caller: str, name: str, how: str, why: str, fix: str, then: str = "the step would ignore it"
) -> RuntimeError:
    return RuntimeError(f"{caller}: the .grad of parameter {name!r} was {how}, but {why}, so {then}: {fix}")
