"""Torch calls that would silently do nothing, or the wrong thing, on a ZeRO engine's parameters, made loud.

The engine keeps each trained parameter's fp32 master and optimizer state in its partition, and at stages 2-3 its
gradient too (``.grad`` stays None; at stage 1 it holds only this rank's reduced shard). Two torch calls a ported
FSDP or DDP loop makes read ``.grad`` and would go wrong without a word:

- **A torch optimizer built on ``model.parameters()``** steps nothing at stages 2-3, steps each rank on its own
  shard at stage 1 (the ranks drift apart), and at every stage leaves the master the engine checkpoints stale. A
  global optimizer step pre-hook refuses its ``step()`` in one line naming ``engine.optimizer``.
- **``torch.nn.utils.clip_grad_norm_(model.parameters(), ...)``** returns 0 and clips nothing at stages 2-3 (and a
  rank's own norm at stage 1). Given exactly an engine's trained parameters (what ``model.parameters()`` holds,
  frozen ones aside), it is routed to ``engine.clip_grad_norm_``, FSDP's global norm; given some of them, refused.
- **The same function imported by name before the first engine** (``from torch.nn.utils import clip_grad_norm_`` at
  the top of a script) is torch's own and cannot be rerouted. It reaches the engine's parameters through
  ``torch.nn.utils.clip_grad._clip_grads_with_norm_``, which it looks up as it runs, and that is where it is refused
  wherever ``.grad`` is not the whole gradient. So are ``torch.nn.utils.clip_grads_with_norm_`` and
  ``clip_grad_value_`` over such parameters. Where ``.grad`` is the whole averaged gradient (stage 0, or stage 1 on
  one rank, without TP, fp16 loss scaling or offload) torch's functions are right and pass through.

- **``zero_grad()`` of a module other than the model ``apply_zero`` was given** (``torch.compile(model)``'s
  ``OptimizedModule``, an outer module holding the model) is ``nn.Module``'s: it clears ``.grad``, which at stages
  2-3 is None, and left the engine's gradients to add into the next window's. Where such a module holds every
  parameter an engine trains it also calls ``engine.zero_grad()``, as the model's own does; where it holds some of
  them (a submodule) at stages 2-3, which keep one partition for them all, it is refused. At stages 0-1 ``.grad`` is
  cleared by hand as torch clears it.

- **``torch.distributed.checkpoint``'s state-dict API** (``get_state_dict``, ``get_optimizer_state_dict``,
  ``set_state_dict``, ``set_optimizer_state_dict``) over an engine's optimizer: its ``state`` is empty (the
  moments are this rank's partition of flat buffers, in ``state_dict()``'s ``zero_shard``), so DCP took it for
  uninitialised and ran a step with zero gradients at lr 0 to create it (the moments decayed, the step count
  moved), then saved no optimizer state at all. Its ``_init_optim_state``, which all four call as they run, refuses a
  ZeRO optimizer in one line; the module is patched when it is imported (importing it costs most of a second, so it
  is not imported for this).

All are installed once per process, by the first engine, and pass every other optimizer and parameter through.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from zerobench.zero.registry import owner


def install() -> None:
    """Install the step pre-hook and wrap ``torch.nn.utils.clip_grad_norm_`` (once per process)."""
    if getattr(torch.nn.utils.clip_grad_norm_, "zerobench_routed", False):
        return
    register_optimizer_step_pre_hook(_refuse_foreign_step)
    module = torch.nn.utils.clip_grad
    wrapped = _routed(torch.nn.utils.clip_grad_norm_)
    torch.nn.utils.clip_grad_norm_ = module.clip_grad_norm_ = wrapped
    with_norm = _guarded(module._clip_grads_with_norm_, "clip_grads_with_norm_")
    module._clip_grads_with_norm_ = torch.nn.utils.clip_grads_with_norm_ = with_norm
    torch.nn.utils.clip_grad_value_ = module.clip_grad_value_ = _guarded(module.clip_grad_value_, "clip_grad_value_")
    torch.nn.Module.zero_grad = _module_zero_grad(torch.nn.Module.zero_grad)
    if _DCP in sys.modules:
        _guard_dcp(sys.modules[_DCP])
    else:
        sys.meta_path.insert(0, _DcpFinder())


def _engines(params) -> dict[int, tuple[object, set[int]]]:
    """id(engine) -> (engine, indices in ``engine.zparams``) of the trained parameters among ``params``."""
    found: dict[int, tuple[object, set[int]]] = {}
    for p in params:
        engine, i = owner(p)
        if engine is not None:
            found.setdefault(id(engine), (engine, set()))[1].add(i)
    return found


def _refuse_foreign_step(optimizer, args, kwargs) -> None:
    from zerobench.zero.optim.torch_optimizer import ZeroOptimizer

    if isinstance(optimizer, ZeroOptimizer):
        return
    found = _engines(p for g in optimizer.param_groups for p in g["params"])
    if found:
        engine = next(iter(found.values()))[0]
        raise RuntimeError(
            f"{type(optimizer).__name__}.step() on parameters a ZeRO engine (stage {engine.stage}) trains: their "
            "gradients, fp32 master and optimizer state live in the engine's partition, so this step would "
            "update nothing or the wrong values. Step engine.optimizer (or engine.step()), and give your "
            "optimizer's groups to initialize(optimizer=...) or apply_zero(param_groups=...)"
        )


def _routed(clip):
    @functools.wraps(clip)
    def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        found = _engines(params)
        if not found:
            return clip(params, max_norm, norm_type, error_if_nonfinite, foreach)
        (engine, given), *others = found.values()
        rest = [p for p in params if owner(p)[0] is None and p.requires_grad]
        if others or rest or len(given) != len(engine.zparams):
            raise RuntimeError(
                "torch.nn.utils.clip_grad_norm_ given part of a ZeRO engine's trained parameters (or them and "
                "others): its gradients live in the engine's partition, so torch sees none. Clip the whole "
                "window with engine.clip_grad_norm_(max_norm) (model.clip_grad_norm_), as FSDP's"
            )
        return engine.clip_grad_norm_(max_norm, norm_type, error_if_nonfinite)

    clip_grad_norm_.zerobench_routed = True
    return clip_grad_norm_


def _grads_whole(engine) -> bool:
    """Whether the ``.grad`` of ``engine``'s parameters holds the whole averaged gradient, as torch's clipping functions
    assume: not a partition (stages 2-3 keep none, stage 1 on several ranks only this rank's shard), not a TP shard
    whose norm misses the other TP ranks', not times fp16's loss scale, and not a copy the step does not read
    (offload streams the gradient to the host during backward)."""
    return (
        engine.stage < 2
        and not engine.grads_sharded
        and engine.tp_group is None
        and not engine.scaler.enabled
        and engine.storage.host is None
    )


def _guarded(fn, name: str):
    """``fn`` (a torch clipping function whose first argument is the parameters), refused in one line over a ZeRO
    engine's parameters whose ``.grad`` is not the whole gradient (``_grads_whole``)."""

    @functools.wraps(fn)
    def guarded(parameters, *args, **kwargs):
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        for engine, _ in _engines(params).values():
            if not _grads_whole(engine):
                raise RuntimeError(
                    f"torch's {name} reached parameters a ZeRO engine (stage {engine.stage}) trains, whose .grad is not "
                    "their whole averaged gradient, so torch would clip by the wrong norm or nothing at all (a "
                    "clip_grad_norm_ imported by name before the engine was built is torch's own and gets here). "
                    "Clip with engine.clip_grad_norm_(max_norm), or call torch.nn.utils.clip_grad_norm_ through the module"
                )
        return fn(params, *args, **kwargs)

    guarded.zerobench_routed = True
    return guarded


def _module_zero_grad(zero_grad):
    """``nn.Module.zero_grad``, then the engines' whose trained parameters the module holds (module docstring)."""

    @functools.wraps(zero_grad)
    def routed(self, set_to_none: bool = True) -> None:
        found = _engines(self.parameters())
        for engine, given in found.values():
            if len(given) != len(engine.zparams) and engine.stage >= 2:
                raise RuntimeError(
                    f"{type(self).__name__}.zero_grad() on part of a ZeRO engine's trained parameters (stage "
                    f"{engine.stage}): their gradients live in one partition with the others', so it cannot clear "
                    "these alone. Call zero_grad() on the model apply_zero was given, or engine.zero_grad()"
                )
        zero_grad(self, set_to_none)
        for engine, given in found.values():
            if len(given) == len(engine.zparams):
                engine.zero_grad(set_to_none)

    routed.zerobench_routed = True
    return routed


_DCP = "torch.distributed.checkpoint.state_dict"


class _DcpFinder(importlib.abc.MetaPathFinder):
    """Patches ``torch.distributed.checkpoint.state_dict`` as it is imported (``_guard_dcp``), then leaves."""

    def find_spec(self, name, path, target=None):
        if name != _DCP:
            return None
        sys.meta_path.remove(self)  # the module's own spec, from the finders after this one
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _guard_dcp(module)

        spec.loader.exec_module = exec_module
        return spec


def _guard_dcp(module) -> None:
    init = module._init_optim_state
    if getattr(init, "zerobench_routed", False):
        return

    @functools.wraps(init)
    def guarded(optim):
        from zerobench.zero.optim.torch_optimizer import ZeroOptimizer

        if isinstance(optim, ZeroOptimizer):
            raise RuntimeError(
                "torch.distributed.checkpoint's state dicts cannot hold a ZeRO engine's optimizer state (this rank's "
                "partition of flat buffers): DCP would save none, after running a step to create it. Checkpoint with "
                "engine.save_checkpoint() or zerobench.zero.state.checkpoint's save_sharded(), and take the weights "
                "alone with get_model_state_dict(model)"
            )
        return init(optim)

    guarded.zerobench_routed = True
    module._init_optim_state = guarded
