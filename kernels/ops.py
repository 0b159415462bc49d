"""The kernels as ``torch.library`` custom ops (``torch.ops.zerobench.*``), dispatched by device.

Every op has three bodies: the default (any device) is the pure-PyTorch reference arithmetic, ``cpu`` calls
the C++ library (``kernels.cpu``), ``cuda`` launches the Triton kernel. Fake (meta) implementations make
them traceable by ``torch.compile``; the differentiable ones register their backward with
``register_autograd``. The C++ CPU kernels compute in fp32: other CPU dtypes are upcast around the call.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kernels import cpu, reference, tables

CPU_COPY_PIECE_BYTES = 1 << 20
_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _ptr(t: Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


def _code(t: Tensor) -> int:
    if t.dtype not in _CODES:
        raise TypeError(f"kernels take fp32, bf16 or fp16 tensors, got {t.dtype}")
    return _CODES[t.dtype]


def _triton():
    from kernels import triton_kernels  # noqa: F401  (imports triton)
    from kernels.triton_kernels import adamw, elementwise, norm_softmax

    return adamw, elementwise, norm_softmax


# -- fused AdamW ------------------------------------------------------------------------------------
@torch.library.custom_op("zerobench::adamw_", mutates_args=("param", "exp_avg", "exp_avg_sq", "out"))
def adamw_(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, out: Tensor | None,
           blocks: Tensor, found_inf: Tensor | None, lr: float, beta1: float, beta2: float, eps: float,
           weight_decay: float, step: int, grad_scale: float) -> None:
    """AdamW step ``step`` (1-based) over flat fp32 ``param``; see ``kernels.fused_adamw_``."""
    if found_inf is not None and found_inf.item() != 0:
        return
    mask = torch.zeros(param.numel(), dtype=torch.bool, device=param.device)
    for s, e, d in blocks.tolist():
        mask[s:e] = bool(d)
    p, m, v = reference.adamw(param, grad, exp_avg, exp_avg_sq, mask, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                              weight_decay=weight_decay, step=step, grad_scale=grad_scale)
    param.copy_(p), exp_avg.copy_(m), exp_avg_sq.copy_(v)
    if out is not None:
        out.copy_(p)


def adamw_scalars(lr, beta1, beta2, eps, weight_decay, step, grad_scale) -> tuple[float, ...]:
    """The kernels' scalar arguments, derived in double precision and rounded to fp32 once, as
    torch.optim.AdamW derives them: (decay_keep, beta2, 1 - beta1, 1 - beta2, eps, step_size,
    sqrt(1 - beta2^t), grad_scale). (1 - beta1 computed in fp32 would differ in the last bit.)"""
    return (1.0 - lr * weight_decay, beta2, 1.0 - beta1, 1.0 - beta2, eps, lr / (1.0 - beta1**step),
            math.sqrt(1.0 - beta2**step), grad_scale)


@adamw_.register_kernel("cpu")
def _(param, grad, exp_avg, exp_avg_sq, out, blocks, found_inf, lr, beta1, beta2, eps, weight_decay, step,
      grad_scale):
    if found_inf is not None and found_inf.item() != 0:
        return
    cpu.library().zb_adamw(
        param.data_ptr(), grad.data_ptr(), _code(grad), exp_avg.data_ptr(), exp_avg_sq.data_ptr(), _ptr(out),
        _code(out) if out is not None else 0, blocks.data_ptr(), blocks.shape[0],
        *adamw_scalars(lr, beta1, beta2, eps, weight_decay, step, grad_scale), cpu.threads(),
    )


@adamw_.register_kernel("cuda")
def _(param, grad, exp_avg, exp_avg_sq, out, blocks, found_inf, lr, beta1, beta2, eps, weight_decay, step,
      grad_scale):
    _triton()[0].adamw_(param, grad, exp_avg, exp_avg_sq, out, blocks, found_inf,
                        adamw_scalars(lr, beta1, beta2, eps, weight_decay, step, grad_scale))


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


def _cpu_fp32(*ts: Tensor) -> list[Tensor]:
    return [t.detach().float().contiguous() for t in ts]


@bias_gelu_op.register_kernel("cpu")
def _(x, bias, approximate):
    xf, bf = _cpu_fp32(x, bias)
    y = torch.empty_like(xf)
    n = bf.numel()
    cpu.library().zb_bias_gelu_fwd(xf.data_ptr(), bf.data_ptr(), y.data_ptr(), xf.numel() // max(n, 1), n,
                                   int(approximate == "tanh"), cpu.threads())
    return y.to(x.dtype)


@bias_gelu_backward_op.register_kernel("cpu")
def _(dy, x, bias, approximate):
    dyf, xf, bf = _cpu_fp32(dy, x, bias)
    dx = torch.empty_like(xf)
    n = bf.numel()
    cpu.library().zb_bias_gelu_bwd(dyf.data_ptr(), xf.data_ptr(), bf.data_ptr(), dx.data_ptr(),
                                   xf.numel() // max(n, 1), n, int(approximate == "tanh"), cpu.threads())
    return dx.to(x.dtype)


@bias_gelu_op.register_kernel("cuda")
def _(x, bias, approximate):
    return _triton()[1].bias_gelu_fwd(x.contiguous(), bias.contiguous(), approximate == "tanh")


@bias_gelu_backward_op.register_kernel("cuda")
def _(dy, x, bias, approximate):
    return _triton()[1].bias_gelu_bwd(dy.contiguous(), x.contiguous(), bias.contiguous(), approximate == "tanh")


@bias_gelu_op.register_fake
def _(x, bias, approximate):
    return torch.empty_like(x)


@bias_gelu_backward_op.register_fake
def _(dy, x, bias, approximate):
    return torch.empty_like(x)


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
def layer_norm_backward_op(dy: Tensor, x: Tensor, weight: Tensor, mean: Tensor,
                           rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
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
    cpu.library().zb_layer_norm_fwd(xf.data_ptr(), wf.data_ptr(), bf.data_ptr(), y.data_ptr(), mean.data_ptr(),
                                    rstd.data_ptr(), rows, n, eps, cpu.threads())
    return y.to(x.dtype), mean, rstd


@layer_norm_backward_op.register_kernel("cpu")
def _(dy, x, weight, mean, rstd):
    n = x.shape[-1]
    dyf, xf, wf = _cpu_fp32(dy, x, weight)
    rows = xf.numel() // n
    dx = torch.empty_like(xf)
    dw = torch.empty(n, dtype=torch.float32)
    db = torch.empty(n, dtype=torch.float32)
    cpu.library().zb_layer_norm_bwd(dyf.data_ptr(), xf.data_ptr(), wf.data_ptr(), mean.contiguous().data_ptr(),
                                    rstd.contiguous().data_ptr(), dx.data_ptr(), dw.data_ptr(), db.data_ptr(),
                                    rows, n, cpu.threads())
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
    return torch.empty_like(x), stat, stat.clone()


@layer_norm_backward_op.register_fake
def _(dy, x, weight, mean, rstd):
    return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(weight)


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
    cpu.library().zb_causal_softmax_bwd(dyf.data_ptr(), yf.data_ptr(), dx.data_ptr(), yf.numel() // (s * s), s,
                                        scale, cpu.threads())
    return dx.to(y.dtype)


@causal_softmax_op.register_kernel("cuda")
def _(x, scale):
    return _triton()[2].causal_softmax_fwd(x.contiguous(), scale)


@causal_softmax_backward_op.register_kernel("cuda")
def _(dy, y, scale):
    return _triton()[2].causal_softmax_bwd(dy.contiguous(), y.contiguous(), scale)


@causal_softmax_op.register_fake
def _(x, scale):
    return torch.empty_like(x)


@causal_softmax_backward_op.register_fake
def _(dy, y, scale):
    return torch.empty_like(y)


def _sm_setup(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.scale = inputs[1]


def _sm_bwd(ctx, dy):
    (y,) = ctx.saved_tensors
    return causal_softmax_backward_op(dy.contiguous(), y, ctx.scale), None


causal_softmax_op.register_autograd(_sm_bwd, setup_context=_sm_setup)


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
    addrs = (torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64))
    cpu.library().zb_flat_copy(flat.data_ptr(), addrs.data_ptr(), pieces.data_ptr(), pieces.shape[0], int(unpack),
                               cpu.threads())


@flat_copy_.register_kernel("cuda")
def _(flat, tensors, offsets, unpack):
    pieces = tables.copy_pieces([t.numel() for t in tensors], list(offsets), 1 << 16).to(flat.device)
    _triton()[1].flat_copy_(flat, tensors, pieces, unpack)


@flat_copy_.register_fake
def _(flat, tensors, offsets, unpack):
    return None
