"""Which parameters the engine trains, and which stage-3 unit gathers each one. Pure bookkeeping over a
model's modules: no tensors are touched.

- Only parameters with ``requires_grad`` are trained (frozen ones stay as the model holds them: whole
  on every rank, no gradient, no optimizer state, never communicated).
- A parameter belongs to the unit whose module holds it. One reachable from several units (a weight
  shared between blocks), from a unit and a module outside every unit (a head tied to a layer's weight) or
  from no unit (embeddings, final norm, a head tied to them) belongs to the *root* unit,
  which stays gathered across the whole forward and the whole backward, so every use of a shared
  weight sees it gathered.
- A parameter given as *external* (``apply_zero(..., external_params=...)``: read outside the forward of the unit
  that holds it, by a parent's forward, a unit called through another method than ``forward``, or a unit that
  returns it, as DeepSpeed's ``register_external_parameter``) belongs to the root too.
- Units that own no parameter (``nn.GELU()`` in a block list, a block whose weights are all shared or
  frozen) need no gathering and are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from zerobench.config import ConfigError


@dataclass(frozen=True)
class UnitPlan:
    """Stage 3's gather units as ``apply_zero`` resolved them, and the parameters the root owns whatever module
    holds them."""

    modules: list[nn.Module]
    external: frozenset[int] = frozenset()
    """``id(param)`` of each parameter given as ``external_params``."""


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


def assign_units(model: nn.Module, units: list[nn.Module], external: frozenset[int] = frozenset()) -> UnitAssignment:
    """Assign every trained parameter to a unit (see the module docstring)."""
    _check_disjoint(model, units)
    named = trainable_parameters(model)
    trained = {id(p) for _, p in named} - external
    owners: dict[int, set[int]] = {}
    for u, m in enumerate(units):
        for p in m.parameters():
            if id(p) in trained:
                owners.setdefault(id(p), set()).add(u)
    inside = {id(s) for m in units for s in m.modules()}
    at_root = {id(p) for m in model.modules() if id(m) not in inside for p in m.parameters(recurse=False)}
    sole = {pid: next(iter(us)) for pid, us in owners.items() if len(us) == 1 and pid not in at_root}
    kept = sorted(set(sole.values()))
    index = {u: i + 1 for i, u in enumerate(kept)}
    unit_of = {pid: index[sole[pid]] if pid in sole else 0 for pid in owners}
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
                    f"stage-3 units must not nest: {name_of[id(sub)]!r} is inside {name_of[id(m)]!r}; list one of them"
                )


def resolve_external(model: nn.Module, params) -> frozenset[int]:
    """``external_params`` (parameters of ``model`` or their names, as ``named_parameters`` spells them) as ids;
    anything else is one line."""
    if params is None:
        return frozenset()
    if isinstance(params, (str, nn.Parameter)):
        params = [params]
    by_name = dict(model.named_parameters(remove_duplicate=False))
    trained = {id(p) for _, p in trainable_parameters(model)}
    ids, out = {id(v) for v in by_name.values()}, set()
    for p in params:
        q = by_name.get(p) if isinstance(p, str) else p
        if not isinstance(q, nn.Parameter) or id(q) not in ids:
            what = (
                repr(p)
                if isinstance(p, str)
                else f"a {type(p).__name__} of shape {tuple(p.shape)}"
                if hasattr(p, "shape")
                else f"{p!r} of type {type(p).__name__}"
            )
            raise ConfigError(
                f"external_params: {what} is not a parameter of the model: give its parameters or "
                "their names, as model.named_parameters() spells them"
            )
        if id(q) not in trained:
            name = next(n for n, v in by_name.items() if v is q)
            raise ConfigError(
                f"external_params: {name!r} is frozen (requires_grad=False): a frozen parameter is "
                "never sharded, so leave it out"
            )
        out.add(id(q))
    return frozenset(out)
