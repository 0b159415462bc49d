"""``apply_fused_kernels``: swap the GPT's LayerNorms, MLP activation and (optionally) attention softmax
for the fused kernels of ``kernels/``, from outside the model.

Applied after ``apply_tp`` (it works on the TP layers too: the column-parallel MLP input skips its bias add,
which the fused bias+GeLU then does) and before activation checkpointing and ZeRO. Parameter names and
order are unchanged, so checkpoints and ZeRO layouts are the same with or without it.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

import kernels
from zerobench.models.gpt import GPT, MLP
from zerobench.parallel.layers import ColumnParallelLinear


class FusedLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` computed by the fused kernel (same parameters and state dict)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.layer_norm(x, self.weight, self.bias, self.eps, mode="fused")


class FusedMLP(nn.Module):
    """``proj(gelu(fc(x)))`` with the bias add and GeLU of ``fc`` fused into one kernel."""

    def __init__(self, mlp: MLP):
        super().__init__()
        self.fc, self.proj = mlp.fc, mlp.proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(self.fc, ColumnParallelLinear):
            h = self.fc(x, skip_bias=True)
        else:
            h = F.linear(x, self.fc.weight)
        return self.proj(kernels.bias_gelu(h, self.fc.bias, "none", mode="fused"))


def _fusable(norm: nn.LayerNorm) -> bool:
    """The fused kernel normalises over the last dimension with a weight and a bias: any other LayerNorm (several
    normalised dimensions, ``elementwise_affine=False`` or ``bias=False``) is left as torch's."""
    return len(norm.normalized_shape) == 1 and norm.weight is not None and norm.bias is not None


def apply_fused_kernels(
    model: GPT, mode: str = "auto", softmax_attention: bool = False, device: torch.device | None = None
) -> str:
    """Swap in the fused kernels (LayerNorms the kernel computes exactly, ``_fusable``; the GPT's MLPs); return the path taken ("fused", or "reference" when ``mode`` resolves so,
    in which case the model is left as it is).

    ``softmax_attention`` replaces SDPA by explicit attention with the fused causal softmax (Megatron's
    non-flash path); leave it off where SDPA has flash/memory-efficient kernels (GPUs). ``device``: where the model
    will run, for a model built on the meta device (default: its parameters').
    """
    path = kernels.resolve(mode, device if device is not None else next(model.parameters()).device)
    if path == "reference":
        return path
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.LayerNorm and _fusable(child):
                fused = FusedLayerNorm(child.normalized_shape, child.eps, device="meta")
                fused.weight, fused.bias = child.weight, child.bias
                setattr(parent, name, fused)
            elif type(child) is MLP:
                setattr(parent, name, FusedMLP(child))
    if softmax_attention:
        for block in model.blocks:
            block.attn.causal_softmax = functools.partial(kernels.causal_softmax, mode="fused")
    return path
