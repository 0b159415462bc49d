"""``engine.optimizer`` with the names DeepSpeed's fp16 optimizers give the loss scale (``as_deepspeed`` makes the
engine's ``ZeroOptimizer`` one)."""

from __future__ import annotations

import math

from zerobench.zero.config import LossScaleRule
from zerobench.zero.optim.torch_optimizer import ZeroOptimizer


class DeepSpeedOptimizer(ZeroOptimizer):
    """``engine.optimizer`` with the loss-scale names of DeepSpeed's fp16 optimizers, which DeepSpeed's tests and
    Megatron-style loops read: ``cur_scale`` (also ``loss_scale``; setting it sets the scale), ``dynamic_loss_scale``,
    ``scale_window``, ``min_loss_scale`` and ``cur_iter`` (steps judged, skipped ones included), as DeepSpeed's older
    releases name them (0.16), the same under ``loss_scale_config`` as 0.19.8 keeps them, and ``loss_scaler``, its
    scaler object's names. Outside fp16 the scale is 1 and nothing moves it. Made by ``as_deepspeed``, never
    constructed."""

    @property
    def cur_scale(self) -> float:
        return self._engine.scaler.scale

    @cur_scale.setter
    def cur_scale(self, value: float) -> None:
        value = float(value)
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"loss scale {value!r}: must be a positive finite number")
        if not self._engine.scaler.enabled:
            raise ValueError("the loss scale applies to fp16 training only; this engine trains without one")
        self._engine.scaler.scale = value

    loss_scale = cur_scale

    @property
    def dynamic_loss_scale(self) -> bool:
        s = self._engine.scaler
        return s.enabled and s.cfg.rule is not LossScaleRule.STATIC

    @property
    def scale_window(self) -> int:
        return self._engine.scaler.cfg.growth_interval

    @property
    def min_loss_scale(self) -> float:
        return self._engine.scaler.cfg.min_scale

    @property
    def cur_iter(self) -> int:
        return self._engine.scaler.updates

    @property
    def loss_scaler(self) -> LossScalerView:
        """DeepSpeed's fp16 optimizers' ``loss_scaler`` (``optimizer.loss_scaler.cur_scale``, which Hugging Face's
        Trainer and DeepSpeed's tests read): a view of the engine's scaler, read live."""
        return LossScalerView(self)

    @property
    def loss_scale_config(self) -> LossScaleView:
        """Where DeepSpeed 0.19.8 keeps these figures (``optimizer.loss_scale_config.cur_scale``, ...)."""
        return LossScaleView(self)


class LossScaleView:
    """DeepSpeed's ``optimizer.loss_scale_config`` over ``DeepSpeedOptimizer``: its figures, read live."""

    def __init__(self, optimizer: DeepSpeedOptimizer):
        self._opt = optimizer

    use_grad_scaling = property(lambda self: self._opt._engine.scaler.enabled)
    dynamic_loss_scale = property(lambda self: self._opt.dynamic_loss_scale)
    cur_scale = property(lambda self: self._opt.cur_scale)
    cur_iter = property(lambda self: self._opt.cur_iter)
    scale_window = property(lambda self: self._opt.scale_window)
    min_loss_scale = property(lambda self: self._opt.min_loss_scale)
    scale_factor = property(lambda self: self._opt._engine.scaler.cfg.growth_factor)


class LossScalerView:
    """DeepSpeed's ``optimizer.loss_scaler`` (its ``LossScaler`` / ``DynamicLossScaler``) over ``DeepSpeedOptimizer``:
    the engine's scaler under DeepSpeed's names, read live (setting ``cur_scale`` sets the engine's scale). No figure
    is kept here: the engine's scaler is the one source."""

    def __init__(self, optimizer: DeepSpeedOptimizer):
        self._opt = optimizer

    @property
    def cur_scale(self) -> float:
        return self._opt.cur_scale

    @cur_scale.setter
    def cur_scale(self, value: float) -> None:
        self._opt.cur_scale = value

    loss_scale = property(lambda self: self._opt.cur_scale)
    dynamic = property(lambda self: self._opt.dynamic_loss_scale)
    cur_iter = property(lambda self: self._opt.cur_iter)
    scale_window = property(lambda self: self._opt.scale_window)
    min_scale = property(lambda self: self._opt.min_loss_scale)
    scale_factor = property(lambda self: self._opt._engine.scaler.cfg.growth_factor)
    delayed_shift = property(lambda self: self._opt._engine.scaler.cfg.hysteresis)
    cur_hysteresis = property(lambda self: self._opt._engine.scaler.hysteresis_left)
    consecutive_hysteresis = property(lambda self: self._opt._engine.scaler.cfg.consecutive_hysteresis)
    raise_error_at_min_scale = property(lambda self: self._opt._engine.scaler.cfg.stop_at_min)
