"""Helpers shared by the Triton kernels."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def to_bf16_rne(x):
    """fp32 -> bf16, round to nearest even (NaN stays a quiet NaN) — the same bits as ``x.to(torch.bfloat16)``."""
    u = x.to(tl.uint32, bitcast=True)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    quiet = (u >> 16) | 0x40
    return tl.where(nan, quiet, rounded).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def store_cast(ptr, x, mask, DTYPE: tl.constexpr):
    """Store fp32 ``x`` as DTYPE (0 fp32, 1 bf16 with RNE, 2 fp16)."""
    if DTYPE == 1:
        tl.store(ptr, to_bf16_rne(x), mask=mask)
    elif DTYPE == 2:
        tl.store(ptr, x.to(tl.float16), mask=mask)
    else:
        tl.store(ptr, x, mask=mask)


def dtype_code(dtype: torch.dtype) -> int:
    codes = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
    if dtype not in codes:
        raise TypeError(f"kernels take fp32, bf16 or fp16 tensors, got {dtype}")
    return codes[dtype]
