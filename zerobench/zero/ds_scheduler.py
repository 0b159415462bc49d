"""A DeepSpeed config's ``scheduler`` section: read and checked with the config (``parse``: pure, no optimizer),
built on the engine's optimizer by ``zerobench.zero.initialize`` (``build``) and attached to the engine
(``attach``), which steps it after every optimizer step that was applied and keeps its state in checkpoints, as
DeepSpeed's engine does with ``engine.lr_scheduler``.

``type`` is one of DeepSpeed's schedules (``zero/lr_schedules.py``, ``zero/one_cycle.py``) or, as DeepSpeed
resolves it, a class of ``torch.optim.lr_scheduler`` whose arguments JSON can hold (``StepLR``,
``CosineAnnealingLR``, ...). ``params`` are checked against its constructor when the config is read: an unknown
argument, a missing one or a schedule JSON cannot describe is one line, before any process group is touched.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
from torch.optim import Optimizer

from zerobench.config import ConfigError
from zerobench.zero.lr_schedules import LRRangeTest, WarmupCosineLR, WarmupDecayLR, WarmupLR
from zerobench.zero.one_cycle import OneCycle

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
    return SchedulerSpec(str(section["type"]), dict(params))


def build(spec: SchedulerSpec, optimizer: Optimizer):
    """The schedule on ``optimizer``; a value its constructor refuses is one line."""
    try:
        return schedule_class(spec.type)(optimizer, **spec.params)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"DeepSpeed config scheduler {spec.type}: {e}") from None


def attach(engine, scheduler) -> None:
    """Make ``scheduler`` the engine's (``engine.lr_scheduler``, saved and loaded with its checkpoints) and step it
    after every optimizer step that was applied (not inside an accumulation window, nor on an fp16 overflow)."""
    engine.lr_scheduler = scheduler
    opt = engine.optimizer
    opt.register_step_post_hook(lambda *_: scheduler.step() if opt.applied else None)
