"""``engine.optimizer``: the ZeRO engine's optimizer step behind the ``torch.optim.Optimizer`` interface.

Training code written for plain PyTorch drives an optimizer object: learning-rate schedulers
(``torch.optim.lr_scheduler.*``, Megatron's or Hugging Face's) write ``param_groups[i]["lr"]`` before each step, step
hooks are registered on it, its ``state_dict()`` is saved next to the model's. ``ZeroOptimizer`` is that object for a
``ZeroEngine``. It holds no state of its own: the fp32 master and the Adam moments stay in the engine's flat
partitions.

- The param groups given to ``apply_zero(param_groups=...)`` (default: one over the trained parameters,
  weight decay on 2+-dim ones; ``zero/optim/param_groups.py``). Each group's ``lr``, ``betas``, ``eps`` and
  ``weight_decay`` are read at every step (validated then), so a schedule's changes take effect at the next
  ``step()``. The groups are laid out in the partition at construction: adding one later is refused.
- ``step(closure=None)`` is torch's step: the gradients stay until ``zero_grad()``, an incomplete window is
  refused. ``engine.step()`` (DeepSpeed's) calls it at a window's end and then zeroes; either runs the step
  hooks and counts as the optimizer step for a scheduler's order check. ``applied`` says whether it updated
  anything.
- ``state_dict()`` holds the groups' hyperparameters and *this rank's* shard of the master and moments
  (``zero_shard``); ``load_state_dict`` restores both on a model with the same partitioning (the same DP
  size and a stage that cuts the partition alike; stage 0's shard is the whole model), on every DP rank, and
  refuses another partition in one line naming both. To change the number of ranks or the stage, use
  ``zerobench.zero.state.checkpoint.save_sharded`` / ``load_sharded`` (or DeepSpeed's ``save_checkpoint``).
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict

import torch

from zerobench.config import ConfigError
from zerobench.zero.config import AdamWConfig
from zerobench.zero.optim.loss_scale import amp_unscale
from zerobench.zero.optim.step import check_steppable, optimizer_step
from zerobench.zero.protocols import Engine
from zerobench.zero.state.gathered import check_outside
from zerobench.zero.state.shards import load_shard_state_dicts, shard_state_dict
from zerobench.zero.state.transaction import agree

HYPER_KEYS = ("lr", "betas", "eps", "weight_decay")
UNSUPPORTED = {
    "amsgrad": False,
    "maximize": False,
    "decoupled_weight_decay": True,
    "differentiable": False,
    "capturable": False,
}
"""``torch.optim.AdamW`` group keys the engine's step does not implement, with the value it does (refused otherwise):
its step runs under ``no_grad`` (no ``differentiable`` graph) and is not written for CUDA-graph capture."""


class FixedParams(list):
    """A param group's ``params`` after construction: the engine laid these parameters out in its partition under
    this group's hyperparameters, so editing the list (moving a parameter to another group, dropping one) would
    change nothing the step does. torch's optimizer steps each group's current list; here an edit is refused."""

    def _refuse(self, *args, **kwargs):
        raise ValueError(
            "a ZeRO optimizer's param groups hold the parameters given at construction (the engine lays them out "
            "in its partition): pass the groups you want to apply_zero(param_groups=...) instead of editing "
            "param_groups[i]['params']"
        )

    append = extend = insert = remove = pop = clear = sort = reverse = _refuse
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse

    def __reduce__(self):  # a copy is a plain list (copy.deepcopy, pickling)
        return list, (list(self),)


class ZeroOptimizer(torch.optim.Optimizer):
    """The engine's optimizer as a ``torch.optim.Optimizer``; see the module docstring."""

    def __init__(self, engine: Engine, params: list, cfg: AdamWConfig):
        """``params``: parameters or torch-style groups (hyperparameters missing from a group are ``cfg``'s)."""
        self._engine = engine
        self._ready = False
        super().__init__(
            params, {"lr": cfg.lr, "betas": tuple(cfg.betas), "eps": cfg.eps, "weight_decay": cfg.weight_decay}
        )
        self._ready = True
        self._groups = len(self.param_groups)
        for g in self.param_groups:
            g["params"] = FixedParams(g["params"])
        self._lists = [g["params"] for g in self.param_groups]
        """Each group's parameter list, in the order the partition laid the groups out (``hyper`` checks it)."""
        self.hyper()  # a bad value in a group fails at construction, not at the first step
        self.applied = False
        """Whether the last ``step()`` updated the parameters (False: no gradient, or a skipped overflow)."""
        self.overflow = False
        """Whether the last ``step()`` was skipped on a non-finite gradient: an fp16 overflow, or outside fp16 under
        ``engine.skip_nonfinite`` (DeepSpeed's optimizers' flag, which Accelerate reads as ``step_was_skipped``)."""

    def add_param_group(self, param_group: dict) -> None:
        if self._ready:
            raise ValueError(
                "the ZeRO engine lays out its param groups in the partition at construction: pass "
                "every group to apply_zero(param_groups=...) instead of adding one later"
            )
        super().add_param_group(param_group)

    def hyper(self) -> list[AdamWConfig]:
        """This step's hyperparameters from ``param_groups``, one per group; one line naming a bad value."""
        if len(self.param_groups) != self._groups:
            raise ConfigError(
                f"the ZeRO optimizer has {self._groups} param group(s), fixed at construction, "
                f"found {len(self.param_groups)}: pass every group to apply_zero(param_groups=...)"
            )
        for i, (g, held) in enumerate(zip(self.param_groups, self._lists)):
            if g["params"] is not held:  # replaced, or the groups reordered: hyperparameters go by position
                raise ConfigError(
                    f"param_groups[{i}]['params'] is not the list this group was built with (the groups were "
                    "reordered, or the list replaced): the engine laid the groups out in its partition at "
                    "construction; pass the groups you want to apply_zero(param_groups=...)"
                )
        return [_hyper(i, g) for i, g in enumerate(self.param_groups)]

    _step_supports_amp_scaling = True
    """A ``torch.amp`` GradScaler hands ``step()`` its scale and overflow flag (``zero/optim/loss_scale.py``)."""

    def step(self, closure=None):
        """The engine's step (see ``ZeroEngine.step``); returns ``closure()``'s loss when given one. Driven by a
        GradScaler (``zero/optim/loss_scale.py``) it is skipped on an overflow, and folds the scaler's 1/scale into
        its own."""
        check_steppable(self._engine, "step()")  # before the closure runs or anything counts
        self._opt_called = True  # what torch's schedulers check before their first step (see ``_wrapped_by_lr_sched``)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        unscale = amp_unscale(self)
        if unscale is None:  # a GradScaler found an overflow on some rank
            self.applied, self.overflow = False, True
            return loss
        self._engine._clip *= unscale  # the step multiplies the gradients by _clip / loss scale
        skipped = self._engine.scaler.skipped_steps
        self.overflow = False
        self.applied = optimizer_step(self._engine, self.hyper())  # zero/optim/step.py
        self.overflow = self._engine.scaler.skipped_steps > skipped
        return loss

    step._wrapped_by_lr_sched = True
    """``step`` records its calls itself, as torch's schedulers wrap an optimizer's ``step`` to: a scheduler rebound
    to this optimizer (``zero/compat/deepspeed/client.py``) checks the order of its first step against it without a
    false warning."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """``engine.zero_grad(set_to_none)``: stages 0-1 set ``.grad`` to None or zero it, as ``torch.optim``."""
        self._engine.zero_grad(set_to_none)

    def state_dict(self) -> dict:
        """torch's format (``param_groups`` with parameter indices, an empty per-parameter ``state``) plus
        ``zero_shard``: this rank's master and moments (collective at no stage; plain tensors and data). Post-hooks
        see the whole dict, ``zero_shard`` included, and may return another, as torch's."""
        with _held(self, "_optimizer_state_dict_post_hooks") as post:
            sd = super().state_dict()
        sd["zero_shard"] = shard_state_dict(self._engine)
        for hook in post.values():
            sd = _or(hook(self, sd), sd)
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore hyperparameters and this rank's shard (on every DP rank: stages 1-2 re-gather parameters).

        As torch's ``Optimizer.load_state_dict`` it leaves the model's weights as they are: the shard's fp32 master
        is taken only where the parameter still holds its rounding (a model loaded from the same save: the master
        then keeps its fp32 bits), and a weight changed since (new or pretrained weights loaded before the
        optimizer's state, a head re-initialised) is kept, the master taking its value.

        Pre-hooks run first, on the whole dict (``zero_shard`` included), and the dict they return is the one
        loaded, as torch's; a hook that raises leaves everything as it was."""
        state_dict = state_dict.copy()  # shallow, as torch's: a hook's edits stay off the caller's dict
        for hook in self._optimizer_load_state_dict_pre_hooks.values():
            state_dict = _or(hook(self, state_dict), state_dict)
        if "zero_shard" not in state_dict:
            raise ValueError(
                "not a ZeRO optimizer state dict (no 'zero_shard'): save it with "
                "engine.optimizer.state_dict() on every rank"
            )
        rest = {k: v for k, v in state_dict.items() if k != "zero_shard"}
        groups = rest.get("param_groups")
        if not isinstance(groups, list) or [len(g.get("params", ())) for g in groups] != [
            len(g["params"]) for g in self.param_groups
        ]:  # torch's own check, made before the shard is loaded: a refused load changes nothing
            raise ValueError(
                "loaded state dict's param groups do not match this optimizer's (their number or their parameters' "
                "counts differ): load a state dict of the same model and param groups"
            )
        # the shard first: a transaction over the ranks, refused on any rank before anything changes on any; the
        # groups' hyperparameters after it, so a refused shard leaves them as they were
        check_outside(self._engine, "load_state_dict()", "the loaded values")
        storage = self._engine.storage
        storage.adopt_edits()  # an assigned or edited parameter is what the model holds
        held = [s.detach().clone() for s in storage.shards]
        load_shard_state_dicts(self._engine, [state_dict["zero_shard"]])
        keep_held_weights(self._engine, held)
        with _held(self, "_optimizer_load_state_dict_pre_hooks"):  # they ran above
            super().load_state_dict(rest)


@contextlib.contextmanager
def _held(optimizer, hooks: str):
    """Run torch's ``state_dict``/``load_state_dict`` without the hooks ``hooks`` names (yielded: the caller runs
    them where the ZeRO shard puts them in torch's order)."""
    held = getattr(optimizer, hooks)
    setattr(optimizer, hooks, OrderedDict())
    try:
        yield held
    finally:
        setattr(optimizer, hooks, held)


def _or(result, state_dict: dict) -> dict:
    return state_dict if result is None else result


def _hyper(i: int, g: dict) -> AdamWConfig:
    """Group ``i``'s hyperparameters, checked."""
    try:
        lr, wd, eps = float(g["lr"]), float(g["weight_decay"]), float(g["eps"])
        b1, b2 = (float(b) for b in g["betas"])
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(
            f"param_groups[{i}] needs numbers for {', '.join(HYPER_KEYS)} (betas a pair): {type(e).__name__}: {e}"
        ) from None
    if not (math.isfinite(lr) and lr >= 0):
        raise ConfigError(f"param_groups[{i}]['lr'] must be a finite number >= 0, got {g['lr']}")
    if not (math.isfinite(wd) and wd >= 0):
        raise ConfigError(f"param_groups[{i}]['weight_decay'] must be a finite number >= 0, got {g['weight_decay']}")
    for key, plain in UNSUPPORTED.items():  # torch.optim.AdamW's switches that change the update: never ignored
        if key in g and bool(g[key]) != plain:
            raise ConfigError(
                f"param_groups[{i}][{key!r}]={g[key]!r}: the ZeRO engine's AdamW has no {key} variant "
                f"(torch.optim.AdamW's default {key}={plain}); drop the key"
            )
    if not (math.isfinite(eps) and eps > 0) or not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise ConfigError(
            f"param_groups[{i}] needs eps > 0 and betas in [0, 1), got eps {g['eps']}, betas {g['betas']}"
        )
    return AdamWConfig(lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)


@torch.no_grad()
def keep_held_weights(engine, held: list[torch.Tensor]) -> None:
    """After a load wrote the master (and the shards from it): where this rank's parameter shard held, before it, a
    value other than the loaded master's rounding, put that value back, in the master too (``load_state_dict``)."""
    storage, moved = engine.storage, False
    for before, shard, master in zip(held, storage.shards, storage.master):
        same = (before == shard) | (before.isnan() & shard.isnan())
        if bool(same.all()):
            continue
        moved = True
        keep = ~same.to(master.device)
        master.copy_(torch.where(keep, before.to(master.device, master.dtype), master))
    if agree(engine, int(moved)):  # the re-publish is collective: every rank does it if any rank kept a weight
        storage.rewritten()
        engine.params_from_master()
