"""Mixed precision: the model's forward inputs cast to the training dtype.

Under ``Precision.BF16``/``FP16`` the parameters are bf16/fp16, so a model fed fp32 inputs (features, images, a
mask) would fail in its first ``F.linear``. A forward pre-hook on the model given to ``apply_zero`` casts every
floating-point tensor among its positional and keyword arguments (inside tuples, lists, dicts and dataclasses too)
to the training dtype, as FSDP's mixed precision does by default (``ZeroEngine.cast_forward_inputs="all"``);
integer tensors (token ids, labels) and other values pass as they are. Float labels are cast too, as FSDP casts
them. The DeepSpeed-style ``initialize`` casts nothing, as DeepSpeed's engine (``"none"``), or, with
``fp16.auto_cast``, the positional arguments only (``"positional"``). Submodules called on their own (stage 3's
``model.encoder(x)``) are not cast: cast their inputs yourself.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from zerobench.zero.interop.containers import map_tensors
from zerobench.zero.interop.tooling import eager


def cast_floats(value, dtype: torch.dtype):
    """``value`` with every floating-point tensor in it (through tuples, lists, dicts, dataclasses) cast to
    ``dtype``."""
    return map_tensors(lambda t: t.to(dtype) if t.is_floating_point() else t, value)


def cast_forward_inputs(model: nn.Module, engine) -> RemovableHandle | None:
    """Cast ``model``'s floating-point forward inputs to ``engine``'s training dtype (``param_dtype``), those its
    ``cast_forward_inputs`` names at each forward: "all" (positional and keyword), "positional" or "none". No hook
    for float32 training."""
    dtype = engine.param_dtype
    if dtype is torch.float32:
        return None

    def hook(_module, args, kwargs):
        which = engine.cast_forward_inputs
        if which == "none":
            return None
        return cast_floats(args, dtype), (cast_floats(kwargs, dtype) if which == "all" else kwargs)

    return model.register_forward_pre_hook(eager(hook), with_kwargs=True)
