"""Run one kernel implementation by name on CPU tensors: "cpu" (the C++ library through the custom op)
or "triton" (the Triton kernel under TRITON_INTERPRET=1, launched directly on CPU tensors)."""

from __future__ import annotations

import torch

import kernels
from kernels import tables
from kernels.ops import adamw_scalars

IMPLS = ["cpu", "triton"]


def triton_mod(name: str):
    import importlib

    return importlib.import_module(f"kernels.triton_kernels.{name}")


def adamw(impl, p, g, m, v, ranges, *, out=None, found_inf=None, lr, betas, eps, weight_decay, step, grad_scale):
    if impl == "cpu":
        blocks = kernels.adamw_blocks(p.numel(), ranges, "cpu")
        kernels.fused_adamw_(p, g, m, v, blocks=blocks, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                             step=step, grad_scale=grad_scale, out=out, found_inf=found_inf)
    else:
        blocks = tables.adamw_blocks(p.numel(), ranges, kernels.TRITON_ADAMW_BLOCK)
        scalars = adamw_scalars(lr, betas[0], betas[1], eps, weight_decay, step, grad_scale)
        triton_mod("adamw").adamw_(p, g, m, v, out, blocks, found_inf, scalars)


def nonfinite(impl, x, flag):
    if impl == "cpu":
        kernels.nonfinite_(x, flag)
    else:
        triton_mod("adamw").nonfinite_(x, flag)


def bias_gelu_fwd_bwd(impl, x, b, dy, approximate):
    if impl == "cpu":
        xx, bb = x.clone().requires_grad_(), b.clone().requires_grad_()
        y = kernels.bias_gelu(xx, bb, approximate, mode="fused")
        y.backward(dy)
        return y.detach(), xx.grad, bb.grad
    E = triton_mod("elementwise")
    y = E.bias_gelu_fwd(x, b, approximate == "tanh")
    dx = E.bias_gelu_bwd(dy, x, b, approximate == "tanh")
    return y, dx, dx.float().reshape(-1, b.numel()).sum(0)


def layer_norm_fwd_bwd(impl, x, w, b, dy, eps):
    if impl == "cpu":
        xx, ww, bb = (t.clone().requires_grad_() for t in (x, w, b))
        y = kernels.layer_norm(xx, ww, bb, eps, mode="fused")
        y.backward(dy)
        return y.detach(), xx.grad, ww.grad, bb.grad
    N = triton_mod("norm_softmax")
    y, mean, rstd = N.layer_norm_fwd(x, w, b, eps)
    dx, dw, db = N.layer_norm_bwd(dy, x, w, mean, rstd)
    return y, dx, dw, db


def causal_softmax_fwd_bwd(impl, x, dy, scale):
    if impl == "cpu":
        xx = x.clone().requires_grad_()
        y = kernels.causal_softmax(xx, scale, mode="fused")
        y.backward(dy)
        return y.detach(), xx.grad
    N = triton_mod("norm_softmax")
    y = N.causal_softmax_fwd(x, scale)
    return y, N.causal_softmax_bwd(dy, y, scale)


def flat_copy(impl, flat, tensors, offsets, unpack):
    if impl == "cpu":
        (kernels.unflatten_from_ if unpack else kernels.flatten_into_)(flat, tensors, offsets)
    else:
        pieces = tables.copy_pieces([t.numel() for t in tensors], offsets, 100)
        triton_mod("elementwise").flat_copy_(flat, tensors, pieces, unpack)


def make(shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)
