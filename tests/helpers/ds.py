"""Engines with DeepSpeed's names for tests that drive them as DeepSpeed users do: ``apply_zero``'s engine made a
``DeepSpeedEngine`` (``zerobench.zero.as_deepspeed``), the engine ``zerobench.zero.initialize`` returns."""

from __future__ import annotations

from zerobench.zero.api import apply_zero
from zerobench.zero.compat.deepspeed.engine import DeepSpeedEngine, as_deepspeed


def ds_apply_zero(*args, micro_batch: int | None = None, **kwargs) -> DeepSpeedEngine:
    """``apply_zero(*args, **kwargs)`` with DeepSpeed's engine names."""
    return as_deepspeed(apply_zero(*args, **kwargs), micro_batch)
