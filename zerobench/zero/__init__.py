"""ZeRO-DP: partitioned optimizer states (stage 1), gradients (2) and parameters (3) over a DP group.

The configs import without torch; everything else loads on first use, so parsing a suite or planning does not
pay for importing torch. ``initialize`` and ``as_deepspeed`` are the DeepSpeed layer's
(``zero/compat/deepspeed/``), re-exported here as DeepSpeed users look for them; the core never imports it.
"""

import importlib

from zerobench.zero.config import AdamWConfig, LossScaleConfig, LossScaleRule, Precision, ZeroConfig

_LAZY = {
    "apply_zero": "zerobench.zero.api",
    "ZeroEngine": "zerobench.zero.engine",
    "engine_of": "zerobench.zero.registry",
    "GatheredParameters": "zerobench.zero.state.gathered",  # deepspeed.zero.GatheredParameters's counterpart
    "ShardedGradScaler": "zerobench.zero.optim.loss_scale",
    "LossScaleAtMinimum": "zerobench.zero.optim.loss_scale",
    "initialize": "zerobench.zero.compat.deepspeed.initialize",  # deepspeed.initialize's counterpart
    "as_deepspeed": "zerobench.zero.compat.deepspeed.engine",
    "DeepSpeedEngine": "zerobench.zero.compat.deepspeed.engine",
}

__all__ = [
    "AdamWConfig",
    "DeepSpeedEngine",
    "GatheredParameters",
    "LossScaleAtMinimum",
    "LossScaleConfig",
    "LossScaleRule",
    "Precision",
    "ShardedGradScaler",
    "ZeroConfig",
    "ZeroEngine",
    "apply_zero",
    "as_deepspeed",
    "engine_of",
    "initialize",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'zerobench.zero' has no attribute {name!r}")
