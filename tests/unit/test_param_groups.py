"""Param groups without processes: how ``apply_zero(param_groups=...)`` is resolved (``zero/optim/param_groups.py``),
and the sharded step over chunks that several groups share, against ``torch.optim.AdamW`` with the same
groups, on both kernel paths. The engine's side, at every stage, is ``tests/distributed/test_param_groups.py``."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import kernels
from zerobench.config import ConfigError
from zerobench.zero.config import AdamWConfig
from zerobench.zero.optim.adamw import ShardedAdamW
from zerobench.zero.optim.param_groups import resolve_param_groups

CFG = AdamWConfig(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(7, 4), nn.LayerNorm(4), nn.Linear(4, 3))


def _named(m: nn.Module):
    return [(n, p) for n, p in m.named_parameters() if p.requires_grad]


def test_no_groups_is_one_group_with_decay_on_matrices_only():
    m = _model()
    g = resolve_param_groups(_named(m), None, CFG)
    assert len(g.groups) == 1 and g.groups[0]["params"] == list(m.parameters())
    assert g.groups[0]["weight_decay"] == CFG.weight_decay and not g.explicit
    assert [g.decays(p) for p in m.parameters()] == [True, False, False, True, False]


def test_named_parameters_are_taken_as_torch_optim_takes_them():
    """``model.named_parameters()`` (torch.optim accepts ``(name, param)`` pairs since 2.5), bare or in a group;
    before, ``param_groups[0] holds a tuple, not a parameter``."""
    m = _model()
    bare = resolve_param_groups(_named(m), m.named_parameters(), CFG)
    assert bare.groups[0]["params"] == list(m.parameters()) and bare.explicit
    first, rest = list(m.named_parameters())[:2], list(m.named_parameters())[2:]
    two = resolve_param_groups(_named(m), [{"params": first, "lr": 0.5}, {"params": rest}], CFG)
    assert [g["params"] for g in two.groups] == [[p for _, p in first], [p for _, p in rest]]
    assert two.groups[0]["lr"] == 0.5


def test_user_groups_are_torch_groups():
    """Missing hyperparameters come from the config, extra keys stay, and decay reaches every parameter of
    a group (its rate may be 0); a plain iterable of parameters is one such group."""
    m = _model()
    groups = [
        {"params": [m[0].weight, m[2].weight], "lr": 1e-3, "name": "matrices"},
        {"params": [*m[1].parameters(), m[2].bias], "weight_decay": 0.0},
    ]
    g = resolve_param_groups(_named(m), groups, CFG)
    assert g.explicit and [p.dim() for p in g.groups[1]["params"]] == [1, 1, 1]
    assert g.groups[0] == {
        "params": [m[0].weight, m[2].weight],
        "lr": 1e-3,
        "betas": CFG.betas,
        "eps": CFG.eps,
        "weight_decay": CFG.weight_decay,
        "name": "matrices",
    }
    assert g.of_param[id(m[2].bias)] == 1 and all(g.decays(p) for p in m.parameters())
    flat = resolve_param_groups(_named(m), m.parameters(), CFG)
    assert len(flat.groups) == 1 and flat.groups[0]["params"] == list(m.parameters())


def test_frozen_parameters_are_dropped_from_groups():
    m = _model()
    m[1].requires_grad_(False)
    g = resolve_param_groups(_named(m), [{"params": m.parameters()}], CFG)
    assert g.groups[0]["params"] == [m[0].weight, m[2].weight, m[2].bias]


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda m: [{"params": [m[0].weight]}, {"params": [m[0].weight, *m[1:].parameters()]}],
            r"parameter 0.weight is in param_groups\[1\] in param_groups\[0\] too: put each parameter in one group",
        ),
        (
            lambda m: [{"params": [m[0].weight, m[0].weight, *m[1:].parameters()]}],
            r"parameter 0.weight is in param_groups\[0\] twice",
        ),
        (
            lambda m: [{"params": [m[0].weight]}],
            (
                r"parameter 1.weight requires a gradient but is in no param group \(4 such\): add it to one, or set "
                r"requires_grad=False"
            ),
        ),
        (
            lambda m: [{"params": [*m.parameters(), nn.Parameter(torch.ones(5))]}],
            r"param_groups\[0\] holds a tensor of shape \(5,\) that is not one of the model's trained parameters",
        ),
        (lambda m: [{"lr": 1.0}], r"param_groups\[0\] has no 'params'"),
        (lambda m: [], "param_groups is empty"),
        (lambda m: [{"params": [m[0].weight]}, m[1].weight], "mixes dicts and parameters"),
        (lambda m: {"params": list(m.parameters())}, "not a single tensor or dict"),
        (lambda m: [{"params": ["0.weight"]}], r"param_groups\[0\] holds a str, not a parameter"),
    ],
)
def test_bad_groups_are_one_line(make, message):
    m = _model()
    with pytest.raises(ConfigError, match=message) as e:
        resolve_param_groups(_named(m), make(m), CFG)
    assert "\n" not in str(e.value)


GROUP_HYPERS = [
    AdamWConfig(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1),
    AdamWConfig(lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.0),
    AdamWConfig(lr=5e-2, betas=(0.5, 0.9), eps=1e-3, weight_decay=0.3),
]


def _paths():
    ok, _ = kernels.available("cpu")
    return ["reference", pytest.param("fused", marks=pytest.mark.skipif(not ok, reason="no fused CPU kernel"))]


@pytest.mark.parametrize("path", _paths())
def test_the_sharded_step_follows_torch_adamw_per_group(path):
    """Seven parameters of three groups, flattened with padding and cut into three chunks across parameter
    boundaries (as a rank's shards are): three steps with a gradient scale, each group with its own lr, betas,
    eps and weight decay, match ``torch.optim.AdamW``; the padding is left alone, and the bf16 parameter copy
    the step writes is the master rounded."""
    torch.manual_seed(1)
    sizes, group_of = [5, 3, 8, 1, 6, 4, 2], [0, 1, 2, 0, 1, 2, 0]
    params = [torch.randn(n) for n in sizes]
    offsets, pos = [], 0
    for n in sizes:
        offsets.append(pos)
        pos += n + 1  # one padding element after each parameter
    flat = torch.full((pos,), 0.0)
    for p, o in zip(params, offsets):
        flat[o : o + p.numel()] = p
    cuts = [0, 7, 20, pos]
    master = [flat[a:b].clone() for a, b in itertools.pairwise(cuts)]
    decay, spans = [[] for _ in master], [{} for _ in master]
    for n, o, g in zip(sizes, offsets, group_of):
        for c, (a, b) in enumerate(itertools.pairwise(cuts)):
            lo, hi = max(o, a), min(o + n, b)
            if lo < hi:
                decay[c].append((lo - a, hi - a))
                spans[c].setdefault(g, []).append((lo - a, hi - a))
    opt = ShardedAdamW(CFG, master, decay, kernel_mode=path, group_spans=spans)
    ref_params = [p.clone().requires_grad_(True) for p in params]
    ref = torch.optim.AdamW(
        [
            {
                "params": [p for p, g in zip(ref_params, group_of) if g == k],
                "lr": h.lr,
                "betas": h.betas,
                "eps": h.eps,
                "weight_decay": h.weight_decay,
            }
            for k, h in enumerate(GROUP_HYPERS)
        ],
        foreach=False,
    )
    for _ in range(3):
        grads = [torch.randn(n) for n in sizes]
        gflat = torch.zeros(pos)
        for gr, o in zip(grads, offsets):
            gflat[o : o + gr.numel()] = gr * 2.0
        out = [torch.zeros(m.numel(), dtype=torch.bfloat16) for m in master]
        opt.step([gflat[a:b].clone() for a, b in itertools.pairwise(cuts)], 0.5, out=out, hyper=GROUP_HYPERS)
        for p, gr in zip(ref_params, grads):
            p.grad = gr
        ref.step()
    got = torch.cat(master)
    for p, o in zip(ref_params, offsets):
        torch.testing.assert_close(got[o : o + p.numel()], p.detach(), rtol=1e-5, atol=1e-6)
    pad = [o + n for n, o in zip(sizes, offsets)]
    assert got[pad].abs().max().item() == 0.0
    low = torch.cat(out)
    for p, o in zip(ref_params, offsets):
        assert torch.equal(low[o : o + p.numel()], got[o : o + p.numel()].to(torch.bfloat16))
