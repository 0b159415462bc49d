"""Dynamic loss scaling for fp16: skip a step whose gradients overflowed and back off; grow when stable."""

from __future__ import annotations

from zerobench.zero.config import LossScaleConfig


class DynamicLossScaler:
    """The same policy as ``torch.amp.GradScaler`` (backoff on overflow, growth after an interval), with
    DeepSpeed's ``hysteresis``: the first ``hysteresis - 1`` overflows since the scale last grew only skip."""

    def __init__(self, cfg: LossScaleConfig, enabled: bool):
        self.cfg = cfg
        self.enabled = enabled
        self.scale = cfg.init_scale if enabled else 1.0
        self.good_steps = 0
        self.skipped_steps = 0
        self.hysteresis_left = cfg.hysteresis

    def update(self, overflow: bool) -> None:
        if not self.enabled:
            return
        if overflow:
            if self.hysteresis_left > 1:
                self.hysteresis_left -= 1
            else:
                self.scale = max(self.scale * self.cfg.backoff_factor, self.cfg.min_scale)
            self.good_steps = 0
            self.skipped_steps += 1
            return
        self.good_steps += 1
        if self.good_steps >= self.cfg.growth_interval:
            self.scale *= self.cfg.growth_factor
            self.good_steps = 0
            self.hysteresis_left = self.cfg.hysteresis

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped_steps": self.skipped_steps,
                "hysteresis_left": self.hysteresis_left}

    def load_state_dict(self, sd: dict) -> None:
        self.scale = float(sd["scale"])
        self.good_steps = int(sd["good_steps"])
        self.skipped_steps = int(sd["skipped_steps"])
        self.hysteresis_left = int(sd.get("hysteresis_left", self.cfg.hysteresis))  # absent before hysteresis existed
