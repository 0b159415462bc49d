"""Workers for ``tests/distributed/test_backward_args.py``: the arguments of DeepSpeed's ``engine.backward``, trained by
the engine against single-process ``torch.optim.AdamW``.

``two_losses``: two losses of one forward, each with its own backward (``retain_graph=True`` on the first).
Loops (DeepSpeed's test of the pattern, ``test_zero_user_backward``, has the first two shapes):
- ``plain``: ``l1.backward(retain_graph=True); l2.backward()``, then torch's optimizer calls: l1 + l2's gradient
  (two windows without ``zero_grad()`` accumulate);
- ``zero_between``: ``engine.backward(l1, retain_graph=True); engine.zero_grad(); engine.backward(l2)``: l2's alone;
- ``accum``: the two losses as the two micro-batches of one window (``grad_accum_steps=2``, ``engine.step()``
  after each): (l1 + l2) / 2.

``unscaled_accumulation``: ``engine.backward(loss / 2, scale_wrt_gas=False)`` over a window of two micro-batches.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from tests.helpers.ds import ds_apply_zero
from zerobench.zero import ZeroConfig
from zerobench.zero.config import AdamWConfig

STEPS, PER_RANK = 3, 2
ADAMW = AdamWConfig(lr=1e-2, weight_decay=0.0)


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for b in self.blocks:
            x = torch.tanh(b(x))
        return self.head(x)


def _losses(out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return out[:, 0].pow(2).mean(), out[:, 1].abs().mean()


def _engine_window(engine, out: torch.Tensor, loop: str) -> None:
    l1, l2 = _losses(out)
    if loop == "plain":
        l1.backward(retain_graph=True)
        l2.backward()
        engine.optimizer.step()
        engine.optimizer.zero_grad()
    elif loop == "zero_between":
        engine.backward(l1, retain_graph=True)
        engine.zero_grad()
        engine.backward(l2)
        engine.optimizer.step()
        engine.zero_grad()
    else:
        engine.backward(l1, retain_graph=True)
        engine.step()
        engine.backward(l2)
        engine.step()


def _reference_loss(out: torch.Tensor, loop: str) -> torch.Tensor:
    l1, l2 = _losses(out)
    return {"plain": l1 + l2, "zero_between": l2, "accum": (l1 + l2) / 2}[loop]


def two_losses(rank: int, world: int, stage: int, loop: str) -> dict:
    """Largest parameter difference from one process after ``STEPS`` steps."""
    torch.manual_seed(0)
    net = _Net()
    ref = copy.deepcopy(net)
    cfg = ZeroConfig(stage=stage, grad_accum_steps=2 if loop == "accum" else 1, optimizer=ADAMW)
    engine = ds_apply_zero(net, None, cfg)
    opt = torch.optim.AdamW(ref.parameters(), lr=ADAMW.lr, betas=ADAMW.betas, eps=ADAMW.eps, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    lo = rank * PER_RANK
    for _ in range(STEPS):
        x = torch.randn(PER_RANK * world, 4, generator=g)
        _engine_window(engine, net(x[lo : lo + PER_RANK]), loop)
        opt.zero_grad()
        _reference_loss(ref(x), loop).backward()
        opt.step()
    with engine.gathered_params():
        return {"diff": max((p - q).abs().max().item() for p, q in zip(net.parameters(), ref.parameters()))}


def unscaled_accumulation(rank: int, world: int, stage: int) -> dict:
    """``grad_accum_steps=2`` with each micro-batch's loss divided by hand and ``scale_wrt_gas=False``: the mean over the
    window's four micro-batches of the two ranks, as one process on the global batch."""
    torch.manual_seed(0)
    net = _Net()
    ref = copy.deepcopy(net)
    engine = ds_apply_zero(net, None, ZeroConfig(stage=stage, grad_accum_steps=2, optimizer=ADAMW))
    opt = torch.optim.AdamW(ref.parameters(), lr=ADAMW.lr, betas=ADAMW.betas, eps=ADAMW.eps, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    lo = rank * PER_RANK
    for _ in range(STEPS):
        xs = [torch.randn(PER_RANK * world, 4, generator=g) for _ in range(2)]
        for x in xs:
            engine.backward(_reference_loss(net(x[lo : lo + PER_RANK]), "plain") / 2, scale_wrt_gas=False)
            engine.step()
        opt.zero_grad()
        for x in xs:
            (_reference_loss(ref(x), "plain") / 2).backward()
        opt.step()
    with engine.gathered_params():
        return {"diff": max((p - q).abs().max().item() for p, q in zip(net.parameters(), ref.parameters()))}


def scaled_plain(rank: int, world: int, stage: int, precision: str) -> dict:
    """DeepSpeed's ``engine.scale(loss).backward()`` in DeepSpeed's loop (``engine.step()`` after each of a window's two
    micro-batches) against the same engine driven by ``engine.backward(loss)``: the largest parameter difference
    after ``STEPS`` windows; and, under fp16, what a plain backward of the unscaled loss raises."""
    from zerobench.zero import Precision

    cfg = ZeroConfig(stage=stage, grad_accum_steps=2, precision=Precision(precision), optimizer=ADAMW)
    torch.manual_seed(0)
    a, b = _Net(), _Net()
    b.load_state_dict(a.state_dict())
    ea, eb = ds_apply_zero(a, None, cfg), ds_apply_zero(b, None, cfg)
    g = torch.Generator().manual_seed(1 + rank)
    for _ in range(STEPS * 2):
        x = torch.randn(PER_RANK, 4, generator=g)
        ea.backward(_reference_loss(a(x), "plain"))
        ea.step()
        eb.scale(_reference_loss(b(x), "plain")).backward()
        eb.step()
    with ea.gathered_params(), eb.gathered_params():
        out = {"diff": max((p.float() - q.float()).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))}
    out["bare_error"] = None
    if precision == "fp16":
        try:
            _reference_loss(b(torch.randn(PER_RANK, 4, generator=g)), "plain").backward()
        except RuntimeError as e:
            out["bare_error"] = str(e)
    return out


def all_cases(rank: int, world: int, stage: int) -> dict:
    """Every case of this file at one stage, in one spawn of the ranks (the fast tier pays the start-up once)."""
    return {
        "two_losses": {loop: two_losses(rank, world, stage, loop) for loop in ("plain", "zero_between", "accum")},
        "unscaled": unscaled_accumulation(rank, world, stage),
        "scaled": {p: scaled_plain(rank, world, stage, p) for p in ("fp32", "fp16")},
    }
