"""A window whose gradient holds an inf or NaN is skipped where DeepSpeed skips it, outside fp16 too: its ZeRO
optimizers in fp32 (stages 1-3), its bf16 optimizer at stage 0 and stage 3, and bf16 stages 1-2 under
``bf16.check_grad_overflow`` (on by default, as DeepSpeed 0.19's tests expect: ``skipped_steps`` 1, the step not
applied, the parameters finite, the next window applied). fp32 at stage 0, and bf16 with the key off, step on it,
as DeepSpeed's and torch's optimizers do.

Before, every such window was stepped outside fp16: one bad batch made the fp32 master and the moments NaN for good,
``skipped_steps`` stayed 0 and ``was_step_applied()`` said True (the key was listed as ignored)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tests.helpers.dist import run_distributed

pytestmark = pytest.mark.dist


def _loop(rank: int, world: int, stage: int, precision: str, check: bool | None, tmp: str) -> dict:
    from zerobench.zero import initialize

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-2, "warmup_num_steps": 4}},
        "zero_optimization": {"stage": stage},
    }
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True, **({} if check is None else {"check_grad_overflow": check})}
    engine, *_ = initialize(model=model, config=cfg, model_parameters=model.parameters())
    g = torch.Generator().manual_seed(rank)
    windows, lrs = [], []
    for bad in (False, True, False):
        loss = engine(torch.randn(2, 8, generator=g).to(engine.param_dtype)).float().pow(2).mean()
        engine.backward(loss * (float("nan") if bad else 1.0))
        engine.step()
        lrs.append(engine.get_lr()[0])
        with engine.gathered_params():
            finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
        windows.append((engine.was_step_applied(), engine.skipped_steps, finite))
    engine.save_checkpoint(tmp, tag="t")
    torch.manual_seed(0)
    again = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    other, *_ = initialize(model=again, config=cfg, model_parameters=again.parameters())
    other.load_checkpoint(tmp, tag="t")
    return {"windows": windows, "lrs": lrs, "resumed_skipped": other.skipped_steps}


CASES = [
    *[("bf16", s, None, True) for s in (0, 1, 2, 3)],
    ("bf16", 2, False, False),
    ("fp32", 0, None, False),
    *[("fp32", s, None, True) for s in (1, 2, 3)],
]


@pytest.mark.parametrize(
    ("precision", "stage", "check", "skips"),
    [c if c[:3] in (("bf16", 3, None), ("fp32", 0, None)) else pytest.param(*c, marks=pytest.mark.slow) for c in CASES],
    ids=[f"{p}-s{s}" + ("-check-off" if c is False else "") for p, s, c, _ in CASES],
)
def test_a_non_finite_window_is_skipped_where_deepspeed_skips_it(tmp_path, precision, stage, check, skips):
    for r in run_distributed(_loop, 2, stage, precision, check, str(tmp_path), timeout=300):
        w = r["windows"]
        if skips:
            assert w == [(True, 0, True), (False, 1, True), (True, 1, True)], w
            assert r["lrs"][1] == r["lrs"][0] < r["lrs"][2], r["lrs"]  # the scheduler waits out the skipped step
            assert r["resumed_skipped"] == 1
        else:  # the step runs on the NaN, as torch's optimizer would
            assert [a for a, _, _ in w] == [True, True, True] and w[1][1] == 0 and not w[2][2], w
            assert not any(math.isnan(x) for x in r["lrs"])
