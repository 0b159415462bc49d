"""AdamW over flat fp32 partitions: the optimizer step of every ZeRO stage.

The optimizer sees a list of *chunks* (this rank's shard of each bucket; the whole bucket at stage 0):
fp32 master chunks, gradient chunks (any dtype; summed over ranks), and the weight-decay ranges inside
each chunk (parameters of 2+ dims decay, biases and norms do not, as Megatron-LM and nanoGPT do). Moments
live in two flat fp32 buffers. The arithmetic is exactly ``torch.optim.AdamW``'s, with the gradient
scale (1 / (ranks * loss scale), times the clip coefficient) folded into the gradient read.

Two paths: the fused kernel (``kernels.fused_adamw_``: one pass per chunk reading p, g, m, v and writing p,
m, v and the low-precision parameter copy) and the reference (``torch._foreach_*`` over the chunks, then a
separate copy-out). ``kernels`` mode ``"auto"`` takes the fused one wherever the device has it.
"""

from __future__ import annotations

import math

import torch

import kernels
from zerobench.zero.config import AdamWConfig


class ShardedAdamW:
    """AdamW on a rank's partition; ``step(grads, grad_scale)`` updates ``master`` chunks in place."""

    def __init__(
        self,
        cfg: AdamWConfig,
        master: list[torch.Tensor],
        decay_ranges: list[list[tuple[int, int]]],
        kernel_mode: str = "auto",
    ):
        self.cfg = cfg
        self.master = master
        self.decay_ranges = decay_ranges
        total = sum(m.numel() for m in master)
        device = master[0].device if master else torch.device("cpu")
        self.exp_avg = torch.zeros(total, dtype=torch.float32, device=device)
        self.exp_avg_sq = torch.zeros(total, dtype=torch.float32, device=device)
        self.m, self.v = self._chunks(self.exp_avg), self._chunks(self.exp_avg_sq)
        self.step_count = 0
        self.path = kernels.resolve(kernel_mode, device)
        self.blocks = (
            [kernels.adamw_blocks(m.numel(), r, device) for m, r in zip(master, decay_ranges)]
            if self.path == "fused" else None
        )

    def _chunks(self, flat: torch.Tensor) -> list[torch.Tensor]:
        out, off = [], 0
        for m in self.master:
            out.append(flat[off : off + m.numel()])
            off += m.numel()
        return out

    @torch.no_grad()
    def flag_nonfinite(self, grads: list[torch.Tensor], flag: torch.Tensor) -> None:
        """Raise ``flag`` (one fp32 element) when any gradient chunk holds inf or NaN."""
        for g in grads:
            if self.path == "fused":
                kernels.nonfinite_(g, flag)
            elif not torch.isfinite(g).all():
                flag.fill_(1.0)
                return

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor], grad_scale: float, out: list[torch.Tensor] | None = None) -> None:
        """One step; ``out`` (optional) receives the updated chunks in their dtype (the parameter copy)."""
        cfg = self.cfg
        self.step_count += 1
        if not self.master:
            return
        if self.path == "fused":
            for i, (p, g, m, v) in enumerate(zip(self.master, grads, self.m, self.v)):
                kernels.fused_adamw_(
                    p, g, m, v, blocks=self.blocks[i], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                    weight_decay=cfg.weight_decay, step=self.step_count, grad_scale=grad_scale,
                    out=out[i] if out is not None else None,
                )
            return
        b1, b2 = cfg.betas
        g32 = [g.to(torch.float32) if g.dtype != torch.float32 else g for g in grads]
        g32 = torch._foreach_mul(g32, grad_scale)
        if cfg.weight_decay:
            keep = 1.0 - cfg.lr * cfg.weight_decay
            for chunk, ranges in zip(self.master, self.decay_ranges):
                for lo, hi in ranges:
                    chunk[lo:hi].mul_(keep)
        torch._foreach_lerp_(self.m, g32, 1.0 - b1)
        torch._foreach_mul_(self.v, b2)
        torch._foreach_addcmul_(self.v, g32, g32, value=1.0 - b2)
        bc1 = 1.0 - b1**self.step_count
        bc2_sqrt = math.sqrt(1.0 - b2**self.step_count)
        denom = torch._foreach_sqrt(self.v)
        torch._foreach_div_(denom, bc2_sqrt)
        torch._foreach_add_(denom, cfg.eps)
        torch._foreach_addcdiv_(self.master, self.m, denom, value=-cfg.lr / bc1)
        if out is not None:
            torch._foreach_copy_(out, self.master)

    def tensors(self) -> list[torch.Tensor]:
        return [self.exp_avg, self.exp_avg_sq]
