"""Global statistics of the reduced gradient, over every partition: its L2 norm (for clipping) and the
fp16 overflow flag. Each rank holds a partition of the DP-averaged gradient (under TP, of its TP shard),
so both are local sums combined by small all-reduces; TP-replicated parameters count once."""

from __future__ import annotations

import math

import torch

from zerobench.config import ConfigError
from zerobench.distributed import collectives as C
from zerobench.zero.grads.replaced import adopt_replaced
from zerobench.zero.protocols import Engine


def found_nonfinite(engine: Engine, grads: list[torch.Tensor], sharded: bool) -> bool:
    """Whether any rank's gradient partition holds an inf or NaN (fp16 overflow)."""
    found = torch.zeros(1, dtype=torch.float32, device=grads[0].device if grads else engine.device)
    engine.adamw.flag_nonfinite(grads, found)
    return bool(agree_max(engine, found.to(engine.device), sharded, "found_inf").item())


def agree_max(engine: Engine, t: torch.Tensor, sharded: bool, tag: str) -> torch.Tensor:
    """``t`` (on the engine's device) made the maximum over the DP group (when the gradient is partitioned there)
    and the TP group, in place: the same answer on every rank."""
    if sharded:
        C.all_reduce(t, engine.group, engine.ledger, tag, op=torch.distributed.ReduceOp.MAX)
    if engine.tp_group is not None:
        C.all_reduce(t, engine.tp_group, engine.ledger, tag, op=torch.distributed.ReduceOp.MAX)
    return t


def reduced_grads(engine: Engine, caller: str) -> list[torch.Tensor]:
    """This rank's reduced gradient chunks for ``caller`` (host copies finished), or one line if the window is
    not reduced yet. A ``.grad`` assigned since backward is taken in first, or refused (``replaced.py``)."""
    if not engine.window.open:
        adopt_replaced(engine, caller)
    if engine.window.open or not engine.grads.reduced:
        raise RuntimeError(
            f"{caller} before this window's gradients are reduced: call it after the last backward() "
            "of the window, before step()"
        )
    if engine.storage.host is not None:
        engine.storage.host.finish_grad_copies()
    return engine.grad_chunks()


def _power_sum(g: torch.Tensor, p: float) -> torch.Tensor:
    return g.float().pow(2).sum() if p == 2.0 else g.float().abs().pow(p).sum()


def global_grad_norm(engine: Engine, grads: list[torch.Tensor], sharded: bool, norm_type: float = 2.0) -> float:
    """The ``norm_type``-norm (default L2; any p > 0, or inf) of the (reduced, still loss-scaled) gradient over
    every partition, DP and TP, as ``torch.nn.utils.clip_grad_norm_`` computes it over one process's gradients."""
    p = float(norm_type)
    if math.isinf(p):
        return _max_abs(engine, grads, sharded)
    sq = torch.zeros(2, dtype=torch.float32, device=grads[0].device if grads else engine.device)  # [all, TP-replicated]
    for g, repl in zip(grads, engine.replicated_ranges):
        sq[0] += _power_sum(g, p)
        if engine.tp_group is not None:
            for lo, hi in repl:
                sq[1] += _power_sum(g[lo:hi], p)
    sq = sq.to(engine.device)  # collectives run on the device (grads may be host chunks under offload)
    if sharded:
        C.all_reduce(sq, engine.group, engine.ledger, "grad_norm")
    root = math.sqrt if p == 2.0 else (lambda x: x ** (1.0 / p))
    if engine.tp_group is None:
        return root(sq[0].item())
    tp_part = (sq[0] - sq[1]).reshape(1)
    C.all_reduce(tp_part, engine.tp_group, engine.ledger, "grad_norm")
    return root(tp_part.item() + sq[1].item())


def _max_abs(engine: Engine, grads: list[torch.Tensor], sharded: bool) -> float:
    """The inf-norm: the largest |element| of any partition (a TP-replicated element counts alike on every rank)."""
    top = torch.zeros(1, dtype=torch.float32, device=engine.device)
    for g in grads:
        if g.numel():
            top = torch.maximum(top, g.float().abs().max().to(engine.device).reshape(1))
    return agree_max(engine, top, sharded, "grad_norm").item()


def zero_padding(engine: Engine) -> None:
    """Zero the full gradient buffer's elements that hold no parameter (stages 0-1). Nothing writes them but a
    scaling of the shard views: a clip by a NaN coefficient made them NaN for good (the next window's gradients are
    copied into the parameters' views only), so every later norm and overflow check read NaN."""
    full, layout = engine.grads.full, engine.layout
    if full is None:
        return
    for b in layout.buckets:
        view = full.bucket_view(b.index)
        for lo, hi in layout.padding(b.index):
            view[lo:hi].zero_()


def clip_coefficient(norm: float, max_norm: float) -> float:
    """The factor ``clip_grad_norm_(max_norm)`` scales a gradient of total ``norm`` by, as torch's computes it:
    ``max_norm / (norm + 1e-6)`` clamped to at most 1, so an infinite norm gives 0 and a NaN norm NaN (the
    gradient is then as broken as torch leaves it, not stepped unclipped). ``torch.nn.utils.clip_grad_norm_`` on a
    rank sees only that rank's ``.grad`` (stage 1: its shard; stages 2-3: None), hence the engine's method."""
    coef = max_norm / (norm + 1e-6)
    return coef if math.isnan(coef) else min(1.0, coef)


def check_clip_args(max_norm: float, norm_type: float) -> None:
    """One line for a ``max_norm`` that is not positive (``inf`` measures and clips nothing, as torch's) or a
    ``norm_type`` that is not a p-norm."""
    if not max_norm > 0:  # NaN too
        raise ConfigError(f"clip_grad_norm_ needs a positive max_norm, got {max_norm}")
    if not (float(norm_type) > 0):
        raise ConfigError(
            f"clip_grad_norm_(norm_type={norm_type}): the ZeRO engine clips by a global p-norm, "
            "p > 0 or inf (2 by default)"
        )


@torch.no_grad()
def window_grad_norm(engine: Engine, max_norm: float, sharded: bool, norm_type: float = 2.0) -> float:
    """For ``engine.clip_grad_norm_(max_norm)``: the norm of this window's reduced gradient, loss scale removed,
    once the window is reduced; one line for a bad ``max_norm`` or ``norm_type``, or a window still open."""
    check_clip_args(max_norm, norm_type)
    return (
        global_grad_norm(engine, reduced_grads(engine, "clip_grad_norm_()"), sharded, norm_type) / engine.scaler.scale
    )
