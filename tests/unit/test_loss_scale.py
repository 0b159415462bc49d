"""The fp16 loss scaler (``zerobench/zero/loss_scale.py``): each rule's growth steps, hysteresis, the end of
training at the minimum scale, and its checkpoint state (older shards included). DeepSpeed's own scaler and engine
are run next to it in ``tests/distributed/test_ds_loss_scale.py``."""

from __future__ import annotations

import re

import pytest

from zerobench.config import ConfigError, RunFailed
from zerobench.zero.config import LossScaleConfig, LossScaleRule, ZeroConfig
from zerobench.zero.optim.loss_scale import DynamicLossScaler, LossScaleAtMinimum


def _scales(cfg: LossScaleConfig, overflows: list[bool]) -> list[float]:
    s = DynamicLossScaler(cfg, enabled=True)
    out = []
    for o in overflows:
        s.update(o)
        out.append(s.scale)
    return out


@pytest.mark.parametrize("window", [1, 2, 3])
def test_each_rule_grows_the_scale_after_its_own_clean_steps(window):
    """Without an overflow, torch's rule grows after clean steps w, 2w, ...; DeepSpeed's after w+1, 2w+1, ...
    (its count of clean steps since the start, less one, a positive multiple of the window)."""
    n = 12
    for rule, grows_after in (
        (LossScaleRule.TORCH, lambda k: k % window == 0),
        (LossScaleRule.DEEPSPEED, lambda k: k > 1 and (k - 1) % window == 0),
    ):
        expected, scale = [], 256.0
        for k in range(1, n + 1):
            scale *= 2 if grows_after(k) else 1
            expected.append(scale)
        assert _scales(LossScaleConfig(init_scale=256, growth_interval=window, rule=rule), [False] * n) == expected


def test_deepspeeds_rule_counts_from_the_last_overflow_and_keeps_counting_past_a_growth():
    """Window 2: after an overflow the scale grows after the 3rd, 5th, ... clean step since it (torch's rule:
    after the 2nd, 4th, ...), hysteresis 1 backing off at the overflow."""
    ds = LossScaleConfig(init_scale=256, growth_interval=2, rule=LossScaleRule.DEEPSPEED)
    torch_rule = LossScaleConfig(init_scale=256, growth_interval=2)
    pattern = [True] + [False] * 5
    assert _scales(ds, pattern) == [128, 128, 128, 256, 256, 512]
    assert _scales(torch_rule, pattern) == [128, 128, 256, 256, 512, 512]


def test_hysteresis_is_restored_on_growth_or_after_every_clean_step_with_consecutive_hysteresis():
    """Hysteresis 2: an overflow, a clean step, an overflow. Restored only when the scale grows, the second overflow
    backs off; restored after every clean step (DeepSpeed's ``consecutive_hysteresis``), it only skips."""
    pattern = [True, False, True]
    for rule in (LossScaleRule.TORCH, LossScaleRule.DEEPSPEED):
        base = dict(init_scale=256, growth_interval=100, hysteresis=2, rule=rule)
        assert _scales(LossScaleConfig(**base), pattern) == [256, 256, 128]
        assert _scales(LossScaleConfig(**base, consecutive_hysteresis=True), pattern) == [256, 256, 256]


@pytest.mark.parametrize("rule", [LossScaleRule.TORCH, LossScaleRule.DEEPSPEED])
def test_an_overflow_at_the_minimum_scale_ends_training_in_one_line(rule):
    """Backed off to ``min_scale``, the next overflow that would back off again raises (DeepSpeed's
    ``raise_error_at_min_scale``), naming the scale, the minimum and what to do; nothing is counted."""
    s = DynamicLossScaler(LossScaleConfig(init_scale=8, min_scale=2, hysteresis=2, rule=rule), enabled=True)
    for _ in range(3):  # the first only uses up the hysteresis; 8 -> 4 -> 2
        s.update(True)
    assert (s.scale, s.skipped_steps) == (2, 3)
    before = s.state_dict()
    with pytest.raises(LossScaleAtMinimum) as e:
        s.update(True)
    msg = str(e.value)
    assert isinstance(e.value, RuntimeError) and isinstance(e.value, RunFailed) and "\n" not in msg
    assert "minimum 2" in msg and "min_loss_scale 2" in msg and "3 earlier step(s) skipped" in msg
    assert all(w in msg for w in ("lower the learning rate", "raise min_loss_scale", "bf16")), msg
    assert s.state_dict() == before


def test_hysteresis_left_at_the_minimum_only_skips():
    """At the minimum with hysteresis left (restored by a growth and a back-off), an overflow only uses it up."""
    s = DynamicLossScaler(LossScaleConfig(init_scale=1, min_scale=1, hysteresis=2, growth_interval=1), enabled=True)
    s.update(True)  # hysteresis 2 -> 1: skipped, scale 1
    with pytest.raises(LossScaleAtMinimum):
        s.update(True)
    s.update(False)  # grows to 2, hysteresis back to 2
    s.update(True)
    s.update(True)  # 2 -> 1
    assert (s.scale, s.hysteresis_left) == (1, 1)


def test_a_static_scale_never_ends_training():
    """A static scale (DeepSpeed's ``fp16.loss_scale``) is not a minimum: its overflows are skipped, as DeepSpeed's."""
    s = DynamicLossScaler(LossScaleConfig(init_scale=1, min_scale=1, rule=LossScaleRule.STATIC), enabled=True)
    for o in [True] * 50 + [False] * 10:
        s.update(o)
    assert (s.scale, s.skipped_steps) == (1, 50)


def test_the_state_dict_carries_every_counter_and_older_shards_still_load():
    cfg = LossScaleConfig(init_scale=256, growth_interval=2, hysteresis=2, rule=LossScaleRule.DEEPSPEED)
    s = DynamicLossScaler(cfg, enabled=True)
    for o in [False, False, False, True, False]:
        s.update(o)
    back = DynamicLossScaler(cfg, enabled=True)
    back.load_state_dict(s.state_dict())
    for o in [False] * 4:  # the restored scaler goes on exactly as the original
        s.update(o)
        back.update(o)
        assert back.state_dict() == s.state_dict()
    old = {"scale": 512.0, "good_steps": 1, "skipped_steps": 3}  # a shard saved before clean_steps and hysteresis
    back.load_state_dict(old)
    assert (back.scale, back.good_steps, back.clean_steps, back.skipped_steps, back.hysteresis_left) == (
        512,
        1,
        1,
        3,
        2,
    )


@pytest.mark.parametrize(
    "ls, words",
    [
        (LossScaleConfig(growth_interval=0), "growth interval (DeepSpeed's loss_scale_window) must be >= 1"),
        (LossScaleConfig(min_scale=0.0), "minimum loss scale must be a positive finite number"),
        (LossScaleConfig(rule="gradscaler"), "unknown loss-scale rule 'gradscaler': choose torch, deepspeed or static"),
    ],
)
def test_an_invalid_loss_scale_config_is_one_line(ls, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        ZeroConfig(loss_scale=ls).validate()
    assert LossScaleConfig(rule="deepspeed").rule is LossScaleRule.DEEPSPEED
