"""ZeRO-DP: partitioned optimizer states (stage 1), gradients (2) and parameters (3) over a DP group."""

from zerobench.zero.api import apply_zero
from zerobench.zero.config import AdamWConfig, LossScaleConfig, Precision, ZeroConfig
from zerobench.zero.engine import ZeroEngine

__all__ = ["apply_zero", "AdamWConfig", "LossScaleConfig", "Precision", "ZeroConfig", "ZeroEngine"]
