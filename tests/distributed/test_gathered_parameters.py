"""``zerobench.zero.GatheredParameters``, DeepSpeed's module-level ``deepspeed.zero.GatheredParameters``, at stages
0-3 (``zerobench/zero/gathered.py``): inside, the given parameters hold their full values; without
``modifier_rank`` changes are discarded, with it that rank's are kept on every rank; a parameter no engine trains is
left alone; ``enabled=False`` gathers nothing; the engine trains on afterwards."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.dist import run_distributed
from tests.helpers.tiers import STAGES

pytestmark = pytest.mark.dist


def _worker(rank: int, world: int, stage: int) -> dict:
    from zerobench.zero import GatheredParameters, ZeroConfig, apply_zero

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    initial = [p.detach().clone() for p in model.parameters()]
    engine = apply_zero(model, None, ZeroConfig(stage=stage, bucket_numel=16))
    first, out = model[0].weight, {}
    with GatheredParameters(model.parameters()):
        out["read"] = max((p - r).abs().max().item() for p, r in zip(model.parameters(), initial))
        first.data.fill_(float(rank + 5))
    with GatheredParameters(first):
        out["discarded"] = (first - initial[0]).abs().max().item()
    with GatheredParameters([first], modifier_rank=world - 1):
        first.data.fill_(float(rank + 5))
    with GatheredParameters(first):
        out["kept"] = first.detach().unique().tolist()
    with GatheredParameters(first, enabled=False):
        out["disabled_numel"] = first.numel()
    plain = nn.Parameter(torch.ones(2))
    with GatheredParameters([plain], modifier_rank=0):
        plain.data.mul_(rank + 2)
    out["plain"] = plain.tolist()
    engine.backward(model(torch.ones(2, 4)).sum())
    out["stepped"] = engine.step()
    return out


@pytest.mark.parametrize("stage", STAGES)
def test_gathered_parameters_as_deepspeeds(stage):
    for rank, r in enumerate(run_distributed(_worker, 2, stage, timeout=120)):
        assert r["read"] == 0.0 and r["discarded"] == 0.0
        assert r["kept"] == [6.0]  # DP rank 1's value (1 + 5) on both ranks
        assert r["disabled_numel"] == (0 if stage == 3 else 32)  # stage 3's placeholder, not gathered
        assert r["plain"] == [rank + 2.0] * 2  # not the engine's: no broadcast, each rank's own change
        assert r["stepped"] is True
