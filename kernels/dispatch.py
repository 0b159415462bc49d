"""Shared pieces of the custom ops (``kernels/ops.py``, ``kernels/transformer_ops.py``): dtype codes for
the C++ library, raw pointers, the lazy Triton import and fp32 staging of CPU inputs."""

from __future__ import annotations

import torch
from torch import Tensor

CPU_COPY_PIECE_BYTES = 1 << 20
_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _ptr(t: Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


def _code(t: Tensor) -> int:
    if t.dtype not in _CODES:
        raise TypeError(f"kernels take fp32, bf16 or fp16 tensors, got {t.dtype}")
    return _CODES[t.dtype]


def _triton():
    import kernels.triton_kernels  # noqa: F401  (imports triton)
    from kernels.triton_kernels import adamw, elementwise, norm_softmax

    return adamw, elementwise, norm_softmax


def _cpu_fp32(*ts: Tensor) -> list[Tensor]:
    return [t.detach().float().contiguous() for t in ts]
