"""Run one kernel implementation by name on CPU tensors: "cpu" (the C++ library through the custom op)
or "triton" (the Triton kernel: under TRITON_INTERPRET=1 launched directly on the CPU tensors; on a machine
with CUDA compiled for the GPU, with the inputs copied there and the results copied back in place, so the
same tests check the real kernels)."""

from __future__ import annotations

import os

import torch

import kernels
from kernels import tables
from kernels.ops import adamw_scalars

IMPLS = ["cpu", "triton"]
ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"


def _dev(*ts):
    """The triton impl's view of CPU test tensors: themselves (interpreter) or CUDA copies."""
    return tuple(t.cuda() if ON_GPU and isinstance(t, torch.Tensor) else t for t in ts)


def _back(pairs):
    """Copy in-place results of the CUDA copies back into the CPU test tensors."""
    if ON_GPU:
        for orig, new in pairs:
            if orig is not None:
                orig.copy_(new.cpu())


def _host(*ts):
    return tuple(t.cpu() if isinstance(t, torch.Tensor) else t for t in ts)


def triton_mod(name: str):
    import importlib

    return importlib.import_module(f"kernels.triton_kernels.{name}")


def adamw(
    impl,
    p,
    g,
    m,
    v,
    ranges,
    *,
    out=None,
    found_inf=None,
    lr,
    betas,
    eps,
    weight_decay,
    step,
    grad_scale,
    spans=None,
    adopt=False,
):
    if impl == "cpu":
        blocks = kernels.adamw_blocks(p.numel(), ranges, "cpu", spans)
        kernels.fused_adamw_(
            p,
            g,
            m,
            v,
            blocks=blocks,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            step=step,
            grad_scale=grad_scale,
            out=out,
            found_inf=found_inf,
            adopt=adopt,
        )
    else:
        blocks = tables.adamw_blocks(p.numel(), ranges, kernels.TRITON_ADAMW_BLOCK, spans)
        scalars = adamw_scalars(lr, betas[0], betas[1], eps, weight_decay, step, grad_scale)
        d = _dev(p, g, m, v, out, blocks, found_inf)
        triton_mod("adamw").adamw_(*d[:6], d[6], scalars, adopt)
        _back([(p, d[0]), (m, d[2]), (v, d[3]), (out, d[4]), (found_inf, d[6])])


def nonfinite(impl, x, flag):
    if impl == "cpu":
        kernels.nonfinite_(x, flag)
    else:
        dx, dflag = _dev(x, flag)
        triton_mod("adamw").nonfinite_(dx, dflag)
        _back([(flag, dflag)])


def bias_gelu_fwd_bwd(impl, x, b, dy, approximate):
    if impl == "cpu":
        xx, bb = x.clone().requires_grad_(), b.clone().requires_grad_()
        y = kernels.bias_gelu(xx, bb, approximate, mode="fused")
        y.backward(dy)
        return y.detach(), xx.grad, bb.grad
    E = triton_mod("elementwise")
    x, b, dy = _dev(x, b, dy)
    y = E.bias_gelu_fwd(x, b, approximate == "tanh")
    dx = E.bias_gelu_bwd(dy, x, b, approximate == "tanh")
    return _host(y, dx, dx.float().reshape(-1, b.numel()).sum(0))


def layer_norm_fwd_bwd(impl, x, w, b, dy, eps):
    if impl == "cpu":
        xx, ww, bb = (t.clone().requires_grad_() for t in (x, w, b))
        y = kernels.layer_norm(xx, ww, bb, eps, mode="fused")
        y.backward(dy)
        return y.detach(), xx.grad, ww.grad, bb.grad
    N = triton_mod("norm_softmax")
    x, w, b, dy = _dev(x, w, b, dy)
    y, mean, rstd = N.layer_norm_fwd(x, w, b, eps)
    dx, dw, db = N.layer_norm_bwd(dy, x, w, mean, rstd)
    return _host(y, dx, dw, db)


def causal_softmax_fwd_bwd(impl, x, dy, scale):
    if impl == "cpu":
        xx = x.clone().requires_grad_()
        y = kernels.causal_softmax(xx, scale, mode="fused")
        y.backward(dy)
        return y.detach(), xx.grad
    N = triton_mod("norm_softmax")
    x, dy = _dev(x, dy)
    y = N.causal_softmax_fwd(x, scale)
    return _host(y, N.causal_softmax_bwd(dy, y, scale))


def flat_copy(impl, flat, tensors, offsets, unpack):
    if impl == "cpu":
        (kernels.unflatten_from_ if unpack else kernels.flatten_into_)(flat, tensors, offsets)
    else:
        pieces = tables.copy_pieces([t.numel() for t in tensors], offsets, 100)
        dflat, dpieces = _dev(flat, pieces)
        dts = list(_dev(*tensors))
        triton_mod("elementwise").flat_copy_(dflat, dts, dpieces, unpack)
        _back([(flat, dflat)] if not unpack else list(zip(tensors, dts)))


def make(shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)
