"""The trained model as one plain state dict, for ``model.load_state_dict`` on a model without ZeRO.

``full_state_dict(engine)`` is called on every DP rank (each bucket of the fp32 master is all-gathered in turn, so
a rank holds one bucket's full values on its device at a time). Its keys are the model's own ``state_dict()`` keys
in its order: every trained parameter's full value (a tied one under each name it is registered by), the persistent
buffers (DP rank 0's) and the frozen parameters (unless ``exclude_frozen_parameters``), then each module's extra
state (``get_extra_state()``, under ``<module>._extra_state``). Trained values come from
the fp32 master, in the training dtype by default. Under tensor parallelism each TP rank holds its own slices: a
whole state dict is refused in one line (save a sharded checkpoint, one ``tp-XX`` directory per TP rank, and
consolidate each with ``zero/state/checkpoint.py``'s ``consolidate``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from zerobench.config import ConfigError
from zerobench.files import replace_file
from zerobench.zero.protocols import Engine
from zerobench.zero.state.shards import iter_full


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


EXTRA_STATE = "_extra_state"
"""torch's ``state_dict`` key for a module's ``get_extra_state()`` (``nn.modules.module._EXTRA_STATE_KEY_SUFFIX``)."""


def extra_states(model: nn.Module) -> dict[str, nn.Module]:
    """``{state_dict key: module}`` for every module that keeps extra state (overrides ``get_extra_state``, as
    Transformer Engine's FP8 layers do), which ``state_dict()`` saves beside its tensors and ``load_state_dict``
    hands to ``set_extra_state``; a shared module under each of its names."""
    return {
        f"{prefix}.{EXTRA_STATE}" if prefix else EXTRA_STATE: mod
        for prefix, mod in model.named_modules(remove_duplicate=False)
        if type(mod).get_extra_state is not nn.Module.get_extra_state
    }


def full_state_dict(
    engine: Engine, dtype: torch.dtype | None = None, exclude_frozen_parameters: bool = False, rank0_only: bool = True
) -> dict[str, torch.Tensor]:
    """The model's whole state dict on the host, on DP rank 0 (every rank with ``rank0_only=False``; the others
    get ``{}``). Trained parameters in ``dtype`` (default: the training dtype). Collective over the DP group."""
    if engine.tp_group is not None:
        raise ConfigError(
            "a TP-sharded model has no one state dict: each TP rank holds its own slices; save with "
            "a sharded checkpoint (one tp-XX directory per TP rank) and consolidate each directory"
        )
    dtype = dtype if dtype is not None else engine.param_dtype
    keep = not rank0_only or engine.group.rank == 0
    full = {}
    engine.storage.adopt_edits()
    for i, value in iter_full(engine, engine.adamw.master):
        if keep:
            full[id(engine.zparams[i].param)] = value.to(device="cpu", dtype=dtype, copy=True)
    if not keep:
        return {}
    named = state_entries(engine.module, {id(zp.param) for zp in engine.zparams}, not exclude_frozen_parameters)
    out = {k: full[id(t)] if id(t) in full else t.detach().to("cpu", copy=True) for k, t in named}
    out.update({k: mod.get_extra_state() for k, mod in extra_states(engine.module).items()})
    return out


def save_whole(obj, path: Path) -> None:
    """``torch.save`` to ``path`` through ``files.replace_file``: a reader, or a machine that loses power, sees the
    old file or the new one, never half of one."""
    replace_file(path, lambda f: torch.save(obj, f))
