"""``initialize``'s engine counts a window's micro-batches in ``engine.step()`` calls, as DeepSpeed's engine does:
two ``engine.backward()`` calls before one ``step()`` (two losses, or a ``retain_graph`` backward) are one
micro-batch, and train as one backward of their sum. Counted in backward calls (as before), such a loop with
``gradient_accumulation_steps`` 2 stepped every micro-batch on half a window's gradient, ran the schedule twice as
fast, and ``is_gradient_accumulation_boundary()`` said False before steps it then applied (0.029 off one process
after four micro-batches; DeepSpeed's is 1e-8 off)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.dist import run_distributed
from tests.helpers.tiers import tiered

pytestmark = pytest.mark.dist


def _config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 100, "warmup_type": "linear"}},
        "zero_optimization": {"stage": stage},
    }


def _loop(rank: int, world: int, stage: int, how: str) -> dict:
    from zerobench.zero import initialize

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    engine, *_ = initialize(model=model, config=_config(stage), model_parameters=model.parameters())
    g = torch.Generator().manual_seed(rank)
    seen = []
    for _ in range(4):
        x = torch.randn(2, 8, generator=g)
        l1, l2 = engine(x).pow(2).mean(), engine(2 * x).pow(2).mean()
        if how == "sum":
            engine.backward(l1 + l2)
        elif how == "two":
            engine.backward(l1)
            engine.backward(l2)
        else:  # the same loss twice through one graph: twice its gradient
            engine.backward(l1, retain_graph=True)
            engine.backward(l1)
        boundary = engine.is_gradient_accumulation_boundary()
        engine.step()
        seen.append(
            (boundary, engine.was_step_applied(), engine.global_steps, engine.lr_scheduler.last_batch_iteration)
        )
    with engine.gathered_params():
        params = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    return {"seen": seen, "params": params}


def _double(rank: int, world: int, stage: int) -> dict:
    """``backward(2 * l1)``: what a ``retain_graph`` backward of ``l1`` twice must equal."""
    from zerobench.zero import initialize

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    engine, *_ = initialize(model=model, config=_config(stage), model_parameters=model.parameters())
    g = torch.Generator().manual_seed(rank)
    for _ in range(4):
        x = torch.randn(2, 8, generator=g)
        l1 = engine(x).pow(2).mean()
        engine(2 * x)  # the same forwards as the loop's, so both consume the generator alike
        engine.backward(2 * l1)
        engine.step()
    with engine.gathered_params():
        return {"params": torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()}


def _worst(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


@pytest.mark.parametrize("stage", tiered((0, 1, 2, 3), fast=(3,)))
def test_backwards_before_one_step_are_one_micro_batch(stage):
    windows = [(False, False, 0, -1), (True, True, 1, 0), (False, False, 1, 0), (True, True, 2, 1)]
    one = run_distributed(_loop, 2, stage, "sum", timeout=240)
    two = run_distributed(_loop, 2, stage, "two", timeout=240)
    for a, b in zip(one, two):
        assert a["seen"] == windows and b["seen"] == windows, (a["seen"], b["seen"])
        assert _worst(a["params"], b["params"]) < 1e-6
    retain = run_distributed(_loop, 2, stage, "retain", timeout=240)
    double = run_distributed(_double, 2, stage, timeout=240)
    for a, b in zip(retain, double):
        assert a["seen"] == windows
        assert _worst(a["params"], b["params"]) < 1e-6


def _torch_style(rank: int, world: int) -> str:
    from zerobench.zero import initialize

    model = nn.Linear(8, 4)
    engine, *_ = initialize(model=model, config=_config(2), model_parameters=model.parameters())
    for _ in range(2):
        engine.backward(engine(torch.randn(2, 8)).pow(2).mean())
    try:
        engine.optimizer.step()
    except RuntimeError as e:
        return str(e)
    return ""


def test_a_torch_style_step_on_a_deepspeed_window_says_to_call_engine_step():
    for msg in run_distributed(_torch_style, 2, timeout=240):
        assert "counts micro-batches in engine.step() calls" in msg and "\n" not in msg, msg
