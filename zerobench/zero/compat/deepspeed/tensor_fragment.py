"""One parameter's full fp32 value, gradient and Adam moments, read and written by the parameter itself:
DeepSpeed's ``deepspeed.utils`` functions ``safe_get_full_fp32_param``, ``safe_set_full_fp32_param``,
``safe_get_full_grad``, ``safe_set_full_grad``, ``safe_get_full_optimizer_state`` and
``safe_set_full_optimizer_state``.

Each rank holds its segments of the parameter (``layout.segments``) in the engine's per-bucket chunks; the
full value is those pieces written into a zero tensor and summed over the DP group (each element lives on
one rank). So every function is a collective over the engine's DP group at stages 1-3: call it on every DP
rank with the same parameter (and, to set, the same value). A parameter the engine does not train (frozen,
or never given to ``apply_zero``) gives None, as DeepSpeed's.

The engine of a parameter is found in the engine registry (``zero/registry.py``), not in attributes set on it.
"""

from __future__ import annotations

import torch

from zerobench.distributed import collectives as C
from zerobench.zero.grads.replaced import adopt_replaced, unsettled_gradient
from zerobench.zero.grads.stats import reduced_grads
from zerobench.zero.protocols import Engine
from zerobench.zero.registry import owner as _owner
from zerobench.zero.state.module_state import segments_by_param, write_segments
from zerobench.zero.state.shards import segment_view

MOMENTS = ("exp_avg", "exp_avg_sq")


def _assemble(engine: Engine, i: int, chunks: list[torch.Tensor]) -> torch.Tensor:
    """Parameter ``i``'s full fp32 value from this rank's ``chunks`` and the other DP ranks'."""
    slot = engine.zparams[i].slot
    out = torch.zeros(slot.end - slot.start, dtype=torch.float32, device=engine.device)
    for seg in segments_by_param(engine).get(i, ()):
        out[seg.param_start : seg.param_end] = segment_view(chunks, engine.layout, seg).float().to(engine.device)
    if engine.layout.shards > 1:
        C.all_reduce(out, engine.group)
    return out.view(slot.shape)


def _target(param: torch.Tensor, value: torch.Tensor, caller: str) -> tuple[Engine | None, int]:
    """The engine training ``param`` and its index (None: no engine does), ``value`` checked against its full
    shape in one line."""
    engine, i = _owner(param)
    if engine is not None and tuple(value.shape) != tuple((zp := engine.zparams[i]).slot.shape):
        raise ValueError(f"{caller}: {zp.name} has shape {tuple(zp.slot.shape)}, the value {tuple(value.shape)}")
    return engine, i


def _state(engine: Engine, key: str) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    if key not in MOMENTS:
        raise KeyError(f"optimizer state {key!r}: the engine's AdamW keeps {' and '.join(MOMENTS)}")
    ms, vs = engine.adamw.moments()
    return ms, vs, MOMENTS.index(key)


def safe_get_full_fp32_param(param: torch.Tensor) -> torch.Tensor | None:
    """The parameter's full fp32 master value (collective over DP)."""
    engine, i = _owner(param)
    if engine is None:
        return None
    engine.storage.adopt_edits()  # a parameter changed in place since the last step holds the current value
    return _assemble(engine, i, engine.adamw.master)


@torch.no_grad()
def safe_set_full_fp32_param(param: torch.Tensor, value: torch.Tensor) -> None:
    """Set the parameter's fp32 master to ``value`` (its full shape), and the parameter (or this rank's shard of it,
    at stage 3) to ``value`` in the training dtype. Adam's moments are kept."""
    engine, i = _target(param, value, "safe_set_full_fp32_param")
    if engine is None:
        return
    zp = engine.zparams[i]
    write_segments(engine, segments_by_param(engine).get(i, ()), value.float().to(engine.device))
    if zp.param.shape == zp.slot.shape:  # the replica at stages 0-2 (a stage-3 placeholder holds nothing)
        zp.param.copy_(value)


def safe_get_full_grad(param: torch.Tensor) -> torch.Tensor | None:
    """The parameter's reduced gradient in fp32 (averaged over DP ranks, the loss scale removed), between the
    window's last ``backward()`` and ``step()``; None when no gradient is held (after ``zero_grad()``). In a window
    with no backward it is what the next step would train on (``zero/grads/replaced.py``), read on this rank alone.
    Inside ``no_sync()`` after a backward there, this rank's own gradient so far (``_unsynced_grad``)."""
    engine, i = _owner(param)
    if engine is None:
        return None
    if engine.window.suspended and engine.window.unsynced:
        return _unsynced_grad(engine, i)
    if not engine.window.open:  # a .grad set by hand with no backward is the gradient too (zero/grads/replaced.py)
        adopt_replaced(engine, "safe_get_full_grad", collective=False)
    if not engine.window.open and not engine.grads.reduced:  # no backward, and peers: read, settle nothing
        g = unsettled_gradient(engine, i)
        return None if g is None else g / engine.scaler.scale
    return _assemble(engine, i, reduced_grads(engine, "safe_get_full_grad")) / engine.scaler.scale


def _unsynced_grad(engine: Engine, i: int) -> torch.Tensor | None:
    """Inside ``no_sync()`` at stages 0-1: this rank's own gradient accumulated over the window's micro-batches so far,
    not averaged over DP ranks (the loss scale removed), read without a collective, as DeepSpeed's
    ``safe_get_full_grad`` reads ``param.grad`` there; None where no backward reached the parameter. At stages 2-3
    each micro-batch is reduce-scattered into partitions (DeepSpeed refuses ``no_sync()`` there): one line."""
    if not engine.grads.keep_full:
        raise RuntimeError(
            f"safe_get_full_grad inside no_sync() at stage {engine.stage}: the gradients are reduce-scattered into "
            "partitions every micro-batch there; call it after the window's last backward, outside no_sync()"
        )
    grad = engine.zparams[i].param.grad
    if grad is None:
        return None
    # the buffer holds the loss's share: the DP average's 1 / N is in it unless the collective would apply it
    pre_scale = engine.grads.pre_scale or 1.0
    return grad.detach().float() * (pre_scale * engine.group.size / engine.scaler.scale)


@torch.no_grad()
def safe_set_full_grad(param: torch.Tensor, value: torch.Tensor) -> None:
    """Set the parameter's reduced gradient to ``value``, its full shape as ``safe_get_full_grad`` returns it
    (averaged over DP ranks, the loss scale removed), between the window's last ``backward()`` and ``step()``: the
    step trains on it, and at stage 0 ``.grad`` shows it (at stage 1, in this rank's shard). The way to change a
    gradient where ``p.grad = ...`` cannot reach it (stages 2-3, stage 1 on several ranks, offload). Each rank writes
    its own pieces, so give every DP rank the same value."""
    engine, i = _target(param, value, "safe_set_full_grad")
    if engine is None:
        return
    chunks = reduced_grads(engine, "safe_set_full_grad")
    flat = (value.detach().float() * engine.scaler.scale).reshape(-1).to(engine.device)
    for seg in segments_by_param(engine).get(i, ()):
        segment_view(chunks, engine.layout, seg).copy_(flat[seg.param_start : seg.param_end])


def safe_get_full_optimizer_state(param: torch.Tensor, optim_state_key: str) -> torch.Tensor | None:
    """The parameter's full Adam moment ``exp_avg`` or ``exp_avg_sq`` in fp32 (decoded under 8-bit states)."""
    engine, i = _owner(param)
    if engine is None:
        return None
    ms, vs, k = _state(engine, optim_state_key)
    return _assemble(engine, i, (ms, vs)[k])


@torch.no_grad()
def safe_set_full_optimizer_state(param: torch.Tensor, value: torch.Tensor, optim_state_key: str) -> None:
    """Set the parameter's Adam moment ``exp_avg`` or ``exp_avg_sq`` to ``value`` (its full shape)."""
    engine, i = _owner(param)
    if engine is None:
        return
    ms, vs, k = _state(engine, optim_state_key)
    flat = value.detach().float().reshape(-1)
    numel = engine.zparams[i].slot.end - engine.zparams[i].slot.start
    if flat.numel() != numel:
        raise ValueError(
            f"safe_set_full_optimizer_state: {engine.zparams[i].name} has {numel} elements, the value {flat.numel()}"
        )
    chunks = (ms, vs)[k]
    for seg in segments_by_param(engine).get(i, ()):
        segment_view(chunks, engine.layout, seg).copy_(flat[seg.param_start : seg.param_end])
    engine.adamw.load_moments(ms, vs)
