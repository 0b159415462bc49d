"""The model-state byte counts a configuration implies, by formula: this engine's per-rank device and host
bytes by category, and the ZeRO paper's mixed-precision formulas (ZeRO §3.1, §5). Pure arithmetic without torch, so
planning (``zerobench plan``) and the simulator answer without importing it; the ledgers (``metrics/memory.py``)
measure what these predict.

- ``model_state_bytes_analytic``: per-rank model-state bytes of a ZeRO stage for any precision recipe; with
  2-byte params/grads, a 4-byte master and 8 bytes of Adam states it is exactly the paper's 2Ψ+2Ψ+KΨ (K=12),
  4Ψ+KΨ/N_d, 2Ψ+14Ψ/N_d, 16Ψ/N_d (``paper_model_state_bytes``).
- ``host_state_bytes_analytic``: the host side under offload.
"""

from __future__ import annotations


def model_state_bytes_analytic(
    numel: int,
    dp: int,
    stage: int,
    param_bytes: int,
    grad_bytes: int,
    master_bytes: int,
    optim_bytes: float = 8,
    offload_optimizer: bool = False,
    offload_param: bool = False,
) -> dict[str, float]:
    """Per-rank *device* bytes by category for ``numel`` parameters over ``dp`` ranks at a ZeRO stage.

    ``optim_bytes``: 8 for fp32 Adam moments, 2 + 8/2048 for 8-bit ones. Under optimizer offload the
    master, the moments and (stages 2-3) the gradient partition are on the host; under parameter offload
    (stage 3) the parameter partition is too (``host_state_bytes_analytic``)."""
    shard = 1.0 / dp
    out = {
        "params": numel * param_bytes * (shard if stage >= 3 else 1.0),
        "grads": numel * grad_bytes * (shard if stage >= 2 else 1.0),
        "master": numel * master_bytes * (shard if stage >= 1 else 1.0),
        "optimizer_states": numel * optim_bytes * (shard if stage >= 1 else 1.0),
    }
    if offload_optimizer:
        out["master"] = out["optimizer_states"] = 0.0
        if stage >= 2:
            out["grads"] = 0.0
    if offload_param:
        out["params"] = 0.0
    return out


def host_state_bytes_analytic(
    numel: int,
    dp: int,
    stage: int,
    param_bytes: int,
    grad_bytes: int,
    optim_bytes: float = 8,
    offload_param: bool = False,
) -> dict[str, float]:
    """Per-rank host bytes under optimizer offload (stages 1-3): the fp32 master, the moments, the gradient
    partition and the low-precision parameter partition (copy-out, or the partition itself under
    parameter offload). fp32 training streams the master itself, so it has no separate copy-out."""
    part = numel / dp
    fp32 = param_bytes == 4
    return {
        "host_params": part * param_bytes if (offload_param or not fp32) else 0.0,
        "host_grads": part * grad_bytes,
        "host_master": 0.0 if (fp32 and offload_param) else part * 4,
        "host_optimizer_states": part * optim_bytes,
    }


def paper_model_state_bytes(psi: float, nd: int, stage: int, k: int = 12) -> float:
    """The ZeRO paper's mixed-precision formulas (ZeRO §3.1, §5): (4+K)Ψ, 4Ψ+KΨ/N_d, 2Ψ+(2+K)Ψ/N_d,
    (4+K)Ψ/N_d; with K=12: 16Ψ, 4Ψ+12Ψ/N_d, 2Ψ+14Ψ/N_d, 16Ψ/N_d."""
    return {
        0: (2 + 2 + k) * psi,
        1: 4 * psi + k * psi / nd,
        2: 2 * psi + (2 + k) * psi / nd,
        3: (2 + 2 + k) * psi / nd,
    }[stage]
