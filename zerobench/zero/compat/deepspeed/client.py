"""A client optimizer and scheduler handed to ``zerobench.zero.initialize``, as DeepSpeed's callers hand them
(Hugging Face Accelerate among them: ``initialize(model, optimizer=AdamW(...), lr_scheduler=get_scheduler(...))``).

``optimizer=`` is a fresh ``torch.optim.AdamW``, or an ``Adam`` without weight decay (the same update), or a
callable building one from ``model_parameters``. Its param groups, with every hyperparameter, become the engine's
(``apply_zero(param_groups=...)``); the engine's own optimizer takes its place, as DeepSpeed's ZeRO optimizer wraps
the client's. ``lr_scheduler=`` may then be a scheduler already built on that client optimizer: it is rebound to
the engine's optimizer, whose groups start from the rates the scheduler has written; the client's ``param_groups``
are the engine's from then on. Anything else is one line:
another optimizer class (the engine's update is AdamW's), an Adam whose weight decay is added to the gradient, a
client optimizer that has already stepped (the engine's moments start at zero), a scheduler built on another
optimizer.
"""

from __future__ import annotations

import torch
from torch import nn

from zerobench.config import ConfigError
from zerobench.zero.compat.deepspeed.values import DeepSpeedAssertionError

_HOW_TORCH_RUNS_IT = ("foreach", "fused")
"""torch.optim group keys that choose an implementation, not the update: dropped."""
_NO_VARIANT = ("capturable", "differentiable")
"""torch.optim switches the engine's step has no variant for: refused set (it would step as if they were not)."""


def client_groups(optimizer, model: nn.Module, model_parameters) -> tuple[torch.optim.Optimizer, list[dict]]:
    """(the client optimizer, built if a callable; its param groups as the engine takes them)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        if not callable(optimizer):
            raise ConfigError(
                f"initialize: optimizer= must be a torch.optim.AdamW or a callable fn(params) returning "
                f"one, not {type(optimizer).__name__}"
            )
        params = (
            list(model_parameters)
            if model_parameters is not None
            else [p for p in model.parameters() if p.requires_grad]
        )
        optimizer = optimizer(params)
    if not isinstance(optimizer, torch.optim.Adam):  # torch.optim.AdamW is an Adam
        # an AssertionError too, as DeepSpeed asserts an optimizer it has not tested under ZeRO
        raise DeepSpeedAssertionError(
            f"initialize: a client {type(optimizer).__name__} cannot be taken: the ZeRO engine's update "
            "is AdamW's (zero_allow_untested_optimizer does not change that); pass a torch.optim.AdamW, or give "
            "the config an 'optimizer' section"
        )
    if optimizer.state:
        raise ConfigError(
            "initialize: the client optimizer has already stepped (it holds state) and the engine's "
            "moments start at zero: pass a fresh one, and load a checkpoint to resume"
        )
    groups = []
    for i, group in enumerate(optimizer.param_groups):
        if on := [k for k in _NO_VARIANT if group.get(k)]:
            raise ConfigError(
                f"initialize: the client optimizer's param_groups[{i}] sets {on[0]}=True, which the ZeRO engine's "
                f"AdamW has no variant for: build it with {on[0]}=False (torch's default)"
            )
        g = {k: v for k, v in group.items() if k not in _HOW_TORCH_RUNS_IT + _NO_VARIANT}
        if not (isinstance(optimizer, torch.optim.AdamW) or g.get("decoupled_weight_decay", False)):
            if g["weight_decay"]:
                raise ConfigError(
                    f"initialize: the client Adam's param_groups[{i}] adds weight_decay "
                    f"{g['weight_decay']} to the gradient (L2), and the engine's AdamW decays the weights "
                    "instead: pass torch.optim.AdamW"
                )
            g["decoupled_weight_decay"] = True  # without weight decay the two are one update
        groups.append(g)
    return optimizer, groups


def check_scheduler(scheduler, client: torch.optim.Optimizer | None) -> bool:
    """Whether ``scheduler`` (not None) is one already built, which must be on ``client``; a callable is not, a
    scheduler class taking the optimizer included (one line for anything else)."""
    built = hasattr(scheduler, "step") and not isinstance(scheduler, type)  # a class is a callable, as DeepSpeed's
    if (built or not callable(scheduler)) and (client is None or getattr(scheduler, "optimizer", None) is not client):
        raise DeepSpeedAssertionError(  # DeepSpeed asserts it: an AssertionError too
            "initialize: lr_scheduler must be a callable fn(optimizer) -> scheduler, or one built on the "
            "optimizer passed as optimizer= (one built on another optimizer would not move the engine's "
            "learning rate)"
        )
    return built


def rebind(scheduler, engine_optimizer: torch.optim.Optimizer):
    """``scheduler`` (built on the client optimizer) now moves ``engine_optimizer``'s learning rates, and so do the
    schedulers it drives (``SequentialLR``'s and ``ChainedScheduler``'s, which write their own optimizer's rates);
    returns it."""
    scheduler.optimizer = engine_optimizer
    for inner in getattr(scheduler, "_schedulers", ()):
        rebind(inner, engine_optimizer)
    return scheduler


def share_groups(client: torch.optim.Optimizer, engine_optimizer: torch.optim.Optimizer) -> None:
    """The client optimizer's ``param_groups`` become the engine's: a rate the loop writes there by hand (a
    warm-up, ``g["lr"] = ...``), or a scheduler that still holds the client, moves the engine's, as the
    client's groups are DeepSpeed's ZeRO optimizer's own. (Its ``step()`` is refused: the engine steps.)"""
    client.param_groups = engine_optimizer.param_groups
