"""DeepSpeed's ``zero_optimization`` section read into ``ZeroConfig``'s fields (``config.py`` reads the rest).

Every key is honoured, read and listed as ignored (it tunes only DeepSpeed's own buffers), or refused in one line.
DeepSpeed's config model names its stage-3 keys both ways: ``stage3_prefetch_bucket_size`` and
``prefetch_bucket_size`` are one key (``ALIASES``), and so are the pre-0.3.16 offload switches and the sections
that replaced them (``cpu_offload`` for ``offload_optimizer``, ``cpu_offload_param`` for ``offload_param``). A key
given under two of its names with values that disagree is refused: which one DeepSpeed keeps is not what the user
meant either way.
"""

from __future__ import annotations

from zerobench.config import ConfigError
from zerobench.zero.compat.deepspeed.values import DeepSpeedAssertionError, flag, is_num, known, num, section

ALIASES = {
    "prefetch_bucket_size": "stage3_prefetch_bucket_size",
    "param_persistence_threshold": "stage3_param_persistence_threshold",
    "model_persistence_threshold": "stage3_model_persistence_threshold",
    "max_live_parameters": "stage3_max_live_parameters",
    "max_reuse_distance": "stage3_max_reuse_distance",
    "gather_16bit_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",  # its older name
    "module_granularity_threshold": "stage3_module_granularity_threshold",
    "use_all_reduce_for_fetch_params": "stage3_use_all_reduce_for_fetch_params",
}
"""A name DeepSpeed's ``zero_optimization`` takes -> the name it is read under here (DeepSpeed's config model gives
each stage-3 field its un-prefixed name and the ``stage3_`` one as an alias)."""
_MISSPELT = {"cpu_offload_params": "cpu_offload_param"}
"""Names DeepSpeed refuses, which an earlier zerobench took: the one-line refusal names DeepSpeed's key."""

ZERO_TUNING = {
    "allgather_bucket_size",
    "allgather_partitions",
    "reduce_scatter",
    "contiguous_gradients",
    "stage3_param_persistence_threshold",
    "stage3_max_live_parameters",
    "stage3_max_reuse_distance",
    "sub_group_size",
    "round_robin_gradients",
    "elastic_checkpoint",
    "load_from_fp32_weights",
    "memory_efficient_linear",
    "use_multi_rank_bucket_allreduce",
    "cpu_offload_use_pin_memory",
    "log_trace_cache_warnings",
    "stage3_model_persistence_threshold",
    "stage3_module_granularity_threshold",
    "stage3_use_all_reduce_for_fetch_params",
    "pipeline_loading_checkpoint",
}
"""Keys that tune only DeepSpeed's own buffers and fetches (and ``pipeline_loading_checkpoint``: the node's ranks
load one after another, to bound host memory; the values loaded are the same): read, listed as ignored."""
_ZERO_REFUSED = {
    "zero_quantized_weights": ("quantized weight communication (ZeRO++)", bool),
    "zero_quantized_gradients": ("quantized gradient communication (ZeRO++)", bool),
    "zero_hpz_partition_size": ("hierarchical partitioning (ZeRO++)", lambda v: v != 1),
    "mics_shard_size": ("MiCS", lambda v: not is_num(v) or v > 0),
}
"""ZeRO features zerobench does not have, with when a value asks for one (DeepSpeed's defaults: off, 1, -1)."""
_KNOWN = {
    "stage",
    "reduce_bucket_size",
    "overlap_comm",
    "offload_optimizer",
    "offload_param",
    "cpu_offload",
    "cpu_offload_param",
    "stage3_prefetch_bucket_size",
    "ignore_unused_parameters",
    "stage3_gather_16bit_weights_on_model_save",
}
_OFFLOAD_KEYS = {
    "device",
    "nvme_path",
    "pin_memory",
    "buffer_count",
    "buffer_size",
    "max_in_cpu",
    "fast_init",
    "ratio",
    "pipeline",
    "pipeline_read",
    "pipeline_write",
}


def zero_section(cfg: dict) -> dict:
    """``zero_optimization`` with every key under the name it is read by (``ALIASES``); a key given under two names
    with different values is one line naming both."""
    zo = section(cfg, "zero_optimization")
    out = {k: v for k, v in zo.items() if k not in ALIASES}
    for alias, name in ALIASES.items():
        if alias not in zo:
            continue
        if name in out and out[name] != zo[alias]:
            given = name if name in zo else next(a for a, n in ALIASES.items() if n == name and a in zo)
            raise ConfigError(
                f"DeepSpeed config zero_optimization: {alias} {zo[alias]!r} and {given} {out[name]!r} are one key "
                "(DeepSpeed reads either name); give one of them"
            )
        out[name] = zo[alias]
    return out


def _offload(zo: dict, key: str, allowed: tuple[str, ...]) -> tuple[str, str | None]:
    sec = section(zo, key)
    known(sec, _OFFLOAD_KEYS, f"zero_optimization.{key}")
    device = str(sec.get("device", "none")).lower()
    if device not in allowed:
        raise ConfigError(
            f"DeepSpeed config zero_optimization.{key}.device {device!r}: zerobench offers {', '.join(allowed)}"
        )
    if sec.get("ratio", 1.0) != 1.0:
        raise ConfigError(f"DeepSpeed config zero_optimization.{key}.ratio: partial offload is not supported (use 1)")
    return device, sec.get("nvme_path")


def _legacy_offload(zo: dict, legacy: str, key: str, device: str) -> str:
    """The offload device, from the section ``key`` or DeepSpeed's older switch ``legacy`` (true: ``cpu``); both
    given and disagreeing is one line."""
    if legacy not in zo:
        return device
    old = "cpu" if flag(zo, legacy, False, "zero_optimization") else "none"
    if key in zo and old != device:  # DeepSpeed asserts both given
        raise DeepSpeedAssertionError(
            f"DeepSpeed config zero_optimization: {legacy} ({zo[legacy]}) is DeepSpeed's older spelling of "
            f"{key}.device ({device!r}) and disagrees with it; give {key} alone"
        )
    return old


def _check_offload(stage: int, opt: str, par: str, nvme: str | None) -> None:
    """What ``ZeroConfig.validate`` refuses of an offload, said in the DeepSpeed config's keys (its own lines name
    ``zerobench train``'s flags)."""
    where = "DeepSpeed config zero_optimization"
    if par != "none" and (stage != 3 or opt == "none"):
        raise ConfigError(
            f"{where}.offload_param: zerobench offloads parameters at stage 3 together with the optimizer: set "
            f"zero_optimization.stage 3 (it is {stage}) and offload_optimizer.device to cpu or nvme"
            if stage != 3
            else f"{where}.offload_param: zerobench offloads parameters together with the optimizer: set "
            "zero_optimization.offload_optimizer.device to cpu or nvme too"
        )
    if opt != "none" and stage == 0:
        raise ConfigError(
            f"{where}.offload_optimizer: optimizer offload partitions the optimizer: set zero_optimization.stage to "
            "1, 2 or 3"
        )
    if opt == "nvme" and not nvme:
        raise ConfigError(
            f"{where}.offload_optimizer.device nvme: give offload_optimizer.nvme_path (where the optimizer-state "
            "files go)"
        )


def read_zero(cfg: dict, ignored: list[str]) -> dict:
    """``ZeroConfig``'s keyword arguments from ``zero_optimization``; the keys read without effect are added to
    ``ignored`` as dotted paths."""
    given = section(cfg, "zero_optimization")
    for k, v in given.items():
        if k in _MISSPELT:
            raise ConfigError(
                f"DeepSpeed config zero_optimization.{k}: DeepSpeed's key is {_MISSPELT[k]} (it refuses {k})"
            )
        if k in _ZERO_REFUSED and _ZERO_REFUSED[k][1](v):
            raise ConfigError(f"DeepSpeed config zero_optimization.{k}: {_ZERO_REFUSED[k][0]} is not supported")
        if ALIASES.get(k, k) not in _KNOWN | ZERO_TUNING | set(_ZERO_REFUSED):
            raise ConfigError(
                f"DeepSpeed config zero_optimization.{k}: unknown key (zerobench reads {', '.join(sorted(_KNOWN))}, "
                "and their names without stage3_)"
            )
    zo = zero_section(cfg)
    ignored += [f"zero_optimization.{k}" for k in given if ALIASES.get(k, k) in ZERO_TUNING]
    opt, nvme = _offload(zo, "offload_optimizer", ("none", "cpu", "nvme"))
    par, _ = _offload(zo, "offload_param", ("none", "cpu"))
    opt = _legacy_offload(zo, "cpu_offload", "offload_optimizer", opt)  # the pre-0.3.16 spellings
    par = _legacy_offload(zo, "cpu_offload_param", "offload_param", par)
    stage = num(zo, "stage", 0, int, "zero_optimization")
    _check_offload(stage, opt, par, nvme)
    out = {
        "stage": stage,
        "overlap_comm": flag(zo, "overlap_comm", stage == 3, "zero_optimization"),  # DeepSpeed's
        "offload_optimizer": opt,
        "offload_param": par,
        "nvme_path": nvme,
        "prefetch": num(zo, "stage3_prefetch_bucket_size", 1, float, "zero_optimization") != 0,
        "find_unused_parameters": flag(zo, "ignore_unused_parameters", True, "zero_optimization"),
    }
    if "reduce_bucket_size" in zo:
        out["bucket_numel"] = num(zo, "reduce_bucket_size", 0, int, "zero_optimization")
    return out


def gather_16bit_on_save(cfg: dict) -> bool:
    """``stage3_gather_16bit_weights_on_model_save`` under any of its names (DeepSpeed's default false)."""
    return flag(zero_section(cfg), "stage3_gather_16bit_weights_on_model_save", False, "zero_optimization")
