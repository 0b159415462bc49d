"""DeepSpeed engine names on one process: ``set_train_batch_size`` (the accumulation steps change between windows,
the micro-batch stays) and the optimizer's ``overflow`` flag."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.ds import ds_apply_zero
from zerobench.config import ConfigError
from zerobench.distributed.collectives import Group
from zerobench.zero import ZeroConfig
from zerobench.zero.state.shards import full_parameters

ONE = Group(None, "dp", 1, 0)


def engine():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
    return ds_apply_zero(model, ONE, ZeroConfig(stage=2, bucket_numel=40), micro_batch=2)


def test_a_larger_batch_accumulates_over_more_micro_batches():
    """Growing the batch from 2 to 8 samples makes the next window 4 micro-batches of 2; its step equals one step
    on the 8 samples as one micro-batch (the mean loss over them), up to rounding."""
    x = torch.randn(10, 6, generator=torch.Generator().manual_seed(1))
    a, b = engine(), engine()
    for e in (a, b):
        e.backward(e(x[:2]).pow(2).mean())
        assert e.step()
    a.set_train_batch_size(8)
    assert a.get_batch_info() == (8, 2, 4)
    flags = []
    for i in range(4):
        flags.append(a.is_gradient_accumulation_boundary())
        a.backward(a(x[2 + 2 * i : 4 + 2 * i]).pow(2).mean())
        assert a.step() == (i == 3)
    assert flags == [False, False, False, True]
    b.backward(b(x[2:]).pow(2).mean())  # b stays at one micro-batch a step: all 8 samples in it
    b.step()
    for name, value in full_parameters(b).items():
        torch.testing.assert_close(full_parameters(a)[name], value, rtol=1e-5, atol=1e-6)


def test_a_batch_that_is_not_a_multiple_or_changes_inside_a_window_is_refused():
    e = engine()
    with pytest.raises(ValueError, match=r"give a multiple of micro-batch 2 x 1 DP rank\(s\) = 2"):
        e.set_train_batch_size(7)
    with pytest.raises(ConfigError, match="give a positive integer"):
        e.set_train_batch_size(0)
    e.set_train_batch_size(4)
    e.backward(e(torch.ones(2, 6)).sum())
    with pytest.raises(RuntimeError, match=r"inside an accumulation window \(1 of 2 micro-batches run\)"):
        e.set_train_batch_size(8)
    e.backward(e(torch.ones(2, 6)).sum())  # the window is complete, its step not taken yet
    with pytest.raises(RuntimeError, match=r"inside an accumulation window \(2 of 2 micro-batches run\)"):
        e.set_train_batch_size(8)
    assert e.gradient_accumulation_steps() == 2
    e.step()
    e.set_train_batch_size(8)  # between windows
    assert e.gradient_accumulation_steps() == 4 and not e.is_gradient_accumulation_boundary()


def test_the_optimizer_says_whether_the_last_step_overflowed():
    """Accelerate asks ``engine.optimizer.overflow`` whether DeepSpeed skipped the step (``step_was_skipped``): True
    after an fp16 overflow, False after an applied step, and False where a step ran with no gradient."""
    from zerobench.zero import LossScaleConfig

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
    e = ds_apply_zero(
        model, ONE, ZeroConfig(stage=2, precision="fp16", loss_scale=LossScaleConfig(init_scale=2.0**8)), micro_batch=2
    )
    seen = []
    for scale in (float("inf"), 1.0, None):
        if scale is not None:
            e.backward(e(torch.ones(2, 6)).sum() * scale)
        e.step()
        seen.append((e.optimizer.overflow, e.was_step_applied(), e.skipped_steps))
    assert seen == [(True, False, 1), (False, True, 1), (False, False, 1)]


def test_the_scheduler_stepped_is_whatever_engine_lr_scheduler_holds():
    """DeepSpeed steps ``engine.lr_scheduler`` as it is at each step: one assigned after the engine is built is
    stepped, and None steps none (the rate then stays where the last one left it)."""
    from zerobench.zero.compat.deepspeed.lr_schedules import DEEPSPEED

    def reference(steps):
        opt = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=1e-3)
        sched = DEEPSPEED["WarmupLR"](opt, warmup_min_lr=1e-4, warmup_max_lr=1e-2, warmup_num_steps=4)
        for _ in range(steps):
            sched.step()
        return opt.param_groups[0]["lr"]

    e = engine()
    x = torch.randn(2, 6, generator=torch.Generator().manual_seed(1))
    assert e.lr_scheduler is None
    e.lr_scheduler = DEEPSPEED["WarmupLR"](e.optimizer, warmup_min_lr=1e-4, warmup_max_lr=1e-2, warmup_num_steps=4)
    seen = []
    for i in range(6):
        if i == 3:
            e.lr_scheduler = None
        e.backward(e(x).pow(2).mean())
        assert e.step()
        seen.append(e.get_lr()[0])
    assert seen == pytest.approx([reference(1), reference(2), reference(3)] + [reference(3)] * 3)
    e.lr_scheduler = again = DEEPSPEED["WarmupLR"](
        e.optimizer, warmup_min_lr=0.0, warmup_max_lr=1.0, warmup_num_steps=2
    )
    e.backward(e(x).pow(2).mean())
    assert e.step() and again.last_batch_iteration == 0 and e.get_lr() == again.get_last_lr()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_zero_queries_answer_as_deepspeeds(stage):
    """DeepSpeed 0.19.8's ``zero_optimization()`` (ZeRO on), ``..._partition_gradients()`` (stage >= 2) and
    ``..._partition_weights()`` (stage 3), which scripts call to pick their save and clip paths."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
    e = ds_apply_zero(model, ONE, ZeroConfig(stage=stage), micro_batch=2)
    got = (e.zero_optimization(), e.zero_optimization_partition_gradients(), e.zero_optimization_partition_weights())
    assert got == (stage > 0, stage >= 2, stage == 3) and e.zero_optimization_stage() == stage
    e.destroy()


def test_load_checkpoint_takes_deepspeeds_custom_load_fn_as_none_only(tmp_path):
    e = engine()
    e.save_checkpoint(tmp_path)
    assert e.load_checkpoint(tmp_path, custom_load_fn=None)[0] is not None
    assert e.load_checkpoint(tmp_path, None, False)[0] is not None  # DeepSpeed's third: load_module_strict
    with pytest.raises(ConfigError, match=r"custom_load_fn=.*leave it None") as err:
        e.load_checkpoint(tmp_path, custom_load_fn=lambda *a: None)
    assert "\n" not in str(err.value)
    e.destroy()


def test_a_step_inside_no_sync_is_refused_as_deepspeeds():
    """DeepSpeed's engine asserts that ``step()`` is not called inside ``no_sync()`` (``test_no_sync_ctxt.py``
    expects an ``AssertionError``), even where no optimizer step would run; the message here said to call
    ``step()`` after each backward, which the loop did. The torch-style ``optimizer.step()`` is refused alike."""
    e = engine()
    x = torch.randn(2, 6)
    with e.no_sync():
        e.backward(e(x).pow(2).mean())
        with pytest.raises(AssertionError, match=r"engine.step\(\) inside no_sync\(\)") as err:
            e.step()
        assert isinstance(err.value, RuntimeError) and "\n" not in str(err.value)
        with pytest.raises(AssertionError, match=r"inside no_sync\(\)"):
            e.optimizer.step()
    assert e.micro_steps == 0  # refused before anything counted
    e.destroy()


def test_the_optimizer_has_deepspeeds_loss_scaler_as_a_view_of_the_engines_scale():
    """Hugging Face's Trainer and DeepSpeed's tests read ``engine.optimizer.loss_scaler.cur_scale`` (and
    ``.loss_scale``); it was missing. It reads the engine's scaler live: a step that overflows moves it, and setting
    it sets the engine's scale."""
    from zerobench.zero.compat.deepspeed.config import from_deepspeed

    def build(fp16: dict):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
        cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Adam"}, "fp16": {"enabled": True, **fp16}}
        return ds_apply_zero(model, ONE, from_deepspeed(cfg, 1).zero, micro_batch=2)

    static = build({"loss_scale": 138.0})
    assert static.optimizer.dynamic_loss_scale is False and static.optimizer.loss_scaler.loss_scale == 138.0
    assert static.optimizer.loss_scaler.dynamic is False
    static.destroy()
    e = build({"initial_scale_power": 8, "hysteresis": 1, "loss_scale_window": 100})
    scaler = e.optimizer.loss_scaler
    assert (scaler.cur_scale, scaler.loss_scale, scaler.dynamic, scaler.scale_window) == (256.0, 256.0, True, 100)
    assert (scaler.delayed_shift, scaler.cur_hysteresis, scaler.min_scale, scaler.scale_factor) == (1, 1, 1.0, 2.0)
    e.backward(e(torch.ones(2, 6)).sum() * float("inf"))
    e.step()
    assert scaler.cur_scale == e.optimizer.cur_scale == e.scaler.scale == 128.0 and scaler.cur_iter == 1
    scaler.cur_scale = 64.0
    assert e.scaler.scale == 64.0 and e.optimizer.loss_scaler.cur_scale == 64.0
    with pytest.raises(ValueError, match="must be a positive finite number"):
        scaler.cur_scale = 0.0
    e.destroy()
