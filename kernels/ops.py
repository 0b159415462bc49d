"""The optimizer-side kernels (fused AdamW, non-finite check, flat copies) as ``torch.library`` custom ops
(``torch.ops.zerobench.*``), dispatched by device.

Every op has three bodies: the default (any device) is the pure-PyTorch reference arithmetic, ``cpu`` calls
the C++ library (``kernels.cpu``), ``cuda`` launches the Triton kernel. Fake (meta) implementations make
them traceable by ``torch.compile``. The transformer ops (differentiable, with ``register_autograd``) are in
``kernels/transformer_ops.py`` and re-exported here. The C++ CPU kernels compute in fp32: other CPU dtypes
are upcast around the call.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

import kernels.cpu as cpu  # noqa: PLR0402 - not `from kernels import`: that re-enters the package's __init__
import kernels.reference as reference  # noqa: PLR0402
import kernels.tables as tables  # noqa: PLR0402
from kernels.dispatch import CPU_COPY_PIECE_BYTES, _code, _ptr, _triton
from kernels.transformer_ops import (  # noqa: F401 - re-exported: torch.ops.zerobench.* and kernels.ops.*
    bias_gelu_backward_op,
    bias_gelu_op,
    causal_softmax_backward_op,
    causal_softmax_op,
    layer_norm_backward_op,
    layer_norm_op,
)


# -- fused AdamW ------------------------------------------------------------------------------------
def adamw_any_device(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    out: Tensor | None,
    blocks: Tensor,
    found_inf: Tensor | None,
    *scalars: float,
    adopt: bool = False,
) -> None:
    """The op's default body (any device without a kernel): the reference arithmetic over the table's rows only,
    as the kernels update them (a table over spans leaves every other element as it was)."""
    lr, beta1, beta2, eps, weight_decay, step, grad_scale = scalars  # adamw_'s, in its order
    if found_inf is not None and found_inf.item() != 0:
        return
    mask = torch.zeros(param.numel(), dtype=torch.bool, device=param.device)
    covered = torch.zeros_like(mask)  # the table's rows: elements outside them are not this call's (spans)
    for s, e, d in blocks.tolist():
        mask[s:e], covered[s:e] = bool(d), True
    if adopt and out is not None:
        base = param.clone()
        reference.adopt_(base, out)
        param.copy_(torch.where(covered, base, param))
    p, m, v = reference.adamw(
        param,
        grad,
        exp_avg,
        exp_avg_sq,
        mask,
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        eps=eps,
        weight_decay=weight_decay,
        step=step,
        grad_scale=grad_scale,
    )
    param.copy_(torch.where(covered, p, param))
    exp_avg.copy_(torch.where(covered, m, exp_avg)), exp_avg_sq.copy_(torch.where(covered, v, exp_avg_sq))
    if out is not None:
        out.copy_(torch.where(covered, p.to(out.dtype), out))


@torch.library.custom_op("zerobench::adamw_", mutates_args=("param", "exp_avg", "exp_avg_sq", "out"))
def adamw_(
    param: Tensor,
    grad: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    out: Tensor | None,
    blocks: Tensor,
    found_inf: Tensor | None,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
    grad_scale: float,
    adopt: bool = False,
) -> None:
    """AdamW step ``step`` (1-based) over flat fp32 ``param``; see ``kernels.fused_adamw_``."""
    scalars = (lr, beta1, beta2, eps, weight_decay, step, grad_scale)
    adamw_any_device(param, grad, exp_avg, exp_avg_sq, out, blocks, found_inf, *scalars, adopt=adopt)


def adamw_scalars(lr, beta1, beta2, eps, weight_decay, step, grad_scale) -> tuple[float, ...]:
    """The kernels' scalar arguments, derived in double precision and rounded to fp32 once, as
    torch.optim.AdamW derives them: (decay_keep, beta2, 1 - beta1, 1 - beta2, eps, step_size,
    sqrt(1 - beta2^t), grad_scale). (1 - beta1 computed in fp32 would differ in the last bit.)"""
    return (
        1.0 - lr * weight_decay,
        beta2,
        1.0 - beta1,
        1.0 - beta2,
        eps,
        lr / (1.0 - beta1**step),
        math.sqrt(1.0 - beta2**step),
        grad_scale,
    )


@adamw_.register_kernel("cpu")
def _adamw_cpu(
    param,
    grad,
    exp_avg,
    exp_avg_sq,
    out,
    blocks,
    found_inf,
    lr,
    beta1,
    beta2,
    eps,
    weight_decay,
    step,
    grad_scale,
    adopt=False,
):
    if found_inf is not None and found_inf.item() != 0:
        return
    cpu.library().zb_adamw(
        param.data_ptr(),
        grad.data_ptr(),
        _code(grad),
        exp_avg.data_ptr(),
        exp_avg_sq.data_ptr(),
        _ptr(out),
        _code(out) if out is not None else 0,
        int(adopt),
        blocks.data_ptr(),
        blocks.shape[0],
        *adamw_scalars(lr, beta1, beta2, eps, weight_decay, step, grad_scale),
        cpu.threads(),
    )


@adamw_.register_kernel("cuda")
def _adamw_cuda(
    param,
    grad,
    exp_avg,
    exp_avg_sq,
    out,
    blocks,
    found_inf,
    lr,
    beta1,
    beta2,
    eps,
    weight_decay,
    step,
    grad_scale,
    adopt=False,
):
    _triton()[0].adamw_(
        param,
        grad,
        exp_avg,
        exp_avg_sq,
        out,
        blocks,
        found_inf,
        adamw_scalars(lr, beta1, beta2, eps, weight_decay, step, grad_scale),
        adopt,
    )


EAGER_ADAMW = {"cpu": _adamw_cpu, "cuda": _adamw_cuda}
"""The device bodies of ``adamw_``, called directly in eager mode: the optimizer step needs no autograd or
tracing, and the custom-op dispatcher's Python layers cost more than the kernel itself on small
partitions. Under ``torch.compile`` the op goes through the dispatcher."""


@adamw_.register_fake
def _(*args, **kwargs):
    return None


@torch.library.custom_op("zerobench::nonfinite_", mutates_args=("flag",))
def nonfinite_(x: Tensor, flag: Tensor) -> None:
    """Set ``flag`` (one fp32 element) to 1 when ``x`` holds an inf or NaN."""
    if reference.nonfinite(x):
        flag.fill_(1.0)


@nonfinite_.register_kernel("cpu")
def _(x, flag):
    if cpu.library().zb_nonfinite(x.data_ptr(), _code(x), x.numel(), cpu.threads()):
        flag.fill_(1.0)


@nonfinite_.register_kernel("cuda")
def _(x, flag):
    _triton()[0].nonfinite_(x, flag)


@nonfinite_.register_fake
def _(x, flag):
    return None


# -- flatten / unflatten copy -----------------------------------------------------------------------
@torch.library.custom_op("zerobench::flat_copy_", mutates_args=("flat", "tensors"))
def flat_copy_(flat: Tensor, tensors: list[Tensor], offsets: list[int], unpack: bool) -> None:
    """Copy each tensor to/from ``flat[offset : offset + numel]`` (same dtype, contiguous)."""
    for t, off in zip(tensors, offsets):
        view = flat[off : off + t.numel()].view_as(t)
        t.copy_(view) if unpack else view.copy_(t)


@flat_copy_.register_kernel("cpu")
def _(flat, tensors, offsets, unpack):
    es = flat.element_size()
    pieces = tables.copy_pieces([t.numel() * es for t in tensors], [o * es for o in offsets], CPU_COPY_PIECE_BYTES)
    if pieces.shape[0] == 0:
        return
    addrs = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64)
    cpu.library().zb_flat_copy(
        flat.data_ptr(), addrs.data_ptr(), pieces.data_ptr(), pieces.shape[0], int(unpack), cpu.threads()
    )


@flat_copy_.register_kernel("cuda")
def _(flat, tensors, offsets, unpack):
    pieces = tables.copy_pieces([t.numel() for t in tensors], list(offsets), 1 << 16).to(flat.device)
    _triton()[1].flat_copy_(flat, tensors, pieces, unpack)


@flat_copy_.register_fake
def _(flat, tensors, offsets, unpack):
    return None
