"""DeepSpeed's learning-rate schedules, for a DeepSpeed config's ``scheduler`` section (``{"type": ..., "params":
{...}}``), on any ``torch.optim`` optimizer (the engine's ``ZeroOptimizer`` reads each group's ``lr`` and ``betas``
at every step). Pure: no processes.

The five are DeepSpeed's, with its arguments, defaults and numbers (tested step by step against DeepSpeed's own
classes): ``WarmupLR``, ``WarmupDecayLR``, ``WarmupCosineLR``, ``LRRangeTest`` and ``OneCycle``. As DeepSpeed's,
each counts *batches*: ``step()`` moves to the next batch index and writes the learning rate for it, and the
constructor writes the rate for index -1 (e.g. ``warmup_min_lr``), which the first optimizer step uses. Their state
is that index (``state_dict()``). Where DeepSpeed would warn and carry on (an unknown ``warmup_type``), these
refuse in one line. A ``type`` DeepSpeed does not define is looked up in ``torch.optim.lr_scheduler``, as DeepSpeed
does (``StepLR``, ``CosineAnnealingLR``, ...); ``build`` makes either.
"""

from __future__ import annotations

import math

import torch
from torch.optim import Optimizer

from zerobench.config import ConfigError

WARMUP_TYPES = ("log", "linear")


def _per_group(optimizer: Optimizer, value, name: str) -> list:
    """A scalar for every param group, or a list with one value per group."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ConfigError(f"scheduler {name}: {len(value)} values for {len(optimizer.param_groups)} param groups")
        return list(value)
    return [value] * len(optimizer.param_groups)


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"scheduler {name}: must be a positive integer, got {value!r}")
    return value


def _warmup_type(value: str) -> str:
    if value not in WARMUP_TYPES:
        raise ConfigError(f"scheduler warmup_type {value!r}: give 'log' or 'linear'")
    return value


def _warmup_fraction(batch: int, steps: int, kind: str) -> float:
    """How far through a warm-up of ``steps`` (at least 2) batches index ``batch`` is: log(i + 1) / log(n) or i / n."""
    return (1.0 / math.log(steps)) * math.log(batch + 1) if kind == "log" else batch / steps


class BatchSchedule:
    """What DeepSpeed's schedules share: the index of the last batch (-1 before the first), ``step()`` to the next
    (or to ``last_batch_iteration``) writing every group's ``lr`` (``_write``), ``get_last_lr()`` and the state."""

    def __init__(self, optimizer: Optimizer, last_batch_iteration: int = -1):
        self.optimizer = optimizer
        self.last_batch_iteration = last_batch_iteration
        self._last_lr: list[float] | None = None

    def get_lr(self) -> list[float]:
        raise NotImplementedError

    def _write(self) -> None:
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def step(self, last_batch_iteration: int | None = None) -> None:
        self.last_batch_iteration = (
            self.last_batch_iteration + 1 if last_batch_iteration is None else last_batch_iteration
        )
        self._write()

    def get_last_lr(self) -> list[float]:
        if self._last_lr is None:
            raise RuntimeError("get_last_lr(): the schedule has not written a learning rate yet; call step() first")
        return self._last_lr

    def state_dict(self) -> dict:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: dict) -> None:
        self.last_batch_iteration = state["last_batch_iteration"]


class WarmupLR(BatchSchedule):
    """From ``warmup_min_lr`` to ``warmup_max_lr`` (default: each group's lr) over ``warmup_num_steps`` batches,
    rising as log(i + 1) / log(n) or i / n, then flat."""

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_min_lr=0.0,
        warmup_max_lr=None,
        warmup_num_steps: int = 1000,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ):
        super().__init__(optimizer, last_batch_iteration)
        _positive_int(warmup_num_steps, "warmup_num_steps")
        if warmup_max_lr is None:
            warmup_max_lr = [group["lr"] for group in optimizer.param_groups]
        self.min_lrs = _per_group(optimizer, warmup_min_lr, "warmup_min_lr")
        self.max_lrs = _per_group(optimizer, warmup_max_lr, "warmup_max_lr")
        self.delta_lrs = [hi - lo for hi, lo in zip(self.max_lrs, self.min_lrs)]
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = _warmup_type(warmup_type)
        if last_batch_iteration == -1:
            self._write()

    def _warmup_gamma(self) -> float:
        return _warmup_fraction(self.last_batch_iteration, self.warmup_num_steps, self.warmup_type)

    def _gamma(self) -> float:
        return self._warmup_gamma() if self.last_batch_iteration < self.warmup_num_steps else 1.0

    def get_lr(self) -> list[float]:
        if self.last_batch_iteration < 0:
            return list(self.min_lrs)
        gamma = self._gamma()
        return [lo + delta * gamma for lo, delta in zip(self.min_lrs, self.delta_lrs)]


class WarmupDecayLR(WarmupLR):
    """``WarmupLR``'s warm-up, then a linear decay to 0 at ``total_num_steps``."""

    def __init__(
        self,
        optimizer: Optimizer,
        total_num_steps: int,
        warmup_min_lr=0.0,
        warmup_max_lr=0.001,
        warmup_num_steps: int = 1000,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ):
        self.total_num_steps = _positive_int(total_num_steps, "total_num_steps")
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type, last_batch_iteration)

    def _gamma(self) -> float:
        if self.last_batch_iteration < self.warmup_num_steps:
            return self._warmup_gamma()
        left = float(self.total_num_steps - self.last_batch_iteration)
        return max(0.0, left / float(max(1.0, self.total_num_steps - self.warmup_num_steps)))


class WarmupCosineLR(BatchSchedule):
    """Each group's lr times a ratio: from ``warmup_min_ratio`` to 1 over ``warmup_num_steps`` batches, then a cosine
    down to ``cos_min_ratio`` at ``total_num_steps``, where it stays."""

    def __init__(
        self,
        optimizer: Optimizer,
        total_num_steps: int,
        warmup_min_ratio: float = 0.0,
        warmup_num_steps: int = 1000,
        cos_min_ratio: float = 0.0001,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ):
        super().__init__(optimizer, last_batch_iteration)
        self.total_num_steps = _positive_int(total_num_steps, "total_num_steps")
        self.warmup_num_steps = max(2, _positive_int(warmup_num_steps, "warmup_num_steps"))
        self.warmup_type = _warmup_type(warmup_type)
        self.warmup_min_ratio, self.cos_min_ratio = warmup_min_ratio, cos_min_ratio
        self.org_lrs = [float(group["lr"]) for group in optimizer.param_groups]
        if last_batch_iteration == -1:
            self._write()

    def ratio(self) -> float:
        if self.last_batch_iteration < 0:
            return 0.0
        if self.last_batch_iteration < self.warmup_num_steps:
            warmed = _warmup_fraction(self.last_batch_iteration, self.warmup_num_steps, self.warmup_type)
            return self.warmup_min_ratio + warmed * (1.0 - self.warmup_min_ratio)
        done = self.last_batch_iteration - self.warmup_num_steps + 1
        progress = min(1.0, done / max(1, self.total_num_steps - self.warmup_num_steps))
        cosine = (1 + math.cos(math.pi * progress)) / 2
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * cosine)

    def get_lr(self) -> list[float]:
        r = self.ratio()
        return [lr * r for lr in self.org_lrs]


class LRRangeTest(BatchSchedule):
    """The learning-rate range test: ``lr_range_test_min_lr`` times (1 + rate x batches / step size), continuous or
    in stairs."""

    def __init__(
        self,
        optimizer: Optimizer,
        lr_range_test_min_lr=1e-3,
        lr_range_test_step_size: int = 2000,
        lr_range_test_step_rate: float = 1.0,
        lr_range_test_staircase: bool = False,
        last_batch_iteration: int = -1,
    ):
        super().__init__(optimizer, last_batch_iteration)
        self.min_lr = _per_group(optimizer, lr_range_test_min_lr, "lr_range_test_min_lr")
        self.step_size = _positive_int(lr_range_test_step_size, "lr_range_test_step_size")
        self.step_rate, self.staircase = lr_range_test_step_rate, bool(lr_range_test_staircase)
        if last_batch_iteration == -1:
            self._write()

    def get_lr(self) -> list[float]:
        interval = float(self.last_batch_iteration + 1) / self.step_size
        increase = 1 + self.step_rate * (math.floor(interval) if self.staircase else interval)
        return [lr * increase for lr in self.min_lr]
