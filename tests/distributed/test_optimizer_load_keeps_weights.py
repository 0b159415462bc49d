"""``engine.optimizer.load_state_dict(sd)`` leaves the model's weights as they are, as torch's does: a warm start
(other weights loaded into the model, then an optimizer state) keeps those weights; a resume (the model loaded from
the same save, then the optimizer's state) keeps the saved fp32 master bit for bit under bf16.

The shard's fp32 master used to be published into the parameters, so the warm start silently went back to the saved
weights (0.893 off torch, still 0.882 a step later)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.dist import run_distributed
from tests.helpers.tiers import tiered

pytestmark = pytest.mark.dist


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def _train(model, engine, rank: int, steps: int) -> None:
    g = torch.Generator().manual_seed(10 + rank)
    for _ in range(steps):
        model(torch.randn(4, 8, generator=g).to(engine.param_dtype)).float().pow(2).mean().backward()
        engine.optimizer.step()
        engine.optimizer.zero_grad()


def _load(rank: int, world: int, stage: int, precision: str) -> dict:
    from zerobench.zero.api import apply_zero
    from zerobench.zero.config import Precision, ZeroConfig
    from zerobench.zero.state.shards import full_parameters

    def build():
        m = _model()
        return m, apply_zero(m, None, ZeroConfig(stage=stage, precision=Precision(precision), bucket_numel=64))

    model, engine = build()
    _train(model, engine, rank, 2)
    osd = engine.optimizer.state_dict()
    with engine.gathered_params():
        msd = {k: v.clone() for k, v in model.state_dict().items()}
    saved_master = full_parameters(engine)

    # a warm start: other weights, then the optimizer's state
    warm, warm_engine = build()
    other = {k: torch.full_like(v, 0.25) for k, v in msd.items()}
    with warm_engine.gathered_params():
        warm.load_state_dict(other)
    warm_engine.optimizer.load_state_dict(osd)
    with warm_engine.gathered_params():
        kept = all(bool((p == 0.25).all()) for p in warm.parameters())
    warm_master = full_parameters(warm_engine)

    # a resume: the same save's weights, then its optimizer state
    resumed, resumed_engine = build()
    with resumed_engine.gathered_params():
        resumed.load_state_dict(msd)
    resumed_engine.optimizer.load_state_dict(osd)
    master = full_parameters(resumed_engine)
    return {
        "kept": kept,
        "warm_master": all(bool((v == 0.25).all()) for v in warm_master.values()),
        "exact": all(torch.equal(master[k], saved_master[k]) for k in saved_master),
        "step": resumed_engine.adamw.step_count,
    }


@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16", marks=pytest.mark.slow)])
@pytest.mark.parametrize("stage", tiered((0, 1, 2, 3), fast=(3,)))
def test_loading_optimizer_state_keeps_the_models_weights(stage, precision):
    for r in run_distributed(_load, 2, stage, precision, timeout=240):
        assert r["kept"] and r["warm_master"], r
        assert r["exact"] and r["step"] == 2, r
