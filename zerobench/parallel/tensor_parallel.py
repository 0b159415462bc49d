"""``apply_tp``: Megatron tensor parallelism for the plain GPT, applied from outside the model.

Applied first (before activation checkpointing and ZeRO, which act on whatever parameters TP leaves):
QKV and MLP-in become column-parallel, attention-out and MLP-out row-parallel, the token embedding and
the tied LM head vocabulary-parallel, and the loss vocabulary-parallel cross-entropy. LayerNorms, the
position embedding and row-parallel biases stay replicated (identical on every TP rank, as are their
gradients). The returned ``TPInfo`` tells ZeRO which parameters are TP-sharded, so that the gradient norm
counts sharded parameters once per TP rank and replicated ones once in all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from zerobench.config import ConfigError
from zerobench.distributed.collectives import Group
from zerobench.metrics.comm import CommLedger
from zerobench.models.gpt import GPT
from zerobench.parallel.config import validate_tp
from zerobench.parallel.cross_entropy import VocabParallelLMLoss
from zerobench.parallel.layers import (
    ColumnParallelLinear,
    ParallelLMHead,
    RowParallelLinear,
    VocabParallelEmbedding,
    shard_cols,
    shard_rows,
)
from zerobench.parallel.random import TPRngTracker


@dataclass(frozen=True)
class TPInfo:
    """What ``apply_tp`` did: the TP group and the names of the TP-sharded parameters."""

    group: Group
    sharded: frozenset[str]
    rng: TPRngTracker | None = None
    """The RNG of sharded regions (attention); checkpoint recompute replays it."""


def apply_tp(
    model: GPT,
    group: Group | dist.ProcessGroup | None,
    ledger: CommLedger | None = None,
    seed: int = 0,
    sequence_parallel: bool = False,
    device: torch.device | None = None,
) -> TPInfo:
    """Shard ``model`` in place over ``group``; every rank must pass an identically initialised model.

    Attention (heads split over TP ranks) draws dropout from a per-TP-rank RNG (``seed`` + rank);
    everything else from the default RNG, identical on every TP rank — except with
    ``sequence_parallel``, where the regions between the matmuls hold different sequence positions on each
    TP rank, so their dropout draws from the per-rank RNG too. ``device``: where the model will run, for a
    model built on the meta device (default: its parameters'). ``group``: a ``Group``, a
    ``torch.distributed.ProcessGroup`` or ``None`` (the default, world group), as ``Group.coerce`` takes them.
    """
    group = Group.coerce(group, "tp", "apply_tp's group")
    validate_tp(model.config, group.size)
    if sequence_parallel and model.config.seq % group.size:
        raise ConfigError(
            f"sequence length {model.config.seq} is not divisible by TP degree {group.size}: "
            "sequence parallelism splits the sequence evenly"
        )
    if group.size == 1:
        return TPInfo(group, frozenset())
    head = model.lm_head
    if head.weight is not model.wte.weight or getattr(head, "bias", None) is not None:
        raise ConfigError(
            "apply_tp: the LM head is not tied to the token embedding (its own weight, or a bias): tensor parallelism "
            "shards the head with the embedding, vocabulary-parallel, and would drop a head of its own; tie them "
            "(model.lm_head.weight = model.wte.weight, no bias) or train this model without TP"
        )
    sp = sequence_parallel
    rng = TPRngTracker(seed, group.rank, device if device is not None else next(model.parameters()).device)
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        attn.qkv = ColumnParallelLinear(attn.qkv, group, ledger, strided=3, sequence_parallel=sp)
        attn.proj = RowParallelLinear(attn.proj, group, ledger, sequence_parallel=sp)
        attn.heads //= group.size
        attn.core_attention = _in_region(attn.core_attention, rng)
        mlp.fc = ColumnParallelLinear(mlp.fc, group, ledger, sequence_parallel=sp)
        mlp.proj = RowParallelLinear(mlp.proj, group, ledger, sequence_parallel=sp)
        if sp:
            block.drop.forward = _in_region(block.drop.forward, rng)
    model.wte = VocabParallelEmbedding(model.wte, group, ledger, sequence_parallel=sp)
    model.lm_head = ParallelLMHead(model.wte.weight, group, ledger, sequence_parallel=sp)
    if sp:
        _sequence_parallel_extras(model, group, ledger)
    model.loss = VocabParallelLMLoss(group, ledger)
    sharded = set()
    for name, module in model.named_modules():
        if isinstance(module, (ColumnParallelLinear, VocabParallelEmbedding)):
            sharded.update(f"{name}.{p}" for p, _ in module.named_parameters())
        elif isinstance(module, RowParallelLinear):
            sharded.add(f"{name}.weight")
    for name, p in model.named_parameters():
        if name in sharded:  # Megatron's mark, read as DeepSpeed reads it: apply_zero refuses it without a TP group
            p.tensor_model_parallel = True
    return TPInfo(group, frozenset(sharded), rng)


def _sequence_parallel_extras(model: GPT, group: Group, ledger: CommLedger | None) -> None:
    """Position embeddings for this rank's positions only, and TP-summed gradients for every parameter
    that now sees only a slice of the sequence (LayerNorms, row-parallel biases, position embedding)."""
    from zerobench.parallel.sequence import local_sequence, sum_grad_over_tp

    inner = model.wpe.forward
    model.wpe.forward = lambda pos, _inner=inner: local_sequence(_inner(pos), group, dim=0)
    partial = [model.wpe.weight, model.ln_f.weight, model.ln_f.bias]
    for block in model.blocks:
        partial += [*block.ln_1.parameters(), *block.ln_2.parameters(), block.attn.proj.bias, block.mlp.proj.bias]
    for p in partial:
        if p is not None and p.requires_grad:  # a frozen one gets no gradient (the engine refuses unfreezing it)
            sum_grad_over_tp(p, group, ledger)


def shard_parameter(name: str, full: torch.Tensor, group: Group) -> torch.Tensor:
    """This TP rank's piece of the plain GPT's parameter ``name`` (full value ``full``), as ``apply_tp``'s layers
    cut it: QKV rows by head blocks, MLP-in rows, attention-out and MLP-out weight columns, vocabulary rows; the
    rest whole. ``parallel/init.py`` initialises a meta-built model with it (tested equal to ``apply_tp``'s)."""
    if group.size == 1:
        return full
    layer, _, kind = name.rpartition(".")
    if layer.endswith("attn.qkv"):
        return shard_rows(full, group, strided=3)
    if layer.endswith("mlp.fc") or name == "wte.weight":
        return shard_rows(full, group)
    if layer.endswith(("attn.proj", "mlp.proj")) and kind == "weight":
        return shard_cols(full, group)
    return full


def _in_region(fn, rng: TPRngTracker):
    def region(*args, **kwargs):
        with rng.fork():
            return fn(*args, **kwargs)

    return region


def sharded_parameters(model: nn.Module, info: TPInfo) -> set[int]:
    """``id``s of the TP-sharded parameters of ``model``."""
    return {id(p) for n, p in model.named_parameters() if n in info.sharded}
