"""Under fp16 a rank's own gradient carries the whole loss scale, as in DeepSpeed's ZeRO optimizers and in torch's
DDP with ``GradScaler``. When one rank's gradient overflows, every rank skips the step and the scale backs off, and a
static scale is the factor each rank's gradient carries. The engine used to divide the loss by N along with the scale,
so a rank's gradient carried scale / N: an overflow on one rank went unseen and the step was taken, and a static scale
reached the gradients N times smaller than configured."""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed

pytestmark = pytest.mark.dist

INPUTS = ([350.0, 10.0], [350.0, 10.0], [1.0, 1.0])
"""Per step, each rank's input: at a scale of 256, rank 0's own gradient (about 89,600) is past fp16's 65,504, and
its half (44,800) is not; rank 1's is far from both. At a scale of 128 both are finite."""


def _scales(rank: int, world: int, stage: int, fp16: dict) -> list[tuple]:
    """(loss scale, skipped steps, whether the step was applied) after each step of ``INPUTS``."""
    import torch

    from zerobench.zero import initialize

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 2, bias=False))
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "fp16": {"enabled": True, **fp16},
    }
    engine = initialize(model=model, config=config, model_parameters=model.parameters())[0]
    out = []
    for xs in INPUTS:
        x = torch.full((1, 4), xs[rank], dtype=torch.float16)
        engine.backward(engine(x).float().sum())
        engine.step()
        out.append((engine.optimizer.cur_scale, engine.skipped_steps, engine.was_step_applied()))
    return out


def _every_stage(rank: int, world: int, configs: dict) -> dict:
    return {(stage, name): _scales(rank, world, stage, fp16) for stage in range(4) for name, fp16 in configs.items()}


def test_an_overflow_on_one_rank_skips_the_step_on_every_rank():
    """Dynamic scaling from 256, hysteresis 1: step 1 overflows on rank 0 alone and is skipped everywhere, the scale
    halves to 128, and steps 2-3 are taken (DeepSpeed 0.19.8's engine gives the same sequence at stages 1-3)."""
    configs = {
        "dynamic": {"initial_scale_power": 8, "loss_scale_window": 1000, "hysteresis": 1},
        "static": {"loss_scale": 256},
    }
    for r in run_distributed(_every_stage, 2, configs, timeout=240):
        for stage in range(4):
            assert r[stage, "dynamic"] == [(128.0, 1, False), (128.0, 1, True), (128.0, 1, True)], (stage, r)
            # a static scale never backs off: both steps whose rank-0 gradient overflows are skipped
            assert r[stage, "static"] == [(256.0, 1, False), (256.0, 2, False), (256.0, 2, True)], (stage, r)


def _norms_after_an_overflow(rank: int, world: int, stage: int) -> list[tuple]:
    import torch

    from zerobench.zero import Precision, ZeroConfig, apply_zero, as_deepspeed

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    engine = as_deepspeed(apply_zero(model, None, ZeroConfig(stage=stage, precision=Precision.FP16)), micro_batch=1)
    out = []
    for i in range(4):
        loss = model(torch.full((1, 4), 0.1 * (i + 1) + rank)).float().pow(2).sum()
        engine.backward(loss * float("inf") if i == 1 else loss)  # window 1 overflows
        if i == 3:
            norm = float(engine.clip_grad_norm_(1e9))  # measured by the caller in this window
        engine.step()
        out.append((engine.was_step_applied(), engine.get_global_grad_norm()))
    out.append(norm)
    return out


@pytest.mark.parametrize("stage", [0, 3])
def test_an_overflow_norm_does_not_stand_for_later_windows(stage):
    """An engine that measures no norm of its own (no clipping configured, no ``always_norm``) reported the overflowed
    window's inf for every later window, applied ones included (a helper's review): a clean window that measured none
    now reports None, and one whose norm ``clip_grad_norm_`` measured reports that."""
    for r in run_distributed(_norms_after_an_overflow, 2, stage, timeout=120):
        *steps, measured = r
        assert steps[:3] == [(True, None), (False, float("inf")), (True, None)], r
        assert steps[3] == (True, pytest.approx(measured, rel=1e-6)) and 0 < measured < float("inf"), r
