"""LayerNorm forward/backward and causal scaled softmax forward/backward (Triton), one row per program.

Rows are the last dimension (LayerNorm: hidden size; softmax: the key axis of ``[batch, s, s]`` scores),
held whole in one block (``next_power_of_2``), fp32 arithmetic, stored back in the input dtype. LayerNorm's
weight/bias gradients accumulate per program over a strided set of rows, and the per-program partials are
summed afterwards, so no atomics are needed (deterministic).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_kernels.common import dtype_code, store_cast


@triton.jit
def _ln_fwd(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n, eps, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / n + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    store_cast(y_ptr + row * n + cols, xc * rstd * w + b, mask, DTYPE)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _ln_bwd(
    dy_ptr,
    x_ptr,
    w_ptr,
    mean_ptr,
    rstd_ptr,
    dx_ptr,
    dw_part_ptr,
    db_part_ptr,
    rows,
    n,
    DTYPE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    progs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)
    db = tl.zeros((BLOCK,), dtype=tl.float32)
    for r in range(pid, rows, progs):
        base = (tl.full((), 0, tl.int64) + r) * n  # 64-bit offsets (r is a plain int under the interpreter)
        x = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + r)
        rstd = tl.load(rstd_ptr + r)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        g = dy * w
        a = tl.sum(g, axis=0) / n
        c = tl.sum(g * xhat, axis=0) / n
        store_cast(dx_ptr + base + cols, rstd * (g - a - xhat * c), mask, DTYPE)
        dw += dy * xhat
        db += dy
    tl.store(dw_part_ptr + pid.to(tl.int64) * n + cols, dw, mask=mask)
    tl.store(db_part_ptr + pid.to(tl.int64) * n + cols, db, mask=mask)


def layer_norm_fwd(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float):
    n = x.shape[-1]
    rows = x.numel() // n
    y = torch.empty_like(x)
    mean = torch.empty(rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows:
        _ln_fwd[(rows,)](x, w, b, y, mean, rstd, n, eps, DTYPE=dtype_code(x.dtype), BLOCK=triton.next_power_of_2(n))
    return y, mean, rstd


def layer_norm_bwd(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor):
    n = x.shape[-1]
    rows = x.numel() // n
    dx = torch.empty_like(x)
    progs = max(1, min(rows, 256))
    dw_part = torch.empty(progs, n, dtype=torch.float32, device=x.device)
    db_part = torch.empty(progs, n, dtype=torch.float32, device=x.device)
    if rows:
        _ln_bwd[(progs,)](
            dy,
            x,
            w,
            mean,
            rstd,
            dx,
            dw_part,
            db_part,
            rows,
            n,
            DTYPE=dtype_code(x.dtype),
            BLOCK=triton.next_power_of_2(n),
        )
    else:
        dw_part.zero_(), db_part.zero_()
    return dx, dw_part.sum(0).to(w.dtype), db_part.sum(0).to(w.dtype)


@triton.jit
def _softmax_fwd(x_ptr, y_ptr, s, scale, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    i = row % s
    cols = tl.arange(0, BLOCK)
    valid = cols <= i
    x = tl.load(x_ptr + row * s + cols, mask=valid, other=0.0).to(tl.float32) * scale
    x = tl.where(valid, x, float("-inf"))
    e = tl.where(valid, tl.exp(x - tl.max(x, axis=0)), 0.0)
    store_cast(y_ptr + row * s + cols, e / tl.sum(e, axis=0), cols < s, DTYPE)


@triton.jit
def _softmax_bwd(dy_ptr, y_ptr, dx_ptr, s, scale, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    valid = cols <= row % s  # masked entries' gradient is 0, also where y is NaN
    dy = tl.load(dy_ptr + row * s + cols, mask=valid, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + row * s + cols, mask=valid, other=0.0).to(tl.float32)
    dot = tl.sum(dy * y, axis=0)
    store_cast(dx_ptr + row * s + cols, tl.where(valid, scale * y * (dy - dot), 0.0), cols < s, DTYPE)


def causal_softmax_fwd(x: torch.Tensor, scale: float) -> torch.Tensor:
    s = x.shape[-1]
    y = torch.empty_like(x)
    rows = x.numel() // s
    if rows:
        _softmax_fwd[(rows,)](x, y, s, scale, DTYPE=dtype_code(x.dtype), BLOCK=triton.next_power_of_2(s))
    return y


def causal_softmax_bwd(dy: torch.Tensor, y: torch.Tensor, scale: float) -> torch.Tensor:
    s = y.shape[-1]
    dx = torch.empty_like(y)
    rows = y.numel() // s
    if rows:
        _softmax_bwd[(rows,)](dy, y, dx, s, scale, DTYPE=dtype_code(y.dtype), BLOCK=triton.next_power_of_2(s))
    return dx
