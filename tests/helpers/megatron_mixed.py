"""Rank bodies of the Megatron-LM baseline's mixed-precision tests: the baseline and zerobench's stage 0 trained on
the same batches from the same weights, step by step, with what each step did recorded."""

from __future__ import annotations

import dataclasses

import torch


def _config(precision: str, init_scale: float, tp: int, dp: int = 1, accum: int = 1):
    from zerobench.models.sizes import preset
    from zerobench.train.config import TrainConfig
    from zerobench.zero.config import LossScaleConfig, Precision, ZeroConfig

    zero = ZeroConfig(
        stage=0,
        precision=Precision(precision),
        loss_scale=LossScaleConfig(init_scale=init_scale),
        grad_accum_steps=accum,
    )
    return TrainConfig(model=preset("tiny"), preset="tiny", dp=dp, tp=tp, zero=zero)


def train_both(
    rank: int,
    world: int,
    precision: str,
    init_scale: float,
    steps: int,
    tp: int | None = None,
    accum: int = 1,
    plant_at: int | None = None,
) -> dict:
    """Both systems, ``steps`` steps each on the same data (``accum`` micro-batches a step, TP ``tp``, the rest DP):
    losses, which steps were taken, the fp16 loss scale after each, and the baseline's memory ledger against its
    parameters' count. ``plant_at``: at that step the last rank puts an inf into one of the baseline's reduced
    gradients, as an overflow of its own shard only."""
    from zerobench.baselines.megatron import MegatronSystem
    from zerobench.distributed.mesh import build_mesh
    from zerobench.metrics.comm import CommLedger
    from zerobench.train.systems import ZeroSystem

    tp = tp or world
    cfg = _config(precision, init_scale, tp=tp, dp=world // tp, accum=accum)
    mesh = build_mesh(tp, world // tp)
    g = torch.Generator().manual_seed(0)
    m = cfg.model
    # each DP rank and each micro-batch its own samples (a missing all-reduce or a wrong 1/dp or 1/accum would show),
    # the same ones at every step: a loss that must fall
    dp_rank = rank // tp
    micro = []
    for _ in range(world // tp * accum):
        x = torch.randint(0, m.vocab, (2, m.seq), generator=g)
        micro.append((x, torch.roll(x, -1, dims=1)))
    mine = micro[dp_rank * accum : (dp_rank + 1) * accum]
    out = {}
    for name, cls in (("megatron", MegatronSystem), ("zerobench", ZeroSystem)):
        system = cls(dataclasses.replace(cfg, system=name), mesh, CommLedger(), torch.device("cpu"))
        losses, taken, scales = [], [], []
        for i in range(steps):
            losses.append(sum(float(system.forward_backward(x, y)) for x, y in mine) / accum)
            if name == "megatron" and i == plant_at and rank == world - 1:
                system.params[0].main_grad.view(-1)[0] = float("inf")  # before the step's reduction: this rank's only
            taken.append(bool(system.step()))
            system.zero_grad()
            scaler = system.scaler if name == "megatron" else system.engine.scaler
            scales.append(float(scaler.scale))
        out[name] = {"losses": losses, "taken": taken, "scales": scales}
        if name == "megatron":
            numel = sum(p.numel() for p in system.params)
            out["ledger"] = {k: v / numel for k, v in system.memory_ledger().items()}
            out["state_bytes_per_param"] = system.model_state_bytes() / numel
            out["param_dtypes"] = sorted({str(p.dtype) for p in system.params})
            from megatron.core import parallel_state as ps

            ps.destroy_model_parallel()
    return out
