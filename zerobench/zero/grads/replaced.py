"""A ``.grad`` assigned by the user since the engine's backward (``p.grad = g``), or with no backward at all.

torch's optimizers step whatever ``.grad`` holds, so code written for them changes gradients by assignment:
gradient surgery, ``p.grad = torch.autograd.grad(...)``, DeepSpeed's own tests setting ``.grad`` by hand before
``step()``. The engine steps its gradient buffers, which such a ``.grad`` no longer is, so the assignment would
be ignored without a word. Before anything reads the reduced gradient (the step, clipping, a scaler's unscale),
``adopt_replaced`` settles it:

- Where each ``.grad`` is the whole gradient the step reads (stage 0, and stage 1 on one DP rank, without optimizer
  offload: ``.grad`` is a view of the full buffer), the assigned tensor is taken into the buffer and the view put
  back, so the step trains on what ``.grad`` says, as torch's optimizer would. Under fp16 ``.grad`` is times the
  loss scale, as DeepSpeed's fp16 optimizer reads it. ``.grad`` set with no backward since ``zero_grad()`` is
  taken on a world of one; the parameters whose ``.grad`` stayed None then step with a zero gradient (the fused
  step has no per-parameter skip; DeepSpeed's fp16 optimizer counts None as zero too).
- Everywhere else it is refused in one line naming the parameter: at stages 2-3 the step reads this rank's reduced
  gradient partition and keeps no ``.grad``; at stage 1 on several ranks the ``.grad`` views hold the reduced
  gradient only in this rank's shard; under offload the gradient went to the host during backward; and a ``.grad``
  set with no backward on several DP ranks is this rank's alone, never averaged, so the replicas would step
  apart. ``safe_set_full_grad`` (DeepSpeed's name) sets a parameter's reduced gradient at every stage.
- A ``.grad`` set to None after backward is refused too: torch's optimizers skip such a parameter, which the
  fused step cannot, and stepping it with the gradient ``.grad`` no longer shows would be a silent difference.

In-place changes (``p.grad.mul_(...)``) need none of this at stages 0-1: they change the view itself.
"""

from __future__ import annotations

import torch

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
                "assigned",
                f"at stage {engine.stage} the step reads this rank's reduced gradient partition and keeps no .grad",
                fix=f"set it with {SET_FULL_GRAD}(param, value) between backward and step",
            )
        return
    assigned = [
        (zp, v) for zp, v in zip(grads.zparams, grads.views) if zp.param.grad is not None and zp.param.grad is not v
    ]
    nulled = [zp for zp in grads.zparams if zp.param.grad is None] if grads.reduced else []
    if nulled:
        raise RuntimeError(
            f"{caller}: parameter {nulled[0].name!r}'s .grad was set to None after backward; torch's optimizers skip "
            "such a parameter, which the engine's fused step cannot: freeze it before apply_zero "
            "(requires_grad_(False)), or zero its gradient in place (p.grad.zero_())"
        )
    if not assigned:
        return
    zp = assigned[0][0]
    if engine.grads_sharded:
        raise _refused(
            caller,
            zp.name,
            "assigned",
            f"at stage 1 on {engine.group.size} ranks the step reads the gradient this rank reduced into its shard, "
            "which .grad holds only in part",
        )
    if engine.storage.host is not None:
        raise _refused(
            caller,
            zp.name,
            "assigned",
            "under optimizer offload the gradient went to the host during backward",
            fix=f"set it with {SET_FULL_GRAD}(param, value) between backward and step",
        )
    if not grads.reduced and engine.group.size > 1:
        raise _refused(
            caller,
            zp.name,
            "set with no backward in this window",
            f"it is this rank's alone, never averaged over the {engine.group.size} DP ranks, so the replicas would "
            "step apart",
            fix="compute it with a backward through the engine",
        )
    with torch.no_grad():
        if not grads.reduced:  # zero_grad(set_to_none) left the buffer as it was: nothing of it is this window's
            grads.full.data.zero_()
        for zp, view in assigned:
            grad = zp.param.grad
            zp.check_grad(grad, grads.grad_dtype)
            view.copy_(grad)
        for zp, view in zip(grads.zparams, grads.views):
            zp.param.grad = view
    grads.reduced = True


def _refused(caller: str, name: str, how: str, why: str, fix: str = "") -> RuntimeError:
    fix = fix or f"change it in place (p.grad.mul_(...)), or set it with {SET_FULL_GRAD}(param, value)"
    return RuntimeError(
        f"{caller}: parameter {name!r}'s .grad was {how} (p.grad = ...), but {why}, so the step would ignore it: {fix}"
    )
