"""A window whose gradient norm is NaN, clipped with ``engine.clip_grad_norm_``, then clean windows: training goes
on at every stage. At stages 0-1 the clip scaled the bucket buffer's padding by NaN, which nothing else writes, so
every later norm read NaN: an fp16 run skipped every step until its loss scale hit the minimum, and a run that
skips non-finite steps (as a DeepSpeed config's does) skipped every later step without a word."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from zerobench.distributed.collectives import Group
from zerobench.zero import AdamWConfig, ZeroConfig
from zerobench.zero.api import apply_zero


def run(stage: int) -> list[tuple[float, bool]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))  # 340 elements: buckets padded
    engine = apply_zero(
        model,
        Group(None, "dp", 1, 0),
        ZeroConfig(stage=stage, bucket_numel=100, optimizer=AdamWConfig(lr=1e-2, weight_decay=0.0)),
    )
    engine.skip_nonfinite = True
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(4):
        loss = model(torch.randn(8, 16, generator=g)).pow(2).mean()
        engine.backward(loss * float("nan") if i == 0 else loss)
        norm = float(engine.clip_grad_norm_(1.0))
        out.append((norm, bool(engine.step())))
    return out


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_training_goes_on_after_a_nan_window_clipped(stage):
    got = run(stage)
    assert math.isnan(got[0][0]) and got[0][1] is False  # the NaN window is skipped
    assert all(math.isfinite(n) and stepped for n, stepped in got[1:]), got
    assert [n for n, _ in got[1:]] == pytest.approx([n for n, _ in run(2)[1:]], rel=1e-6)  # as stage 2's
