"""A plain decoder-only GPT (GPT-2 style, pre-LN, tied LM head).

The model holds no parallel code: tensor parallelism, activation checkpointing and ZeRO are applied to it
from the outside by ordered ``apply_*`` transforms. It can be built on the meta device.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from zerobench.models.config import GPTConfig


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        # None: SDPA. Else a causal scaled softmax ``f(scores, scale)`` for explicit attention (fused kernel).
        self.causal_softmax = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)
        b, s = qkv.shape[:2]  # from the projection: a transform may change the sequence it sees
        q, k, v = qkv.view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        y = self.core_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))

    def core_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention over ``[b, heads, s, d]`` (flash / memory-efficient kernels on GPU)."""
        p = self.dropout if self.training else 0.0
        if self.causal_softmax is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        probs = self.causal_softmax(q @ k.transpose(-2, -1), 1.0 / math.sqrt(q.shape[-1]))
        return F.dropout(probs, p) @ v


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.hidden, 4 * cfg.hidden)
        self.proj = nn.Linear(4 * cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.hidden)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln_1(x)))
        return x + self.drop(self.mlp(self.ln_2(x)))


class LMLoss(nn.Module):
    """Mean next-token cross-entropy over ``[b, s, V]`` logits, computed in fp32."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


class GPT(nn.Module):
    """Token + position embeddings, ``layers`` blocks, final LayerNorm, LM head tied to ``wte``."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.hidden)
        self.wpe = nn.Embedding(cfg.seq, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.loss = LMLoss()
        if not self.wte.weight.is_meta:
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """GPT-2 init (``init_parameter``), parameter by parameter in ``named_parameters`` order."""
        for name, p in self.named_parameters():
            init_parameter(name, p, self.config, generator)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Return logits ``[b, s, V]``, or the mean cross-entropy loss when ``targets`` is given."""
        s = tokens.shape[1]
        if s > self.config.seq:
            raise ValueError(f"sequence length {s} exceeds the model's maximum {self.config.seq}")
        pos = torch.arange(s, device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return self.loss(logits, targets)


@torch.no_grad()
def init_parameter(name: str, p: torch.Tensor, cfg: GPTConfig, generator: torch.Generator | None = None) -> None:
    """GPT-2 init of the parameter ``name`` in place: N(0, std) weights, zero biases, LayerNorm weights 1, residual
    projections scaled by 1/sqrt(2L). Called in ``named_parameters`` order it draws what ``reset_parameters`` draws
    (the sharded initialisation of a model built on the meta device relies on it: ``parallel/init.py``)."""
    if name.endswith("bias"):
        p.zero_()
    elif "ln" in name:
        p.fill_(1.0)
    else:
        scale = 1.0 / math.sqrt(2 * cfg.layers) if name.endswith("proj.weight") else 1.0
        p.normal_(0.0, cfg.init_std * scale, generator=generator)
