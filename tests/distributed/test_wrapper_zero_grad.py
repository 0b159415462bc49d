"""``zero_grad()`` through a module built around the model after ``apply_zero`` (``torch.compile(model)``, an outer
module holding it) clears the engine's gradients as the model's own does; on a submodule at stages 2-3 it is refused.

Both wrappers inherit ``nn.Module.zero_grad``, which clears ``.grad``; at stages 2-3 a trained parameter's ``.grad``
is always None (its gradient lives in the engine's partition), so each window's gradients were added to the last
one's: 0.0227 off the same loop through ``model.zero_grad()`` after four steps, with no error."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.dist import run_distributed
from tests.helpers.tiers import tiered

pytestmark = pytest.mark.dist


class _Outer(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def _train(rank: int, world: int, stage: int, wrapper: str) -> dict:
    from zerobench.zero.api import apply_zero
    from zerobench.zero.config import ZeroConfig

    model = _model()
    engine = apply_zero(model, None, ZeroConfig(stage=stage, bucket_numel=64))
    wrapped = {"none": model, "compiled": torch.compile(model, backend="eager"), "outer": _Outer(model)}[wrapper]
    g = torch.Generator().manual_seed(rank)
    for _ in range(4):
        wrapped(torch.randn(4, 8, generator=g)).pow(2).mean().backward()
        engine.optimizer.step()
        wrapped.zero_grad()
    with engine.gathered_params():
        params = torch.cat([p.detach().flatten() for p in model.parameters()])
    refused = None
    wrapped(torch.randn(4, 8, generator=g)).pow(2).mean().backward()
    try:
        model[0].zero_grad()  # a submodule: part of the engine's parameters
    except RuntimeError as e:
        refused = str(e)
    return {"params": params.tolist(), "refused": refused}


@pytest.mark.parametrize("stage", tiered((0, 1, 2, 3), fast=(3,)))
def test_a_wrappers_zero_grad_clears_the_engines_gradients(stage):
    plain = run_distributed(_train, 2, stage, "none", timeout=240)
    for wrapper in ("compiled", "outer"):
        got = run_distributed(_train, 2, stage, wrapper, timeout=240)
        for a, b in zip(plain, got):
            worst = max(abs(x - y) for x, y in zip(a["params"], b["params"]))
            assert worst == 0.0, (wrapper, stage, worst)
    for r in plain:
        if stage >= 2:
            assert "Linear.zero_grad() on part of a ZeRO engine's" in r["refused"]
            assert "\n" not in r["refused"]
        else:  # .grad holds what the engine reads: cleared by hand, as torch clears it
            assert r["refused"] is None
