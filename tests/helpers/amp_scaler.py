"""torch.amp loss scaling driving the engine's optimizer inside spawned ranks (``zerobench/zero/amp.py``), against
one process with ``torch.amp.GradScaler`` and ``torch.optim.AdamW`` on the same global batches.

At the second step a hook makes one weight's gradient non-finite (on rank 0 only, in the ranks; on the whole
batch, in the reference): every rank must skip that step and back its scale off, as the reference does. One
variant unscales explicitly and clips (``scaler.unscale_``, then ``clip_grad_norm_``), as torch's docs show.
"""

from __future__ import annotations

import copy

import torch

from tests.helpers.reference import make_adamw
from tests.helpers.user_models import ADAM, batches, compare, engine_for, make_model, reference_loss, slice_of
from zerobench.distributed.collectives import Group
from zerobench.zero import Precision
from zerobench.zero.optim.loss_scale import ShardedGradScaler

STEPS, BAD_STEP, CLIP = 4, 1, 0.5


def _scaler(cls=torch.amp.GradScaler):
    return cls("cpu", init_scale=2.0**10, growth_interval=2)


def _poison(param, step: int, on: bool):
    return param.register_hook(lambda g: g * float("inf")) if on and step == BAD_STEP else None


def reference(model, data, world: int, clip: bool) -> tuple[dict, list[float], float]:
    ref = copy.deepcopy(model)
    opt, scaler, scales = make_adamw(ref.parameters(), ADAM), _scaler(), []
    for step, (x, y) in enumerate(data):
        hook = _poison(ref.blocks[1].fc1.weight, step, True)
        scaler.scale(reference_loss(ref, x, y, world)).backward()
        if hook is not None:
            hook.remove()
        if clip:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        opt.zero_grad(set_to_none=True)
    return {n: p.detach().clone() for n, p in ref.named_parameters()}, scales


def _train(engine, scaler, data, rank: int, world: int, clip: bool) -> tuple[list[float], list[bool]]:
    scales, applied = [], []
    for step, (x, y) in enumerate(data):
        hook = _poison(engine.module.blocks[1].fc1.weight, step, rank == 0)
        scaler.scale(engine.module(slice_of(x, rank, world), slice_of(y, rank, world))).backward()
        if hook is not None:
            hook.remove()
        if clip:
            scaler.unscale_(engine.optimizer)
            engine.clip_grad_norm_(CLIP)
        scaler.step(engine.optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
        applied.append(engine.was_step_applied())
        engine.optimizer.zero_grad()
    return scales, applied


def _error(fn) -> str | None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the message is the result
        return f"{type(e).__name__}: {e}"
    return None


def run_amp_scaler(rank: int, world: int) -> dict:
    group = Group.of(None, "dp")
    model, data = make_model("mlp"), batches(STEPS, 2 * world)
    refs = {clip: reference(model, data, world, clip) for clip in (False, True)}
    out: dict = {}
    for stage in (0, 1, 2, 3):
        for clip in (False, True):
            engine = engine_for(copy.deepcopy(model), group, stage)
            scales, applied = _train(engine, _scaler(ShardedGradScaler), data, rank, world, clip)
            ref_params, ref_scales = refs[clip]
            out[f"s{stage}-clip{int(clip)}"] = {
                **compare(engine, model, ref_params),
                "scales": scales,
                "ref_scales": ref_scales,
                "applied": applied,
            }
        engine = engine_for(copy.deepcopy(model), group, stage)
        out[f"s{stage}-plain"] = _error(lambda e=engine: _train(e, _scaler(), data[:1], rank, world, False))
        if stage == 0:
            out["s0-plain-params"] = compare(engine, model, reference(model, data[:1], world, False)[0])
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as FSDPScaler

        engine = engine_for(copy.deepcopy(model), group, stage)
        out[f"s{stage}-fsdp"] = _error(lambda e=engine: _train(e, _scaler(FSDPScaler), data[:1], rank, world, False))
        fp16 = engine_for(copy.deepcopy(model), group, stage, precision=Precision.FP16)
        out[f"s{stage}-fp16"] = _error(
            lambda e=fp16: _train(e, _scaler(ShardedGradScaler), data[:1], rank, world, False)
        )
        x, y = (slice_of(t, rank, world) for t in data[0])
        fp16 = engine_for(copy.deepcopy(model), group, stage, precision=Precision.FP16)
        scaler = _scaler(ShardedGradScaler)
        scaler.scale(fp16.scale(fp16.module(x, y))).backward()  # DeepSpeed's fp16 scaling, and a GradScaler's on top
        out[f"s{stage}-fp16-step"] = _error(lambda e=fp16, sc=scaler: sc.step(e.optimizer))
    return out
