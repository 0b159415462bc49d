"""DeepSpeed's configuration (a ``ds_config.json`` or its dict) read into zerobench's typed configs, for
``zerobench.zero.initialize`` (``deepspeed.initialize``'s counterpart). Pure: no processes.

What is read: the batch triple (``train_batch_size`` = ``train_micro_batch_size_per_gpu`` x
``gradient_accumulation_steps`` x DP ranks; any two, or either size alone, as DeepSpeed resolves it),
``zero_optimization`` (``zero_section.py``: stage, ``reduce_bucket_size``, ``overlap_comm``, optimizer and
parameter offload, ``stage3_prefetch_bucket_size`` 0 as no prefetch, ``ignore_unused_parameters``), ``bf16``/``fp16``
(``zero/compat/deepspeed/precision.py``: DeepSpeed's dynamic loss scaling and its rule for moving the scale, or a
static ``loss_scale``), an ``optimizer`` of type Adam/AdamW (decoupled weight decay, DeepSpeed's defaults: betas
(0.9, 0.999), weight decay 0), ``gradient_clipping`` (DeepSpeed's default 1.0 where absent; 0: no clipping) and a
``scheduler`` (DeepSpeed's five schedules or a ``torch.optim.lr_scheduler`` class, checked by
``zero/compat/deepspeed/lr_schedules.py``). Keys that only tune DeepSpeed's own buffers, logging or profilers, and
``activation_checkpointing`` (which configures only ``deepspeed.checkpointing``), are read and listed in
``DeepSpeedConfig.ignored``. A key that would train something zerobench does not (another optimizer, 16-bit master
weights, pipeline parallelism, ZeRO++'s quantized communication) is refused in one line naming it, and so is an
unknown key: a typo must not train silently with a default. Each key is read as the type DeepSpeed gives it (a
number, a switch, a section); anything else is one line naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerobench.config import ConfigError
from zerobench.zero.compat.deepspeed.lr_schedules import SchedulerSpec, parse
from zerobench.zero.compat.deepspeed.precision import (
    check_data_types,
    input_cast,
    read_precision,
    skips_nonfinite,
    stage0_loss_scale,
)
from zerobench.zero.compat.deepspeed.values import DeepSpeedAssertionError, flag, is_num, known, load, num, section
from zerobench.zero.compat.deepspeed.zero_section import gather_16bit_on_save, read_zero
from zerobench.zero.config import AdamWConfig, ZeroConfig

_NO_EFFECT = {
    "steps_per_print",
    "wall_clock_breakdown",
    "dump_state",
    "flops_profiler",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "comet",
    "comms_logger",
    "memory_breakdown",
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
    "timers",
    "monitor_config",
    "activation_checkpointing",
    "aio",
}
"""Top-level keys without effect on training here: logging and profilers, ``aio`` (the NVMe reads' and writes' block
size, queue depth and threads: speed only), and ``activation_checkpointing``, which configures only
``deepspeed.checkpointing`` (apply zerobench.parallel's ``apply_activation_checkpointing``)."""
_REFUSED = {
    "amp": "NVIDIA Apex AMP is not used: give 'bf16' or 'fp16'",
    "pipeline": "zerobench has no pipeline parallelism",
    "sparse_attention": "zerobench has no sparse attention",
    "compression_training": "zerobench has no compression training",
    "curriculum_learning": "zerobench has no curriculum learning",
    "data_efficiency": "zerobench has no data-efficiency library",
    "elasticity": "zerobench has no elastic batch sizes",
}


@dataclass(frozen=True)
class DeepSpeedConfig:
    """A DeepSpeed configuration as zerobench trains it."""

    zero: ZeroConfig
    """The engine's configuration."""
    micro_batch: int
    """``train_micro_batch_size_per_gpu``: samples per DP rank in one micro-batch."""
    train_batch: int
    """``train_batch_size``: samples per optimizer step over the DP group."""
    drop_last: bool = False
    """``dataloader_drop_last``: the training loader leaves out a last, partial micro-batch."""
    ignored: tuple[str, ...] = ()
    """Keys read that change nothing here (DeepSpeed's own buffer sizes, logging, profilers), as dotted paths."""
    scheduler: SchedulerSpec | None = None
    """``scheduler``: the learning-rate schedule ``initialize`` builds on the engine's optimizer (None: none)."""
    tag_validation: str = "WARN"
    """``checkpoint.tag_validation``: what ``save_checkpoint`` does when the ranks give different tags (``WARN``,
    DeepSpeed's default; ``FAIL``; ``IGNORE``)."""
    skip_nonfinite: bool = False
    """Whether DeepSpeed would skip the step of a window with a non-finite gradient outside fp16
    (``precision.skips_nonfinite``): the engine's ``skip_nonfinite``."""
    cast_inputs: str = "none"
    """Which forward arguments the engine casts (``precision.input_cast``): the engine's ``cast_forward_inputs``."""
    gather_16bit_on_save: bool = False
    """``zero_optimization.stage3_gather_16bit_weights_on_model_save`` (or another of its names, ``zero_section``;
    DeepSpeed's default false):
    what ``engine.zero_gather_16bit_weights_on_model_save()`` answers, which Accelerate and HF's Trainer read
    before asking a stage-3 engine for the whole 16-bit state dict."""


def _positive_int(cfg: dict, key: str) -> int | None:
    if cfg.get(key) is None:
        return None
    v = num(cfg, key, None, int, "")
    if v < 1:
        raise DeepSpeedAssertionError(f"DeepSpeed config {key}: must be a positive integer, got {v!r}")
    return v


def batch_sizes(cfg: dict, dp: int) -> tuple[int, int, int]:
    """(micro-batch, accumulation steps, train batch) from whichever of the three are given, as DeepSpeed. A triple
    that does not resolve is a ``DeepSpeedAssertionError``: DeepSpeed asserts it."""
    tbs, mbs = _positive_int(cfg, "train_batch_size"), _positive_int(cfg, "train_micro_batch_size_per_gpu")
    gas = _positive_int(cfg, "gradient_accumulation_steps")
    if tbs is None and mbs is None:
        raise DeepSpeedAssertionError("DeepSpeed config: give train_batch_size or train_micro_batch_size_per_gpu")
    if tbs is None:
        gas = gas or 1
        return mbs, gas, mbs * gas * dp
    if mbs is None or gas is None:
        known = mbs if mbs is not None else gas if gas is not None else 1
        if tbs % (known * dp):
            raise DeepSpeedAssertionError(
                f"DeepSpeed config: train_batch_size {tbs} is not a multiple of "
                f"{'train_micro_batch_size_per_gpu' if mbs is not None else 'gradient_accumulation_steps'} "
                f"{known} x {dp} DP ranks"
            )
        other = tbs // (known * dp)
        mbs, gas = (mbs, other) if mbs is not None else (other, known)
    if mbs * gas * dp != tbs:
        raise DeepSpeedAssertionError(
            f"DeepSpeed config: train_batch_size {tbs} != train_micro_batch_size_per_gpu {mbs} x "
            f"gradient_accumulation_steps {gas} x {dp} DP ranks ({mbs * gas * dp})"
        )
    return mbs, gas, tbs


_ADAM_SWITCHES = {"adam_w_mode": True, "amsgrad": False, "bias_correction": True, "torch_adam": False}
"""``optimizer.params``' switches and DeepSpeed's defaults: each must be true or false (a string such as "false" would
read as true)."""


def _optimizer(cfg: dict, ignored: list[str]) -> AdamWConfig:
    opt = section(cfg, "optimizer")
    known(opt, {"type", "params", "legacy_fusion"}, "optimizer")
    ignored += ["optimizer.legacy_fusion"] if "legacy_fusion" in opt else []  # DeepSpeed's fp16 fusion switch
    kind = str(opt.get("type", "")).lower()
    if "type" not in opt:
        raise ConfigError(
            'DeepSpeed config has no optimizer: add {"optimizer": {"type": "AdamW", "params": '
            '{"lr": ...}}}, or pass initialize(optimizer=torch.optim.AdamW(...))'
        )
    if kind not in ("adam", "adamw", "fusedadam"):
        raise ConfigError(
            f"DeepSpeed config optimizer.type {opt.get('type')!r}: zerobench's engine trains with "
            'AdamW; give {"type": "AdamW", "params": {...}}'
        )
    p = opt.get("params") or {}
    if not isinstance(p, dict):
        raise ConfigError(f"DeepSpeed config optimizer.params: must be an object, got {p!r}")
    p = dict(p)
    switches = {k: flag(p, k, d, "optimizer.params") for k, d in _ADAM_SWITCHES.items()}
    for k in switches:
        p.pop(k, None)
    if not switches["adam_w_mode"] or switches["amsgrad"] or not switches["bias_correction"]:
        raise ConfigError(
            "DeepSpeed config optimizer.params: only decoupled weight decay with bias correction and "
            "without amsgrad (AdamW) is supported"
        )
    # DeepSpeed builds torch.optim.AdamW(params, **params) under torch_adam, whose weight_decay defaults to 0.01;
    # FusedAdam and DeepSpeedCPUAdam default it to 0 (DeepSpeed 0.19.8, get_optimizer_configuration)
    torch_adam = switches["torch_adam"]
    if torch_adam:
        p.pop("foreach", None)  # how torch runs it, as DeepSpeed passes it on
    extra = set(p) - {"lr", "betas", "eps", "weight_decay"}
    if extra:
        raise ConfigError(f"DeepSpeed config optimizer.params: unknown {', '.join(sorted(extra))}")
    betas = p.get("betas", (0.9, 0.999))
    if not isinstance(betas, (list, tuple)) or len(betas) != 2 or not all(is_num(b) for b in betas):
        raise ConfigError(f"DeepSpeed config optimizer.params.betas: two numbers, got {betas!r}")
    where = "optimizer.params"
    return AdamWConfig(
        lr=num(p, "lr", 1e-3, float, where),
        betas=(float(betas[0]), float(betas[1])),
        eps=num(p, "eps", 1e-8, float, where),
        weight_decay=num(p, "weight_decay", 0.01 if torch_adam else 0.0, float, where),
    )


def _check_top(cfg: dict, ignored: list[str]) -> None:
    known = {
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "zero_optimization",
        "bf16",
        "bfloat16",
        "fp16",
        "optimizer",
        "gradient_clipping",
        "prescale_gradients",
        "gradient_predivide_factor",
        "communication_data_type",
        "sparse_gradients",
        "dataloader_drop_last",
        "scheduler",
        "checkpoint",
        "data_types",
        "gradient_allreduce_op",
    }
    for k, v in cfg.items():
        if k in _REFUSED and v not in (None, {}, False) and not (isinstance(v, dict) and v.get("enabled") is False):
            raise ConfigError(f"DeepSpeed config {k}: {_REFUSED[k]}")
        if k not in known | _NO_EFFECT | set(_REFUSED):
            raise ConfigError(
                f"DeepSpeed config: unknown key {k!r} (zerobench reads {', '.join(sorted(known))}; "
                "logging keys are accepted)"
            )
    if cfg.get("prescale_gradients") or cfg.get("gradient_predivide_factor", 1.0) != 1.0 or cfg.get("sparse_gradients"):
        raise ConfigError(
            "DeepSpeed config: prescale_gradients, gradient_predivide_factor and sparse_gradients are not "
            "supported (gradients are averaged over DP ranks as DDP does)"
        )
    op = cfg.get("gradient_allreduce_op", "mean")
    if not isinstance(op, str) or op.lower() != "mean":
        raise ConfigError(
            f"DeepSpeed config gradient_allreduce_op {op!r}: gradients are averaged over DP ranks (mean), as DDP "
            'does; give "mean" or remove the key'
        )
    ignored += ["gradient_allreduce_op"] if "gradient_allreduce_op" in cfg else []
    if cfg.get("communication_data_type") is not None:
        raise ConfigError(
            "DeepSpeed config communication_data_type: gradients are reduced in the training dtype; remove the key"
        )
    ignored += sorted(k for k in cfg if k in _NO_EFFECT)


TAG_VALIDATION = ("WARN", "IGNORE", "FAIL")


def _checkpoint(cfg: dict, ignored: list[str]) -> str:
    """``checkpoint.tag_validation`` (DeepSpeed's modes, any case; default ``WARN``), and ``load_universal`` refused;
    the section's other keys (where DeepSpeed writes from) change nothing here."""
    sec = section(cfg, "checkpoint")
    mode = sec.get("tag_validation", "Warn")
    if not isinstance(mode, str) or mode.upper() not in TAG_VALIDATION:
        raise ConfigError(
            f"DeepSpeed config checkpoint.tag_validation: must be Warn, Ignore or Fail (any case), got {mode!r}"
        )
    if flag(sec, "load_universal", False, "checkpoint"):
        raise ConfigError(
            "DeepSpeed config checkpoint.load_universal: DeepSpeed's universal checkpoints are not read here, and "
            "a zerobench checkpoint loads at another world size as it is: leave it false"
        )
    ignored += [f"checkpoint.{k}" for k in sorted(sec) if k not in ("tag_validation", "load_universal")]
    return mode.upper()


GRADIENT_CLIPPING_DEFAULT = 1.0
"""DeepSpeed's ``gradient_clipping`` where a config leaves it out: its engine clips the global norm to 1.0."""


def _clipping(cfg: dict) -> float | None:
    """``gradient_clipping`` as ``ZeroConfig.clip_grad_norm``: DeepSpeed's 1.0 when absent, None (no clipping)
    for 0."""
    clip = num(cfg, "gradient_clipping", GRADIENT_CLIPPING_DEFAULT, float, "")
    if clip < 0:
        raise ConfigError(
            f"DeepSpeed config gradient_clipping {clip:g}: give a positive norm to clip to, or 0 for no clipping"
        )
    return clip or None


def from_deepspeed(config, dp: int, client_optimizer: bool = False) -> DeepSpeedConfig:
    """``config`` (a dict or a JSON file's path) for ``dp`` data-parallel ranks, as zerobench's configs. With a
    ``client_optimizer`` (``initialize(optimizer=...)``) its groups carry the hyperparameters: the config's
    ``optimizer`` section, if any, is listed as ignored, as DeepSpeed lets the client's take precedence."""
    cfg = load(config)
    ignored: list[str] = ["optimizer"] if client_optimizer and "optimizer" in cfg else []
    _check_top(cfg, ignored)
    micro, gas, train = batch_sizes(cfg, dp)
    precision, loss_scale = read_precision(cfg, ignored)
    check_data_types(cfg, precision, ignored)
    zero_keys = read_zero(cfg, ignored)
    if zero_keys["stage"] == 0:
        loss_scale = stage0_loss_scale(loss_scale, section(cfg, "fp16"), ignored)
    zero = ZeroConfig(
        precision=precision,
        grad_accum_steps=gas,
        clip_grad_norm=_clipping(cfg),
        optimizer=AdamWConfig() if client_optimizer else _optimizer(cfg, ignored),
        loss_scale=loss_scale,
        **zero_keys,
    )
    zero.validate()
    tags = _checkpoint(cfg, ignored)
    drop_last = flag(cfg, "dataloader_drop_last", False, "")
    skip = skips_nonfinite(cfg, precision, zero.stage)
    gather = gather_16bit_on_save(cfg)
    sched, cast = parse(cfg.get("scheduler")), input_cast(cfg, precision)
    return DeepSpeedConfig(zero, micro, train, drop_last, tuple(ignored), sched, tags, skip, cast, gather)
