"""The engine ``apply_zero`` returns has a closed surface: what the core documents, nothing passed through to the
module and none of DeepSpeed's names. ``as_deepspeed`` composes DeepSpeed's on the same object."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from zerobench.config import ConfigError
from zerobench.distributed.collectives import Group
from zerobench.zero import DeepSpeedEngine, ZeroConfig, ZeroEngine, apply_zero, as_deepspeed, engine_of

ONE = Group(None, "dp", 1, 0)
DOCS = Path(__file__).resolve().parents[2] / "docs" / "engine.md"


def engine() -> ZeroEngine:
    torch.manual_seed(0)
    return apply_zero(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1)), ONE, ZeroConfig(stage=2))


@pytest.mark.parametrize("name", ["get_lr", "train_batch_size", "save_checkpoint", "save_16bit_model", "parameters"])
def test_the_core_engine_has_none_of_deepspeeds_names(name):
    e = engine()
    with pytest.raises(AttributeError, match=f"'ZeroEngine' object has no attribute '{name}'"):
        getattr(e, name)


def test_the_core_engine_is_not_the_model():
    with pytest.raises(TypeError, match="not callable"):
        engine()(torch.ones(2, 4))


def test_as_deepspeed_adds_deepspeeds_names_to_the_same_engine():
    e = engine()
    model, hooks = e.module, len(e._hooks)
    ds = as_deepspeed(e, micro_batch=2)
    assert ds is e and isinstance(ds, DeepSpeedEngine) and isinstance(ds, ZeroEngine)
    assert ds.module is model and len(ds._hooks) == hooks and engine_of(model) is ds
    assert ds.train_batch_size() == 2 and ds.get_lr() == [ds.optimizer.param_groups[0]["lr"]]
    assert list(ds.parameters()) == list(model.parameters())  # passed through to the module
    loss = ds(torch.ones(2, 4)).sum()
    ds.backward(loss)
    assert ds.step() and ds.global_steps == 1
    with pytest.raises(AttributeError, match="'DeepSpeedEngine' object has no attribute 'nope' nor has its module"):
        ds.nope  # noqa: B018


def test_as_deepspeed_takes_an_engine_only():
    with pytest.raises(ConfigError, match="as_deepspeed takes the engine apply_zero returns, not a Sequential"):
        as_deepspeed(nn.Sequential())


def test_every_public_name_of_the_core_engine_is_documented():
    """docs/engine.md lists the core engine's surface; a name added to the class without a line there fails."""
    public = {n for n in vars(ZeroEngine) if not n.startswith("_")}
    e = engine()
    public |= {n for n in vars(e) if not n.startswith("_")}
    documented = set(re.findall(r"`engine\.([A-Za-z_]+)", DOCS.read_text()))
    assert sorted(public - documented) == []
