"""Training loops written for DDP/FSDP, which call ``loss.backward()`` and ``optimizer.step()`` instead of
``engine.backward(loss)``, run against the engine in spawned ranks and compared with single-process
``torch.optim.AdamW`` training (``tests/helpers/user_models.py``). Before ``zero/grads/backward.py`` such a loop
trained nothing, silently: the gradients were never reduced and every step was skipped.

Cases (each a fresh engine on the MLP): the DDP loop; accumulation over two micro-batches with
``grad_accum_steps=2`` and each loss as it is (the engine divides, as DeepSpeed's plain backward does); the model's own re-entrant checkpointing; a backward that
does not go through the root module's hooks (``model.forward`` called directly: stages 0-2); the two loops
mixed step by step, and two windows accumulated without ``zero_grad()``; DeepSpeed's loop (``engine.backward``
and ``engine.step()`` after every micro-batch, no ``zero_grad()``), with and without accumulation; a backward aborted by an exception,
then training on; fp16, refused in one line; a window mixing the two, refused in one line. Gradients cleared
as PyTorch code clears them: ``model.zero_grad()`` (either ``set_to_none``), and ``p.grad = None`` by hand at
stages 0-1 (at stages 2-3 ``.grad`` is None already); the model's class after that routing. DDP's accumulation
loop under ``engine.no_sync()``, with its gradient traffic per step, and ``step()`` after only unsynchronised
passes, refused in one line. And what DDP's
users read: at stage 0 ``p.grad`` after either backward, and ``torch.nn.utils.clip_grad_norm_``'s norm, equal
torch DDP's in the same ranks (the mean over ranks); at every stage ``full_gradients`` does.
"""

from __future__ import annotations

import contextlib
import copy

import torch
from torch.nn.parallel import DistributedDataParallel

from tests.helpers.user_models import batches, compare, engine_for, error_line, make_model, reference_params, slice_of
from zerobench.distributed.collectives import Group
from zerobench.metrics.comm import CommLedger
from zerobench.zero.config import Precision
from zerobench.zero.state.shards import full_gradients


def run_plain_backward(rank: int, world: int, stage: int) -> dict:
    group = Group.of(None, "dp")
    data = batches(3, 4 * world)  # 4 sequences per rank
    mine = [(slice_of(x, rank, world), slice_of(y, rank, world)) for x, y in data]
    out: dict = {}

    def ddp_loop(variant: str, call, steps_itself: bool = False, **kw) -> dict:
        model = make_model(variant)
        engine = engine_for(copy.deepcopy(model), group, stage, **kw)
        opt = engine.optimizer
        for i, (x, y) in enumerate(mine):
            call(engine, i, x, y)
            if not steps_itself:
                opt.step()
                opt.zero_grad()
        return {**compare(engine, model, reference_params(model, data, world)), "state": engine.passes.state.value}

    def plain(engine, i, x, y):
        engine.module(x, y).backward()

    def halves(engine, i, x, y):  # grad_accum_steps=2: the engine divides each micro-batch's gradient by 2
        for lo in (0, 2):
            engine.module(x[lo : lo + 2], y[lo : lo + 2]).backward()

    def mixed(engine, i, x, y):
        loss = engine.module(x, y)
        engine.backward(loss) if i % 2 else loss.backward()

    out["plain"] = ddp_loop("mlp", plain)
    out["accum"] = ddp_loop("mlp", halves, grad_accum_steps=2)
    out["reentrant"] = ddp_loop("user_ckpt_reentrant", plain)
    out["mixed"] = ddp_loop("mlp", mixed)
    if stage < 3:  # at stage 3 the root's parameters are gathered by its forward hooks, which this bypasses
        out["no_root_hooks"] = ddp_loop("mlp", lambda engine, i, x, y: engine.module.forward(x, y).backward())
    out["two_windows"] = _two_windows(group, stage, data, mine, world)

    def deepspeed(engine, i, x, y):  # DeepSpeed's loop: backward and step per micro-batch, never zero_grad()
        for lo in (0, 2) if engine.config.grad_accum_steps == 2 else (0,):
            hi = lo + 2 if engine.config.grad_accum_steps == 2 else 4
            engine.backward(engine.module(x[lo:hi], y[lo:hi]))
            out.setdefault(f"ds_applied_{engine.config.grad_accum_steps}", []).append(engine.step())

    out["ds_loop"] = ddp_loop("mlp", deepspeed, True)
    out["ds_loop_accum"] = ddp_loop("mlp", deepspeed, True, grad_accum_steps=2)

    def zero_by(clear):
        def call(engine, i, x, y):
            if i:  # the optimizer's own zero_grad() left out: the model's (or a hand-written one) instead
                clear(engine.module)
            engine.module(x, y).backward()
            engine.step()

        return call

    out["module_zero_grad"] = ddp_loop("mlp", zero_by(lambda m: m.zero_grad()), True)
    out["module_zero_grad_keep"] = ddp_loop("mlp", zero_by(lambda m: m.zero_grad(set_to_none=False)), True)
    if stage < 2:
        out["grad_none_by_hand"] = ddp_loop(
            "mlp", zero_by(lambda m: [setattr(p, "grad", None) for p in m.parameters()]), True
        )
    out.update(_model_class(group, stage, mine[0]))
    out.update(_no_sync(group, stage, data, mine, world))
    out["aborted"] = _aborted_then_trained(group, stage, data, mine, world)
    out.update(_against_ddp(group, stage, mine[0]))

    engine = engine_for(make_model("mlp"), group, stage, grad_accum_steps=2)
    x, y = mine[0]
    engine.backward(engine.module(x, y))
    out["mixed_window_error"] = error_line(lambda: engine.module(x, y).backward())

    engine = engine_for(make_model("mlp"), group, stage, precision=Precision.FP16)
    x, y = mine[0]
    out["fp16_error"] = error_line(lambda: engine.module(x, y).backward())
    out["fp16_state"] = engine.passes.state.value
    return out


def _aborted_then_trained(group: Group, stage: int, data, mine, world: int) -> dict:
    """A ``loss.backward()`` that raises (a user's hook on the loss, after the engine opened the pass), then
    ``zero_grad()`` and three ordinary steps: the engine trains as if the failed pass had never been."""
    model = make_model("mlp")
    engine = engine_for(copy.deepcopy(model), group, stage)
    x, y = mine[0]
    loss = engine.module(x, y)

    def fail(grad):
        raise ValueError("user hook failed")

    loss.register_hook(fail)
    out = {"error": error_line(loss.backward), "state_after_error": engine.passes.state.value}
    engine.zero_grad()
    for x, y in mine:
        engine.module(x, y).backward()
        engine.step()
        engine.zero_grad()
    return {**out, **compare(engine, model, reference_params(model, data, world))}


def _two_windows(group: Group, stage: int, data, mine, world: int) -> dict:
    """Two plain backward passes per step without ``zero_grad()`` between them: two windows, accumulated."""
    model = make_model("mlp")
    engine = engine_for(copy.deepcopy(model), group, stage)
    for x, y in mine:
        for _ in range(2):
            engine.module(x, y).backward()
        engine.step()
        engine.zero_grad()
    return compare(engine, model, reference_params(model, data, world, windows=2))


def _against_ddp(group: Group, stage: int, batch) -> dict:
    """The largest difference from torch DDP's ``.grad`` (same model, same slice, gloo): of ``p.grad`` at stage 0
    and of ``full_gradients`` at every stage, after ``engine.backward`` and after a plain ``loss.backward()``;
    and of ``clip_grad_norm_``'s total norm (torch's on ``p.grad`` at stage 0, the engine's at every stage)."""
    x, y = batch
    model = make_model("mlp")
    ddp = DistributedDataParallel(copy.deepcopy(model))
    ddp(x, y).backward()
    want = {n: p.grad.clone() for n, p in ddp.module.named_parameters()}
    want_norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1e9).item()
    out = {"ddp_grad_max": max(g.abs().max().item() for g in want.values())}
    for path in ("engine", "plain"):
        engine = engine_for(copy.deepcopy(model), group, stage)
        loss = engine.module(x, y)
        engine.backward(loss) if path == "engine" else loss.backward()
        full = full_gradients(engine)
        out[f"{path}_full_diff"] = max((full[n] - want[n]).abs().max().item() for n in want)
        if stage == 0:
            grads = dict(engine.module.named_parameters())
            out[f"{path}_pgrad_diff"] = max((grads[n].grad - want[n]).abs().max().item() for n in want)
            out[f"{path}_torch_clip_norm"] = torch.nn.utils.clip_grad_norm_(engine.module.parameters(), 1e9).item()
        out[f"{path}_engine_clip_norm"] = engine.clip_grad_norm_(1e9).item()
    out["ddp_clip_norm"] = want_norm
    return out


def _model_class(group: Group, stage: int, batch) -> dict:
    """After ``apply_zero`` the model keeps its class name and ``isinstance``; a deepcopy (an EMA copy) is of the
    model's own class, and clearing the copy's gradients leaves the engine's alone. ``optimizer.zero_grad()``
    leaves ``.grad`` None, as torch's does (every stage); with ``set_to_none=False``, zeros (stages 0-1)."""
    from tests.helpers.user_models import MLP

    engine = engine_for(make_model("mlp"), group, stage)
    m = engine.module
    x, y = batch
    m(x, y).backward()
    ema = copy.deepcopy(m)
    ema.zero_grad()
    reduced = engine.grads.reduced
    engine.step()
    engine.optimizer.zero_grad()  # torch's default: set_to_none
    none_after = all(p.grad is None for p in m.parameters())
    m(x, y).backward()
    engine.optimizer.zero_grad(set_to_none=False)
    zeros_after = all(p.grad is not None and not p.grad.any() for p in m.parameters()) if stage < 2 else None
    return {
        "grad_none_after_zero_grad": none_after,
        "grad_zeros_after_zero_grad_keep": zeros_after,
        "class_name": type(m).__name__,
        "isinstance": isinstance(m, MLP),
        "copy_class": type(ema) is MLP,
        "reduced_after_copy_cleared": reduced,
    }


def _no_sync(group: Group, stage: int, data, mine, world: int) -> dict:
    """DDP's accumulation loop: the first half of each rank's batch under ``no_sync()``, the second outside it,
    each loss divided by 2; against the reference, and its gradient traffic per step (DP elements) next to
    the same loop without ``no_sync()``. Then ``step()`` after a backward under ``no_sync()`` only."""
    out: dict = {}
    model = make_model("mlp")
    for use in (True, False):
        ledger = CommLedger()
        engine = engine_for(copy.deepcopy(model), group, stage, ledger=ledger)
        m = engine.module
        for x, y in mine:
            ledger.reset()
            with engine.no_sync() if use else contextlib.nullcontext():
                (m(x[:2], y[:2]) / 2).backward()
            (m(x[2:], y[2:]) / 2).backward()
            out[f"grad_volume_{use}"] = ledger.volume_elements(tag="grad")
            engine.optimizer.step()
            engine.optimizer.zero_grad()
        out[f"no_sync_{use}"] = compare(engine, model, reference_params(model, data, world))
    engine = engine_for(copy.deepcopy(model), group, stage)
    with engine.no_sync():
        engine.module(*mine[0]).backward()
    out["no_sync_step_error"] = error_line(engine.step)
    return out
