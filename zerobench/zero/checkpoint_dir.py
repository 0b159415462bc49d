"""DeepSpeed's checkpoint directory on a ``ZeroEngine``: ``engine.save_checkpoint(save_dir, tag, client_state)``
and ``engine.load_checkpoint(load_dir, tag)``, called on every rank, as DeepSpeed's.

``save_dir/<tag>/`` holds the engine's sharded checkpoint (``zero/state_dict.py``: parameters, fp32 master,
moments, step count, loss scale, the param group's hyperparameters; any DP size can load it), plus, from the
first rank, ``module_extra.pt`` (the model's state the engine does not hold: persistent buffers such as
BatchNorm's running statistics, and frozen parameters; under TP one file per TP rank) and ``client_state.pt``
(the caller's dict). ``save_dir/latest`` names the newest tag and is written after every rank has finished
its files, so it never points at a half-written checkpoint. Every file loads with ``weights_only=True``:
``client_state`` must hold tensors and plain Python data, which is checked when saving.
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from zerobench.config import ConfigError
from zerobench.zero.state_dict import load_checkpoint, rank_dir, save_checkpoint

LATEST = "latest"


def module_extra(engine) -> dict[str, torch.Tensor]:
    """The model's persistent buffers and frozen parameters, by ``state_dict`` name (what the engine does not
    hold; at stage 3 frozen parameters stay whole on every rank)."""
    trained = {id(zp.param) for zp in engine.zparams}
    out = {}
    for prefix, mod in engine.module.named_modules():
        dot = f"{prefix}." if prefix else ""
        for name, b in mod._buffers.items():
            if b is not None and name not in mod._non_persistent_buffers_set:
                out[dot + name] = b.detach().cpu().clone()
        for name, p in mod._parameters.items():
            if p is not None and id(p) not in trained:
                out[dot + name] = p.detach().cpu().clone()
    return out


def _plain(client_state: dict) -> bytes:
    """``client_state`` serialised, or one line saying why it would not load back with ``weights_only=True``."""
    buf = io.BytesIO()
    try:
        torch.save(client_state, buf)
        torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    except (pickle.PickleError, TypeError, AttributeError) as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
        first = next((ln for ln in lines if "Unsupported global" in ln), lines[0])
        raise ConfigError(f"client_state must hold only tensors and plain Python data (checkpoints load with "
                          f"weights_only=True): {first}") from None
    return buf.getvalue()


def _first(engine) -> bool:
    return engine.group.rank == 0


def _barrier(engine) -> None:
    """Every rank of the engine's DP group, then of its TP group, is past this point."""
    for g in (engine.group, engine.tp_group):
        if g is not None and g.size > 1:
            dist.barrier(group=g.pg)


def save_tagged(engine, save_dir: str | os.PathLike, tag: str | None = None, client_state: dict | None = None) -> Path:
    """Save into ``save_dir/<tag>`` (default tag ``global_step<N>``, N the optimizer steps taken) and point
    ``save_dir/latest`` at it; returns the tag's directory."""
    tag = str(tag) if tag is not None else f"global_step{engine.adamw.step_count}"
    if not tag or "/" in tag or tag in (".", ".."):
        raise ConfigError(f"checkpoint tag {tag!r} must be one directory name (no '/')")
    blob = _plain(dict(client_state or {}))
    path = Path(save_dir) / tag
    save_checkpoint(engine, path)
    first_tp = engine.tp_group is None or engine.tp_group.rank == 0
    if _first(engine):  # save_checkpoint made rank_dir
        torch.save(module_extra(engine), rank_dir(engine, path) / "module_extra.pt")
        if first_tp:
            (path / "client_state.pt").write_bytes(blob)
    _barrier(engine)
    if _first(engine) and first_tp:
        tmp = Path(save_dir) / f".{LATEST}.tmp"
        tmp.write_text(tag)
        os.replace(tmp, Path(save_dir) / LATEST)
    _barrier(engine)
    return path


@torch.no_grad()
def load_tagged(engine, load_dir: str | os.PathLike, tag: str | None = None) -> tuple[str | None, dict | None]:
    """Load ``load_dir/<tag>`` (default: the tag ``load_dir/latest`` names); returns (its path, the client
    state). With no tag given and no ``latest``, warns and returns (None, None), as DeepSpeed does."""
    load_dir = Path(load_dir)
    if tag is None:
        if not (load_dir / LATEST).exists():
            warnings.warn(f"no checkpoint to load: {load_dir / LATEST} does not exist", stacklevel=3)
            return None, None
        tag = (load_dir / LATEST).read_text().strip()
    path = load_dir / str(tag)
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint {tag!r} in {load_dir}")
    load_checkpoint(engine, path)
    extra = torch.load(rank_dir(engine, path) / "module_extra.pt", map_location="cpu", weights_only=True)
    mod = engine.module
    for name, value in extra.items():
        owner, _, leaf = name.rpartition(".")
        sub = mod.get_submodule(owner)
        target = sub._parameters.get(leaf) if leaf in sub._parameters else sub._buffers.get(leaf)
        if target is None or target.shape != value.shape:
            raise ValueError(f"checkpoint {path} holds {name!r} {tuple(value.shape)}, which this model "
                             f"{'lacks' if target is None else f'has as {tuple(target.shape)}'}")
        target.copy_(value)
    client = torch.load(path / "client_state.pt", map_location="cpu", weights_only=True)
    return str(path), client
