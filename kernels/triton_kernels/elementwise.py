"""Fused bias + GeLU (erf and tanh forms), forward and backward, and the multi-tensor flat copy (Triton)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_kernels.common import dtype_code, store_cast

BLOCK = 1024
# The constants are written as literals inside the kernels: compiled Triton refuses plain float globals
# (1/sqrt(2) = 0.7071067811865476, sqrt(2/pi) = 0.7978845608028654, 1/sqrt(2 pi) = 0.3989422804014327).


@triton.jit
def _bias_gelu_fwd(x_ptr, b_ptr, y_ptr, total, n, TANH: tl.constexpr, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < total
    u = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u += tl.load(b_ptr + offs % n, mask=mask, other=0.0).to(tl.float32)
    if TANH:
        y = u * tl.sigmoid(2.0 * 0.7978845608028654 * (u + 0.044715 * u * u * u))  # 0.5*(1+tanh z) == sigmoid(2z)
    else:
        y = 0.5 * u * (1.0 + tl.math.erf(u * 0.7071067811865476))
    store_cast(y_ptr + offs, y, mask, DTYPE)


@triton.jit
def _bias_gelu_bwd(
    dy_ptr, x_ptr, b_ptr, dx_ptr, total, n, TANH: tl.constexpr, DTYPE: tl.constexpr, BLOCK: tl.constexpr
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < total
    u = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u += tl.load(b_ptr + offs % n, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if TANH:
        sg = tl.sigmoid(2.0 * 0.7978845608028654 * (u + 0.044715 * u * u * u))
        d = sg + 2.0 * u * sg * (1.0 - sg) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * u * u)
    else:
        d = 0.5 * (1.0 + tl.math.erf(u * 0.7071067811865476)) + u * 0.3989422804014327 * tl.exp(-0.5 * u * u)
    store_cast(dx_ptr + offs, dy * d, mask, DTYPE)


def bias_gelu_fwd(x: torch.Tensor, bias: torch.Tensor, tanh_form: bool) -> torch.Tensor:
    y = torch.empty_like(x)
    total = x.numel()
    if total:
        _bias_gelu_fwd[(triton.cdiv(total, BLOCK),)](
            x, bias, y, total, bias.numel(), TANH=tanh_form, DTYPE=dtype_code(x.dtype), BLOCK=BLOCK
        )
    return y


def bias_gelu_bwd(dy: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, tanh_form: bool) -> torch.Tensor:
    dx = torch.empty_like(x)
    total = x.numel()
    if total:
        _bias_gelu_bwd[(triton.cdiv(total, BLOCK),)](
            dy, x, bias, dx, total, bias.numel(), TANH=tanh_form, DTYPE=dtype_code(x.dtype), BLOCK=BLOCK
        )
    return dx


@triton.jit
def _flat_copy(flat_ptr, addr_ptr, pieces_ptr, UNPACK: tl.constexpr, BLOCK: tl.constexpr):
    # One program per piece (tensor index, element offset in tensor, element offset in flat, elements).
    row = tl.program_id(0).to(tl.int64) * 4
    t = tl.load(pieces_ptr + row)
    toff = tl.load(pieces_ptr + row + 1)
    foff = tl.load(pieces_ptr + row + 2)
    count = tl.load(pieces_ptr + row + 3)
    base = tl.load(addr_ptr + t).to(tl.pointer_type(flat_ptr.dtype.element_ty))
    for start in range(0, count, BLOCK):
        i = start + tl.arange(0, BLOCK).to(tl.int64)
        mask = i < count
        if UNPACK:
            tl.store(base + toff + i, tl.load(flat_ptr + foff + i, mask=mask), mask=mask)
        else:
            tl.store(flat_ptr + foff + i, tl.load(base + toff + i, mask=mask), mask=mask)


def flat_copy_(flat: torch.Tensor, tensors: list[torch.Tensor], pieces: torch.Tensor, unpack: bool) -> None:
    """``pieces`` in elements (not bytes): rows of ``kernels.tables.copy_pieces`` with element sizes."""
    if pieces.shape[0] == 0:
        return
    addrs = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=flat.device)
    _flat_copy[(pieces.shape[0],)](flat, addrs, pieces, UNPACK=unpack, BLOCK=BLOCK)
