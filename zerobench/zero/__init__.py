"""ZeRO-DP: partitioned optimizer states (stage 1), gradients (2) and parameters (3) over a DP group.

The configs import without torch; the engine (and ``apply_zero``) load on first use, so parsing a suite
or planning does not pay for importing torch.
"""

from zerobench.zero.config import AdamWConfig, LossScaleConfig, LossScaleRule, Precision, ZeroConfig
from zerobench.zero.loss_scale import LossScaleAtMinimum

__all__ = [
    "AdamWConfig",
    "GatheredParameters",
    "LossScaleAtMinimum",
    "LossScaleConfig",
    "LossScaleRule",
    "Precision",
    "ShardedGradScaler",
    "ZeroConfig",
    "ZeroEngine",
    "apply_zero",
    "initialize",
]


def __getattr__(name: str):
    if name == "apply_zero":
        from zerobench.zero.api import apply_zero

        return apply_zero
    if name == "initialize":  # deepspeed.initialize's counterpart, from a DeepSpeed config
        from zerobench.zero.ds_initialize import initialize

        return initialize
    if name == "GatheredParameters":  # deepspeed.zero.GatheredParameters's counterpart
        from zerobench.zero.gathered import GatheredParameters

        return GatheredParameters
    if name == "ShardedGradScaler":
        from zerobench.zero.amp import ShardedGradScaler

        return ShardedGradScaler
    if name == "ZeroEngine":
        from zerobench.zero.engine import ZeroEngine

        return ZeroEngine
    raise AttributeError(f"module 'zerobench.zero' has no attribute {name!r}")
