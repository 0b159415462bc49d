"""Fused AdamW over a flat fp32 partition (Triton): one pass reads p, g, m, v and writes p, m, v and,
optionally, the low-precision copy of the updated partition. One program per row of the block table
(``kernels.tables.adamw_blocks``), so weight decay is a per-program flag. A nonzero ``found_inf`` flag
(fp16 overflow, already reduced over ranks) makes every program a no-op without a host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_kernels.common import dtype_code, store_cast, to_bf16_rne

BLOCK = 1024


@triton.jit
def _adamw_kernel(
    p_ptr,
    g_ptr,
    m_ptr,
    v_ptr,
    out_ptr,
    blocks_ptr,
    flag_ptr,
    decay_keep,
    beta2,
    one_minus_beta1,
    one_minus_beta2,
    eps,
    neg_step_size,
    bc2_sqrt,
    grad_scale,
    OUT_DTYPE: tl.constexpr,
    HAS_OUT: tl.constexpr,
    HAS_FLAG: tl.constexpr,
    ADOPT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64) * 3
    start = tl.load(blocks_ptr + row)
    end = tl.load(blocks_ptr + row + 1)
    decay = tl.load(blocks_ptr + row + 2)
    offs = start + tl.arange(0, BLOCK).to(tl.int64)
    mask = offs < end
    if HAS_FLAG:
        # Broadcast load of the flag (one cached word); folding it into the mask needs no early return.
        mask = mask & (tl.load(flag_ptr + offs * 0, mask=mask, other=0.0) == 0.0)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32) * grad_scale
    m = tl.load(m_ptr + offs, mask=mask, other=0.0)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)
    p = tl.load(p_ptr + offs, mask=mask, other=0.0)
    if ADOPT:  # an element of out changed since the last step wrote it: the step starts from it
        o = tl.load(out_ptr + offs, mask=mask, other=0.0)
        if OUT_DTYPE == 1:
            mine = to_bf16_rne(p)
        else:
            mine = p.to(tl.float16)
        changed = o.to(tl.uint16, bitcast=True) != mine.to(tl.uint16, bitcast=True)
        p = tl.where(changed, o.to(tl.float32), p)
    keep = tl.where(decay != 0, decay_keep, 1.0)
    m = m + one_minus_beta1 * (g - m)
    v = beta2 * v + one_minus_beta2 * g * g
    denom = tl.sqrt(v) / bc2_sqrt + eps
    p = tl.fma(neg_step_size, m / denom, p * keep)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)
    tl.store(p_ptr + offs, p, mask=mask)
    if HAS_OUT:
        store_cast(out_ptr + offs, p, mask, OUT_DTYPE)


def adamw_(param, grad, exp_avg, exp_avg_sq, out, blocks, found_inf, scalars, adopt: bool = False) -> None:
    """Launch over ``blocks`` (block size <= ``BLOCK``); ``scalars`` from ``kernels.ops.adamw_scalars``;
    ``adopt`` (bf16/fp16 ``out``): see ``kernels.fused_adamw_``.

    The step size is negated here, in Python: compiled Triton negates a scalar as ``0 - x``, which turns
    lr = 0 into +0 and would flip -0.0 parameters to +0.0 (torch's addcdiv keeps -0.0)."""
    scalars = (*scalars[:5], -scalars[5], *scalars[6:])
    n = blocks.shape[0]
    if n == 0:
        return
    _adamw_kernel[(n,)](
        param,
        grad,
        exp_avg,
        exp_avg_sq,
        out if out is not None else param,
        blocks,
        found_inf if found_inf is not None else param,
        *scalars,
        OUT_DTYPE=dtype_code(out.dtype) if out is not None else 0,
        HAS_OUT=out is not None,
        HAS_FLAG=found_inf is not None,
        ADOPT=adopt and out is not None and out.dtype in (torch.bfloat16, torch.float16),
        BLOCK=BLOCK,
    )


@triton.jit
def _nonfinite_kernel(x_ptr, flag_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    bad = tl.max((tl.abs(x) > 3.4028234663852886e38) | (x != x), axis=0)  # noqa: PLR0124 - NaN test
    if bad:
        tl.store(flag_ptr, 1.0)


def nonfinite_(x: torch.Tensor, flag: torch.Tensor) -> None:
    """Set ``flag`` (one fp32 element) to 1 when ``x`` holds an inf or NaN; leave it otherwise."""
    n = x.numel()
    if n:
        _nonfinite_kernel[(triton.cdiv(n, BLOCK),)](x, flag, n, BLOCK=BLOCK)
