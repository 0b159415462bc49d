"""The states a gradient bucket group moves through: how it keeps and reduces gradients (``SyncMode``, one per
ZeRO stage), each bucket's lifecycle (``BucketState``) and a collective in flight (``Inflight``); used by
``zero/bucket.py``."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class SyncMode(enum.Enum):
    """How a bucket group keeps and reduces gradients."""

    ALL_REDUCE = "all_reduce"
    """Stage 0: a full gradient buffer, each bucket all-reduced."""
    REDUCE_SCATTER_FULL = "reduce_scatter_full"
    """Stage 1: a full gradient buffer, each bucket reduce-scattered in place into this rank's shard."""
    REDUCE_SCATTER_STAGED = "reduce_scatter_staged"
    """Stages 2-3: transient staging buckets reduce-scattered into this rank's gradient partition."""

    @classmethod
    def for_stage(cls, stage: int) -> SyncMode:
        return cls.ALL_REDUCE if stage == 0 else cls.REDUCE_SCATTER_FULL if stage == 1 else cls.REDUCE_SCATTER_STAGED


class BucketState(enum.Enum):
    """FILLING -> REDUCING (collective started) -> DONE (collective finished); FILLING again at ``zero()``
    or at the next synchronising micro-batch."""

    FILLING = "filling"
    REDUCING = "reducing"
    DONE = "done"


@dataclass
class Inflight:
    """A bucket's collective in flight: its work, staging buffer, output and where the output is added."""

    bucket: int
    work: object
    staging: torch.Tensor | None
    out: torch.Tensor | None
    accumulate_into: torch.Tensor | None
    first: bool = True
