"""What the engine's helpers may read of it: the ``Engine`` protocol their ``engine`` parameter is typed with.

The helpers (the optimizer step, gradient statistics, checkpoints, teardown, ...) are imported by
``zero/engine.py``; annotating them with ``ZeroEngine`` itself would make each import the engine back, a cycle even
when only type checkers follow it (``tests/unit/test_architecture.py``). This protocol names the attributes they
use instead. Attributes whose classes live in modules that import helpers are typed ``Any`` and name their class.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from zerobench.distributed.collectives import Group
from zerobench.metrics.comm import CommLedger
from zerobench.zero.config import ZeroConfig
from zerobench.zero.layout import PartitionLayout
from zerobench.zero.param import ZeroParam


class Engine(Protocol):
    """A ``ZeroEngine`` as its helpers see it (docs/engine.md lists the public surface)."""

    module: nn.Module
    config: ZeroConfig
    stage: int
    group: Group
    tp_group: Group | None
    ledger: CommLedger
    device: torch.device
    param_dtype: torch.dtype
    layout: PartitionLayout
    zparams: list[ZeroParam]
    rank_in_shards: int
    replicated_ranges: list
    frozen: list[tuple[str, nn.Parameter]]
    _known_param_ids: frozenset[int]
    destroyed: bool
    global_steps: int
    last_grad_norm: float | None
    always_norm: bool
    skip_nonfinite: bool
    unused_hint: str
    _clip: float
    _norm_taken: bool
    grads_sharded: bool
    storage: Any
    """``storage.params.ParamStorage``."""
    placement: Any
    """``storage.placement.Placement``."""
    allocator: Any
    """``storage.allocator.Allocator``."""
    adamw: Any
    """``optim.adamw.ShardedAdamW``: the step over this rank's flat partitions."""
    optimizer: Any
    """``optim.torch_optimizer.ZeroOptimizer``."""
    scaler: Any
    """``optim.loss_scale.DynamicLossScaler``."""
    grads: Any
    """``grads.buckets.GradBucketGroup``."""
    passes: Any
    """``grads.backward.BackwardPasses``."""
    window: Any
    """``grads.accumulation.AccumulationWindow``."""
    gatherer: Any
    """``stage3.gatherer.Stage3Gatherer`` (stage 3), else None."""

    def grad_chunks(self) -> list[torch.Tensor]: ...

    def params_from_master(self) -> None: ...

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def restart_window(self) -> None: ...
