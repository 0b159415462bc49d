"""DeepSpeed's loop queries on the ZeRO engine, side by side with DeepSpeed's own engine (when installed) in the
same ranks: the same model, batches, accumulation and clipping, driven by the same loop, recording what a
DeepSpeed training script reads each micro-batch (what ``engine.backward(loss)`` returns, over the loss;
``is_gradient_accumulation_boundary()`` before forward and after backward, ``was_step_applied()``,
``global_steps``, ``get_global_grad_norm()`` at the boundaries) and the parameters after training. The loop calls ``engine.backward(loss)``, or ``loss.backward()`` (DeepSpeed divides that
gradient by ``gradient_accumulation_steps`` too)."""

from __future__ import annotations

import contextlib
import copy
import os

import torch

from tests.helpers.ds import ds_apply_zero
from tests.helpers.reference import make_adamw
from tests.helpers.user_models import ADAM, batches, make_model, reference_loss, slice_of
from zerobench.distributed.collectives import Group
from zerobench.zero import ZeroConfig
from zerobench.zero.state.shards import full_parameters

ACCUM, MICRO_BATCHES, CLIP = 2, 6, 0.5


def _loop(engine, data, rank: int, world: int, plain: bool) -> list[dict]:
    """DeepSpeed's loop: ``engine.backward(loss)``, or (``plain``) ``loss.backward()``, then ``engine.step()``."""
    seen = []
    for x, y in data:
        before = engine.is_gradient_accumulation_boundary()
        loss = engine(slice_of(x, rank, world), slice_of(y, rank, world))
        returned = loss.backward() if plain else (engine.backward(loss) / loss).item()
        after = engine.is_gradient_accumulation_boundary()
        engine.step()
        norm = engine.get_global_grad_norm() if after else None
        seen.append(
            {
                "boundary_before_forward": before,
                "boundary_after_backward": after,
                "applied": engine.was_step_applied(),
                "global_steps": engine.global_steps,
                "norm": None if norm is None else float(norm),
                "returned_over_loss": returned,
            }
        )
    return seen


def _deepspeed(model, stage: int, micro: int):
    import deepspeed

    os.environ.setdefault("LOCAL_RANK", "0")
    config = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": ACCUM,
        "gradient_clipping": CLIP,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    opt = make_adamw(model.parameters(), ADAM)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config, dist_init_required=False)
    return engine


def ds_counters(rank: int, world: int, stage: int, with_deepspeed: bool, plain: bool = False) -> dict:
    group = Group.of(None, "dp")
    model = make_model("all_in_blocks")  # DeepSpeed cannot broadcast the MLP's 0-dim parameter
    data = batches(MICRO_BATCHES, 2 * world)
    cfg = ZeroConfig(stage=stage, bucket_numel=5000, optimizer=ADAM, grad_accum_steps=ACCUM, clip_grad_norm=CLIP)
    ours = ds_apply_zero(copy.deepcopy(model), group, cfg)
    out = {
        "ours": _loop(ours, data, rank, world, plain),
        "queries": (ours.gradient_accumulation_steps(), ours.zero_optimization_stage()),
    }
    if with_deepspeed and not (plain and stage == 0):  # DeepSpeed 0.19.8 refuses loss.backward() at stage 0
        ds = _deepspeed(copy.deepcopy(model), stage, 2)
        out["deepspeed"] = _loop(ds, data, rank, world, plain)
        out["queries_deepspeed"] = (ds.gradient_accumulation_steps(), ds.zero_optimization_stage())
        mine = full_parameters(ours)
        with _gathered(ds, stage):
            out["param_diff"] = max((mine[n] - p.detach()).abs().max().item() for n, p in ds.module.named_parameters())
        out["moved"] = max((mine[n] - p.detach()).abs().max().item() for n, p in model.named_parameters())
    return out


BOUNDARIES = [False, True, False, False, True, True]
"""Windows of 2, 3 and 1 micro-batches with ``ACCUM`` 2: set by hand, as Accelerate does from its ``sync_gradients``
(an epoch's last window may be shorter, a caller's longer)."""


def _manual_loop(engine, data, rank: int, world: int, step_every: bool) -> list[dict]:
    """Accelerate's loop: ``set_gradient_accumulation_boundary(b)``, ``engine.backward(loss)``, and ``engine.step()``
    at a boundary; or (``step_every``) after every backward, as RL trainers do."""
    seen = []
    for (x, y), b in zip(data, BOUNDARIES, strict=True):
        engine.set_gradient_accumulation_boundary(b)
        engine.backward(engine(slice_of(x, rank, world), slice_of(y, rank, world)))
        if b or step_every:
            engine.step()
        seen.append(
            {"boundary": engine.is_gradient_accumulation_boundary(), "global_steps": engine.global_steps}
            | ({"applied": engine.was_step_applied()} if b or step_every else {})
        )
    return seen


def _reference(model, data, world: int) -> dict:
    """One process on the global batches: each window's losses over ``ACCUM`` summed, clipped, one AdamW step."""
    opt = make_adamw(model.parameters(), ADAM)
    for (x, y), b in zip(data, BOUNDARIES, strict=True):
        (reference_loss(model, x, y, world) / ACCUM).backward()
        if b:
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def ds_manual_boundaries(rank: int, world: int, stage: int, with_deepspeed: bool, step_every: bool) -> dict:
    """``_manual_loop`` on the ZeRO engine, against the one-process reference, and beside DeepSpeed's engine."""
    group = Group.of(None, "dp")
    model = make_model("all_in_blocks")
    data = batches(len(BOUNDARIES), 2 * world)
    cfg = ZeroConfig(stage=stage, bucket_numel=5000, optimizer=ADAM, grad_accum_steps=ACCUM, clip_grad_norm=CLIP)
    ours = ds_apply_zero(copy.deepcopy(model), group, cfg)
    out = {"ours": _manual_loop(ours, data, rank, world, step_every)}
    mine = full_parameters(ours)
    ref = _reference(copy.deepcopy(model), data, world)
    out["reference_diff"] = max((mine[n] - p).abs().max().item() for n, p in ref.items())
    out["moved"] = max((mine[n] - p.detach()).abs().max().item() for n, p in model.named_parameters())
    if with_deepspeed:
        ds = _deepspeed(copy.deepcopy(model), stage, 2)
        out["deepspeed"] = _manual_loop(ds, data, rank, world, step_every)
        with _gathered(ds, stage):
            out["param_diff"] = max((mine[n] - p.detach()).abs().max().item() for n, p in ds.module.named_parameters())
    return out


def _gathered(ds, stage: int):
    if stage < 3:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(ds.module.parameters()))
