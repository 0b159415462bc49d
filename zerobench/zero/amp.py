"""``torch.amp`` loss scaling on a ZeRO engine: ``ShardedGradScaler``, as FSDP's ``ShardedGradScaler``.

torch's ``GradScaler`` unscales and checks the ``.grad`` of the optimizer's parameters on this rank. Under ZeRO
that is not the reduced gradient: at stages 2-3 ``.grad`` is None (torch then fails with ``No inf checks were
recorded for this optimizer``), and at stage 1 each rank's ``.grad`` holds the reduced values only in its own
shard, so ranks could disagree on an overflow, skip the step on some ranks only and grow their scales apart.
``ShardedGradScaler`` unscales and checks this rank's reduced gradient partition (``engine.grad_chunks()``) and
takes the overflow flag's maximum over the DP and TP groups, so every rank skips or steps alike and keeps the same
scale. The engine's optimizer declares ``_step_supports_amp_scaling``, so a scaler that did not unscale hands it
the scale, which the step folds into its own unscaling (no pass over the gradients), and the overflow flag.

The loop is torch's (``scaler.scale(loss).backward()``, optionally ``scaler.unscale_(optimizer)`` and
``engine.clip_grad_norm_``, then ``scaler.step(optimizer)``, ``scaler.update()``), under ``torch.autocast`` on an
fp32 or bf16 engine. torch's plain ``GradScaler`` stays right at stage 0, where ``.grad`` is the whole reduced
gradient, and is refused in one line at stages 1-3; an fp16 engine scales its loss itself and refuses both.
"""

from __future__ import annotations

import torch

from zerobench.config import ConfigError
from zerobench.zero.grad_stats import agree_max, reduced_grads


class ShardedGradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` over a ZeRO engine's reduced gradient partition (see the module docstring); with
    any other optimizer it is torch's."""

    def _unscale_grads_(self, optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor, allow_fp16: bool):
        engine = getattr(optimizer, "_engine", None)
        if engine is None or not getattr(optimizer, "_step_supports_amp_scaling", False):
            return super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        optimizer.amp_checked = True
        return {found_inf.device: unscale_partition(engine, inv_scale, found_inf)}


@torch.no_grad()
def unscale_partition(engine, inv_scale: torch.Tensor, found_inf: torch.Tensor) -> torch.Tensor:
    """Multiply this rank's reduced gradient partition by ``inv_scale`` in place and set ``found_inf`` to 1 if any
    rank of the DP and TP groups holds a non-finite element; returns ``found_inf``."""
    check_amp(engine)
    chunks = [c for c in reduced_grads(engine, "scaler.unscale_()/scaler.step()") if c.numel()]
    flag = torch.zeros(1, dtype=torch.float32, device=chunks[0].device if chunks else engine.device)
    if chunks:  # one storage: the device's gradient partition, or the host's under offload
        torch._amp_foreach_non_finite_check_and_unscale_(chunks, flag, inv_scale.to(flag.device))
    flag = agree_max(engine, flag.to(engine.device), engine.grads_sharded, "found_inf")
    found_inf.copy_(flag.reshape(()).to(found_inf.device))
    return found_inf


def check_amp(engine) -> None:
    """One line where torch's loss scaling cannot drive this engine."""
    if engine.scaler.enabled:
        raise ConfigError(
            "a torch.amp GradScaler on an fp16 ZeRO engine would scale the loss twice: the engine "
            "scales it itself (ZeroConfig.precision='fp16'); drop the GradScaler, or train fp32/bf16 "
            "under torch.autocast with zerobench.zero.amp.ShardedGradScaler"
        )


def amp_unscale(optimizer) -> float | None:
    """Inside ``optimizer.step()`` driven by a GradScaler: None to skip the step (an overflow on some rank), else
    the factor that unscales the gradients (1 when the scaler unscaled them already). Outside one: 1."""
    if not hasattr(optimizer, "found_inf"):
        return 1.0
    engine, checked = optimizer._engine, optimizer.__dict__.pop("amp_checked", False)
    check_amp(engine)
    if not checked and (engine.stage >= 2 or (engine.stage == 1 and engine.group.size > 1)):
        raise ConfigError(
            f"torch.amp.GradScaler checks the .grad this rank holds, which at ZeRO stage "
            f"{engine.stage} is not the reduced gradient: use zerobench.zero.amp.ShardedGradScaler, "
            "as FSDP's ShardedGradScaler"
        )
    if float(optimizer.found_inf) > 0:
        return None
    scale = optimizer.grad_scale
    return 1.0 if scale is None else 1.0 / float(scale)
