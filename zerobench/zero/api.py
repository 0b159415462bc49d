"""``apply_zero``: the one entry point that turns a plain model into a ZeRO-trained one."""

from __future__ import annotations

from torch import nn

from zerobench.distributed.collectives import Group
from zerobench.metrics.comm import CommLedger
from zerobench.parallel.tensor_parallel import TPInfo
from zerobench.zero.config import ZeroConfig
from zerobench.zero.engine import ZeroEngine


def default_units(model: nn.Module) -> list[nn.Module]:
    """Stage-3 gather units: every transformer block (``model.blocks``) if the model has them."""
    blocks = getattr(model, "blocks", None)
    return list(blocks) if isinstance(blocks, nn.ModuleList) else []


def apply_zero(
    model: nn.Module,
    dp_group: Group,
    config: ZeroConfig,
    ledger: CommLedger | None = None,
    units: list[nn.Module] | None = None,
    tp: TPInfo | None = None,
) -> ZeroEngine:
    """Apply ZeRO ``config.stage`` to ``model`` over ``dp_group``; returns the engine.

    Apply it last, after tensor parallelism and activation checkpointing: ZeRO partitions whatever
    parameters the model holds at that point. Every rank must pass identically initialised models.
    With tensor parallelism, pass the ``TPInfo`` that ``apply_tp`` returned: ZeRO then runs over the DP
    group of this TP rank, and gradient norms and overflow checks span both groups.
    """
    return ZeroEngine(model, dp_group, config, default_units(model) if units is None else units, ledger, tp)
