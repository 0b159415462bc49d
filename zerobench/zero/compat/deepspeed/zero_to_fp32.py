"""DeepSpeed's ``zero_to_fp32`` functions on a directory ``engine.save_checkpoint`` wrote, in one process and no
group: ``get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)``,
``load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag)`` and
``convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir, tag)`` (``zerobench zero-to-fp32``).

The keys are the model's own ``state_dict()`` keys, as ``full_state_dict`` gives them from a live engine: every
trained parameter's fp32 value (a tied one under each name), then the saved buffers and frozen parameters. A
checkpoint that is not whole is refused (``zero/state/checkpoint.py``); every file loads with ``weights_only=True``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from zerobench.zero.compat.deepspeed.checkpoints import FROZEN, LATEST, tagged_path
from zerobench.zero.state.checkpoint import consolidate
from zerobench.zero.state.export import save_whole
from zerobench.zero.state.transaction import CheckpointMismatch, load_file


def _tag_dir(checkpoint_dir: str | os.PathLike, tag: str | None) -> Path:
    if not Path(checkpoint_dir).is_dir():
        what = " (it is a file: give the directory save_checkpoint wrote)" if Path(checkpoint_dir).exists() else ""
        raise FileNotFoundError(f"no checkpoint directory {checkpoint_dir}{what}")
    path = tagged_path(checkpoint_dir, tag)
    if path is None:
        raise FileNotFoundError(f"no {LATEST} file in {checkpoint_dir}: name the checkpoint's tag (e.g. global_step10)")
    return path


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
        try:
            names = json.loads((path / FROZEN).read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointMismatch(f"checkpoint file {path / FROZEN} is damaged: {e}") from None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise CheckpointMismatch(f"checkpoint file {path / FROZEN} is damaged: not a list of names")
        frozen = set(names)
        unknown = sorted(frozen - set(extra))
        if unknown:
            raise CheckpointMismatch(
                f"checkpoint file {path / FROZEN} is damaged: it names {unknown[:4]}, which the checkpoint does not "
                "hold as buffers or frozen parameters"
            )
        extra = {k: v for k, v in extra.items() if k not in frozen}
    out.update({k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in extra.items()})
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
    """DeepSpeed's: ``get_fp32_state_dict_from_zero_checkpoint`` saved as one file, ``output_dir/filename``
    (default ``pytorch_model.bin``); returns its path."""
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)
    save_whole(sd, Path(output_dir) / filename)
    return Path(output_dir) / filename
