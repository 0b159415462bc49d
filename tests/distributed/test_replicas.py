"""Every DP rank starts from DP rank 0's model, and ranks given different models fail at construction
(``zerobench/zero/replicas.py``), as DDP and DeepSpeed behave: a rank seeded differently trains the same
model as the others, and a rank with another model or ZeRO config gets one line saying so on every rank,
never a collective of the wrong size or a hang."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.helpers.dist import run_distributed
from tests.helpers.user_models import batches, compare, engine_for, make_model, reference_params, slice_of
from zerobench.config import ConfigError
from zerobench.distributed.collectives import Group
from zerobench.zero.replicas import describe, first_difference
from zerobench.zero.state.shards import full_parameters

STAGES = (0, 1, 2, 3)


def _seeded_by_rank(rank: int, world: int) -> dict:
    """Each rank initialises its model (and a buffer) from its own seed; every stage must train rank 0's."""
    group = Group.of(None, "dp")
    out = {}
    for stage in STAGES:
        model = make_model("mlp")  # seed 0: rank 0's model is this one
        model.register_buffer("running", torch.arange(3.0))
        ref_model = copy.deepcopy(model)
        if rank > 0:
            torch.manual_seed(100 + rank)
            for t in (*model.parameters(), *model.buffers()):
                t.data.normal_()
        engine = engine_for(model, group, stage)
        init = full_parameters(engine)
        out[f"init_diff-s{stage}"] = max(
            (init[n] - p.detach()).abs().max().item() for n, p in ref_model.named_parameters()
        )
        out[f"buffer-s{stage}"] = engine.module.running.tolist()
        data = batches(2, 2 * world)
        for x, y in data:
            engine.backward(engine.module(slice_of(x, rank, world), slice_of(y, rank, world)))
            engine.step()
            engine.zero_grad()
        out[f"trained-s{stage}"] = compare(engine, ref_model, reference_params(ref_model, data, world))
    return out


def test_ranks_seeded_differently_train_rank_0s_model():
    ranks = run_distributed(_seeded_by_rank, 2, timeout=240)
    for r in ranks:
        for stage in STAGES:
            assert r[f"init_diff-s{stage}"] == 0.0
            assert r[f"buffer-s{stage}"] == [0.0, 1.0, 2.0]
            t = r[f"trained-s{stage}"]
            assert t["max_update"] > 1e-3 and t["update_rel_err"] <= 1e-4 and t["max_diff"] <= 2e-4, (stage, t)


CASES = ("shape", "missing", "bucket")


def _mismatched(rank: int, world: int) -> dict[str, str | None]:
    """Each case in turn on the same ranks (a refused construction leaves the group usable)."""
    group = Group.of(None, "dp")
    out: dict[str, str | None] = {}
    for what in CASES:
        model, kw = make_model("mlp"), {}
        if rank == 1 and what == "shape":
            model.blocks[2].fc1 = torch.nn.Linear(24, 200)
            model.blocks[2].fc2 = torch.nn.Linear(200, 24)
        elif rank == 1 and what == "missing":
            del model.blocks[2]
        elif rank == 1 and what == "bucket":
            kw = {"bucket_numel": 4000}
        out[what] = None
        try:
            engine_for(model, group, 2, **kw)
        except ConfigError as e:
            out[what] = str(e)
    return out


@pytest.fixture(scope="module")
def mismatched():
    return run_distributed(_mismatched, 2, timeout=120, coll_timeout=30)


@pytest.mark.parametrize(
    ("what", "says"),
    [
        (
            "shape",
            (
                "rank 0 has parameter 'blocks.2.fc1.weight' (300, 24) float32 where rank 1 has parameter "
                "'blocks.2.fc1.weight' (200, 24) float32"
            ),
        ),
        ("missing", "rank 0 has trained parameter 'blocks.2.fc2.bias' where rank 1 has"),
        ("bucket", "bucket_numel=5000"),
    ],
)
def test_a_rank_with_another_model_or_config_fails_on_every_rank(mismatched, what, says):
    for ranks in mismatched:
        e = ranks[what]
        assert e is not None and e.startswith("DP rank 1 was given another model or ZeRO config than DP rank 0"), e
        assert says in e and "build the same model and ZeroConfig on every rank" in e and "\n" not in e, e


def test_descriptions_and_their_first_difference():
    from zerobench.zero.config import ZeroConfig

    model = make_model("mlp")
    d = describe(model, ["head.bias"], ZeroConfig(stage=1))
    assert d[0].startswith("ZeroConfig(stage=1, precision=fp32, bucket_numel=6250000")
    assert d[1] == "trained parameter 'head.bias'" and "parameter 'emb.weight' (40, 24) float32" in d
    assert first_difference(["a", "b"], ["a", "c"], 3) == "rank 0 has b where rank 3 has c"
    assert first_difference(["a", "b"], ["a"], 1) == "rank 0 has b where rank 1 has nothing (1 entries fewer)"
    assert first_difference(["a"], ["a", "x", "y"], 2) == "rank 2 has x where rank 0 has nothing (2 entries more)"
