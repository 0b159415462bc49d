"""Dynamic loss scaling for fp16: skip a step whose gradients overflowed and back off; grow when stable.

``LossScaleConfig.rule`` says when the scale grows: torch's ``GradScaler`` rule (``ZeroConfig``'s default) or
DeepSpeed's (a DeepSpeed config), or never (a static scale). Both dynamic rules share DeepSpeed's ``hysteresis``:
the first ``hysteresis - 1`` overflows since it was last restored only skip their step. An overflow that would back
off a scale already at ``min_scale`` raises ``LossScaleAtMinimum``: every later step would overflow too."""

from __future__ import annotations

from zerobench.config import RunFailed
from zerobench.zero.config import LossScaleConfig, LossScaleRule


class LossScaleAtMinimum(RunFailed):
    """An fp16 step overflowed with the loss scale already at its minimum: training cannot go on. One line naming
    the scale, the minimum and the remedies (DeepSpeed raises at the same point)."""

    def __init__(self, scale: float, min_scale: float, skipped: int):
        super().__init__(
            f"fp16 gradients overflowed with the loss scale already at its minimum {scale:g} "
            f"(min_loss_scale {min_scale:g}; {skipped} step(s) skipped so far): training cannot go on; lower "
            "the learning rate, raise min_loss_scale (LossScaleConfig.min_scale) or train in bf16"
        )
        self.scale, self.min_scale, self.skipped = scale, min_scale, skipped


class DynamicLossScaler:
    """The loss scale of one engine and its counters: ``good_steps`` (overflow-free steps since the scale last
    grew or backed off: torch's counter), ``clean_steps`` (since the last overflow or the start: DeepSpeed's),
    ``skipped_steps`` and ``hysteresis_left``."""

    def __init__(self, cfg: LossScaleConfig, enabled: bool):
        self.cfg = cfg
        self.enabled = enabled
        self.scale = cfg.init_scale if enabled else 1.0
        self.good_steps = 0
        self.clean_steps = 0
        self.skipped_steps = 0
        self.hysteresis_left = cfg.hysteresis

    def update(self, overflow: bool) -> None:
        """After a step: ``overflow`` says whether its gradients held a non-finite value (the step was skipped).
        Raises ``LossScaleAtMinimum`` (before changing anything) where the scale cannot back off any further."""
        if not self.enabled:
            return
        if overflow:
            self._overflow()
            return
        cfg = self.cfg
        self.good_steps += 1
        self.clean_steps += 1
        if cfg.consecutive_hysteresis:
            self.hysteresis_left = cfg.hysteresis
        if self._grows():
            self.scale *= cfg.growth_factor
            self.good_steps = 0
            self.hysteresis_left = cfg.hysteresis

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
            elif self.scale == cfg.min_scale:
                raise LossScaleAtMinimum(self.scale, cfg.min_scale, self.skipped_steps)
            else:
                self.scale = max(self.scale * cfg.backoff_factor, cfg.min_scale)
        self.good_steps = 0
        self.clean_steps = 0
        self.skipped_steps += 1

    def state_dict(self) -> dict:
        return {
            "scale": self.scale,
            "good_steps": self.good_steps,
            "clean_steps": self.clean_steps,
            "skipped_steps": self.skipped_steps,
            "hysteresis_left": self.hysteresis_left,
        }

    def load_state_dict(self, sd: dict) -> None:
        """Counters a checkpoint saved before they existed take what the older ones say: ``hysteresis_left`` the
        configured hysteresis, ``clean_steps`` ``good_steps`` (the overflow-free steps since the last growth, a
        lower bound of those since the last overflow)."""
        self.scale = float(sd["scale"])
        self.good_steps = int(sd["good_steps"])
        self.clean_steps = int(sd.get("clean_steps", self.good_steps))
        self.skipped_steps = int(sd["skipped_steps"])
        self.hysteresis_left = int(sd.get("hysteresis_left", self.cfg.hysteresis))
