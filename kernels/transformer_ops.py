"""The transformer kernels as ``torch.library`` custom ops: bias+GeLU, LayerNorm and the causal softmax,
each with a reference default, the C++ CPU body, the Triton CUDA body, a fake (meta) body and autograd.
(The optimizer-side ops are in ``kernels/ops.py``; shared pieces in ``kernels/dispatch.py``.)"""

from __future__ import annotations

import torch
from torch import Tensor

import kernels.cpu as cpu  # noqa: PLR0402 - not `from kernels import`: that re-enters the package's __init__
import kernels.reference as reference  # noqa: PLR0402
from kernels.dispatch import _cpu_fp32, _triton


# -- bias + GeLU ------------------------------------------------------------------------------------
@torch.library.custom_op("zerobench::bias_gelu", mutates_args=())
def bias_gelu_op(x: Tensor, bias: Tensor, approximate: str) -> Tensor:
    return reference.bias_gelu(x, bias, approximate)


@torch.library.custom_op("zerobench::bias_gelu_backward", mutates_args=())
def bias_gelu_backward_op(dy: Tensor, x: Tensor, bias: Tensor, approximate: str) -> Tensor:
    with torch.enable_grad():
        xx = x.detach().requires_grad_()
        y = reference.bias_gelu(xx, bias.detach(), approximate)
        (dx,) = torch.autograd.grad(y, xx, dy)
    return dx


@bias_gelu_op.register_kernel("cpu")
def _(x, bias, approximate):
    xf, bf = _cpu_fp32(x, bias)
    y = torch.empty_like(xf)
    n = bf.numel()
    cpu.library().zb_bias_gelu_fwd(
        xf.data_ptr(),
        bf.data_ptr(),
        y.data_ptr(),
        xf.numel() // max(n, 1),
        n,
        int(approximate == "tanh"),
        cpu.threads(),
    )
    return y.to(x.dtype)


@bias_gelu_backward_op.register_kernel("cpu")
def _(dy, x, bias, approximate):
    dyf, xf, bf = _cpu_fp32(dy, x, bias)
    dx = torch.empty_like(xf)
    n = bf.numel()
    cpu.library().zb_bias_gelu_bwd(
        dyf.data_ptr(),
        xf.data_ptr(),
        bf.data_ptr(),
        dx.data_ptr(),
        xf.numel() // max(n, 1),
        n,
        int(approximate == "tanh"),
        cpu.threads(),
    )
    return dx.to(x.dtype)


@bias_gelu_op.register_kernel("cuda")
def _(x, bias, approximate):
    return _triton()[1].bias_gelu_fwd(x.contiguous(), bias.contiguous(), approximate == "tanh")


@bias_gelu_backward_op.register_kernel("cuda")
def _(dy, x, bias, approximate):
    return _triton()[1].bias_gelu_bwd(dy.contiguous(), x.contiguous(), bias.contiguous(), approximate == "tanh")


@bias_gelu_op.register_fake
def _(x, bias, approximate):
    return torch.empty_like(x, memory_format=torch.contiguous_format)  # as the bodies return it


@bias_gelu_backward_op.register_fake
def _(dy, x, bias, approximate):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _bias_gelu_setup(ctx, inputs, output):
    x, bias, approximate = inputs
    ctx.save_for_backward(x, bias)
    ctx.approximate = approximate


def _bias_gelu_bwd(ctx, dy):
    x, bias = ctx.saved_tensors
    dx = bias_gelu_backward_op(dy, x, bias, ctx.approximate)
    db = dx.reshape(-1, bias.numel()).sum(0).to(bias.dtype)
    return dx, db, None


bias_gelu_op.register_autograd(_bias_gelu_bwd, setup_context=_bias_gelu_setup)


# -- LayerNorm --------------------------------------------------------------------------------------
@torch.library.custom_op("zerobench::layer_norm", mutates_args=())
def layer_norm_op(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    xf = x.float()
    mean = xf.mean(-1)
    rstd = torch.rsqrt(((xf - mean.unsqueeze(-1)) ** 2).mean(-1) + eps)
    y = reference.layer_norm(xf, weight.float(), bias.float(), eps).to(x.dtype)
    return y, mean.reshape(-1), rstd.reshape(-1)


@torch.library.custom_op("zerobench::layer_norm_backward", mutates_args=())
def layer_norm_backward_op(
    dy: Tensor, x: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    n = x.shape[-1]
    xf, dyf, w = x.float().reshape(-1, n), dy.float().reshape(-1, n), weight.float()
    xhat = (xf - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)
    g = dyf * w
    dx = rstd.unsqueeze(-1) * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    return dx.reshape(x.shape).to(x.dtype), (dyf * xhat).sum(0).to(weight.dtype), dyf.sum(0).to(weight.dtype)


@layer_norm_op.register_kernel("cpu")
def _(x, weight, bias, eps):
    n = x.shape[-1]
    xf, wf, bf = _cpu_fp32(x, weight, bias)
    rows = xf.numel() // n
    y = torch.empty_like(xf)
    mean = torch.empty(rows, dtype=torch.float32)
    rstd = torch.empty(rows, dtype=torch.float32)
    cpu.library().zb_layer_norm_fwd(
        xf.data_ptr(),
        wf.data_ptr(),
        bf.data_ptr(),
        y.data_ptr(),
        mean.data_ptr(),
        rstd.data_ptr(),
        rows,
        n,
        eps,
        cpu.threads(),
    )
    return y.to(x.dtype), mean, rstd


@layer_norm_backward_op.register_kernel("cpu")
def _(dy, x, weight, mean, rstd):
    n = x.shape[-1]
    dyf, xf, wf = _cpu_fp32(dy, x, weight)
    rows = xf.numel() // n
    dx = torch.empty_like(xf)
    dw = torch.empty(n, dtype=torch.float32)
    db = torch.empty(n, dtype=torch.float32)
    cpu.library().zb_layer_norm_bwd(
        dyf.data_ptr(),
        xf.data_ptr(),
        wf.data_ptr(),
        mean.contiguous().data_ptr(),
        rstd.contiguous().data_ptr(),
        dx.data_ptr(),
        dw.data_ptr(),
        db.data_ptr(),
        rows,
        n,
        cpu.threads(),
    )
    return dx.to(x.dtype), dw.to(weight.dtype), db.to(weight.dtype)


@layer_norm_op.register_kernel("cuda")
def _(x, weight, bias, eps):
    return _triton()[2].layer_norm_fwd(x.contiguous(), weight.contiguous(), bias.contiguous(), eps)


@layer_norm_backward_op.register_kernel("cuda")
def _(dy, x, weight, mean, rstd):
    return _triton()[2].layer_norm_bwd(dy.contiguous(), x.contiguous(), weight.contiguous(), mean, rstd)


@layer_norm_op.register_fake
def _(x, weight, bias, eps):
    rows = x.numel() // x.shape[-1]
    stat = x.new_empty(rows, dtype=torch.float32)
    return torch.empty_like(x, memory_format=torch.contiguous_format), stat, stat.clone()


@layer_norm_backward_op.register_fake
def _(dy, x, weight, mean, rstd):
    return (
        torch.empty_like(x, memory_format=torch.contiguous_format),
        torch.empty_like(weight),
        torch.empty_like(weight),
    )


def _ln_setup(ctx, inputs, output):
    x, weight, _, _ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, mean, rstd)


def _ln_bwd(ctx, dy, _dmean, _drstd):
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dw, db = layer_norm_backward_op(dy.contiguous(), x, weight, mean, rstd)
    return dx, dw, db, None


layer_norm_op.register_autograd(_ln_bwd, setup_context=_ln_setup)


# -- causal scaled softmax --------------------------------------------------------------------------
@torch.library.custom_op("zerobench::causal_softmax", mutates_args=())
def causal_softmax_op(x: Tensor, scale: float) -> Tensor:
    return reference.causal_softmax(x.float(), scale).to(x.dtype)


@torch.library.custom_op("zerobench::causal_softmax_backward", mutates_args=())
def causal_softmax_backward_op(dy: Tensor, y: Tensor, scale: float) -> Tensor:
    yf, dyf = y.float(), dy.float()
    return (scale * yf * (dyf - (dyf * yf).sum(-1, keepdim=True))).to(y.dtype)


@causal_softmax_op.register_kernel("cpu")
def _(x, scale):
    (xf,) = _cpu_fp32(x)
    s = xf.shape[-1]
    y = torch.empty_like(xf)
    cpu.library().zb_causal_softmax_fwd(xf.data_ptr(), y.data_ptr(), xf.numel() // (s * s), s, scale, cpu.threads())
    return y.to(x.dtype)


@causal_softmax_backward_op.register_kernel("cpu")
def _(dy, y, scale):
    dyf, yf = _cpu_fp32(dy, y)
    s = yf.shape[-1]
    dx = torch.empty_like(yf)
    cpu.library().zb_causal_softmax_bwd(
        dyf.data_ptr(), yf.data_ptr(), dx.data_ptr(), yf.numel() // (s * s), s, scale, cpu.threads()
    )
    return dx.to(y.dtype)


@causal_softmax_op.register_kernel("cuda")
def _(x, scale):
    return _triton()[2].causal_softmax_fwd(x.contiguous(), scale)


@causal_softmax_backward_op.register_kernel("cuda")
def _(dy, y, scale):
    return _triton()[2].causal_softmax_bwd(dy.contiguous(), y.contiguous(), scale)


@causal_softmax_op.register_fake
def _(x, scale):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@causal_softmax_backward_op.register_fake
def _(dy, y, scale):
    return torch.empty_like(y, memory_format=torch.contiguous_format)


def _sm_setup(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.scale = inputs[1]


def _sm_bwd(ctx, dy):
    (y,) = ctx.saved_tensors
    return causal_softmax_backward_op(dy.contiguous(), y, ctx.scale), None


causal_softmax_op.register_autograd(_sm_bwd, setup_context=_sm_setup)
