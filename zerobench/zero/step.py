"""The optimizer step at a window's end, on this rank's reduced gradient partition: fp16's overflow check (agreed
over DP and TP: every rank skips alike), the clip coefficient from the global norm, then the fused AdamW, which
writes the low-precision parameter shard in the same pass (under offload each chunk streams up as the next steps).
The 1/loss-scale and the clip coefficient are one scale applied inside the step."""

from __future__ import annotations

from zerobench.zero.config import AdamWConfig
from zerobench.zero.grad_stats import found_nonfinite, global_grad_norm


def fused_step(engine, hyper: list[AdamWConfig], clip: float) -> tuple[bool, float | None]:
    """Step ``engine``'s optimizer with ``clip`` (the coefficient ``clip_grad_norm_`` took this window) folded in;
    returns (whether it stepped, the global gradient norm: inf on an overflow, None when nothing computed it)."""
    storage, scaler = engine.storage, engine.scaler
    if storage.host is not None:
        storage.host.finish_grad_copies()
    grads = engine.grad_chunks()
    sharded = engine.grads_sharded
    if scaler.enabled and found_nonfinite(engine, grads, sharded):
        scaler.update(overflow=True)
        return False, float("inf")
    scale, norm = clip / scaler.scale, None
    if engine.config.clip_grad_norm is not None:
        norm = global_grad_norm(engine, grads, sharded) * scale
        coef = engine.config.clip_grad_norm / (norm + 1e-6)
        if coef < 1.0:
            scale *= coef
    out, on_chunk = storage.step_output()
    engine.adamw.step(grads, scale, out=out, on_chunk=on_chunk, hyper=hyper)
    storage.finish_step()
    scaler.update(overflow=False)
    return True, norm
