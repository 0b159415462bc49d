"""``apply_zero``: the one entry point that turns a plain model into a ZeRO-trained one."""

from __future__ import annotations

from collections.abc import Collection

import torch.distributed as dist
from torch import nn

from zerobench.distributed.collectives import Group
from zerobench.metrics.comm import CommLedger
from zerobench.zero.allocator import Allocator
from zerobench.zero.config import ZeroConfig
from zerobench.zero.engine import ZeroEngine


def default_units(model: nn.Module) -> list[nn.Module]:
    """Stage-3 gather units: every transformer block (``model.blocks``) if the model has them."""
    blocks = getattr(model, "blocks", None)
    return list(blocks) if isinstance(blocks, nn.ModuleList) else []


def apply_zero(
    model: nn.Module,
    dp_group: Group | dist.ProcessGroup | None,
    config: ZeroConfig,
    ledger: CommLedger | None = None,
    units: list[nn.Module] | None = None,
    tp_group: Group | dist.ProcessGroup | None = None,
    tp_sharded: Collection[str] = frozenset(),
    allocator: Allocator | None = None,
    param_groups=None,
) -> ZeroEngine:
    """Apply ZeRO ``config.stage`` to ``model`` over ``dp_group``; returns the engine.

    ``dp_group`` is the data-parallel process group: a ``torch.distributed.ProcessGroup``, ``None`` for the
    default (world) group as DDP's ``process_group=None``, a 1-D ``DeviceMesh`` or a
    ``zerobench.distributed.collectives.Group`` (``tp_group`` likewise, but ``None`` there means no TP).

    Apply it last, after tensor parallelism and activation checkpointing: ZeRO partitions whatever
    parameters the model holds at that point. Every DP rank must pass the same model and config (checked at
    construction: a rank that differs fails with one line on every rank); DP rank 0's parameter and buffer
    values are broadcast to the others, as DDP does, so the ranks need not seed their initialisation alike.
    With tensor parallelism, ``dp_group`` is this TP rank's DP group; pass the TP group and the names of the
    parameters TP shards (``TPInfo.sharded``): gradient norms and overflow checks then span both groups,
    counting sharded parameters once per TP rank and replicated ones once. ``zerobench.parallel.parallelize``
    applies TP, fused kernels, checkpointing and this in their one order. ``allocator``: how host work
    and stage-3 resizes are accounted (default ``PlainAllocator``; see ``zero/allocator.py``).
    ``param_groups``: the optimizer's groups as ``torch.optim`` takes them (a list of dicts with ``params``
    and any of ``lr``, ``betas``, ``eps``, ``weight_decay``; each group's weight decay applies to all its
    parameters); default one group of every trained parameter, with weight decay on 2+-dim ones only
    (``zero/param_groups.py``); or a callable ``param_groups(model)`` that returns them from the model as
    ZeRO receives it (after TP has replaced its parameters).
    """
    dp_group = Group.coerce(dp_group, "dp", "apply_zero's dp_group")
    tp_group = None if tp_group is None else Group.coerce(tp_group, "tp", "apply_zero's tp_group")
    return ZeroEngine(model, dp_group, config, default_units(model) if units is None else units, ledger,
                      tp_group, frozenset(tp_sharded), allocator, param_groups)
