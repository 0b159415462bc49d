"""DeepSpeed's checkpoint directory on a ``ZeroEngine``: ``engine.save_checkpoint(save_dir, tag, client_state)``
and ``engine.load_checkpoint(load_dir, tag)``, called on every rank, as DeepSpeed's.

``save_dir/<tag>/`` holds the engine's sharded checkpoint (``zero/state_dict.py``: parameters, fp32 master,
moments, step count, loss scale, the param group's hyperparameters; any DP size can load it), plus, from the
first rank, ``module_extra.pt`` (the model's state the engine does not hold: persistent buffers such as
BatchNorm's running statistics, and frozen parameters, named in ``frozen.json``; under TP one file per TP rank)
and ``client_state.pt`` (the caller's dict), and ``lr_scheduler.pt`` (``engine.lr_scheduler``'s state, where the engine
has one). ``save_dir/latest`` names the newest tag and is written after every rank has finished
its files, so it never points at a half-written checkpoint. Every file loads with ``weights_only=True``:
``client_state`` must hold tensors and plain Python data, which is checked when saving.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from zerobench.config import ConfigError
from zerobench.zero.checkpoint_files import load_file
from zerobench.zero.state_dict import load_checkpoint, rank_dir, save_checkpoint

LATEST = "latest"
SCHEDULER = "lr_scheduler.pt"
FROZEN = "frozen.json"
"""Beside ``module_extra.pt``: which of its names are frozen parameters (the rest are buffers)."""


def state_entries(model: nn.Module, trained: set[int], frozen: bool = True) -> list[tuple[str, torch.Tensor]]:
    """(``state_dict`` key, the tensor registered there) in ``model.state_dict()``'s order: each module's parameters
    (those in ``trained``, and the frozen ones unless ``frozen=False``), then its persistent buffers; a shared
    module under each of its names."""
    out = []
    for prefix, mod in model.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        for name, p in mod._parameters.items():
            if p is not None and (frozen or id(p) in trained):
                out.append((dot + name, p))
        for name, b in mod._buffers.items():
            if b is not None and name not in mod._non_persistent_buffers_set:
                out.append((dot + name, b))
    return out


def _extras(engine, frozen: bool = True) -> dict[str, torch.Tensor]:
    """The model's persistent buffers and (unless ``frozen=False``) frozen parameters, by ``state_dict`` name:
    what the engine does not hold (at stage 3 frozen parameters stay whole on every rank)."""
    trained = {id(zp.param) for zp in engine.zparams}
    return {k: t for k, t in state_entries(engine.module, trained, frozen) if id(t) not in trained}


def _plain(state: dict, what: str = "client_state") -> bytes:
    """``state`` serialised, or one line saying why it would not load back with ``weights_only=True``."""
    buf = io.BytesIO()
    try:
        torch.save(state, buf)
        torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    except (pickle.PickleError, TypeError, AttributeError) as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
        first = next((ln for ln in lines if "Unsupported global" in ln), lines[0])
        raise ConfigError(f"{what} must hold only tensors and plain Python data (checkpoints load with "
                          f"weights_only=True): {first}") from None
    return buf.getvalue()


def _first(engine) -> bool:
    return engine.group.rank == 0


def _barrier(engine) -> None:
    """Every rank of the engine's DP group, then of its TP group, is past this point."""
    for g in (engine.group, engine.tp_group):
        if g is not None and g.size > 1:
            dist.barrier(group=g.pg)


def save_tagged(engine, save_dir: str | os.PathLike, tag: str | None = None, client_state: dict | None = None,
                save_latest: bool = True, exclude_frozen_parameters: bool = False) -> Path:
    """Save into ``save_dir/<tag>`` (default tag ``global_step<N>``, N the optimizer steps taken) and point
    ``save_dir/latest`` at it (not with ``save_latest=False``); returns the tag's directory. As DeepSpeed's,
    ``exclude_frozen_parameters=True`` leaves the frozen parameters out (load it with ``load_module_strict=False``)."""
    tag = str(tag) if tag is not None else f"global_step{engine.adamw.step_count}"
    if not tag or "/" in tag or tag in (".", ".."):
        raise ConfigError(f"checkpoint tag {tag!r} must be one directory name (no '/')")
    blob = _plain(dict(client_state or {}))
    sched = None if engine.lr_scheduler is None else _plain(engine.lr_scheduler.state_dict(), "lr_scheduler.state_dict()")
    path = Path(save_dir) / tag
    save_checkpoint(engine, path)
    first_tp = engine.tp_group is None or engine.tp_group.rank == 0
    if _first(engine):  # save_checkpoint made rank_dir
        extra = _extras(engine, not exclude_frozen_parameters)
        torch.save({n: t.detach().cpu().clone() for n, t in extra.items()}, rank_dir(engine, path) / "module_extra.pt")
        (rank_dir(engine, path) / FROZEN).write_text(json.dumps(sorted(n for n, t in extra.items()
                                                                       if isinstance(t, nn.Parameter))))
        if first_tp:
            (path / "client_state.pt").write_bytes(blob)
            if sched is not None:
                (path / SCHEDULER).write_bytes(sched)
    _barrier(engine)
    if save_latest and _first(engine) and first_tp:
        tmp = Path(save_dir) / f".{LATEST}.tmp"
        tmp.write_text(tag)
        os.replace(tmp, Path(save_dir) / LATEST)
    _barrier(engine)
    return path


def tagged_path(root: str | os.PathLike, tag: str | None) -> Path | None:
    """``root/<tag>`` (default: the tag ``root/latest`` names); None when no tag is given and there is no
    ``latest``; a tag with no directory is one line."""
    root = Path(root)
    if tag is None:
        if not (root / LATEST).exists():
            return None
        tag = (root / LATEST).read_text().strip()
    path = root / str(tag)
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint {tag!r} in {root}")
    return path


@torch.no_grad()
def load_tagged(engine, load_dir: str | os.PathLike, tag: str | None = None, load_module_strict: bool = True,
                load_optimizer_states: bool = True, load_lr_scheduler_states: bool = True,
                load_module_only: bool = False) -> tuple[str | None, dict | None]:
    """Load ``load_dir/<tag>`` (default: the tag ``load_dir/latest`` names); returns (its path, the client
    state). With no tag given and no ``latest``, warns and returns (None, None), as DeepSpeed does. DeepSpeed's
    options: ``load_optimizer_states=False`` loads the weights and the counters, and keeps this engine's moments,
    step count, loss scale and learning rates; ``load_module_only=True`` loads the weights alone;
    ``load_module_strict=False`` skips the buffers and frozen parameters that the checkpoint or the model lacks;
    ``load_lr_scheduler_states=False`` leaves ``engine.lr_scheduler`` where it is (it loads otherwise, unless
    ``load_module_only``; a checkpoint saved without one warns that the schedule starts from its beginning)."""
    path = tagged_path(load_dir, tag)
    if path is None:
        warnings.warn(f"no checkpoint to load: {Path(load_dir) / LATEST} does not exist", stacklevel=3)
        return None, None
    counters = load_checkpoint(engine, path, optimizer_states=load_optimizer_states and not load_module_only)
    if not load_module_only:
        engine.global_steps = counters["global_steps"]
    _load_extras(engine, path, load_module_strict)
    if load_lr_scheduler_states and not load_module_only and engine.lr_scheduler is not None:
        _load_scheduler(engine.lr_scheduler, path)
    client = load_file(path / "client_state.pt")
    return str(path), client


def _load_extras(engine, path: Path, strict: bool) -> None:
    """The saved buffers and frozen parameters into the model; under ``strict`` the names must match both ways."""
    extra = load_file(rank_dir(engine, path) / "module_extra.pt")
    here = _extras(engine)
    missing, unexpected = sorted(set(here) - set(extra)), sorted(set(extra) - set(here))
    if strict and (missing or unexpected):
        what = (f"lacks {missing[:4]} of this model's buffers and frozen parameters" if missing else
                f"holds {unexpected[:4]}, which this model lacks")
        raise ValueError(f"checkpoint {path} {what}: load it with load_module_strict=False to skip them")
    for name, value in extra.items():
        target = here.get(name)
        if target is not None and target.shape != value.shape:
            raise ValueError(f"checkpoint {path} holds {name!r} {tuple(value.shape)}, which this model has as "
                             f"{tuple(target.shape)}")
        if target is not None:
            target.copy_(value)


def _load_scheduler(scheduler, path: Path) -> None:
    """The saved schedule state into ``scheduler``; a checkpoint without one warns (DeepSpeed's would fail)."""
    if not (path / SCHEDULER).exists():
        warnings.warn(f"checkpoint {path} holds no learning-rate scheduler state (saved by an engine without one): "
                      "the scheduler starts from its beginning", stacklevel=4)
        return
    scheduler.load_state_dict(load_file(path / SCHEDULER))
