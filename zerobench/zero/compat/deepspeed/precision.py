"""A DeepSpeed configuration's ``bf16`` and ``fp16`` sections (``zero/compat/deepspeed/config.py``) as zerobench's
precision and loss scaling, with DeepSpeed's defaults and its rule for moving the scale (``LossScaleRule.DEEPSPEED``).
Pure."""

from __future__ import annotations

import dataclasses

from zerobench.config import ConfigError
from zerobench.zero.compat.deepspeed.values import flag, known, num, section
from zerobench.zero.config import LossScaleConfig, LossScaleRule, Precision

_FP16_KEYS = {
    "enabled",
    "loss_scale",
    "initial_scale_power",
    "loss_scale_window",
    "hysteresis",
    "consecutive_hysteresis",
    "min_loss_scale",
    "fp16_master_weights_and_grads",
    "auto_cast",
}
_DYNAMIC_KEYS = {"initial_scale_power", "loss_scale_window", "hysteresis", "consecutive_hysteresis", "min_loss_scale"}
"""fp16 keys that tune only the dynamic scale (read and ignored under a static ``loss_scale``)."""
_BF16_KEYS = {
    "enabled",
    "immediate_grad_update",
    "check_grad_overflow",
    "bf16_master_weights_and_grads",
    "bf16_optimizer_states",
}


def read_precision(cfg: dict, ignored: list[str]) -> tuple[Precision, LossScaleConfig]:
    """The precision ``cfg`` trains in and its loss scaling; keys read without effect are appended to ``ignored``."""
    # DeepSpeed reads "bf16" whenever the key is there (an empty section disables it), and only then "bfloat16"
    bf16 = section(cfg, "bf16" if "bf16" in cfg else "bfloat16")
    ignored += ["bfloat16"] if "bf16" in cfg and "bfloat16" in cfg else []
    fp16 = section(cfg, "fp16")
    known(bf16, _BF16_KEYS, "bf16")
    known(fp16, _FP16_KEYS, "fp16")
    flag(bf16, "check_grad_overflow", True, "bf16")  # read where it has effect (skips_nonfinite); checked here
    if flag(bf16, "bf16_master_weights_and_grads", False, "bf16") or flag(bf16, "bf16_optimizer_states", False, "bf16"):
        raise ConfigError(
            "DeepSpeed config bf16: bf16 master weights or optimizer states are not supported "
            "(zerobench keeps them in fp32)"
        )
    bf16_on, fp16_on = flag(bf16, "enabled", False, "bf16"), flag(fp16, "enabled", False, "fp16")
    if bf16_on and fp16_on:
        raise ConfigError("DeepSpeed config enables both bf16 and fp16: choose one")
    if not fp16_on:
        ignored += [f"bf16.{k}" for k in bf16 if k not in ("enabled", "check_grad_overflow")]
        return (Precision.BF16 if bf16_on else Precision.FP32), LossScaleConfig()
    static = num(fp16, "loss_scale", 0, float, "fp16")
    if static < 0:
        raise ConfigError(f"DeepSpeed config fp16.loss_scale {static}: give 0 (dynamic) or a positive static scale")
    if flag(fp16, "fp16_master_weights_and_grads", False, "fp16"):
        raise ConfigError(
            "DeepSpeed config fp16.fp16_master_weights_and_grads: not supported (zerobench keeps fp32 master weights)"
        )
    if static:  # as DeepSpeed's ZeRO optimizers: an overflowing step is still skipped; the scale never moves
        ignored += [f"fp16.{k}" for k in fp16 if k in _DYNAMIC_KEYS]
        return Precision.FP16, LossScaleConfig(init_scale=static, rule=LossScaleRule.STATIC)
    return Precision.FP16, _dynamic(fp16)


MAX_SCALE_POWER = 127
"""The largest ``fp16.initial_scale_power`` (in magnitude) whose scale fp32 holds (2**128 overflows it). DeepSpeed
checks none; a power below 0 is a scale below ``min_loss_scale``'s default 1, which ``LossScaleConfig`` refuses
unless the minimum is lowered too."""


def _dynamic(fp16: dict) -> LossScaleConfig:
    """DeepSpeed's dynamic loss scale, its defaults where a key is absent (power 16, window 1000, hysteresis 2,
    minimum 1)."""
    window = num(fp16, "loss_scale_window", 1000, int, "fp16")
    if window < 1:
        raise ConfigError(
            f"DeepSpeed config fp16.loss_scale_window {window}: must be >= 1 (the overflow-free steps "
            "between two growths of the scale)"
        )
    floor = num(fp16, "min_loss_scale", 1.0, float, "fp16")
    if floor <= 0:
        raise ConfigError(f"DeepSpeed config fp16.min_loss_scale {floor:g}: must be > 0")
    power = num(fp16, "initial_scale_power", 16, int, "fp16")
    if not -MAX_SCALE_POWER <= power <= MAX_SCALE_POWER:
        raise ConfigError(
            f"DeepSpeed config fp16.initial_scale_power {power}: give -{MAX_SCALE_POWER} to {MAX_SCALE_POWER} (the "
            "initial scale is 2 to that power, and the scaled loss is an fp32 number)"
        )
    return LossScaleConfig(
        init_scale=2.0**power,
        growth_interval=window,
        hysteresis=num(fp16, "hysteresis", 2, int, "fp16"),
        min_scale=floor,
        consecutive_hysteresis=flag(fp16, "consecutive_hysteresis", False, "fp16"),
        rule=LossScaleRule.DEEPSPEED,
    )


def stage0_loss_scale(loss_scale: LossScaleConfig, fp16: dict, ignored: list[str]) -> LossScaleConfig:
    """Without ZeRO (stage 0) DeepSpeed trains fp16 with its fp16 optimizer (``FP16_Optimizer``), whose dynamic scale
    has no hysteresis (every overflow backs it off) and, at ``min_loss_scale``, only skips the step: so does this
    one, and ``hysteresis``/``consecutive_hysteresis`` are listed as read without effect. Its growth rule is the
    ZeRO optimizers' (``LossScaleRule.DEEPSPEED``)."""
    if loss_scale.rule is not LossScaleRule.DEEPSPEED:
        return loss_scale
    ignored += [f"fp16.{k}" for k in ("hysteresis", "consecutive_hysteresis") if k in fp16]
    return dataclasses.replace(loss_scale, hysteresis=1, consecutive_hysteresis=False, stop_at_min=False)


def skips_nonfinite(cfg: dict, precision: Precision, stage: int) -> bool:
    """Whether DeepSpeed skips the optimizer step of a window whose gradient holds an inf or NaN, outside fp16
    (whose loss scaler always does): its ZeRO optimizers do in fp32 (stages 1-3, where they compute the gradient's
    norm), its bf16 optimizer at stage 0 and its stage-3 optimizer in bf16 too, and at bf16 stages 1-2 where
    ``bf16.check_grad_overflow`` is on (its default). fp32 at stage 0 is a torch optimizer's step, which runs on it."""
    if precision is Precision.FP16:
        return False
    if precision is Precision.FP32:
        return stage >= 1
    if stage in (1, 2):
        return flag(section(cfg, "bf16") or section(cfg, "bfloat16"), "check_grad_overflow", True, "bf16")
    return True


def input_cast(cfg: dict, precision: Precision) -> str:
    """Which forward arguments the engine casts (``ZeroEngine.cast_forward_inputs``), as DeepSpeed's engine does:
    none, unless fp16 is on with ``fp16.auto_cast``, which casts the positional ones to half."""
    on = precision is Precision.FP16 and flag(section(cfg, "fp16"), "auto_cast", False, "fp16")
    return "positional" if on else "none"


_DTYPE_NAMES = {
    Precision.FP32: ("fp32", "float32", "float", "torch.float32"),
    Precision.FP16: ("fp16", "float16", "half", "torch.float16"),
    Precision.BF16: ("bf16", "bfloat16", "bfloat", "torch.bfloat16"),
}
"""The spellings DeepSpeed's dtype names take, per precision."""


def check_data_types(cfg: dict, precision: Precision, ignored: list[str]) -> None:
    """``data_types.grad_accum_dtype``: the gradients are accumulated and reduced in the training dtype, so that is
    the one value taken, listed in ``ignored`` as changing nothing (DeepSpeed's default differs only at bf16 without
    ZeRO, where it accumulates in fp32); another is one line."""
    sec = section(cfg, "data_types")
    known(sec, {"grad_accum_dtype"}, "data_types")
    given = sec.get("grad_accum_dtype")
    if given is None:
        return
    found = [p for p, names in _DTYPE_NAMES.items() if isinstance(given, str) and given.lower() in names]
    if not found:
        raise ConfigError(f"DeepSpeed config data_types.grad_accum_dtype {given!r}: give fp32, fp16 or bf16")
    if found[0] is not precision:
        raise ConfigError(
            f"DeepSpeed config data_types.grad_accum_dtype {given!r}: zerobench accumulates and reduces gradients in "
            f"the training dtype ({precision.value}); give {precision.value!r} or remove the key"
        )
    ignored.append("data_types.grad_accum_dtype")
