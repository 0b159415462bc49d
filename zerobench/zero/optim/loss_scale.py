"""Loss scaling for fp16 (the engine's own ``DynamicLossScaler``), and torch's loss scaling on a ZeRO engine
(``ShardedGradScaler``).

``DynamicLossScaler`` skips a step whose gradients overflowed and backs off; it grows the scale when stable.
``LossScaleConfig.rule`` says when it grows: torch's ``GradScaler`` rule (``ZeroConfig``'s default), DeepSpeed's
(a DeepSpeed config), or never (a static scale). Both dynamic rules share DeepSpeed's ``hysteresis``: the first
``hysteresis - 1`` overflows since it was last restored only skip their step. An overflow that would back off a
scale already at ``min_scale`` raises ``LossScaleAtMinimum``: every later step would overflow too, as DeepSpeed's
ZeRO optimizers stop there (with ``stop_at_min`` off it skips the step and warns, as DeepSpeed's fp16 optimizer at
stage 0 goes on).

``ShardedGradScaler`` is FSDP's ``ShardedGradScaler`` for this engine. torch's ``GradScaler`` unscales and
checks the ``.grad`` of the optimizer's parameters on this rank; under ZeRO that is not the reduced gradient (at
stages 2-3 ``.grad`` is None; at stage 1 each rank's ``.grad`` holds reduced values only in its own shard, so
ranks could disagree on an overflow and grow their scales apart). ``ShardedGradScaler`` unscales and checks this
rank's reduced gradient partition and takes the overflow flag's maximum over the DP and TP groups, so every rank
skips or steps alike. The engine's optimizer declares ``_step_supports_amp_scaling``, so a scaler that did not
unscale hands it the scale, which the step folds into its own unscaling. The loop is torch's
(``scaler.scale(loss).backward()``, optionally ``scaler.unscale_(optimizer)`` and ``engine.clip_grad_norm_``,
then ``scaler.step(optimizer)``, ``scaler.update()``) under ``torch.autocast`` on an fp32 or bf16 engine. torch's
plain ``GradScaler`` stays right at stage 0 and is refused in one line at stages 1-3; an fp16 engine scales its
loss itself and refuses both.
"""

from __future__ import annotations

import warnings

import torch

from zerobench.config import ConfigError, TrainingHalted
from zerobench.zero.config import LossScaleConfig, LossScaleRule
from zerobench.zero.grads.stats import agree_max, reduced_grads
from zerobench.zero.protocols import Engine


class LossScaleAtMinimum(TrainingHalted):
    """An fp16 step overflowed with the loss scale already at its minimum: training cannot go on. One line naming
    the scale, the minimum and the remedies (DeepSpeed raises at the same point). The overflow that raises it is
    agreed across the data-parallel ranks, so every rank raises it at the same step."""

    def __init__(self, scale: float, min_scale: float, skipped: int):
        super().__init__(
            f"fp16 gradients overflowed with the loss scale already at its minimum {scale:g} "
            f"(min_loss_scale {min_scale:g}; {skipped} earlier step(s) skipped): training cannot go on; lower "
            "the learning rate, raise min_loss_scale (LossScaleConfig.min_scale) or train in bf16"
        )
        self.scale, self.min_scale, self.skipped = scale, min_scale, skipped


class DynamicLossScaler:
    """The loss scale of one engine and its counters: ``good_steps`` (overflow-free steps since the scale last
    grew or backed off: torch's counter), ``clean_steps`` (since the last overflow or the start: DeepSpeed's),
    ``skipped_steps``, ``hysteresis_left`` and ``updates`` (every step it judged, skipped ones too: DeepSpeed's
    ``cur_iter``)."""

    def __init__(self, cfg: LossScaleConfig, enabled: bool):
        self.cfg = cfg
        self.enabled = enabled
        self.scale = cfg.init_scale if enabled else 1.0
        self.good_steps = 0
        self.clean_steps = 0
        self.skipped_steps = 0
        self.hysteresis_left = cfg.hysteresis
        self.updates = 0

    def update(self, overflow: bool) -> None:
        """After a step: ``overflow`` says whether its gradients held a non-finite value (the step was skipped).
        Raises ``LossScaleAtMinimum`` (before changing anything) where the scale cannot back off any further."""
        if not self.enabled:
            return
        if overflow:
            self._overflow()
            self.updates += 1
            return
        self.updates += 1
        cfg = self.cfg
        self.good_steps += 1
        self.clean_steps += 1
        if cfg.consecutive_hysteresis:
            self.hysteresis_left = cfg.hysteresis
        if self._grows():
            self.scale *= cfg.growth_factor
            self.good_steps = 0
            self.hysteresis_left = cfg.hysteresis

    def skip_nonfinite(self) -> None:
        """A step skipped outside fp16 on a non-finite gradient (``engine.skip_nonfinite``): counted in
        ``skipped_steps`` and ``updates``, as DeepSpeed counts it; there is no scale to move."""
        self.skipped_steps += 1
        self.updates += 1

    def _grows(self) -> bool:
        cfg = self.cfg
        if cfg.rule is LossScaleRule.TORCH:
            return self.good_steps >= cfg.growth_interval
        if cfg.rule is LossScaleRule.DEEPSPEED:
            stable = self.clean_steps - 1
            return stable > 0 and stable % cfg.growth_interval == 0
        return False

    def _overflow(self) -> None:
        cfg = self.cfg
        if cfg.rule is not LossScaleRule.STATIC:
            if self.hysteresis_left > 1:
                self.hysteresis_left -= 1
            elif self.scale == cfg.min_scale and cfg.stop_at_min:
                raise LossScaleAtMinimum(self.scale, cfg.min_scale, self.skipped_steps)
            elif self.scale == cfg.min_scale:
                warnings.warn(
                    f"fp16 gradients overflowed with the loss scale at its minimum {self.scale:g}: step skipped "
                    f"({self.skipped_steps + 1} so far); lower the learning rate or train in bf16",
                    RuntimeWarning,
                    stacklevel=2,
                )
            else:
                self.scale = max(self.scale * cfg.backoff_factor, cfg.min_scale)
        self.good_steps = 0
        self.clean_steps = 0
        self.skipped_steps += 1

    def state_dict(self) -> dict:
        return {
            "enabled": self.enabled,
            "scale": self.scale,
            "good_steps": self.good_steps,
            "clean_steps": self.clean_steps,
            "skipped_steps": self.skipped_steps,
            "hysteresis_left": self.hysteresis_left,
            "updates": self.updates,
        }

    def load_state_dict(self, sd: dict) -> None:
        """The scaler of another precision's run is not this one's, as with torch's ``GradScaler``: a disabled
        scaler (fp32, bf16) loads nothing, and an enabled one (fp16) given a disabled one's state keeps its own
        (its initial scale: an fp32 run's scale of 1.0 would flush fp16's small gradients to zero). Counters a
        checkpoint saved before they existed take what the older ones say: ``hysteresis_left`` the configured
        hysteresis, ``clean_steps`` ``good_steps`` (the overflow-free steps since the last growth, a lower bound
        of those since the last overflow), ``updates`` 0; one saved before ``enabled`` was recorded loads as it
        says. A disabled scaler given a disabled one's state takes its counters (steps skipped on a non-finite
        gradient: ``skip_nonfinite``)."""
        if not self.enabled and sd.get("enabled", True) is False:
            self.skipped_steps = int(sd.get("skipped_steps", 0))
            self.updates = int(sd.get("updates", 0))
            return
        if not self.enabled or not sd.get("enabled", True):
            return
        self.scale = float(sd["scale"])
        self.good_steps = int(sd["good_steps"])
        self.clean_steps = int(sd.get("clean_steps", self.good_steps))
        self.skipped_steps = int(sd["skipped_steps"])
        self.hysteresis_left = int(sd.get("hysteresis_left", self.cfg.hysteresis))
        self.updates = int(sd.get("updates", 0))


class ShardedGradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` over a ZeRO engine's reduced gradient partition (see the module docstring); with
    any other optimizer it is torch's."""

    def _unscale_grads_(self, optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor, allow_fp16: bool):
        engine = getattr(optimizer, "_engine", None)
        if engine is None or not getattr(optimizer, "_step_supports_amp_scaling", False):
            return super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        optimizer.amp_checked = True
        return {found_inf.device: unscale_partition(engine, inv_scale, found_inf)}


@torch.no_grad()
def unscale_partition(engine: Engine, inv_scale: torch.Tensor, found_inf: torch.Tensor) -> torch.Tensor:
    """Multiply this rank's reduced gradient partition by ``inv_scale`` in place and set ``found_inf`` to 1 if any
    rank of the DP and TP groups holds a non-finite element; returns ``found_inf``."""
    check_amp(engine)
    chunks = [c for c in reduced_grads(engine, "scaler.unscale_()/scaler.step()") if c.numel()]
    flag = torch.zeros(1, dtype=torch.float32, device=chunks[0].device if chunks else engine.device)
    if chunks:  # one storage: the device's gradient partition, or the host's under offload
        torch._amp_foreach_non_finite_check_and_unscale_(chunks, flag, inv_scale.to(flag.device))
    flag = agree_max(engine, flag.to(engine.device), engine.grads_sharded, "found_inf")
    found_inf.copy_(flag.reshape(()).to(found_inf.device))
    return found_inf


def check_amp(engine: Engine) -> None:
    """One line where torch's loss scaling cannot drive this engine."""
    if engine.scaler.enabled:
        raise ConfigError(
            "a torch.amp GradScaler on an fp16 ZeRO engine would scale the loss twice: the engine "
            "scales it itself (ZeroConfig.precision='fp16'); drop the GradScaler, or train fp32/bf16 "
            "under torch.autocast with zerobench.zero.ShardedGradScaler"
        )


def amp_unscale(optimizer) -> float | None:
    """Inside ``optimizer.step()`` driven by a GradScaler: None to skip the step (an overflow on some rank), else
    the factor that unscales the gradients (1 when the scaler unscaled them already). Outside one: 1."""
    if not hasattr(optimizer, "found_inf"):
        return 1.0
    engine, checked = optimizer._engine, optimizer.__dict__.pop("amp_checked", False)
    check_amp(engine)
    if not checked and (engine.stage >= 2 or (engine.stage == 1 and engine.group.size > 1)):
        raise ConfigError(
            "torch's GradScaler (torch.amp's, or FSDP's ShardedGradScaler) checks the .grad this rank holds, which "
            f"at ZeRO stage {engine.stage} is not the reduced gradient: use zerobench.zero.ShardedGradScaler, this "
            "engine's counterpart of FSDP's"
        )
    if float(optimizer.found_inf) > 0:
        return None
    scale = optimizer.grad_scale
    return 1.0 if scale is None else 1.0 / float(scale)
