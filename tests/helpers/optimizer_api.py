"""``engine.optimizer`` driven as plain PyTorch code drives a ``torch.optim.Optimizer``, inside spawned ranks,
against single-process ``torch.optim.AdamW`` driven the same way (``tests/helpers/user_models.py``):

- a ``LambdaLR`` schedule (warm-up from lr 0, then decay) stepped after ``engine.step()``, and a weight decay
  switched on through ``param_groups`` by an engine built with none;
- ``optimizer.step(closure)`` and step hooks, under ZeRO-Offload too;
- ``engine.clip_grad_norm_`` (FSDP's spelling) against ``torch.nn.utils.clip_grad_norm_`` on one process;
- ``state_dict()`` through ``torch.save``/``torch.load(weights_only=True)`` into a fresh engine and scheduler
  mid-schedule, then training on: bit-identical to training straight through;
- ``save_sharded``/``load_sharded`` restoring the schedule's current learning rate;
- bad values in ``param_groups`` and an added group: one line, on every rank.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import tempfile
import warnings

import torch
from torch.optim.lr_scheduler import LambdaLR

from tests.helpers.reference import make_adamw
from tests.helpers.user_models import (
    ADAM,
    batches,
    compare,
    engine_for,
    error_line,
    make_model,
    reference_loss,
    slice_of,
)
from zerobench.distributed.collectives import Group
from zerobench.zero.state.checkpoint import load_sharded, save_sharded
from zerobench.zero.state.shards import full_parameters


def schedule(step: int) -> float:
    """Linear warm-up from 0 over two steps, then halving: 0, 0.5, 1, 0.5, 0.25, ..."""
    return step / 2 if step < 2 else 0.5 ** (step - 2)


def reference_scheduled(model, data, world: int) -> dict:
    """``torch.optim.AdamW`` + ``LambdaLR(schedule)`` on the global batch: the parameters after ``data``."""
    ref = copy.deepcopy(model)
    opt = make_adamw(ref.parameters(), ADAM)
    sched = LambdaLR(opt, schedule)
    for x, y in data:
        reference_loss(ref, x, y, world).backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    return {n: p.detach().clone() for n, p in ref.named_parameters()}


def _train(engine, sched, data, rank, world, via_closure=False) -> list[float]:
    lrs = []
    for x, y in data:
        xs, ys = slice_of(x, rank, world), slice_of(y, rank, world)
        lrs.append(engine.get_lr()[0])
        if via_closure:

            def closure(xs=xs, ys=ys):
                loss = engine.module(xs, ys)
                engine.backward(loss)
                return loss

            engine.optimizer.step(closure)
        else:
            engine.backward(engine.module(xs, ys))
            engine.step()
        sched.step()
        engine.optimizer.zero_grad()
    return lrs


def run_optimizer_api(rank: int, world: int, stage: int) -> dict:
    group = Group.of(None, "dp")
    model = make_model("mlp")
    data = batches(5, 2 * world)
    ref = reference_scheduled(model, data, world)
    out: dict = {}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = engine_for(copy.deepcopy(model), group, stage)
        out["is_optimizer"] = isinstance(engine.optimizer, torch.optim.Optimizer)
        out["lrs"] = _train(engine, LambdaLR(engine.optimizer, schedule), data, rank, world)
    out["warnings"] = [str(w.message) for w in caught if "lr_scheduler" in str(w.message)]
    out["schedule"] = compare(engine, model, ref)

    # Weight decay switched on through param_groups (the engine was built with none); the closure form of step,
    # and step hooks, which engine.step() and optimizer.step() both run.
    kw = {"optimizer": dataclasses.replace(ADAM, weight_decay=0.0)}
    if stage > 0:
        kw["offload_optimizer"] = "cpu"
    engine = engine_for(copy.deepcopy(model), group, stage, **kw)
    engine.optimizer.param_groups[0]["weight_decay"] = ADAM.weight_decay
    calls = []
    engine.optimizer.register_step_pre_hook(lambda opt, args, kwargs: calls.append("pre"))
    engine.optimizer.register_step_post_hook(lambda opt, args, kwargs: calls.append("post"))
    _train(engine, LambdaLR(engine.optimizer, schedule), data, rank, world, via_closure=True)
    out["closure_decay_offload"] = compare(engine, model, ref)
    out["hook_calls"] = calls

    out.update(_clip(rank, world, stage, model, data, group))
    out.update(_resume(rank, world, stage, model, data, group))
    out.update(_bad_groups(rank, world, stage, model, data, group))
    return out


def _clip(rank, world, stage, model, data, group) -> dict:
    """``engine.clip_grad_norm_(max_norm)`` each step against ``torch.nn.utils.clip_grad_norm_`` on one process
    (max_norm below every step's norm, so every step clips); then a call before any backward."""
    ref = copy.deepcopy(model)
    opt = make_adamw(ref.parameters(), ADAM)
    engine = engine_for(copy.deepcopy(model), group, stage)
    norms, ref_norms = [], []
    for x, y in data:
        engine.backward(engine.module(slice_of(x, rank, world), slice_of(y, rank, world)))
        norms.append(engine.clip_grad_norm_(0.05).item())
        engine.step()
        engine.zero_grad()
        reference_loss(ref, x, y, world).backward()
        ref_norms.append(torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05).item())
        opt.step()
        opt.zero_grad(set_to_none=True)
    # FSDP1's loop: a plain backward, then the model's own clip_grad_norm_ and the optimizer
    fsdp_like = engine_for(copy.deepcopy(model), group, stage)
    m, model_norms = fsdp_like.module, []
    for x, y in data:
        m(slice_of(x, rank, world), slice_of(y, rank, world)).backward()
        model_norms.append(m.clip_grad_norm_(0.05).item())
        fsdp_like.optimizer.step()
        fsdp_like.optimizer.zero_grad()
    m(slice_of(data[0][0], rank, world), slice_of(data[0][1], rank, world)).backward()
    return {
        "clip": compare(engine, model, {n: p.detach() for n, p in ref.named_parameters()}),
        "clip_norms": (norms, ref_norms),
        "clip_early": error_line(lambda: engine.clip_grad_norm_(1.0)),
        "model_clip": compare(fsdp_like, model, {n: p.detach() for n, p in ref.named_parameters()}),
        "model_clip_norms": model_norms,
        "clip_bad_norm": error_line(lambda: m.clip_grad_norm_(1.0, norm_type=0)),
        **{
            f"clip_p{p}": _clip_p(rank, world, stage, model, data, group, p, max_norm)
            for p, max_norm in ((1.0, 0.5), (3.0, 0.01), (float("inf"), 0.002))
        },
    }


def _clip_p(rank, world, stage, model, data, group, p: float, max_norm: float) -> dict:
    """FSDP1's loop with ``model.clip_grad_norm_(max_norm, norm_type=p)`` against torch's function on one process."""
    ref = copy.deepcopy(model)
    opt = make_adamw(ref.parameters(), ADAM)
    engine = engine_for(copy.deepcopy(model), group, stage)
    norms, ref_norms = [], []
    for x, y in data:
        engine.module(slice_of(x, rank, world), slice_of(y, rank, world)).backward()
        norms.append(engine.module.clip_grad_norm_(max_norm, norm_type=p).item())
        engine.optimizer.step()
        engine.optimizer.zero_grad()
        reference_loss(ref, x, y, world).backward()
        ref_norms.append(torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm, norm_type=p).item())
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {
        "compare": compare(engine, model, {n: p.detach() for n, p in ref.named_parameters()}),
        "norms": (norms, ref_norms),
        "max_norm": max_norm,
    }


def _resume(rank, world, stage, model, data, group) -> dict:
    """Stop after 3 steps (lr at half its peak), carry the model's, the optimizer's and the scheduler's state dicts
    into fresh objects, train on. As torch's, the optimizer's state leaves the model's weights alone: they come from
    the model's state dict, loaded first (the optimizer's fp32 master then keeps its bits under bf16)."""
    straight = engine_for(copy.deepcopy(model), group, stage)
    _train(straight, LambdaLR(straight.optimizer, schedule), data, rank, world)

    first = engine_for(copy.deepcopy(model), group, stage)
    sched = LambdaLR(first.optimizer, schedule)
    _train(first, sched, data[:3], rank, world)
    buf = io.BytesIO()
    with first.gathered_params():
        weights = {k: v.clone() for k, v in first.module.state_dict().items()}
    torch.save({"model": weights, "optim": first.optimizer.state_dict(), "sched": sched.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    fresh = make_model("mlp")
    with torch.no_grad():  # another initialisation: everything must come from the state dict
        for p in fresh.parameters():
            p.add_(1.0)
    second = engine_for(fresh, group, stage)
    sched2 = LambdaLR(second.optimizer, schedule)  # torch's order: the scheduler, then the optimizer's state
    sched2.load_state_dict(saved["sched"])
    fresh.load_state_dict(saved["model"])
    second.optimizer.load_state_dict(saved["optim"])
    lr_after_load = second.get_lr()[0]
    _train(second, sched2, data[3:], rank, world)
    a, b = full_parameters(straight), full_parameters(second)
    out = {
        "resume_lr": lr_after_load,
        "resume_diff": max((a[n] - b[n]).abs().max().item() for n in a),
        "resume_groups": [{k: v for k, v in g.items() if k != "params"} for g in saved["optim"]["param_groups"]],
    }

    with tempfile.TemporaryDirectory() as tmp:  # the sharded checkpoint carries the current lr as well
        path = [tmp] if rank == 0 else [None]
        torch.distributed.broadcast_object_list(path, 0)
        save_sharded(first, path[0])
        torch.distributed.barrier()
        third = engine_for(copy.deepcopy(model), group, stage)
        load_sharded(third, path[0])
        out["checkpoint_lr"] = third.get_lr()[0]
        out["checkpoint_initial_lr"] = third.optimizer.param_groups[0].get("initial_lr")
        torch.distributed.barrier()
    return out


def _bad_groups(rank, world, stage, model, data, group) -> dict:
    engine = engine_for(copy.deepcopy(model), group, stage)
    xs, ys = (slice_of(t, rank, world) for t in data[0])
    engine.backward(engine.module(xs, ys))
    out = {}
    engine.optimizer.param_groups[0]["lr"] = -1.0
    out["negative_lr"] = error_line(engine.step)
    engine.optimizer.param_groups[0]["lr"] = float("nan")
    out["nan_lr"] = error_line(engine.optimizer.step)
    engine.optimizer.param_groups[0]["lr"] = ADAM.lr
    engine.optimizer.param_groups[0]["betas"] = (0.9, 1.5)
    out["bad_betas"] = error_line(engine.step)
    engine.optimizer.param_groups[0]["betas"] = ADAM.betas
    out["add_group"] = error_line(
        lambda: engine.optimizer.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))]})
    )
    out["after_errors_stepped"] = engine.step()  # the refused steps left the window intact
    return out
