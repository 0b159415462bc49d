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

``OneCycle``: the learning rate rises from ``cycle_min_lr`` to ``cycle_max_lr`` over ``cycle_first_step_size``
batches and falls back over ``cycle_second_step_size`` (default: the same), optionally in stairs; after the cycle it
decays as ``cycle_min_lr / (1 + decay_lr_rate x batches / decay_step_size)`` (not at all where either is 0). With
``cycle_momentum`` Adam's beta1 moves the other way, from ``cycle_max_mom`` down to ``cycle_min_mom`` and back, with
beta2 set to 0.99, as DeepSpeed sets it.

The config's ``scheduler`` section is read and checked with the config (``parse``: no processes): its ``type`` is
one of these five or, as DeepSpeed resolves it, a class of ``torch.optim.lr_scheduler`` whose arguments JSON can
hold, its ``params`` are checked against the constructor (an unknown argument, a missing one or a schedule JSON
cannot describe is one line), and it is built once on a stand-in optimizer, so that a value its constructor refuses
is one line too, before any engine or process group exists. ``zerobench.zero.initialize`` builds it on the engine's
optimizer (``build``) and makes it ``engine.lr_scheduler``, which the engine steps after every optimizer step that
was applied (``step_after_steps``) and keeps in checkpoints, as DeepSpeed's engine does.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.optim import Optimizer

from zerobench.config import ConfigError
from zerobench.zero.protocols import Engine

WARMUP_TYPES = ("log", "linear")


def _real(value, name: str):
    """A finite number (JSON's int or float, or a one-element tensor, as torch optimizers take a group's ``lr``): a
    string or a list where a number is due would fail only at a later step, after that step's update, with a bare
    ``TypeError``."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"scheduler {name}: must be a number, got {value!r}")
    return value


def _per_group(optimizer: Optimizer, value, name: str) -> list:
    """A number for every param group, or a list with one number per group."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ConfigError(f"scheduler {name}: {len(value)} values for {len(optimizer.param_groups)} param groups")
        return [_real(v, name) for v in value]
    return [_real(value, name)] * len(optimizer.param_groups)


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"scheduler {name}: must be a positive integer, got {value!r}")
    return value


def _total_steps(value) -> int:
    """``total_num_steps``: a positive whole number, which JSON may write as a float (``1e4``); DeepSpeed takes it."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return _positive_int(value, "total_num_steps")


def _warmup_type(value: str) -> str:
    if value not in WARMUP_TYPES:
        raise ConfigError(f"scheduler warmup_type {value!r}: give 'log' or 'linear'")
    return value


def _warmup_fraction(batch: int, steps: int, kind: str) -> float:
    """How far through a warm-up of ``steps`` (at least 2) batches index ``batch`` is: log(i + 1) / log(n) or i / n."""
    return (1.0 / math.log(steps)) * math.log(batch + 1) if kind == "log" else batch / steps


def _copy(lr):
    return lr.clone() if isinstance(lr, torch.Tensor) else lr


def _set_lr(group: dict, lr: float) -> None:
    """A group's ``lr`` set to ``lr``; a tensor lr (torch optimizers take one) is filled in place, as torch's
    schedulers fill it, so it stays the tensor a compiled step reads."""
    if isinstance(group["lr"], torch.Tensor):
        group["lr"].fill_(lr)
    else:
        group["lr"] = lr


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
            _set_lr(group, lr)
        # a tensor lr is copied, as torch's schedulers copy it: the next step fills the group's tensor in place
        self._last_lr = [_copy(group["lr"]) for group in self.optimizer.param_groups]

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
        self.total_num_steps = _total_steps(total_num_steps)
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
        self.total_num_steps = _total_steps(total_num_steps)
        self.warmup_num_steps = max(2, _positive_int(warmup_num_steps, "warmup_num_steps"))
        self.warmup_type = _warmup_type(warmup_type)
        self.warmup_min_ratio = _real(warmup_min_ratio, "warmup_min_ratio")
        self.cos_min_ratio = _real(cos_min_ratio, "cos_min_ratio")
        self.org_lrs = [_real(group["lr"], "the param group's lr") for group in optimizer.param_groups]
        if last_batch_iteration == -1:
            self._write()

    def get_lr_ratio(self) -> float:
        """DeepSpeed's: the factor every group's lr is multiplied by at the current batch (0 before the first)."""
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
        r = self.get_lr_ratio()
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
        self.step_rate = _real(lr_range_test_step_rate, "lr_range_test_step_rate")
        self.staircase = bool(lr_range_test_staircase)
        if last_batch_iteration == -1:
            self._write()

    def get_lr(self) -> list[float]:
        interval = float(self.last_batch_iteration + 1) / self.step_size
        increase = 1 + self.step_rate * (math.floor(interval) if self.staircase else interval)
        return [lr * increase for lr in self.min_lr]


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
        first = float(_real(cycle_first_step_size, "cycle_first_step_size"))
        second = (
            first if cycle_second_step_size is None else float(_real(cycle_second_step_size, "cycle_second_step_size"))
        )
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
        self.decay_step_size = _real(decay_step_size, "decay_step_size")
        no_decay = math.isclose(decay_step_size, 0)
        self.min_lrs = _per_group(optimizer, cycle_min_lr, "cycle_min_lr")
        self.max_lrs = _per_group(optimizer, cycle_max_lr, "cycle_max_lr")
        self.decay_lr_rate = _real(decay_lr_rate, "decay_lr_rate")
        self.skip_lr_decay = no_decay or math.isclose(decay_lr_rate, 0)
        self.cycle_momentum = bool(cycle_momentum) and "betas" in optimizer.defaults
        self.decay_mom_rate = _real(decay_mom_rate, "decay_mom_rate")
        self.skip_mom_decay = no_decay or math.isclose(decay_mom_rate, 0)
        self.min_moms = [(m, 0.99) for m in _per_group(optimizer, cycle_min_mom, "cycle_min_mom")]
        self.max_moms = [(m, 0.99) for m in _per_group(optimizer, cycle_max_mom, "cycle_max_mom")]
        if self.cycle_momentum:  # beta1 runs between them: Adam needs it in [0, 1) (at 1 its bias correction is 0/0)
            for key, moms in (("cycle_min_mom", self.min_moms), ("cycle_max_mom", self.max_moms)):
                bad = next((m for m, _ in moms if not 0 <= m < 1), None)
                if bad is not None:
                    raise ConfigError(
                        f"scheduler OneCycle: {key} {bad} is beta1 at the cycle's "
                        f"{'top' if key == 'cycle_min_mom' else 'bottom'} of the learning rate, and Adam needs it "
                        "in [0, 1): give a momentum below 1 (DeepSpeed's defaults are 0.8 and 0.9)"
                    )
        if last_batch_iteration == -1:  # the cycle's bottom: the least learning rate, the least momentum
            for group, lr, mom in zip(optimizer.param_groups, self.min_lrs, self.min_moms):
                _set_lr(group, lr)
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
        """The learning rates and, with ``cycle_momentum``, the betas. ``decay_mom_rate`` raises beta1 without bound
        after the cycle (DeepSpeed's formula, which then trains on with beta1 above 1); the batch that would take
        it to 1 or above is refused in one line naming the cause."""
        moms = self.get_mom() or []
        for b1, _ in moms:
            if not 0 <= b1 < 1:
                raise ConfigError(
                    f"scheduler OneCycle: decay_mom_rate {self.decay_mom_rate} takes beta1 to {b1:.4g} at batch "
                    f"{self.last_batch_iteration}, and Adam needs it in [0, 1): lower decay_mom_rate, or set it to 0"
                )
        super()._write()
        for group, betas in zip(self.optimizer.param_groups, moms):
            group["betas"] = betas


DEEPSPEED = {c.__name__: c for c in (WarmupLR, WarmupDecayLR, WarmupCosineLR, LRRangeTest, OneCycle)}
_NOT_FROM_JSON = {
    "LambdaLR": "takes a function",
    "MultiplicativeLR": "takes a function",
    "SequentialLR": "takes other schedulers",
    "ChainedScheduler": "takes other schedulers",
    "ReduceLROnPlateau": "steps on a metric, not after each optimizer step",
}
"""``torch.optim.lr_scheduler`` classes a config cannot describe or the engine cannot step: pass
``initialize(lr_scheduler=fn)`` instead."""


@dataclass(frozen=True)
class SchedulerSpec:
    """The checked ``scheduler`` section."""

    type: str
    """DeepSpeed's schedule name (``WarmupLR``, ...) or a ``torch.optim.lr_scheduler`` class name."""
    params: dict = field(default_factory=dict)
    """Its keyword arguments (all but the optimizer)."""


def schedule_class(name) -> type:
    """The class ``name`` means: DeepSpeed's schedule first, then ``torch.optim.lr_scheduler``'s, as DeepSpeed."""
    if name in DEEPSPEED:
        return DEEPSPEED[name]
    if name in _NOT_FROM_JSON:
        raise ConfigError(
            f"DeepSpeed config scheduler.type {name!r} {_NOT_FROM_JSON[name]}: build it in code and "
            "pass initialize(lr_scheduler=fn), fn(optimizer) -> the scheduler"
        )
    cls = getattr(torch.optim.lr_scheduler, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.lr_scheduler.LRScheduler)):
        raise ConfigError(
            f"DeepSpeed config scheduler.type {name!r}: unknown (DeepSpeed's: {', '.join(DEEPSPEED)}; "
            "or a torch.optim.lr_scheduler class such as StepLR)"
        )
    return cls


def parse(section) -> SchedulerSpec | None:
    """The ``scheduler`` section checked against its class's arguments; None where there is none."""
    if section in (None, {}):
        return None
    if not isinstance(section, dict):
        raise ConfigError(f"DeepSpeed config scheduler: must be an object, got {section!r}")
    extra = sorted(set(section) - {"type", "params"})
    if extra:
        raise ConfigError(f"DeepSpeed config scheduler: unknown {', '.join(extra)} (known: params, type)")
    if "type" not in section:
        raise ConfigError('DeepSpeed config scheduler: give its type, e.g. {"type": "WarmupLR", "params": {...}}')
    params = section.get("params") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"DeepSpeed config scheduler.params: must be an object, got {params!r}")
    cls = schedule_class(section["type"])
    args = dict(inspect.signature(cls).parameters)
    args.pop("optimizer", None)
    unknown = sorted(set(params) - set(args))
    missing = sorted(
        n
        for n, a in args.items()
        if a.default is inspect.Parameter.empty and n not in params and a.kind not in (a.VAR_POSITIONAL, a.VAR_KEYWORD)
    )
    if unknown or missing:
        what = f"unknown {', '.join(unknown)}" if unknown else f"missing {', '.join(missing)}"
        raise ConfigError(
            f"DeepSpeed config scheduler.params for {section['type']}: {what} (its arguments: {', '.join(args)})"
        )
    auto = sorted(k for k, v in params.items() if v == "auto")
    if auto:
        raise ConfigError(
            f"DeepSpeed config scheduler.params.{auto[0]}: 'auto' is filled in by Hugging Face's Trainer; give a value"
        )
    spec = SchedulerSpec(str(section["type"]), dict(params))
    _dry_build(spec)
    return spec


DRY_STEPS = 200
"""Steps ``_dry_build`` takes the stand-in schedule through (fewer where the schedule states its own length)."""


def _dry_build(spec: SchedulerSpec) -> None:
    """Build ``spec`` on a stand-in AdamW and step it up to ``DRY_STEPS`` times, so that its values are checked with
    the config, before any engine or process group exists: a value its constructor takes but a step refuses (a string
    where ``gamma`` is due), or a learning rate that comes out negative or NaN (a negative ``warmup_max_lr``), is one
    line now rather than a failure after optimizer steps were applied. What a schedule refuses only at a late batch
    of its own (OneCycle's ``decay_mom_rate`` taking beta1 to 1), and a rate that grows without bound
    (``ExponentialLR`` above 1), stay the training's to meet at that batch: a shorter run never does. As many groups
    as its longest per-group list (the engine's own count is checked when ``build`` makes the real one)."""
    groups = max([len(v) for v in spec.params.values() if isinstance(v, (list, tuple))] or [1])
    params = [{"params": [torch.zeros(1, requires_grad=True)]} for _ in range(max(groups, 1))]
    opt = torch.optim.AdamW(params, lr=1e-3)
    sched = build(spec, opt)
    p = spec.params
    own = p.get("total_steps") or (
        p["epochs"] * p["steps_per_epoch"] if "epochs" in p and "steps_per_epoch" in p else 0
    )
    steps = min(DRY_STEPS, own - 1) if isinstance(own, int) and own > 1 else DRY_STEPS
    for step in range(1, steps + 1):
        try:
            with warnings.catch_warnings():  # torch warns of a scheduler stepped before its optimizer
                warnings.simplefilter("ignore")
                sched.step()
        except ConfigError:  # a batch our own schedule refuses in training too, when it comes to it
            return
        except (TypeError, ValueError, KeyError, ArithmeticError) as e:
            raise ConfigError(
                f"DeepSpeed config scheduler {spec.type}: at step {step}: {' '.join(str(e).split())}"
            ) from None
        bad = [g["lr"] for g in opt.param_groups if math.isnan(g["lr"]) or g["lr"] < 0]
        if bad:
            raise ConfigError(
                f"DeepSpeed config scheduler {spec.type}: its learning rate comes out {bad[0]!r} at step {step}: "
                "a schedule's rates must be >= 0"
            )


def build(spec: SchedulerSpec, optimizer: Optimizer):
    """The schedule on ``optimizer``; a value its constructor refuses is one line."""
    try:
        return schedule_class(spec.type)(optimizer, **spec.params)
    except (TypeError, ValueError, KeyError) as e:  # torch's messages may span lines: one line here
        raise ConfigError(f"DeepSpeed config scheduler {spec.type}: {' '.join(str(e).split())}") from None


def scheduler_call(scheduler, kwargs, batch_size: Callable[[], int]) -> tuple[tuple, dict]:
    """The arguments ``scheduler.step`` gets after an applied step, as DeepSpeed's engine calls it: ``lr_kwargs``
    (``engine.step(lr_kwargs=...)``) as keywords; with none, no argument, or ``train_batch_size()`` where ``step``
    needs Megatron-LM's ``increment`` (``step(increment)``, the samples consumed, which DeepSpeed's pipeline engine
    passes so).

    Decided before the optimizer steps, so that a call that would fail is one line and nothing moves. DeepSpeed's
    engine finds out after the weights moved, and on a ``TypeError`` calls ``step(train_batch_size())`` whatever
    ``step`` needed: a misspelt keyword then jumps a schedule by a batch size, and ``ReduceLROnPlateau`` takes the
    batch size for its metric, silently. Both are refused here. A scheduler whose ``step`` has no signature to read
    is called as given; with no scheduler the keywords go nowhere."""
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ConfigError(f"engine.step(lr_kwargs=...): give a dict of keywords, not {type(kwargs).__name__}")
    kwargs = kwargs or {}
    try:
        signature = inspect.signature(scheduler.step)
    except (AttributeError, TypeError, ValueError):
        return (), kwargs
    try:
        signature.bind(**kwargs)
        return (), kwargs
    except TypeError as e:
        why = e
    needed = [p.name for p in signature.parameters.values() if p.default is p.empty and p.kind in _POSITIONAL]
    if not kwargs and needed == ["increment"]:
        return (batch_size(),), {}
    given = f"lr_kwargs={sorted(kwargs)}" if kwargs else "no lr_kwargs"
    raise ConfigError(
        f"engine.step({given}): {type(scheduler).__name__}.step{signature} cannot be called with them ({why}); "
        "give its arguments with engine.step(lr_kwargs=...); nothing was stepped"
    )


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def step_after_steps(engine: Engine):
    """Step ``engine.lr_scheduler``, whatever it holds when a step is applied, after every optimizer step that was
    applied (not inside an accumulation window, nor on a skipped step), as DeepSpeed's engine steps its
    ``lr_scheduler`` attribute: a scheduler assigned after ``initialize`` is the one stepped, and None steps none.
    How it is called is decided before the optimizer steps (``scheduler_call``), ``engine.optimizer.step()`` called
    directly included. Registered once per engine (``DeepSpeedEngine.lr_scheduler``); returns the hooks' handles."""
    opt = engine.optimizer

    def decide(*_) -> None:
        scheduler = engine.lr_scheduler
        engine._lr_next = None
        if scheduler is not None:
            engine._lr_next = getattr(engine, "_lr_call", None) or scheduler_call(
                scheduler, None, engine.train_batch_size
            )

    def step(*_) -> None:
        scheduler, (args, kwargs) = engine.lr_scheduler, getattr(engine, "_lr_next", None) or ((), {})
        if scheduler is not None and opt.applied:
            scheduler.step(*args, **kwargs)

    return opt.register_step_pre_hook(decide), opt.register_step_post_hook(step)
