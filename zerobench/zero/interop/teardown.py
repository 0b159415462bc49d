"""``engine.destroy()`` (DeepSpeed's name): the engine's hooks removed and the model handed back as a plain module.

Every hook the engine put on the model, its modules and its parameters is removed, ``model.zero_grad()`` (and the
model's class) is torch's again, and the parameters are no longer registered to the engine, so ``apply_zero`` may
wrap the model again. At stages 0-2 each parameter keeps its trained value as it is (a view of the engine's replica,
in the training dtype); stage 3 first gathers the full values (an all-gather: call ``destroy()`` on every DP rank)
and gives each parameter its own copy, where DeepSpeed leaves them partitioned. The fp32 master and the optimizer
states go with the engine, which refuses any further training step in one line; an NVMe store's file is removed at
once.
"""

from __future__ import annotations

import torch

from zerobench.zero.interop.module_zero_grad import unroute_zero_grad
from zerobench.zero.protocols import Engine
from zerobench.zero.registry import unregister


class DestroyedEngineError(RuntimeError):
    """A training call on an engine after ``destroy()``."""


def check_live(engine: Engine, what: str) -> None:
    """One line if ``engine`` was destroyed."""
    if engine.destroyed:
        raise DestroyedEngineError(
            f"{what} on an engine after destroy(): its hooks and optimizer states are gone; "
            "wrap the model again with apply_zero (or zerobench.zero.initialize)"
        )


def destroy_engine(engine: Engine) -> None:
    """See the module docstring. Idempotent."""
    if engine.destroyed:
        return
    full: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
    if engine.gatherer is not None:  # stage 3: standalone copies of the full values, before the units go
        # (an edit made in place while partitioned never reached a shard: the model gets the trained values back,
        # and destroy, often in a `finally`, does not raise over it)
        engine.gatherer.check_edits(discard=True)
        with engine.gathered_params(writeback=False), torch.no_grad():
            full = [(zp.param, zp.param.detach().clone()) for zp in engine.zparams]
    handles = [*engine._hooks, *engine._model_hooks[0], engine._model_hooks[1], engine.passes.handle]
    handles += engine.gatherer.handles if engine.gatherer is not None else []
    for h in handles:
        if h is not None:
            h.remove()
    unroute_zero_grad(engine.module)
    unregister(engine)
    for p, value in full:
        p.data = value
    for zp in engine.zparams:  # a .grad left as a view of the engine's gradient bucket (stages 0-1)
        zp.param.grad = None
    engine.adamw.store.close()  # NVMe: the state file goes now, not when (or if) the engine is collected
    engine.destroyed = True
