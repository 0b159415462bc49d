"""Megatron tensor-parallel layers, built from a plain layer's weights (or shapes, on the meta device).

- ``ColumnParallelLinear``: output features split over TP ranks (``strided`` > 1 splits each of that
  many stacked blocks separately, e.g. the fused QKV projection so each rank gets whole heads of q, k, v).
- ``RowParallelLinear``: input features split; partial outputs all-reduced; bias added after the reduce.
- ``VocabParallelEmbedding``: vocabulary rows split; tokens outside a rank's range contribute zero.
- ``ParallelLMHead``: logits for this rank's vocabulary slice, with a (possibly tied) weight.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zerobench.config import ConfigError
from zerobench.distributed.collectives import Group
from zerobench.metrics.comm import CommLedger
from zerobench.parallel.mappings import copy_to_tp, reduce_from_tp
from zerobench.parallel.sequence import gather_sequence, reduce_scatter_sequence


def shard_rows(t: torch.Tensor, group: Group, strided: int = 1) -> torch.Tensor:
    """This rank's slice of dim 0; with ``strided`` k, of each of the k stacked blocks, re-stacked."""
    blocks = t.chunk(strided, dim=0)
    return torch.cat([b.chunk(group.size, dim=0)[group.rank] for b in blocks], dim=0).clone()


def shard_cols(t: torch.Tensor, group: Group) -> torch.Tensor:
    return t.chunk(group.size, dim=-1)[group.rank].clone()


def _param(t: torch.Tensor, like: nn.Parameter) -> nn.Parameter:
    """A shard ``t`` of the parameter ``like`` as a parameter of its own: frozen where ``like`` is (a frozen
    embedding or block stays frozen under TP, as at TP 1)."""
    return nn.Parameter(t.detach().clone(), requires_grad=like.requires_grad)


class ColumnParallelLinear(nn.Module):
    def __init__(
        self,
        full: nn.Linear,
        group: Group,
        ledger: CommLedger | None = None,
        strided: int = 1,
        sequence_parallel: bool = False,
    ):
        super().__init__()
        if full.out_features % (strided * group.size):
            blocks = f" in {strided} stacked blocks" if strided > 1 else ""
            raise ConfigError(
                f"ColumnParallelLinear: {full.out_features} output features{blocks} do not split evenly over TP "
                f"degree {group.size}: make them a multiple of {strided * group.size} or choose a TP degree dividing them"
            )
        self.group, self.ledger, self.sequence_parallel = group, ledger, sequence_parallel
        self.weight = _param(shard_rows(full.weight, group, strided), full.weight)
        self.bias = _param(shard_rows(full.bias, group, strided), full.bias) if full.bias is not None else None

    def forward(self, x: torch.Tensor, skip_bias: bool = False) -> torch.Tensor:
        """``skip_bias``: leave the bias add to the caller (a fused bias+activation kernel)."""
        bias = None if skip_bias else self.bias
        if self.sequence_parallel:  # [b, s/tp, h] -> all-gather the sequence (reduce-scatter in backward)
            return F.linear(gather_sequence(x, self.group, self.ledger), self.weight, bias)
        return F.linear(copy_to_tp(x, self.group, self.ledger), self.weight, bias)


class RowParallelLinear(nn.Module):
    def __init__(
        self, full: nn.Linear, group: Group, ledger: CommLedger | None = None, sequence_parallel: bool = False
    ):
        super().__init__()
        if full.in_features % group.size:
            raise ConfigError(
                f"RowParallelLinear: {full.in_features} input features are not divisible by TP degree {group.size}: "
                f"make them a multiple of {group.size} or choose a TP degree dividing them"
            )
        self.group, self.ledger, self.sequence_parallel = group, ledger, sequence_parallel
        self.weight = _param(shard_cols(full.weight, group), full.weight)
        self.bias = _param(full.bias, full.bias) if full.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:  # partial sums -> reduce-scatter along the sequence
            y = reduce_scatter_sequence(F.linear(x, self.weight), self.group, self.ledger)
        else:
            y = reduce_from_tp(F.linear(x, self.weight), self.group, self.ledger)
        return y + self.bias if self.bias is not None else y


class VocabParallelEmbedding(nn.Module):
    def __init__(
        self, full: nn.Embedding, group: Group, ledger: CommLedger | None = None, sequence_parallel: bool = False
    ):
        super().__init__()
        _refuse_embedding_options(full, group.size)
        self.group, self.ledger, self.sequence_parallel = group, ledger, sequence_parallel
        self.per_rank = full.num_embeddings // group.size
        self.start = group.rank * self.per_rank
        self.weight = _param(shard_rows(full.weight, group), full.weight)
        pad = full.padding_idx
        self.padding_idx = pad - self.start if pad is not None and 0 <= pad - self.start < self.per_rank else None
        """The local row of ``full.padding_idx`` on the rank that holds it (its gradient stays zero, as torch's)."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.group.size == 1:
            return F.embedding(tokens, self.weight, self.padding_idx)
        outside = (tokens < self.start) | (tokens >= self.start + self.per_rank)
        local = (tokens - self.start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight, self.padding_idx).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return reduce_scatter_sequence(out, self.group, self.ledger, "mp_embed")
        return reduce_from_tp(out, self.group, self.ledger, "mp_embed")


def _refuse_embedding_options(full: nn.Embedding, tp: int) -> None:
    """One-line errors for what a vocabulary shard cannot do on its own: an uneven split, and the options that need
    every token's full row or count (``padding_idx`` is honoured: the rank holding that row keeps its gradient 0)."""
    v = full.num_embeddings
    if v % tp:
        raise ConfigError(
            f"VocabParallelEmbedding: vocabulary {v} is not divisible by TP degree {tp}: pad the vocabulary to a "
            f"multiple of {tp} (zerobench.models.sizes.padded_vocab), as Megatron-LM does"
        )
    if full.max_norm is not None:
        raise ConfigError(
            f"VocabParallelEmbedding: max_norm={full.max_norm} is not supported under TP (each rank would renormalise "
            "only its own rows): build the embedding with max_norm=None"
        )
    if full.scale_grad_by_freq:
        raise ConfigError(
            "VocabParallelEmbedding: scale_grad_by_freq=True is not supported under TP (a rank sees only its own "
            "tokens' counts): build the embedding with scale_grad_by_freq=False"
        )
    if full.sparse:
        raise ConfigError(
            "VocabParallelEmbedding: sparse=True is not supported under TP (its weight takes dense gradients): "
            "build the embedding with sparse=False"
        )


class ParallelLMHead(nn.Module):
    """Logits ``[..., V / tp]`` of this rank's vocabulary slice (weight tied to the embedding)."""

    def __init__(
        self, weight: nn.Parameter, group: Group, ledger: CommLedger | None = None, sequence_parallel: bool = False
    ):
        super().__init__()
        self.group, self.ledger, self.sequence_parallel = group, ledger, sequence_parallel
        self.weight = weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            return F.linear(gather_sequence(x, self.group, self.ledger, "mp_embed"), self.weight)
        return F.linear(copy_to_tp(x, self.group, self.ledger, "mp_embed"), self.weight)
