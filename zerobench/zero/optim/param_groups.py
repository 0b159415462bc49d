"""Param groups: which of ``apply_zero(param_groups=...)``'s groups each trained parameter belongs to.

Given nothing, the engine trains every parameter that requires a gradient as one group, with weight decay on
parameters of 2+ dims only (biases and norms excluded). Given groups in ``torch.optim``'s forms (an iterable of
parameters, or of dicts with ``"params"`` and any of ``lr``, ``betas``, ``eps``, ``weight_decay``, the rest taken
from ``ZeroConfig.optimizer``; extra keys are kept for schedulers), the groups are torch's: a group's
``weight_decay`` applies to every parameter in it, and each group steps with its own hyperparameters. Parameters
that do not require a gradient are dropped from the groups (as DeepSpeed drops them); every trained parameter must
be in exactly one group. Pure: no processes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from zerobench.config import ConfigError
from zerobench.zero.config import AdamWConfig


@dataclass
class ParamGroups:
    """The resolved groups, ready for ``ZeroOptimizer`` and the partition's per-chunk ranges."""

    groups: list[dict]
    """torch-style groups: ``params`` (trained parameters only) and every hyperparameter filled in."""
    of_param: dict[int, int] = field(default_factory=dict)
    """``id(parameter)`` -> index of its group."""
    explicit: bool = False
    """Whether the user gave the groups (weight decay on every parameter of a decaying group) or not (one
    group, weight decay on 2+-dim parameters only)."""

    def decays(self, p: nn.Parameter) -> bool:
        """Whether weight decay reaches ``p`` (its rate is its group's, read at every step)."""
        return self.explicit or p.dim() >= 2


def _defaults(cfg: AdamWConfig) -> dict:
    return {"lr": cfg.lr, "betas": tuple(cfg.betas), "eps": cfg.eps, "weight_decay": cfg.weight_decay}


def _as_dicts(given) -> list[dict]:
    if isinstance(given, (torch.Tensor, dict)):
        raise ConfigError(
            "param_groups must be an iterable of parameters or of dicts with 'params' "
            "(as torch.optim takes), not a single tensor or dict"
        )
    items = list(given)
    if not items:
        raise ConfigError("param_groups is empty: pass model.parameters() or a list of groups")
    if all(isinstance(g, dict) for g in items):
        return [dict(g) for g in items]
    if any(isinstance(g, dict) for g in items):
        raise ConfigError("param_groups mixes dicts and parameters: give all groups as dicts with 'params'")
    return [{"params": items}]


def _params_of(i: int, group: dict) -> list:
    if "params" not in group:
        raise ConfigError(f"param_groups[{i}] has no 'params': give each group its list of parameters")
    ps = group["params"]
    ps = [ps] if isinstance(ps, torch.Tensor) else list(ps) if isinstance(ps, Iterable) else [ps]
    if ps and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in ps):
        return [p for _, p in ps]  # model.named_parameters(), as torch.optim takes it since 2.5
    return ps


def resolve_param_groups(
    named: list[tuple[str, nn.Parameter]], given, cfg: AdamWConfig, model: nn.Module | None = None
) -> ParamGroups:
    """``named``: the trained parameters (unique, in any order); ``given``: the user's groups, None, or a
    callable ``given(model)`` returning them (for parameters that tensor parallelism replaces before ZeRO
    is applied, as in ``parallelize``). One line naming the first problem: a tensor that is not the model's,
    a parameter in two groups, a trained parameter in none."""
    trained = [p for _, p in named]
    if callable(given):
        given = given(model)
    if given is None:
        return ParamGroups([{"params": trained, **_defaults(cfg)}], {id(p): 0 for p in trained})
    name_of = {id(p): n for n, p in named}
    of_param: dict[int, int] = {}
    groups = []
    for i, group in enumerate(_as_dicts(given)):
        kept = []
        for p in _params_of(i, group):
            if not isinstance(p, torch.Tensor):
                raise ConfigError(f"param_groups[{i}] holds a {type(p).__name__}, not a parameter")
            if id(p) not in name_of:
                if isinstance(p, nn.Parameter) and not p.requires_grad:
                    continue  # frozen: not trained, as DeepSpeed drops it
                raise ConfigError(
                    f"param_groups[{i}] holds a tensor of shape {tuple(p.shape)} that is not one "
                    f"of the model's trained parameters: build the groups from model.parameters()"
                )
            if id(p) in of_param:
                where = "twice" if of_param[id(p)] == i else f"in param_groups[{of_param[id(p)]}] too"
                raise ConfigError(
                    f"parameter {name_of[id(p)]} is in param_groups[{i}] {where}: put each parameter in one group"
                )
            of_param[id(p)] = i
            kept.append(p)
        groups.append({**_defaults(cfg), **group, "params": kept})
    first = {id(p): i for i, p in enumerate(model.parameters())} if model is not None else {}
    missing = [n for n, p in sorted(named, key=lambda np_: first.get(id(np_[1]), 0)) if id(p) not in of_param]
    if missing:
        raise ConfigError(
            f"parameter {missing[0]} requires a gradient but is in no param group"
            f"{f' ({len(missing)} such)' if len(missing) > 1 else ''}: add it to one, or set "
            f"requires_grad=False"
        )
    return ParamGroups(groups, of_param, explicit=True)
