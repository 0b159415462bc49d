"""Typed configuration of the ZeRO engine: stage, precision, buckets, loss scaling, AdamW."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from zerobench.config import ConfigError, check_types

if TYPE_CHECKING:
    import torch


class Precision(str, enum.Enum):
    """Training precision recipe."""

    FP32 = "fp32"
    """Everything fp32; the parameters themselves are the optimizer's master weights."""
    BF16 = "bf16"
    """bf16 parameters and gradients (also reduced in bf16), fp32 master weights and Adam states."""
    FP16 = "fp16"
    """As bf16 but fp16, with loss scaling (``LossScaleConfig``): a step whose gradients overflow is skipped."""

    @property
    def param_dtype(self) -> torch.dtype:
        import torch

        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.value]

    @property
    def has_master(self) -> bool:
        """Whether a separate fp32 master copy exists (mixed precision)."""
        return self is not Precision.FP32


@dataclass(frozen=True)
class AdamWConfig:
    """AdamW hyperparameters (decoupled weight decay, as ``torch.optim.AdamW``)."""

    lr: float = 1e-3
    """Learning rate."""
    betas: tuple[float, float] = (0.9, 0.95)
    """Exponential decay rates of the first and second moments."""
    eps: float = 1e-8
    """Added to the denominator for numerical stability."""
    weight_decay: float = 0.1
    """Decoupled weight decay. Without explicit param groups it applies to parameters of 2 or more dimensions only
    (not biases or norms); a user's group decays every parameter in it (``zero/optim/param_groups.py``)."""


class LossScaleRule(str, enum.Enum):
    """When the fp16 loss scale moves. Every rule skips a step whose gradients overflowed."""

    TORCH = "torch"
    """``torch.amp.GradScaler``'s: grow after ``growth_interval`` consecutive overflow-free steps, counted from the
    last growth or overflow (window 2 from the start: grows after steps 2, 4, 6, ...)."""
    DEEPSPEED = "deepspeed"
    """DeepSpeed's ``DynamicLossScaler``: grow when the overflow-free steps since the last overflow (or the start),
    less one, are a positive multiple of ``growth_interval`` (window 2 from the start: grows after steps 3, 5, 7,
    ...). What a DeepSpeed config (``zerobench.zero.initialize``) trains with."""
    STATIC = "static"
    """A fixed scale, ``init_scale`` (DeepSpeed's ``fp16.loss_scale`` > 0): never grows nor backs off."""


@dataclass(frozen=True)
class LossScaleConfig:
    """Loss scaling for fp16 (ignored for fp32/bf16). At ``min_scale`` an overflow that would back the scale off
    ends training (``zero/optim/loss_scale.py``'s ``LossScaleAtMinimum``; DeepSpeed stops there too): every later
    step would overflow and be skipped as well."""

    init_scale: float = 2.0**16
    """Initial loss scale."""
    growth_factor: float = 2.0
    """Multiply the scale by this after ``growth_interval`` overflow-free steps."""
    backoff_factor: float = 0.5
    """Multiply the scale by this when a step overflows (and is skipped)."""
    growth_interval: int = 1000
    """Overflow-free steps before the scale grows."""
    min_scale: float = 1.0
    """The scale never drops below this."""
    hysteresis: int = 1
    """Overflowing steps tolerated before the scale backs off (DeepSpeed's ``hysteresis``, restored when the scale
    grows); 1: back off at every overflow, as ``torch.amp.GradScaler``. An overflowing step is skipped either way."""
    consecutive_hysteresis: bool = False
    """Restore ``hysteresis`` after every overflow-free step, not only when the scale grows (DeepSpeed's
    ``consecutive_hysteresis``): only that many overflows in a row back the scale off."""
    rule: LossScaleRule = LossScaleRule.TORCH
    """When the scale grows (see ``LossScaleRule``): torch's for ``ZeroConfig``, DeepSpeed's for a DeepSpeed config."""
    stop_at_min: bool = True
    """An overflow with the scale already at ``min_scale`` ends training (``LossScaleAtMinimum``), as DeepSpeed's ZeRO
    optimizers do; False only skips the step and warns, as DeepSpeed's fp16 optimizer without ZeRO (stage 0) does."""

    def __post_init__(self) -> None:
        """``rule="deepspeed"`` is ``LossScaleRule.DEEPSPEED`` (an unknown name is left for ``validate`` to name)."""
        if isinstance(self.rule, str) and not isinstance(self.rule, LossScaleRule):
            match = [r for r in LossScaleRule if r.value == self.rule.lower()]
            if match:
                object.__setattr__(self, "rule", match[0])

    def validate(self) -> None:
        """The factors' directions are ``torch.amp.GradScaler``'s: a backoff factor of 1 or more would raise the scale
        at every overflow, so every step would be skipped and the scale never reach ``min_scale``."""
        if not isinstance(self.rule, LossScaleRule):
            raise ConfigError(f"unknown loss-scale rule {self.rule!r}: choose torch, deepspeed or static")
        check_types(self, "loss_scale")
        if not (_finite(self.init_scale) and self.init_scale > 0):
            raise ConfigError(f"initial loss scale must be a positive finite number, got {self.init_scale}")
        if not (_finite(self.growth_factor) and self.growth_factor > 1):
            raise ConfigError(f"loss-scale growth factor must be a finite number > 1, got {self.growth_factor}")
        if not 0 < self.backoff_factor < 1:
            raise ConfigError(f"loss-scale backoff factor must be in (0, 1), got {self.backoff_factor}")
        if self.hysteresis < 1:
            raise ConfigError(
                f"loss-scale hysteresis must be >= 1 (1: back off at every overflow), got {self.hysteresis}"
            )
        if self.growth_interval < 1:
            raise ConfigError(
                f"loss-scale growth interval (DeepSpeed's loss_scale_window) must be >= 1, got {self.growth_interval}"
            )
        if not (_finite(self.min_scale) and self.min_scale > 0):
            raise ConfigError(f"minimum loss scale must be a positive finite number, got {self.min_scale}")
        if self.rule is not LossScaleRule.STATIC and self.min_scale > self.init_scale:
            raise ConfigError(
                f"minimum loss scale {self.min_scale:g} is above the initial scale {self.init_scale:g}: lower the "
                "minimum (DeepSpeed's min_loss_scale) or raise the initial scale"
            )


def _finite(x) -> bool:
    """``math.isfinite`` that takes an int too large for a float (2**1100) as not finite rather than raising."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


NO_BUCKET_LIMIT = 2**62
"""A bucket size no model reaches: buckets as large as the model (stage 3: one bucket per unit; suites'
``bucket_size: null``, no C_B)."""


MAX_INFLIGHT = 2
"""Gradient bucket collectives outstanding while backward goes on (``overlap_comm``) before it waits for the oldest."""


@dataclass(frozen=True)
class ZeroConfig:
    """Configuration of ``apply_zero``."""

    stage: int = 0
    """0: baseline DP (all-reduce), 1: P_os, 2: P_os+g, 3: P_os+g+p."""
    precision: Precision = Precision.FP32
    """Precision recipe (see ``Precision``)."""
    bucket_numel: int = 6_250_000
    """Elements per gradient/parameter bucket (constant-size buffers, C_B); 25 MB of fp32, torch DDP's
    default. Stages 2-3 hold one staging bucket of this size at a time (``zero/grads/staging.py``). At
    stage 3 a bucket never spans two gather units; a unit larger than this is cut into several buckets
    (gathered together, reduce-scattered one by one as backward fills them)."""
    param_align: int = 16
    """Every parameter starts on a multiple of this many elements in the flat buffers."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step; ``backward`` divides the loss by this."""
    clip_grad_norm: float | None = None
    """Clip the global gradient L2 norm (across all partitions) to this value; None disables."""
    find_unused_parameters: bool = False
    """Allow trained parameters that get no gradient in a step on some rank (a branch not taken, a
    layer skipped): their gradient is zero there. Off (as DDP's default), such a step fails on every
    rank with an error naming them. Costs nothing when on; off, one flag per rank a step (carried by stage 0's
    last gradient all-reduce; one small all-reduce of its own at stages 1-3)."""
    prefetch: bool = True
    """Stage 3: all-gather the next module's parameters while the current one computes."""
    overlap_comm: bool = True
    """Start each gradient bucket's collective as soon as the bucket is complete and let backward run on
    (up to ``MAX_INFLIGHT`` outstanding; DeepSpeed's ``overlap_comm``). At stages 2-3 one large staging bucket is
    reduced at a time: the next one's gradients stay as autograd made them until that collective finishes
    (``zero/grads/staging.py``), so no gradient is held in two places. Off, backward waits for each bucket's
    collective before it goes on: slower wherever communication is not free."""
    kernels: str = "auto"
    """Optimizer kernels: "auto" (fused where the device has them), "fused" (required), "reference"."""
    offload_optimizer: str = "none"
    """ZeRO-Offload (stages 1-3): "none"; "cpu" (fp32 master and Adam states in host memory, gradients
    streamed down per bucket, the step on the CPU kernel, parameters streamed back up); "nvme" (as "cpu",
    with the Adam states swapped to files under ``nvme_path``)."""
    offload_param: str = "none"
    """ZeRO-Infinity's CPU tier for parameters (stage 3, with optimizer offload): "none" or "cpu" (the
    parameter partition lives in host memory and is copied up for each gather)."""
    nvme_path: str | None = None
    """Directory for the NVMe tier's optimizer-state files (``offload_optimizer="nvme"``)."""
    optim_bits: int = 32
    """Adam moments in fp32 (32) or blockwise-quantized 8-bit (8; dynamic code books, one fp32 absmax per
    2048 elements): 2 bytes per parameter instead of 8, so K drops from 12 to about 6."""
    optimizer: AdamWConfig = field(default_factory=AdamWConfig)
    """AdamW hyperparameters."""
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    """fp16 dynamic loss scaling."""

    def __post_init__(self) -> None:
        """``precision="bf16"`` is ``Precision.BF16`` (an unknown name is left for ``validate`` to name)."""
        if isinstance(self.precision, str) and not isinstance(self.precision, Precision):
            match = [p for p in Precision if p.value == self.precision.lower()]
            if match:
                object.__setattr__(self, "precision", match[0])

    def validate(self) -> None:
        if isinstance(self.stage, bool) or self.stage not in (0, 1, 2, 3):
            raise ConfigError(f"unknown ZeRO stage {self.stage!r}: choose 0, 1, 2 or 3")
        if not isinstance(self.precision, Precision):
            raise ConfigError(f"unknown precision {self.precision!r}: choose fp32, bf16 or fp16")
        check_types(self, "ZeroConfig")
        if self.bucket_numel < 1:
            raise ConfigError(f"bucket size must be >= 1 element, got {self.bucket_numel}")
        if self.grad_accum_steps < 1:
            raise ConfigError(f"gradient accumulation steps must be >= 1, got {self.grad_accum_steps}")
        if self.kernels not in ("auto", "fused", "reference"):
            raise ConfigError(f"unknown kernel mode {self.kernels!r}: choose auto, fused or reference")
        if self.offload_optimizer not in ("none", "cpu", "nvme"):
            raise ConfigError(f"unknown optimizer offload {self.offload_optimizer!r}: choose none, cpu or nvme")
        if self.offload_param not in ("none", "cpu"):
            raise ConfigError(f"unknown parameter offload {self.offload_param!r}: choose none or cpu")
        if self.offload_optimizer != "none" and self.stage == 0:
            raise ConfigError("optimizer offload partitions the optimizer: use --stage 1, 2 or 3 with it")
        if self.offload_param != "none" and (self.stage != 3 or self.offload_optimizer == "none"):
            raise ConfigError(
                "parameter offload needs --stage 3 and optimizer offload (--offload-optimizer cpu or nvme)"
            )
        if self.offload_optimizer == "nvme" and not self.nvme_path:
            raise ConfigError("--offload-optimizer nvme needs --nvme-path DIR (where the optimizer-state files go)")
        if self.optim_bits not in (32, 8):
            raise ConfigError(f"optimizer state bits must be 32 or 8, got {self.optim_bits}")
        o = self.optimizer
        if not (math.isfinite(o.lr) and o.lr > 0):
            raise ConfigError(f"learning rate must be a positive finite number, got {o.lr}")
        if not (math.isfinite(o.weight_decay) and o.weight_decay >= 0):
            raise ConfigError(f"weight decay must be a finite number >= 0, got {o.weight_decay}")
        if not (math.isfinite(o.eps) and o.eps > 0) or not all(0 <= b < 1 for b in o.betas):
            raise ConfigError(f"AdamW needs eps > 0 and betas in [0, 1), got eps {o.eps}, betas {o.betas}")
        if self.clip_grad_norm is not None and not (math.isfinite(self.clip_grad_norm) and self.clip_grad_norm > 0):
            raise ConfigError(f"clip norm must be a positive finite number (or unset), got {self.clip_grad_norm}")
        self.loss_scale.validate()
