"""The optimizer step at a window's end, on this rank's reduced gradient partition: fp16's overflow check (agreed
over DP and TP: every rank skips alike), the clip coefficient from the global norm, then the fused AdamW, which
writes the low-precision parameter shard in the same pass (under offload each chunk streams up as the next steps).
The 1/loss-scale and the clip coefficient are one scale applied inside the step. ``optimizer_step`` is what
``engine.optimizer.step()`` runs around it: the window's checks, the counters, the parameters published after."""

from __future__ import annotations

import torch

from zerobench.zero.config import AdamWConfig
from zerobench.zero.grads.accumulation import refuse_inside_no_sync
from zerobench.zero.grads.replaced import adopt_replaced
from zerobench.zero.grads.stats import clip_coefficient, found_nonfinite, global_grad_norm
from zerobench.zero.grads.unused import check_added, check_unused
from zerobench.zero.interop.teardown import check_live
from zerobench.zero.protocols import Engine
from zerobench.zero.state.gathered import check_outside


@torch.no_grad()
def optimizer_step(engine: Engine, hyper: list[AdamWConfig]) -> bool:
    """``engine``'s optimizer step with ``hyper`` (one per param group); whether it updated the parameters."""
    check_live(engine, "step()")  # (check_steppable ran first, in ZeroOptimizer.step: before any closure)
    engine.window.check_step()
    adopt_replaced(engine, "step()")  # a .grad assigned since backward: stepped as torch would, or refused
    if engine.gatherer is not None:  # a parameter edited in place while gathered on demand: refused, not lost
        engine.gatherer.check_edits()
    engine.global_steps += 1
    if not engine.grads.reduced:
        # a backward that reached only parameters added since apply_zero (a new head over a no_grad backbone)
        # reduced nothing, but its gradients are there: refused, not a no-op
        check_added(engine)
        return False
    pending, engine._unused_check = engine._unused_check, None
    check_unused(engine, pending)
    # Under offload the step works on host memory, which a (CPU-emulated) device budget excludes.
    with engine.allocator.host_region(engine.placement.offloaded):
        clip, engine._clip = engine._clip, 1.0
        taken = engine._norm_taken
        stepped, norm = fused_step(engine, hyper, clip)
        engine._norm_taken = False
    # the norm this window measured: the step's, else clip_grad_norm_'s before it; None where neither measured one
    # (an earlier window's, an overflow's inf, would otherwise stand for every later step)
    engine.last_grad_norm = norm if norm is not None or not taken else engine.last_grad_norm
    if engine.gatherer is not None:  # no unit may carry pre-step values into the next forward
        engine.gatherer.reshard_all()
    if stepped:  # stages 1-2 all-gather the updated shards (already written by the step)
        engine.storage.publish(engine.group, engine.ledger)
    return stepped


def check_steppable(engine: Engine, caller: str) -> None:
    """One line, before anything changes (counters, a closure), where an open ``gathered_params()`` context would undo
    the step at its exit (``state.gathered.check_outside``), and inside ``no_sync()``."""
    refuse_inside_no_sync(engine.window, caller)
    check_outside(engine, caller, "the step's", "a backward inside it is fine")


def fused_step(engine: Engine, hyper: list[AdamWConfig], clip: float) -> tuple[bool, float | None]:
    """Step ``engine``'s optimizer with ``clip`` (a factor handed to this step: a torch GradScaler's 1/scale) folded in;
    returns (whether it stepped, the global gradient norm: inf on an overflow, None when nothing computed it or
    ``clip_grad_norm_`` measured the window already)."""
    storage, scaler = engine.storage, engine.scaler
    if storage.host is not None:
        storage.host.finish_grad_copies()
    grads = engine.grad_chunks()
    sharded = engine.grads_sharded
    if (scaler.enabled or engine.skip_nonfinite) and found_nonfinite(engine, grads, sharded):
        scaler.update(overflow=True) if scaler.enabled else scaler.skip_nonfinite()
        return False, float("inf")
    scale, norm = clip / scaler.scale, None
    if engine.config.clip_grad_norm is not None or (engine.always_norm and not engine._norm_taken):
        norm = global_grad_norm(engine, grads, sharded) * scale
    if engine.config.clip_grad_norm is not None:
        coef = clip_coefficient(norm, engine.config.clip_grad_norm)
        if coef != 1.0:  # NaN too: a NaN norm steps NaN, as torch's clip_grad_norm_ leaves the gradient
            scale *= coef
    if engine._norm_taken:
        norm = None  # the window's norm stays the one clip_grad_norm_ measured before its clip
    out, on_chunk = storage.step_output()
    # a parameter changed in place since the last step (storage.adopt_edits) is stepped from its new value: under
    # offload adopted here, with a device master inside the kernels' own pass (adopt=); one whose .data was
    # assigned is taken back into its view first
    storage.reattach()
    if storage.watches_edits:
        storage.adopt_edits()
    engine.adamw.step(grads, scale, out=out, on_chunk=on_chunk, hyper=hyper, adopt=storage.adopts_edits)
    storage.finish_step()
    scaler.update(overflow=False)
    return True, norm
