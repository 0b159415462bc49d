"""DeepSpeed's ``OneCycle`` schedule (``zero/lr_schedules.py`` has the other four and what they share): the
learning rate rises from ``cycle_min_lr`` to ``cycle_max_lr`` over ``cycle_first_step_size`` batches and falls back
over ``cycle_second_step_size`` (default: the same), optionally in stairs; after the cycle it decays as
``cycle_min_lr / (1 + decay_lr_rate x batches / decay_step_size)`` (not at all where either is 0). With
``cycle_momentum`` Adam's beta1 moves the other way, from ``cycle_max_mom`` down to ``cycle_min_mom`` and back, with
beta2 set to 0.99, as DeepSpeed sets it. Pure: no processes.
"""

from __future__ import annotations

import math

from torch.optim import Optimizer

from zerobench.config import ConfigError
from zerobench.zero.lr_schedules import BatchSchedule, _per_group


class OneCycle(BatchSchedule):
    """See the module docstring; arguments, defaults and numbers are DeepSpeed's."""

    def __init__(
        self,
        optimizer: Optimizer,
        cycle_min_lr,
        cycle_max_lr,
        decay_lr_rate: float = 0.0,
        cycle_first_step_size: float = 2000,
        cycle_second_step_size: float | None = None,
        cycle_first_stair_count: int = 0,
        cycle_second_stair_count: int | None = None,
        decay_step_size: float = 0,
        cycle_momentum: bool = True,
        cycle_min_mom: float = 0.8,
        cycle_max_mom: float = 0.9,
        decay_mom_rate: float = 0.0,
        last_batch_iteration: int = -1,
    ):
        super().__init__(optimizer, last_batch_iteration)
        first = float(cycle_first_step_size)
        second = first if cycle_second_step_size is None else float(cycle_second_step_size)
        if first <= 0 or second < 0:
            raise ConfigError(
                f"scheduler OneCycle: cycle_first_step_size must be > 0 and cycle_second_step_size >= 0, "
                f"got {cycle_first_step_size!r} and {cycle_second_step_size!r}"
            )
        self.first_step_size, self.second_step_size = first, second
        self.total_size = first + second
        self.step_ratio = first / self.total_size
        self.first_stair_count = cycle_first_stair_count
        self.second_stair_count = (
            cycle_first_stair_count if cycle_second_stair_count is None else cycle_second_stair_count
        )
        self.decay_step_size = decay_step_size
        no_decay = math.isclose(decay_step_size, 0)
        self.min_lrs = _per_group(optimizer, cycle_min_lr, "cycle_min_lr")
        self.max_lrs = _per_group(optimizer, cycle_max_lr, "cycle_max_lr")
        self.decay_lr_rate = decay_lr_rate
        self.skip_lr_decay = no_decay or math.isclose(decay_lr_rate, 0)
        self.cycle_momentum = bool(cycle_momentum) and "betas" in optimizer.defaults
        self.decay_mom_rate = decay_mom_rate
        self.skip_mom_decay = no_decay or math.isclose(decay_mom_rate, 0)
        self.min_moms = [(m, 0.99) for m in _per_group(optimizer, cycle_min_mom, "cycle_min_mom")]
        self.max_moms = [(m, 0.99) for m in _per_group(optimizer, cycle_max_mom, "cycle_max_mom")]
        if last_batch_iteration == -1:  # the cycle's bottom: the least learning rate, the least momentum
            for group, lr, mom in zip(optimizer.param_groups, self.min_lrs, self.min_moms):
                group["lr"] = lr
                if self.cycle_momentum:
                    group["betas"] = mom
            self._last_lr = list(self.min_lrs)

    def _scale(self) -> float:
        """Where in the cycle the next batch is: 0 at the bottom, 1 at the top (quantised to stairs if counted)."""
        batch = self.last_batch_iteration + 1
        cycle = math.floor(1 + batch / self.total_size)
        x = 1.0 + batch / self.total_size - cycle
        rising = x <= self.step_ratio
        scale = x / self.step_ratio if rising else (x - 1) / (self.step_ratio - 1)
        stairs = self.first_stair_count if rising else self.second_stair_count
        if stairs > 0:  # from the integer offset in the cycle, so a boundary never falls a stair short
            at = batch % self.total_size
            if at <= self.first_step_size:
                position = at * stairs / self.first_step_size
            else:
                position = (self.total_size - at) * stairs / self.second_step_size
            scale = math.floor(position) / stairs
        return scale

    def _after_cycle(self) -> float:
        return (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size

    def get_lr(self) -> list[float]:
        if self.last_batch_iteration < self.total_size:
            scale = self._scale()
            return [lo + (hi - lo) * scale for lo, hi in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return list(self.min_lrs)
        return [lo / (1 + self.decay_lr_rate * self._after_cycle()) for lo in self.min_lrs]

    def get_mom(self) -> list[tuple[float, float]] | None:
        """Each group's betas for the current batch (None without ``cycle_momentum``)."""
        if not self.cycle_momentum:
            return None
        if self.last_batch_iteration < self.total_size:
            scale = self._scale()
            return [(hi[0] - (hi[0] - lo[0]) * scale, lo[1]) for lo, hi in zip(self.min_moms, self.max_moms)]
        if self.skip_mom_decay:
            return list(self.max_moms)
        factor = 1 + self.decay_mom_rate * self._after_cycle()
        return [(b1 * factor, b2) for b1, b2 in self.max_moms]

    def _write(self) -> None:
        super()._write()
        for group, betas in zip(self.optimizer.param_groups, self.get_mom() or []):
            group["betas"] = betas
