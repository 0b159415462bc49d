"""A client optimizer and scheduler handed to ``zerobench.zero.initialize`` (``zerobench/zero/ds_client.py``), as
Hugging Face Accelerate hands them: the client's param groups as the engine takes them, and a torch scheduler built
on the client optimizer moving the engine's learning rate with no warning. The loop's parity with one process, in
that form too, and what is refused are in ``test_ds_initialize.py``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.plain_python import run_plain_python

pytestmark = pytest.mark.dist

CLIENT_SCRIPT = """
import torch
from zerobench.zero import initialize
model = torch.nn.Linear(4, 1)
client = torch.optim.AdamW(model.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.LambdaLR(client, lambda s: 1 / (1 + s))
engine, opt, _, got = initialize(model, config={"train_batch_size": 2, "zero_optimization": {"stage": 2}},
                                 optimizer=client, lr_scheduler=sched)
for _ in range(3):
    engine.backward(engine(torch.ones(2, 4)).sum())
    engine.step()
print(got is sched, opt is engine.optimizer, engine.get_lr()[0], sched.get_last_lr()[0])
"""


def test_a_scheduler_built_on_the_client_optimizer_moves_the_engines_without_a_warning():
    """Rebound to the engine's optimizer, torch's scheduler sees its step-order check pass: no UserWarning (an
    error here) that ``optimizer.step()`` was overridden or not called first."""
    r = run_plain_python("-W", "error::UserWarning", "-c", CLIENT_SCRIPT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "True", "0.025", "0.025"]  # 0.1 / (1 + 3) after three steps


def test_a_client_adam_without_weight_decay_is_adamws_groups():
    """A plain ``torch.optim.Adam`` with no weight decay is AdamW's update; its groups keep their hyperparameters."""
    from zerobench.zero.compat.deepspeed.client import client_groups

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
    first, second = list(model.parameters())[:2], list(model.parameters())[2:]
    client = torch.optim.Adam(
        [{"params": first, "lr": 0.5}, {"params": second}], lr=0.25, betas=(0.8, 0.9), fused=False
    )
    got, groups = client_groups(client, model, None)
    assert got is client and [g["params"] for g in groups] == [first, second]
    assert [(g["lr"], g["betas"], g["weight_decay"], g["decoupled_weight_decay"]) for g in groups] == [
        (0.5, (0.8, 0.9), 0, True),
        (0.25, (0.8, 0.9), 0, True),
    ]
    assert not any(k in g for g in groups for k in ("fused", "foreach", "capturable", "differentiable"))


NESTED_SCRIPT = """
import torch
from torch.optim import lr_scheduler as S
from zerobench.zero import initialize

def run(kind):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    client = torch.optim.AdamW(model.parameters(), lr=0.01)
    if kind == "sequential":
        sched = S.SequentialLR(client, [S.LinearLR(client, 0.5, total_iters=2), S.ExponentialLR(client, 0.5)], [2])
    elif kind == "chained":
        sched = S.ChainedScheduler([S.ExponentialLR(client, 0.8), S.LambdaLR(client, lambda s: 1 / (1 + s))])
    else:
        sched = None
    engine, _, _, _ = initialize(model, config={"train_batch_size": 2, "zero_optimization": {"stage": 2}},
                                 optimizer=client, lr_scheduler=sched)
    lrs = []
    for step in range(4):
        if kind == "by_hand":  # a warm-up written into the client's groups, as loops do
            for g in client.param_groups:
                g["lr"] = 0.0 if step < 2 else 0.01
        engine.backward(engine(torch.ones(2, 4)).sum())
        engine.step()
        lrs.append(round(engine.get_lr()[0], 8))
    return lrs

def torch_lrs(kind):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    if kind == "sequential":
        sched = S.SequentialLR(opt, [S.LinearLR(opt, 0.5, total_iters=2), S.ExponentialLR(opt, 0.5)], [2])
    else:
        sched = S.ChainedScheduler([S.ExponentialLR(opt, 0.8), S.LambdaLR(opt, lambda s: 1 / (1 + s))])
    out = []
    for _ in range(4):
        opt.step()
        sched.step()
        out.append(round(opt.param_groups[0]["lr"], 8))
    return out

print(run("sequential") == torch_lrs("sequential"), run("chained") == torch_lrs("chained"), run("by_hand"))
"""


def test_nested_schedulers_and_rates_written_to_the_client_move_the_engine():
    """``SequentialLR`` and ``ChainedScheduler`` write through the schedulers they hold, each on the client
    optimizer, and loops write ``client.param_groups[i]["lr"]`` by hand: before, the engine's rate never moved (the
    client's groups were copies, and only the outer scheduler was rebound)."""
    r = run_plain_python("-W", "error::UserWarning", "-c", NESTED_SCRIPT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "True", "[0.0,", "0.0,", "0.01,", "0.01]"], r.stdout
