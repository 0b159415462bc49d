"""``torch.distributed.checkpoint``'s state-dict API over a ZeRO engine's optimizer is refused in one line, before it
changes anything, whether the module was imported before the engine was built or after.

The optimizer's ``state`` is empty (its moments are this rank's partition of flat buffers), so DCP's
``get_state_dict`` took it for uninitialised and ran a step with zero gradients at lr 0 to create it: at world 1 the
step count moved and the moments decayed (3e-3 off the same run without the call), and it then saved no optimizer
state at all. ``get_model_state_dict`` (the weights alone) keeps working."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

from tests.helpers.dist import run_distributed

pytestmark = pytest.mark.dist


def _call(rank: int, world: int, stage: int, early: bool) -> dict:
    if early:  # before the engine: patched in place, not as it is imported
        importlib.import_module("torch.distributed.checkpoint.state_dict")
    from zerobench.zero.api import apply_zero
    from zerobench.zero.config import ZeroConfig

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    engine = apply_zero(model, None, ZeroConfig(stage=stage, bucket_numel=64))
    model(torch.randn(4, 8)).pow(2).mean().backward()
    engine.optimizer.step()
    engine.optimizer.zero_grad()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    before = engine.optimizer.state_dict()["zero_shard"]
    refused = None
    try:
        get_state_dict(model, engine.optimizer)
    except RuntimeError as e:
        refused = str(e)
    after = engine.optimizer.state_dict()["zero_shard"]
    weights = get_model_state_dict(model) if stage < 3 else {}
    return {"refused": refused, "unchanged": repr(before) == repr(after), "weights": sorted(weights)}


@pytest.mark.parametrize("world", [1, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("early", [False, True], ids=["imported-after", "imported-before"])
def test_dcp_state_dicts_over_a_zero_optimizer_are_refused_unchanged(world, early):
    for r in run_distributed(_call, world, 1, early, timeout=240):
        assert "torch.distributed.checkpoint's state dicts cannot hold a ZeRO engine's" in r["refused"]
        assert "\n" not in r["refused"] and r["unchanged"]
        assert r["weights"] == ["0.bias", "0.weight", "2.bias", "2.weight"]
