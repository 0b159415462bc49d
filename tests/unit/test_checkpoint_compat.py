"""Loading a checkpoint of another model is one clear error, never a silent truncated load."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.checkpoint_files import forget_digests
from zerobench.distributed.collectives import Group
from zerobench.zero import ZeroConfig, apply_zero
from zerobench.zero.state.checkpoint import load_sharded, save_sharded
from zerobench.zero.state.reading import CheckpointMismatch
from zerobench.zero.state.shards import full_parameters

ONE = Group(None, "dp", 1, 0)


def engine(width: int, depth: int = 2, stage: int = 1):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])
    return apply_zero(model, ONE, ZeroConfig(stage=stage))


def test_same_model_round_trips(tmp_path):
    a = engine(8)
    with torch.no_grad():
        for p in a.module.parameters():
            p.add_(1.0)
        a.adamw.master[0].copy_(a.storage.replica.data)  # fp32: the parameters are the master
    save_sharded(a, tmp_path)
    b = engine(8)
    load_sharded(b, tmp_path)
    want, got = full_parameters(a), full_parameters(b)
    assert all(torch.equal(want[n], got[n]) for n in want)
    assert not torch.equal(got["0.weight"], engine(8).module[0].weight)


@pytest.mark.parametrize(
    ("width", "depth", "message"),
    [
        (6, 2, "shape of '1.bias' is (8,), this model's is (6,)"),  # a larger model into a smaller one
        (8, 3, "it lacks ['2.bias', '2.weight']"),
        (8, 1, "has parameters this model does not"),
    ],
)
def test_another_model_is_refused(tmp_path, width, depth, message):
    save_sharded(engine(8), tmp_path)
    with pytest.raises(CheckpointMismatch) as e:
        load_sharded(engine(width, depth), tmp_path)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("digests", [True, False], ids=["digests", "saved-before-digests"])
def test_damaged_shard_is_refused(tmp_path, digests):
    """A shard whose values no longer match its segments: its digest refuses it, and, in a checkpoint saved before
    digests, the check of its segments against its tensors."""
    save_sharded(engine(8), tmp_path)
    if not digests:
        forget_digests(tmp_path)
    f = tmp_path / "shard-00000.pt"
    sd = torch.load(f, weights_only=True)
    sd["master"] = sd["master"][:-5]
    torch.save(sd, f)
    with pytest.raises(CheckpointMismatch, match="is damaged: its SHA-256" if digests else "damaged shard"):
        load_sharded(engine(8), tmp_path)
