"""Which parameters the engine trains, and which stage-3 unit gathers each one. Pure bookkeeping over a
model's modules: no tensors are touched.

- Only parameters with ``requires_grad`` are trained (frozen ones stay as the model holds them: whole
  on every rank, no gradient, no optimizer state, never communicated).
- A parameter belongs to the unit whose module holds it. One reachable from several units (a weight
  shared between blocks) or from none (embeddings, final norm, a tied head) belongs to the *root* unit,
  which stays gathered across the whole forward and the whole backward, so every use of a shared
  weight sees it gathered.
- Units that own no parameter (``nn.GELU()`` in a block list, a block whose weights are all shared or
  frozen) need no gathering and are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from zerobench.config import ConfigError


@dataclass(frozen=True)
class UnitAssignment:
    """The trained parameters in registration order, the units that own any, and each one's owner."""

    named: list[tuple[str, nn.Parameter]]
    units: list[nn.Module]
    unit_of: dict[int, int]
    """``id(param)`` -> 1-based index into ``units``; 0 (the root) where no single unit owns it."""


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Distinct parameters that need a gradient, first name kept for a tied one."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def assign_units(model: nn.Module, units: list[nn.Module]) -> UnitAssignment:
    """Assign every trained parameter to a unit (see the module docstring)."""
    _check_disjoint(model, units)
    named = trainable_parameters(model)
    trained = {id(p) for _, p in named}
    owners: dict[int, set[int]] = {}
    for u, m in enumerate(units):
        for p in m.parameters():
            if id(p) in trained:
                owners.setdefault(id(p), set()).add(u)
    kept = sorted({next(iter(us)) for us in owners.values() if len(us) == 1})
    index = {u: i + 1 for i, u in enumerate(kept)}
    unit_of = {pid: index[next(iter(us))] if len(us) == 1 else 0 for pid, us in owners.items()}
    return UnitAssignment(named, [units[u] for u in kept], unit_of)


def _check_disjoint(model: nn.Module, units: list[nn.Module]) -> None:
    name_of = {id(m): n or "<root>" for n, m in model.named_modules()}
    seen: dict[int, int] = {}
    for u, m in enumerate(units):
        if id(m) not in name_of:
            raise ConfigError(f"stage-3 unit {u} ({type(m).__name__}) is not a submodule of the model")
        if m is model:
            raise ConfigError("the model itself cannot be a stage-3 unit: pass its blocks (the root is one already)")
        if id(m) in seen:
            raise ConfigError(f"module {name_of[id(m)]!r} is listed twice among the stage-3 units")
        seen[id(m)] = u
    for m in units:
        for sub in m.modules():
            if sub is not m and id(sub) in seen:
                raise ConfigError(
                    f"stage-3 units must not nest: {name_of[id(sub)]!r} is inside {name_of[id(m)]!r}; "
                    "list one of them"
                )
