"""Pure-PyTorch references of every kernel: the definition each implementation is tested against.

All of them run in whatever dtype they are given, so tests evaluate them in fp64 and compare the kernels
(fp32 arithmetic) to that with a tolerance, never bitwise against another torch variant.
"""

from __future__ import annotations

import math

import torch


def adamw(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    decay_mask: torch.Tensor,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    step: int,
    grad_scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One AdamW step (torch.optim.AdamW's arithmetic); returns new (param, exp_avg, exp_avg_sq).

    ``decay_mask`` is a bool tensor: weight decay applies where it is True. ``grad_scale`` multiplies the
    gradient first (the ZeRO engine folds 1 / loss scale and the clip coefficient into it).
    """
    dt = param.dtype
    g = grad.to(dt) * grad_scale
    m = exp_avg + (1 - beta1) * (g - exp_avg)
    v = beta2 * exp_avg_sq + (1 - beta2) * g * g
    bc1 = 1 - beta1**step
    bc2_sqrt = math.sqrt(1 - beta2**step)
    p = torch.where(decay_mask, param * (1 - lr * weight_decay), param)
    p = p - (lr / bc1) * m / (v.sqrt() / bc2_sqrt + eps)
    return p, m, v


@torch.no_grad()
def adopt_(param: torch.Tensor, out: torch.Tensor, chunk: int = 1 << 22) -> None:
    """Where ``out`` (bf16/fp16) no longer holds the bits of ``param`` (fp32) rounded to its dtype, something
    changed it since it was written from ``param``: set ``param`` to it. ``chunk`` elements at a time, so the
    temporaries stay small. The kernels' ``adopt`` does this inside the AdamW pass."""
    if out.dtype not in (torch.bfloat16, torch.float16):
        return
    p, o = param.reshape(-1), out.reshape(-1)
    for lo in range(0, p.numel(), chunk):
        pc, oc = p[lo : lo + chunk], o[lo : lo + chunk]
        changed = oc.view(torch.int16) != pc.to(oc.dtype).view(torch.int16)
        pc.copy_(torch.where(changed, oc, pc))


def nonfinite(x: torch.Tensor) -> bool:
    return not bool(torch.isfinite(x).all())


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu(x + bias); ``approximate`` is "none" (erf) or "tanh"."""
    u = x + bias
    if approximate == "tanh":
        return 0.5 * u * (1 + torch.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u**3)))
    return 0.5 * u * (1 + torch.erf(u / math.sqrt(2)))


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def causal_softmax(x: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(scale * x) over the last dim of ``[..., s, s]`` with column j > row i masked (output 0)."""
    s = x.shape[-1]
    mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
    return torch.softmax((x * scale).masked_fill(mask, float("-inf")), dim=-1)


def flatten(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    out, off = [], 0
    for t in like:
        out.append(flat[off : off + t.numel()].view_as(t))
        off += t.numel()
    return out
