"""Stage 3: a parameter changed in place while its unit was gathered on demand, by a call of one of the model's
modules outside its forward (``model.head(h)``, as DeepSpeed allows). The change reached only the gathered buffer:
the next step freed it and trained on from the shard and fp32 master without it (0.12 from torch, without a word).
It is refused at that step, before anything changes; inside ``gathered_params()`` it is written back, as before."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zerobench.distributed.collectives import Group
from zerobench.zero import AdamWConfig, ZeroConfig
from zerobench.zero.api import apply_zero
from zerobench.zero.state.shards import full_parameters


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(16, 16), nn.Linear(16, 16)])
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for b in self.blocks:
            x = torch.tanh(b(x))
        return self.head(x).pow(2).mean()


def setup():
    torch.manual_seed(0)
    m = Model()
    e = apply_zero(m, Group(None, "dp", 1, 0), ZeroConfig(stage=3, bucket_numel=100, optimizer=AdamWConfig(lr=1e-2)))
    return m, e


def train(m, e, n: int = 1) -> None:
    for _ in range(n):
        e.backward(m(torch.ones(8, 16)))
        e.step()


def test_an_edit_made_while_gathered_on_demand_is_refused_at_the_step():
    m, e = setup()
    train(m, e)
    with torch.no_grad():
        m.head(torch.ones(2, 16))  # gathers the root on demand
        m.head.weight.mul_(0.5)
    before = {k: v.clone() for k, v in full_parameters(e).items()}
    steps = e.global_steps
    e.backward(m(torch.ones(8, 16)))
    with pytest.raises(RuntimeError, match=r"head\.weight changed in place while gathered outside the model's forward"):
        e.step()
    assert e.global_steps == steps and all(torch.equal(v, full_parameters(e)[k]) for k, v in before.items())


def test_an_on_demand_call_without_edits_trains_on():
    m, e = setup()
    train(m, e)
    with torch.no_grad():
        m.head(torch.ones(2, 16))
    train(m, e, 2)


def test_the_same_edit_inside_gathered_params_is_kept():
    m, e = setup()
    train(m, e)
    with torch.no_grad():
        m.head(torch.ones(2, 16))
        with e.gathered_params():
            m.head.weight.zero_()
    assert float(full_parameters(e)["head.weight"].abs().max()) == 0.0
    train(m, e)


def test_a_load_replaces_an_edit_without_a_refusal(tmp_path):
    from zerobench.zero.state.checkpoint import load_sharded, save_sharded

    m, e = setup()
    train(m, e)
    save_sharded(e, tmp_path / "c")
    saved = {k: v.clone() for k, v in full_parameters(e).items()}
    with torch.no_grad():
        m.head(torch.ones(2, 16))
        m.head.weight.mul_(0.5)
    load_sharded(e, tmp_path / "c")
    assert all(torch.equal(v, full_parameters(e)[k]) for k, v in saved.items())  # the loaded values, not the edit
    train(m, e)
