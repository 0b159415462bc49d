"""Workers for ``tests/distributed/test_grad_penalty.py``: a loss holding ``torch.autograd.grad`` of the model's output
(a gradient penalty, ``create_graph=True``), trained by the engine against single-process ``torch.optim.AdamW``.

``torch.autograd.grad`` runs a backward through the model that accumulates into no ``.grad``; it must not count as a
micro-batch or reduce anything, and stage 3 must keep the parameters its graph of the gradient needs.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from zerobench.zero import ZeroConfig
from zerobench.zero.api import apply_zero
from zerobench.zero.config import AdamWConfig

STEPS, PER_RANK = 3, 2
ADAMW = AdamWConfig(lr=1e-2, weight_decay=0.0)


def _loss(model: nn.Module, x: torch.Tensor, penalty: bool) -> torch.Tensor:
    """Mean squared output plus the mean squared norm of d output / d input per sample (WGAN-GP's shape)."""
    x = x.clone().requires_grad_(True)
    out = model(x)
    loss = out.pow(2).mean()
    if penalty:
        (gx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        loss = loss + gx.pow(2).sum(dim=1).mean()
    return loss


def _window(engine, model, xs, loop: str, penalty: bool) -> None:
    for x in xs:
        if loop == "engine":  # DeepSpeed's: the engine divides by the window's micro-batches and steps at its end
            engine.backward(_loss(model, x, penalty))
            engine.step()
        else:  # a plain backward (the engine divides by grad_accum_steps, as DeepSpeed's), torch's optimizer calls
            _loss(model, x, penalty).backward()
    if loop == "plain":
        engine.optimizer.step()
        engine.optimizer.zero_grad()


def penalty_training(rank: int, world: int, stage: int, accum: int, loop: str) -> dict:
    """Largest parameter difference from one process after ``STEPS`` windows, and the DP traffic of a window with the
    penalty against the same window without it."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    ref, twin = copy.deepcopy(net), copy.deepcopy(net)
    cfg = ZeroConfig(stage=stage, grad_accum_steps=accum, optimizer=ADAMW)
    units = [net[2]] if stage == 3 else None
    engine = apply_zero(net, None, cfg, units=units)
    twin_engine = apply_zero(twin, None, cfg, units=[twin[2]] if stage == 3 else None)
    opt = torch.optim.AdamW(ref.parameters(), lr=ADAMW.lr, betas=ADAMW.betas, eps=ADAMW.eps, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    lo = rank * PER_RANK
    volumes = []
    for _ in range(STEPS):
        xs = [torch.randn(PER_RANK * world, 4, generator=g) for _ in range(accum)]
        engine.ledger.reset()
        twin_engine.ledger.reset()
        _window(engine, net, [x[lo : lo + PER_RANK] for x in xs], loop, penalty=True)
        _window(twin_engine, twin, [x[lo : lo + PER_RANK] for x in xs], loop, penalty=False)
        volumes.append((engine.ledger.volume_elements(), twin_engine.ledger.volume_elements()))
        opt.zero_grad()
        for x in xs:
            (_loss(ref, x, penalty=True) / accum).backward()
        opt.step()
    with engine.gathered_params():
        diff = max((p - q).abs().max().item() for p, q in zip(net.parameters(), ref.parameters()))
    return {"diff": diff, "volumes": volumes}


LOOPS = (("engine", 1), ("engine", 2), ("plain", 2))


def penalty_all(rank: int, world: int, stage: int) -> dict:
    """``penalty_training`` for every loop of ``LOOPS`` at one stage, in one spawn of the ranks."""
    return {f"{loop}-{accum}": penalty_training(rank, world, stage, accum, loop) for loop, accum in LOOPS}
