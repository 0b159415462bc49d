"""The class a model gets once the engine trains it: ``model.zero_grad()`` clears the engine's gradients, as on a
DDP or FSDP model, ``model.clip_grad_norm_(max_norm)`` clips the global gradient as on an FSDP1 model, and
``model.half()``/``.to(...)``, which would detach its parameters from the engine, are refused.

At stages 2-3 a trained parameter's ``.grad`` is always None (its gradient lives in this rank's partition), and
at stages 0-1 it is a view of the gradient buffer, so ``nn.Module.zero_grad`` alone would clear nothing the engine
holds, and the next window's gradients would be added to the last one's.

``route_zero_grad`` gives the model a class made for it, deriving from the model's, whose ``zero_grad`` calls the
engine's ``zero_grad()`` and clears any other parameter's ``.grad`` as ``nn.Module.zero_grad`` does. The class keeps
the model's name and ``isinstance`` answers; ``copy.deepcopy`` gives back an object of the model's own class without
the link (a copy, e.g. an EMA model, is not trained by the engine). A module built around the model (``torch.compile``,
an outer module) and a submodule keep ``nn.Module.zero_grad``, which ``interop/foreign.py`` routes: the first to the
engine, the second refused at stages 2-3.

The class's ``_apply`` (what ``.to()``, ``.half()``, ``.cuda()``, ``.to_empty()`` and the like are made of) refuses,
in one line, a conversion that would give the parameters new tensors: they are views of the engine's buffers (or
stage 3's placeholders), so the engine would go on training buffers the model no longer reads (stages 0-2), or
undo the conversion at the next gather (stage 3). A conversion that changes nothing (``model.float()`` of an fp32
model, ``model.to(its device)``) goes through, as torch returns the same tensors. ``linked_engine(model)`` is the
engine a model is linked to (``zero/registry.py``'s ``engine_of`` asks it).
"""

from __future__ import annotations

import copyreg
import weakref

import torch
from torch import nn

from zerobench.config import ConfigError
from zerobench.zero.protocols import Engine

_LINK = "_zero_engine"


def _zero_grad(self: nn.Module, set_to_none: bool = True) -> None:
    """The routed class's ``zero_grad``: the engine's, then every other parameter's as ``nn.Module``'s."""
    engine = linked_engine(self)
    if engine is None:
        _model_class(type(self)).zero_grad(self, set_to_none)
        return
    engine.zero_grad(set_to_none)
    owned = {id(zp.param) for zp in engine.zparams}
    for p in self.parameters():
        if p.grad is None or id(p) in owned:
            continue
        if set_to_none:
            p.grad = None
        else:
            p.grad.detach_() if p.grad.grad_fn is not None else p.grad.requires_grad_(False)
            p.grad.zero_()


def _clip_grad_norm_(self: nn.Module, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
    """The routed class's ``clip_grad_norm_``, FSDP1's spelling on the model: the engine's (the global p-norm of the
    averaged gradient over every partition, L2 by default). ``torch.nn.utils.clip_grad_norm_`` on a rank would see
    only this rank's ``.grad``: its shard at stage 1, None at stages 2-3."""
    engine = linked_engine(self)
    if engine is None:
        return torch.nn.utils.clip_grad_norm_(self.parameters(), max_norm, norm_type)
    return engine.clip_grad_norm_(max_norm, norm_type)


def _apply(self: nn.Module, fn, recurse: bool = True):
    """The routed class's ``_apply``: torch's, unless ``fn`` would replace the engine's parameters (see above)."""
    engine = linked_engine(self)
    if engine is not None:
        kinds = {(zp.param.dtype, zp.param.device) for zp in engine.zparams}
        for dtype, device in kinds:
            probe = torch.empty(0, dtype=dtype, device=device)
            out = fn(probe)
            if out is not probe:
                raise ConfigError(
                    f"converting a model the ZeRO engine trains (to {out.dtype} on {out.device}; its parameters are "
                    f"{dtype} on {device}) would detach its parameters from the engine's buffers: convert the model "
                    "before apply_zero (ZeroConfig.precision picks the training dtype)"
                )
    return _model_class(type(self))._apply(self, fn, recurse)


def _reduce_ex(self: nn.Module, protocol: int):
    """``copy.deepcopy`` (and pickling) rebuild the model's own class, without the link to the engine."""
    state = self.__getstate__()
    state.pop(_LINK, None)
    return copyreg.__newobj__, (_model_class(type(self)),), state


_ROUTED_FROM = "_zero_grad_routed_from"
_CLASSES: dict[type, type] = {}
"""The routed class made for each model class (made once: every instance of a class shares it)."""


def _model_class(cls: type) -> type:
    return cls.__dict__.get(_ROUTED_FROM, cls)


def route_zero_grad(model: nn.Module, engine: Engine) -> None:
    """Make ``model.zero_grad()`` clear ``engine``'s gradients (the engine is held by a weak reference)."""
    cls = _model_class(type(model))
    routed = _CLASSES.get(cls)
    if routed is None:
        methods = {
            "zero_grad": _zero_grad,
            "_apply": _apply,
            "__reduce_ex__": _reduce_ex,
            _ROUTED_FROM: cls,
            "__module__": cls.__module__,
        }
        if not hasattr(cls, "clip_grad_norm_"):  # a model's own method of that name is left as it is
            methods["clip_grad_norm_"] = _clip_grad_norm_
        routed = _CLASSES[cls] = type(cls.__name__, (cls,), methods)
    model.__class__ = routed
    model.__dict__[_LINK] = weakref.ref(engine)


def unroute_zero_grad(model: nn.Module) -> None:
    """Undo ``route_zero_grad``: the model's own class and ``zero_grad`` again, without the link to an engine."""
    model.__class__ = _model_class(type(model))
    model.__dict__.pop(_LINK, None)


def linked_engine(model: nn.Module):
    """The live engine ``route_zero_grad`` linked ``model`` to, or None."""
    ref = model.__dict__.get(_LINK)
    return ref() if ref is not None else None
