"""Which of a model's state dict entries a tagged checkpoint (``checkpoints.py``) loads, and from where: the
entries the engine does not hold (buffers, frozen parameters, modules' extra state: ``module_extra.pt``), and in
a weights-only load every entry by name, as ``model.load_state_dict`` takes them from a saved state dict
(``ByName``). Each function reads and checks; none changes the model."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from zerobench.zero.protocols import Engine
from zerobench.zero.state.checkpoint import rank_dir
from zerobench.zero.state.export import extra_states, state_entries
from zerobench.zero.state.reading import load_file, read_json
from zerobench.zero.state.shards import ByName


def engine_extras(engine: Engine, frozen: bool = True) -> dict[str, torch.Tensor]:
    """The model's persistent buffers and (unless ``frozen=False``) frozen parameters, by ``state_dict`` name:
    what the engine does not hold (at stage 3 frozen parameters stay whole on every rank)."""
    trained = {id(zp.param) for zp in engine.zparams}
    return {k: t for k, t in state_entries(engine.module, trained, frozen) if id(t) not in trained}


def module_extra_file(dp_rank: int) -> str:
    """The file of one DP rank's own buffers and extra states, written where the ranks' differ."""
    return f"module_extra-dp{dp_rank:05d}.pt"


def read_module_extra(engine: Engine, path: Path) -> dict:
    """The saved buffers, frozen parameters and extra states this rank loads: the first rank's
    (``module_extra.pt``), with this DP rank's own buffers and extra states over them where the save wrote one per
    rank (their values differed). A world of another DP size than the one that saved them is warned about: ranks
    beyond it get the first rank's."""
    d = rank_dir(engine, path)
    extra = load_file(d / "module_extra.pt")
    per_rank = sorted(d.glob("module_extra-dp*.pt"))
    if not per_rank:
        return extra
    rank, size = engine.group.rank, engine.group.size
    own = d / module_extra_file(rank)
    if len(per_rank) != size:
        gets = "the ones it saved" if own.is_file() else "the first rank's"
        warnings.warn(
            f"checkpoint {path} holds buffers per DP rank, saved by {len(per_rank)} ranks, and this run has {size}: "
            f"DP rank {rank} gets {gets}",
            stacklevel=5,
        )
    return {**extra, **load_file(own)} if own.is_file() else extra


@dataclass(frozen=True)
class Gathered:
    """In ``route_by_name``'s copies: the value ``ByName.gathered[name]`` will hold once the shards are read."""

    name: str


def route_by_name(engine: Engine, path: Path, strict: bool) -> tuple[ByName, list[tuple]]:
    """Where each of this model's state dict entries comes from in a weights-only load, as
    ``model.load_state_dict`` would take them from the saved state dict (see ``ByName``): (the spec for the shards,
    (tensor or module, its value) to copy or set, in state_dict order, the value from ``module_extra.pt`` or, for a
    frozen tensor saved trained, ``Gathered`` from the shards). Under ``strict`` the model's and the checkpoint's
    keys must match both ways (the trained set at save time does not matter); shapes always. Changes nothing."""
    d = rank_dir(engine, path)
    meta = read_json(d / "meta.json")
    params = meta.get("params") if isinstance(meta.get("params"), dict) else {}
    # where each saved key's value is: a shard's parameter (under its own name, or the one it is tied to)
    in_shards = {**{n: n for n in params}, **{a: n for a, n in (meta.get("aliases") or {}).items() if n in params}}
    extra = read_module_extra(engine, path)
    trained = {id(zp.param): zp for zp in engine.zparams}  # (at stage 3 the module holds placeholders)
    here = {**dict(state_entries(engine.module, set(trained))), **extra_states(engine.module)}
    missing = sorted(set(here) - set(in_shards) - set(extra))
    unexpected = sorted((set(in_shards) | set(extra)) - set(here))
    if strict:
        _refuse_keys(path, missing, unexpected, "parameters, buffers and extra state")
    spec, copies = ByName(), []
    for key, target in here.items():  # in state_dict order: of a tied parameter's keys, the last one saved wins
        zp = trained.get(id(target)) if torch.is_tensor(target) else None
        if zp is not None:  # trained here
            if key in in_shards:
                spec.sources[zp.name] = in_shards[key]
                spec.whole.pop(zp.name, None)
            elif key in extra:
                spec.whole[zp.name] = _fits(path, key, extra[key], zp.slot.shape)
                spec.sources[zp.name] = None
        elif key in extra:
            copies.append(
                (target, _fits(path, key, extra[key], target.shape) if torch.is_tensor(target) else extra[key])
            )
        elif key in in_shards:  # trained when saved, frozen (or a buffer) here
            _check_shape(path, key, tuple(params[in_shards[key]]), target.shape)
            copies.append((target, Gathered(in_shards[key])))
    for zp in engine.zparams:  # a parameter the checkpoint lacks keeps its own values (not strict)
        spec.sources.setdefault(zp.name, None)
    spec.gather = frozenset(v.name for _, v in copies if isinstance(v, Gathered))
    return spec, copies


def _fits(path: Path, name: str, value, shape: torch.Size) -> torch.Tensor:
    """``value``, the checkpoint's ``name``, if it is a tensor of this model's ``shape``; else one line."""
    if not torch.is_tensor(value):
        raise ValueError(f"checkpoint {path} holds {name!r} {_shape(value)}, which this model has as a tensor")
    _check_shape(path, name, tuple(value.shape), shape)
    return value


def _check_shape(path: Path, name: str, saved: tuple, shape: torch.Size) -> None:
    if tuple(saved) != tuple(shape):
        raise ValueError(
            f"checkpoint {path} holds {name!r} as {tuple(saved)}, which this model has as {tuple(shape)}: it was "
            "saved from another model size"
        )


def check_extras(engine: Engine, path: Path, strict: bool) -> list[tuple]:
    """The saved buffers, frozen parameters and modules' extra state, as (the model's tensor or module, its saved
    value) to copy or hand to ``set_extra_state``; under ``strict`` the names must match both ways, and tensor
    shapes always. Changes nothing."""
    extra = read_module_extra(engine, path)
    here = {**engine_extras(engine), **extra_states(engine.module)}
    missing, unexpected = sorted(set(here) - set(extra)), sorted(set(extra) - set(here))
    if strict:
        _refuse_keys(path, missing, unexpected, "buffers, frozen parameters and extra state")
    copies = []
    for name, value in extra.items():
        target = here.get(name)
        if torch.is_tensor(target):
            _fits(path, name, value, target.shape)
        if target is not None:
            copies.append((target, value))
    return copies


def _shape(value) -> str:
    return str(tuple(value.shape)) if torch.is_tensor(value) else f"as a {type(value).__name__}"


def _refuse_keys(path: Path, missing: list[str], unexpected: list[str], what: str) -> None:
    """A strict load's one line for keys the checkpoint or the model lacks (none: nothing)."""
    if missing or unexpected:
        which = (
            f"lacks {missing[:4]} of this model's {what}"
            if missing
            else f"holds {unexpected[:4]}, which this model lacks"
        )
        raise ValueError(f"checkpoint {path} {which}: load it with load_module_strict=False to skip them")
