"""Independent single-process reference training: the recipes the ZeRO engine must reproduce.

fp32: ``torch.optim.AdamW`` on the model (decay on 2+-dim parameters only), ``clip_grad_norm_``.
bf16/fp16: the model in low precision, fp32 master copies updated by ``torch.optim.AdamW`` from the
low-precision gradients, copied back after each step; fp16 adds dynamic loss scaling (skip the step on
inf/NaN gradients and back off). One forward/backward over the whole global batch per step.
"""

from __future__ import annotations

import copy

import torch

from zerobench.zero.config import AdamWConfig, LossScaleConfig


def make_adamw(params, cfg: AdamWConfig) -> torch.optim.AdamW:
    params = list(params)
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, foreach=False)


def reference_train(
    model, batches, precision: str, adam: AdamWConfig, clip=None, ls: LossScaleConfig | None = None, groups=None
):
    """Train a copy of ``model`` on ``batches`` [(x, y) global batches]; return (losses, fp32 params, stepped).
    ``groups(named)``: param groups over ``(name, master)`` pairs (default: decay on 2+-dim parameters)."""
    ls = ls or LossScaleConfig()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    work = copy.deepcopy(model)
    master = [p.detach().clone().float().requires_grad_(True) for p in work.parameters()]
    work.to(dtype)
    if groups is None:
        opt = make_adamw(master, adam)
    else:
        named = list(zip([n for n, _ in work.named_parameters()], master))
        opt = torch.optim.AdamW(
            groups(named), lr=adam.lr, betas=adam.betas, eps=adam.eps, weight_decay=adam.weight_decay, foreach=False
        )
    scale = ls.init_scale if precision == "fp16" else 1.0
    good = 0
    losses, stepped = [], []
    for x, y in batches:
        loss = work(x, y)
        losses.append(loss.item())
        (loss * scale).backward()
        grads = [p.grad.float() / scale for p in work.parameters()]
        work.zero_grad(set_to_none=True)
        if precision == "fp16" and not all(torch.isfinite(g).all() for g in grads):
            scale = max(scale * ls.backoff_factor, ls.min_scale)
            good = 0
            stepped.append(False)
            continue
        for m, g in zip(master, grads):
            m.grad = g
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(master, clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        stepped.append(True)
        if precision == "fp16":
            good += 1
            if good >= ls.growth_interval:
                scale, good = scale * ls.growth_factor, 0
        with torch.no_grad():
            for p, m in zip(work.parameters(), master):
                p.copy_(m)
    names = [n for n, _ in work.named_parameters()]
    return losses, {n: m.detach() for n, m in zip(names, master)}, stepped
