"""``p.data = t`` after ``apply_zero`` (``torch.nn.utils.vector_to_parameters``; HF's ``_init_weights`` assigns
``module.weight.data``): training goes on from the assigned values, as torch's optimizer steps whatever tensor a
parameter holds, and the fp32 master that checkpoints read holds them too.

At stages 0-2 each parameter is a view of the engine's replica; an assignment moved it off the buffer. The model
then read the assigned tensor and was never stepped again, while the engine stepped and checkpointed the old values:
the module 0.0199 and the master 0.25 off torch after three steps, without a word."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from tests.helpers.dist import run_distributed
from tests.helpers.tiers import tiered

pytestmark = pytest.mark.dist
LR = 1e-2


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def _batches() -> list[torch.Tensor]:
    """Three global batches of 8: each of two ranks takes 4, the single process all of them."""
    g = torch.Generator().manual_seed(1)
    return [torch.randn(8, 8, generator=g) for _ in range(3)]


def _assign(model: nn.Module, kind: str) -> None:
    with torch.no_grad():
        if kind == "vector_to_parameters":
            vector_to_parameters(parameters_to_vector(model.parameters()) + 0.25, model.parameters())
        else:
            model[2].weight.data = model[2].weight.data * 0.5 + 0.1


def _loop(model, optimizer, rank, world, kind, after_last: bool) -> None:
    batches = _batches()
    for i, x in enumerate(batches):
        model(x[rank::world]).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if i == 0 or (after_last and i == len(batches) - 1):
            _assign(model, kind)


def _torch(kind: str, after_last: bool) -> list[float]:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    _loop(model, opt, 0, 1, kind, after_last)
    return parameters_to_vector(model.parameters()).tolist()


def _engine(rank: int, world: int, stage: int, kind: str, after_last: bool) -> dict:
    from zerobench.zero.api import apply_zero
    from zerobench.zero.config import AdamWConfig, ZeroConfig
    from zerobench.zero.state.shards import full_parameters

    model = _model()
    engine = apply_zero(
        model, None, ZeroConfig(stage=stage, bucket_numel=64, optimizer=AdamWConfig(lr=LR, weight_decay=0.0))
    )
    _loop(model, engine.optimizer, rank, world, kind, after_last)
    master = full_parameters(engine)
    return {
        "module": parameters_to_vector(model.parameters()).tolist(),
        "master": torch.cat([master[n].flatten() for n, _ in model.named_parameters()]).tolist(),
    }


def _worst(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


@pytest.mark.parametrize(
    "after_last", tiered((False, True), fast=(True,)), ids=["between-steps", "after-the-last-step"]
)
@pytest.mark.parametrize("kind", tiered(("vector_to_parameters", "weight_data"), fast=("vector_to_parameters",)))
@pytest.mark.parametrize("stage", tiered((0, 1, 2), fast=(2,)))
def test_an_assigned_parameter_trains_on_and_is_what_the_master_holds(stage, kind, after_last):
    ref = _torch(kind, after_last)
    for r in run_distributed(_engine, 2, stage, kind, after_last, timeout=240):
        assert _worst(r["module"], ref) < 1e-6, (stage, kind, _worst(r["module"], ref))
        assert _worst(r["master"], ref) < 1e-6, (stage, kind, _worst(r["master"], ref))


def _misshapen(rank: int, world: int) -> str:
    from zerobench.zero.api import apply_zero
    from zerobench.zero.config import ZeroConfig

    model = _model()
    engine = apply_zero(model, None, ZeroConfig(stage=2, bucket_numel=64))
    model(torch.randn(2, 8)).pow(2).mean().backward()
    model[2].bias.data = torch.zeros(5)
    try:
        engine.optimizer.step()
    except RuntimeError as e:
        return str(e)
    return ""


def test_a_tensor_of_another_shape_is_refused_in_one_line():
    for msg in run_distributed(_misshapen, 2, timeout=240):
        assert "'2.bias' was assigned a tensor of shape (5,)" in msg and "\n" not in msg, msg


def _inside_gathered(rank: int, world: int, stage: int, writeback: bool) -> dict:
    """DP rank 0 assigns a weight's ``.data`` inside ``gathered_params`` (DeepSpeed's ``modifier_rank=0``, or a
    discarding context), as an init function run under DeepSpeed's ``GatheredParameters`` would."""
    from zerobench.zero.api import apply_zero
    from zerobench.zero.config import ZeroConfig
    from zerobench.zero.state.shards import full_parameters

    model = _model()
    engine = apply_zero(model, None, ZeroConfig(stage=stage, bucket_numel=64))
    with engine.gathered_params(**({"modifier_rank": 0} if writeback else {"writeback": False})):
        if rank == 0:
            model[2].weight.data = torch.full((4, 16), 0.5)
    with engine.gathered_params():
        held = model[2].weight.detach().clone()
    master = full_parameters(engine)["2.weight"]
    return {"held": held.unique().tolist(), "master": master.unique().tolist()}


@pytest.mark.parametrize("writeback", tiered((True, False), fast=(True,)), ids=["modifier-rank-0", "discarded"])
@pytest.mark.parametrize("stage", tiered((0, 1, 2, 3), fast=(3,)))
def test_an_assignment_inside_gathered_params_is_kept_or_discarded_whole(stage, writeback):
    """Before, the exit broadcast and wrote back the buffers, which the assigned parameter no longer viewed: at stage 3
    only rank 0's own partition took the new values (the others kept the old), at stages 0-2 the model kept the
    assigned tensor off the engine's buffer, and a discarding context kept it."""
    for r in run_distributed(_inside_gathered, 2, stage, writeback, timeout=240):
        if writeback:
            assert r["held"] == [0.5] and r["master"] == [0.5], (stage, r)
        else:
            assert 0.5 not in r["held"] and len(r["held"]) > 1 and r["master"] == r["held"], (stage, r)


def _assigned_while_partitioned(rank: int, world: int) -> str:
    from zerobench.zero.api import apply_zero
    from zerobench.zero.config import ZeroConfig

    model = _model()
    apply_zero(model, None, ZeroConfig(stage=3, bucket_numel=64))
    model[2].weight.data = torch.ones(4, 16)  # outside any gather: the next one would replace it
    try:
        model(torch.randn(2, 8)).pow(2).mean().backward()
    except RuntimeError as e:
        return str(e)
    return ""


def test_an_assignment_to_a_partitioned_parameter_is_refused_in_one_line():
    for msg in run_distributed(_assigned_while_partitioned, 2, timeout=240):
        assert "parameter '2.weight' was assigned .data (shape (4, 16)) while stage 3 held it partitioned" in msg
        assert "\n" not in msg
