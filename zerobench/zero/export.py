"""The trained model as one plain state dict, for ``model.load_state_dict`` on a model without ZeRO.

From a live engine: ``full_state_dict(engine)`` and DeepSpeed's ``engine.save_16bit_model(save_dir,
save_filename)``, called on every DP rank (each bucket of the fp32 master is all-gathered in turn, so a rank
holds one bucket's full values on its device at a time). From a directory ``engine.save_checkpoint`` wrote:
DeepSpeed's ``zero_to_fp32`` functions, ``get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)``,
``load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag)`` and
``convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir, tag)``, in one process, no group.

Either way the keys are the model's own ``state_dict()`` keys in its order: every trained parameter's full
value (a tied one under each name it is registered by), the persistent buffers (DP rank 0's, as DeepSpeed
saves them) and the frozen parameters (unless ``exclude_frozen_parameters``). Trained values come from the
fp32 master: in the training dtype from the engine (DeepSpeed's 16-bit weights; fp32 for an fp32 engine), in
fp32 from a checkpoint. Under tensor parallelism each TP rank holds its own slices: these refuse in one line
(consolidate one ``tp-XX`` directory of a checkpoint with ``checkpoint.consolidate`` for that rank's slices).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from zerobench.config import ConfigError
from zerobench.zero.checkpoint import consolidate
from zerobench.zero.checkpoint_dir import FROZEN, LATEST, state_entries, tagged_path
from zerobench.zero.checkpoint_files import load_file
from zerobench.zero.state_dict import iter_full


def full_state_dict(
    engine, dtype: torch.dtype | None = None, exclude_frozen_parameters: bool = False, rank0_only: bool = True
) -> dict[str, torch.Tensor]:
    """The model's whole state dict on the host, on DP rank 0 (every rank with ``rank0_only=False``; the others
    get ``{}``). Trained parameters in ``dtype`` (default: the training dtype). Collective over the DP group."""
    if engine.tp_group is not None:
        raise ConfigError(
            "a TP-sharded model has no one state dict: each TP rank holds its own slices; save with "
            "engine.save_checkpoint (one tp-XX directory per TP rank) and consolidate each directory"
        )
    dtype = dtype if dtype is not None else engine.param_dtype
    keep = not rank0_only or engine.group.rank == 0
    full = {}
    for i, value in iter_full(engine, engine.adamw.master):
        if keep:
            full[id(engine.zparams[i].param)] = value.to(device="cpu", dtype=dtype, copy=True)
    if not keep:
        return {}
    named = state_entries(engine.module, {id(zp.param) for zp in engine.zparams}, not exclude_frozen_parameters)
    return {k: full[id(t)] if id(t) in full else t.detach().to("cpu", copy=True) for k, t in named}


def save_16bit_model(
    engine,
    save_dir: str | os.PathLike,
    save_filename: str = "pytorch_model.bin",
    exclude_frozen_parameters: bool = False,
) -> bool:
    """DeepSpeed's ``engine.save_16bit_model``: ``full_state_dict`` written by DP rank 0 to ``save_dir/save_filename``
    (through a temporary file, so a reader never sees half of it). Call it on every rank; it returns True once the
    file is written."""
    if not save_filename or Path(save_filename).name != save_filename:
        raise ConfigError(f"save_filename {save_filename!r} must be one file name (no directory)")
    sd = full_state_dict(engine, exclude_frozen_parameters=exclude_frozen_parameters)
    if engine.group.rank == 0:
        _save_whole(sd, Path(save_dir) / save_filename)
    if engine.group.size > 1:  # on return the file is there for every rank to read
        dist.barrier(group=engine.group.pg)
    return True


def _tag_dir(checkpoint_dir: str | os.PathLike, tag: str | None) -> Path:
    if not Path(checkpoint_dir).is_dir():
        raise FileNotFoundError(f"no checkpoint directory {checkpoint_dir}")
    path = tagged_path(checkpoint_dir, tag)
    if path is None:
        raise FileNotFoundError(f"no {LATEST} file in {checkpoint_dir}: name the checkpoint's tag (e.g. global_step10)")
    return path


def _save_whole(obj, path: Path) -> None:
    """``torch.save`` through a temporary file beside ``path``: a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


def get_fp32_state_dict_from_zero_checkpoint(
    checkpoint_dir: str | os.PathLike, tag: str | None = None, exclude_frozen_parameters: bool = False
) -> dict[str, torch.Tensor]:
    """DeepSpeed's: the fp32 state dict of ``checkpoint_dir/<tag>`` (default: the tag ``latest`` names), written by
    ``engine.save_checkpoint`` on any number of DP ranks. Parameters first (each name a tied one is registered
    by), then the saved buffers and frozen parameters, every floating-point value in fp32; every file loads with
    ``weights_only=True``."""
    path = _tag_dir(checkpoint_dir, tag)
    out = dict(consolidate(path))  # one line naming tp-XX for a TP checkpoint
    extra = load_file(path / "module_extra.pt")
    if exclude_frozen_parameters:
        if not (path / FROZEN).exists():
            raise FileNotFoundError(
                f"checkpoint {path} does not say which saved tensors are frozen parameters (no "
                f"{FROZEN}: saved before it was written): load it without exclude_frozen_parameters"
            )
        frozen = set(json.loads((path / FROZEN).read_text()))
        extra = {k: v for k, v in extra.items() if k not in frozen}
    out.update({k: v.float() if v.is_floating_point() else v for k, v in extra.items()})
    return out


def load_state_dict_from_zero_checkpoint(
    model: nn.Module, checkpoint_dir: str | os.PathLike, tag: str | None = None, strict: bool = True
) -> nn.Module:
    """DeepSpeed's: ``get_fp32_state_dict_from_zero_checkpoint`` loaded into ``model`` (moved to the host first, as
    DeepSpeed's); returns ``model``. ``strict`` as ``load_state_dict``'s (DeepSpeed loads non-strictly)."""
    model = model.cpu()
    model.load_state_dict(get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag), strict=strict)
    return model


def convert_zero_checkpoint_to_fp32_state_dict(
    checkpoint_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    tag: str | None = None,
    exclude_frozen_parameters: bool = False,
    filename: str = "pytorch_model.bin",
) -> Path:
    """DeepSpeed's: ``get_fp32_state_dict_from_zero_checkpoint`` saved as ``output_dir/pytorch_model.bin``
    (one file); returns its path."""
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)
    _save_whole(sd, Path(output_dir) / filename)
    return Path(output_dir) / filename
