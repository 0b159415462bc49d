"""Which engine trains a parameter or a model, found without attributes set on either.

Parameters are keys of a side table held weakly (``register`` at construction, ``unregister`` at
``engine.destroy()``); a model is linked by the class the engine gives it (``zero/interop/module_zero_grad.py``). Both
hold weak references: an engine nobody holds is not kept alive by its model or its parameters.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from zerobench.zero.interop.module_zero_grad import linked_engine
from zerobench.zero.protocols import Engine

_OWNER: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""Trained parameter -> (weak reference to its engine, its index in ``engine.zparams``)."""
_HELD: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""Frozen parameter of an engine's model -> weak reference to that engine (which holds it whole, untrained)."""


def register(engine: Engine) -> None:
    """Every parameter ``engine`` trains now names it (and its index in ``engine.zparams``), and every frozen
    parameter of its model names it as its holder."""
    ref = weakref.ref(engine)
    for i, zp in enumerate(engine.zparams):
        _OWNER[zp.param] = (ref, i)
    for _, p in getattr(engine, "frozen", ()):
        _HELD[p] = ref


def unregister(engine: Engine) -> None:
    """``engine``'s parameters belong to no engine any more (``engine.destroy()``)."""
    for zp in engine.zparams:
        _OWNER.pop(zp.param, None)
    for _, p in getattr(engine, "frozen", ()):
        if p in _HELD and _HELD[p]() is engine:
            del _HELD[p]


def owner(param: torch.Tensor) -> tuple[object | None, int | None]:
    """(the live engine training ``param``, its index in ``engine.zparams``), or (None, None)."""
    found = _OWNER.get(param)
    engine = found[0]() if found is not None else None
    return (engine, found[1]) if engine is not None else (None, None)


def engine_of(obj: nn.Module | torch.Tensor) -> object | None:
    """The live engine training ``obj``: a model (or submodule) ``apply_zero`` was given, or a parameter; None for a
    frozen parameter, or anything never given to ``apply_zero``."""
    if isinstance(obj, nn.Module):
        return linked_engine(obj)
    return owner(obj)[0]


def holder(param: torch.Tensor) -> object | None:
    """The live engine whose model holds ``param``: the one training it, or, for a frozen parameter, the one whose
    model it is part of; None for a parameter of no engine's model."""
    engine = owner(param)[0]
    if engine is not None:
        return engine
    ref = _HELD.get(param)
    return ref() if ref is not None else None
