"""``ZeroOptimizer``'s param-group handling without processes: what a schedule may write, and the one-line
refusals (the engine's side is in ``tests/distributed/test_optimizer_api.py``)."""

from __future__ import annotations

import pytest
import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, OneCycleLR, SequentialLR

from zerobench.config import ConfigError
from zerobench.zero.config import AdamWConfig
from zerobench.zero.optim.torch_optimizer import ZeroOptimizer

CFG = AdamWConfig(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def optimizer() -> ZeroOptimizer:
    return ZeroOptimizer(None, [torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.ones(2))], CFG)


def test_one_group_with_the_config_as_defaults():
    opt = optimizer()
    (group,) = opt.param_groups
    assert len(group["params"]) == 2
    assert opt.hyper() == [CFG]


def test_groups_step_with_their_own_hyperparameters_and_the_config_fills_the_rest():
    a, b = torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.ones(2))
    opt = ZeroOptimizer(
        None, [{"params": [a], "lr": 1e-3}, {"params": [b], "weight_decay": 0.0, "betas": [0.8, 0.9]}], CFG
    )
    assert opt.hyper() == [
        AdamWConfig(lr=1e-3, betas=CFG.betas, eps=CFG.eps, weight_decay=CFG.weight_decay),
        AdamWConfig(lr=CFG.lr, betas=(0.8, 0.9), eps=CFG.eps, weight_decay=0.0),
    ]
    opt.param_groups[1]["lr"] = 2.0
    assert [h.lr for h in opt.hyper()] == [1e-3, 2.0]


def test_a_bad_group_fails_at_construction_naming_it():
    a, b = torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.ones(2))
    with pytest.raises(ConfigError, match=r"param_groups\[1\]\['lr'\] must be a finite number >= 0, got -1"):
        ZeroOptimizer(None, [{"params": [a]}, {"params": [b], "lr": -1.0}], CFG)


@pytest.mark.filterwarnings("ignore:Detected call of")  # no engine here to step
def test_a_schedule_writes_what_the_next_step_reads():
    """torch's warm-up + cosine schedules (tensor-free) set lr in place; a tensor lr reads as its value."""
    opt = optimizer()
    warm = LinearLR(opt, start_factor=0.01, total_iters=10)
    sched = SequentialLR(opt, [warm, CosineAnnealingLR(opt, T_max=90, eta_min=0.0)], milestones=[10])
    lrs = []
    for _ in range(100):
        lrs.append(opt.hyper()[0].lr)
        sched.step()
    assert lrs[0] == pytest.approx(3e-6) and max(lrs) == pytest.approx(3e-4)
    assert lrs[-1] < 1e-6 and all(lr >= 0 for lr in lrs)
    opt.param_groups[0]["lr"] = torch.tensor(1e-4)
    assert opt.hyper()[0].lr == pytest.approx(1e-4)


def test_one_cycle_momentum_schedules_write_betas():
    """OneCycleLR cycles beta1 through ``betas``: the step reads both."""
    opt = optimizer()
    OneCycleLR(opt, max_lr=1e-3, total_steps=10)
    (h,) = opt.hyper()
    assert h.betas[0] == pytest.approx(0.95) and h.betas[1] == 0.95 and h.lr == pytest.approx(4e-5)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("lr", -1.0, "param_groups[0]['lr'] must be a finite number >= 0, got -1.0"),
        ("lr", float("inf"), "param_groups[0]['lr'] must be a finite number >= 0, got inf"),
        ("weight_decay", -0.1, "param_groups[0]['weight_decay'] must be a finite number >= 0, got -0.1"),
        ("eps", 0.0, "param_groups[0] needs eps > 0 and betas in [0, 1), got eps 0.0, betas (0.9, 0.95)"),
        ("betas", (0.9, 1.0), "param_groups[0] needs eps > 0 and betas in [0, 1), got eps 1e-08, betas (0.9, 1.0)"),
        ("lr", "fast", "param_groups[0] needs numbers for lr, betas, eps, weight_decay (betas a pair): ValueError"),
        # torch.optim.AdamW's switches that would change the update were silently ignored before
        (
            "amsgrad",
            True,
            (
                "param_groups[0]['amsgrad']=True: the ZeRO engine's AdamW has no amsgrad variant "
                "(torch.optim.AdamW's default amsgrad=False); drop the key"
            ),
        ),
        ("maximize", True, "param_groups[0]['maximize']=True: the ZeRO engine's AdamW has no maximize variant"),
        (
            "decoupled_weight_decay",
            False,
            (
                "param_groups[0]['decoupled_weight_decay']=False: the ZeRO engine's AdamW has "
                "no decoupled_weight_decay variant"
            ),
        ),
        # accepted and stepped as if absent before: the step runs under no_grad and is not built for graph capture
        (
            "differentiable",
            True,
            "param_groups[0]['differentiable']=True: the ZeRO engine's AdamW has no differentiable",
        ),
        ("capturable", True, "param_groups[0]['capturable']=True: the ZeRO engine's AdamW has no capturable variant"),
    ],
)
def test_bad_values_are_one_line(key, value, message):
    opt = optimizer()
    opt.param_groups[0][key] = value
    with pytest.raises(ConfigError) as e:
        opt.hyper()
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_groups_added_after_construction_are_refused():
    opt = optimizer()
    with pytest.raises(ValueError, match=r"lays out its param groups .* apply_zero\(param_groups=...\)"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(1))], "lr": 1.0})
    opt.param_groups.append(dict(opt.param_groups[0]))
    with pytest.raises(ConfigError, match=r"has 1 param group\(s\), fixed at construction, found 2"):
        opt.hyper()


@pytest.mark.parametrize(
    "edit",
    [
        lambda g: g[1]["params"].append(g[0]["params"][0]),
        lambda g: g[0]["params"].remove(g[0]["params"][0]),
        lambda g: g[0]["params"].pop(),
        lambda g: g[0]["params"].__setitem__(0, g[1]["params"][0]),
        lambda g: g[0]["params"].extend([]),
        lambda g: g[0]["params"].reverse(),
    ],
)
def test_a_groups_parameters_cannot_be_edited(edit):
    """The partition holds each group's parameters from construction: torch steps each group's current list, so an
    edit (a parameter moved to a group of lr 0, a bias dropped from decay) used to change nothing the step did."""
    opt = two_groups()
    with pytest.raises(ValueError, match=r"hold the parameters given at construction .* apply_zero\(param_groups="):
        edit(opt.param_groups)
    assert [len(g["params"]) for g in opt.param_groups] == [1, 1]
    assert opt.hyper()[1].lr == 1e-3


@pytest.mark.parametrize(
    "edit",
    [lambda o: o.param_groups.reverse(), lambda o: o.param_groups[0].update(params=list(o.param_groups[0]["params"]))],
    ids=["reordered", "replaced"],
)
def test_reordered_or_replaced_groups_are_refused_at_the_step(edit):
    """Hyperparameters go to the partition's groups by position: reordered groups stepped the weights with the
    biases' lr, and the biases with the weights'."""
    opt = two_groups()
    edit(opt)
    with pytest.raises(ConfigError, match=r"param_groups\[0\]\['params'\] is not the list this group was built"):
        opt.hyper()


def test_copied_param_groups_have_plain_lists():
    import copy
    import pickle

    opt = two_groups()
    groups = copy.deepcopy(opt.param_groups)
    assert type(groups[0]["params"]) is list and type(pickle.loads(pickle.dumps(opt.param_groups[0]["params"]))) is list
    groups[0]["params"].append(1)  # a copy is the caller's to edit


def two_groups() -> ZeroOptimizer:
    a, b = torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.ones(2))
    return ZeroOptimizer(None, [{"params": [a]}, {"params": [b], "lr": 1e-3}], CFG)


def test_a_plain_torch_state_dict_is_refused():
    opt = optimizer()
    plain = torch.optim.AdamW([torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.ones(2))]).state_dict()
    with pytest.raises(ValueError, match="not a ZeRO optimizer state dict"):
        opt.load_state_dict(plain)


def test_adamw_switches_at_their_defaults_are_accepted():
    """A group copied from torch.optim.AdamW's (``amsgrad=False``, ``maximize=False``, ``foreach``...) steps as before."""
    opt = optimizer()
    opt.param_groups[0].update(amsgrad=False, maximize=False, decoupled_weight_decay=True, foreach=None, fused=None)
    assert opt.hyper() == [CFG]
