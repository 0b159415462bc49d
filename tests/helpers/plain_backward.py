"""Training loops written for DDP/FSDP, which call ``loss.backward()`` and ``optimizer.step()`` instead of
``engine.backward(loss)``, run against the engine in spawned ranks and compared with single-process
``torch.optim.AdamW`` training (``tests/helpers/user_models.py``). Before ``zero/backward_pass.py`` such a loop
trained nothing, silently: the gradients were never reduced and every step was skipped.

Cases (each a fresh engine on the MLP): the DDP loop; accumulation over two micro-batches with the loss divided
by hand (as under DDP) and ``grad_accum_steps=2``; the model's own re-entrant checkpointing; a backward that
does not go through the root module's hooks (``model.forward`` called directly: stages 0-2); the two loops
mixed step by step; a backward aborted by an exception, then training on; fp16, refused in one line.
"""

from __future__ import annotations

import copy

from tests.helpers.user_models import batches, compare, engine_for, error_line, make_model, reference_params, slice_of
from zerobench.distributed.collectives import Group
from zerobench.zero.config import Precision


def run_plain_backward(rank: int, world: int, stage: int) -> dict:
    group = Group.of(None, "dp")
    data = batches(3, 4 * world)  # 4 sequences per rank
    mine = [(slice_of(x, rank, world), slice_of(y, rank, world)) for x, y in data]
    out: dict = {}

    def ddp_loop(variant: str, call, **kw) -> dict:
        model = make_model(variant)
        engine = engine_for(copy.deepcopy(model), group, stage, **kw)
        opt = engine.optimizer
        for i, (x, y) in enumerate(mine):
            call(engine, i, x, y)
            opt.step()
            opt.zero_grad()
        return {**compare(engine, model, reference_params(model, data, world)), "state": engine.passes.state.value}

    def plain(engine, i, x, y):
        engine.module(x, y).backward()

    def halves(engine, i, x, y):  # accumulation as under DDP: each micro-batch's loss divided by their number
        for lo in (0, 2):
            (engine.module(x[lo : lo + 2], y[lo : lo + 2]) / 2).backward()

    def mixed(engine, i, x, y):
        loss = engine.module(x, y)
        engine.backward(loss) if i % 2 else loss.backward()

    out["plain"] = ddp_loop("mlp", plain)
    out["accum"] = ddp_loop("mlp", halves, grad_accum_steps=2)
    out["reentrant"] = ddp_loop("user_ckpt_reentrant", plain)
    out["mixed"] = ddp_loop("mlp", mixed)
    if stage < 3:  # at stage 3 the root's parameters are gathered by its forward hooks, which this bypasses
        out["no_root_hooks"] = ddp_loop("mlp", lambda engine, i, x, y: engine.module.forward(x, y).backward())
    out["aborted"] = _aborted_then_trained(group, stage, data, mine, world)

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
