"""How users drive a training loop beyond forward-backward-step, run against the engine in spawned ranks and
compared with single-process ``torch.optim.AdamW`` training (``tests/helpers/user_models.py``):

- evaluation between steps: ``eval()`` and a forward under ``torch.no_grad()`` after every step (at stage 3
  a forward with no backward to follow: its units are gathered and freed again), then training goes on;
- two forwards before one backward (two halves of the batch, the mean of their losses): one backward pass
  through two graphs of the same parameters, as contrastive or multi-view losses do;
- stage 3's all-gathers per step for a block called twice in one forward, counted in the comm ledger;
- a user's forward hooks on a unit see its full weight.
"""

from __future__ import annotations

import collections
import copy

import torch

from tests.helpers.user_models import (
    batches,
    compare,
    engine_for,
    make_model,
    reference_params,
    run_api_checks,
    slice_of,
)
from zerobench.distributed.collectives import Group
from zerobench.metrics.comm import CommLedger


def run_api_and_usage(rank: int, world: int, stage: int) -> dict:
    """``run_api_checks`` and the usage patterns above, in one set of ranks."""
    return {**run_api_checks(rank, world, stage), **run_usage_patterns(rank, world, stage)}


def run_usage_patterns(rank: int, world: int, stage: int) -> dict:
    group = Group.of(None, "dp")
    model = make_model("mlp")
    data = batches(3, 4 * world)  # 4 sequences per rank: two equal halves
    out: dict = {}

    engine = engine_for(copy.deepcopy(model), group, stage)
    evals = []
    for x, y in data:
        xs, ys = slice_of(x, rank, world), slice_of(y, rank, world)
        engine.backward(engine.module(xs, ys))
        engine.step()
        engine.zero_grad()
        engine.module.eval()
        with torch.no_grad():
            evals.append(engine.module(xs, ys).item())
        engine.module.train()
    out["eval_between_steps"] = compare(engine, model, reference_params(model, data, world))
    out["eval_losses"] = evals
    out["eval_after_numel"] = engine.module.blocks[0].fc1.weight.numel()

    engine = engine_for(copy.deepcopy(model), group, stage)
    for x, y in data:
        xs, ys = slice_of(x, rank, world), slice_of(y, rank, world)
        engine.backward((engine.module(xs[:2], ys[:2]) + engine.module(xs[2:], ys[2:])) / 2)
        engine.step()
        engine.zero_grad()
    out["two_forwards"] = compare(engine, model, reference_params(model, data, world))
    if stage == 3:
        out["gathers"] = {v: _gathers_per_step(rank, world, v, group) for v in ("mlp", "reused")}
    out["hook_norms"], out["true_norm"] = _user_hooks(rank, world, stage, model, data[0], group)
    return out


def _user_hooks(rank: int, world: int, stage: int, model, batch, group: Group) -> tuple[list[float], float]:
    """A user's forward pre- and post-hook on a unit, registered before ``apply_zero``: the norm of its weight each saw
    (FSDP2 gathers before the module's own pre-hooks too; before, stage 3's pre-hook ran after them: an empty weight,
    norm 0)."""
    m, seen = copy.deepcopy(model), []
    m.blocks[1].register_forward_pre_hook(lambda mod, args: seen.append(mod.fc1.weight.detach().norm().item()))
    m.blocks[1].register_forward_hook(lambda mod, args, out: seen.append(mod.fc1.weight.detach().norm().item()))
    engine = engine_for(m, group, stage)
    with torch.no_grad():
        engine.module(slice_of(batch[0], rank, world), slice_of(batch[1], rank, world))
    return seen, model.blocks[1].fc1.weight.detach().norm().item()


def _gathers_per_step(rank: int, world: int, variant: str, group: Group) -> dict:
    """All-gathers of one step (the second: no first-step set-up in it) and the buckets of the reused block's unit."""
    ledger = CommLedger()
    engine = engine_for(copy.deepcopy(make_model(variant)), group, 3, ledger=ledger)
    x, y = (slice_of(t, rank, world) for t in batches(1, 2 * world)[0])
    for _ in range(2):
        ledger.reset()
        engine.backward(engine.module(x, y))
        engine.step()
        engine.zero_grad()
    ops = collections.Counter(r.op for r in ledger.records)
    unit = next(u for u in engine.gatherer.units if u.module is engine.module.blocks[1])
    return {"all_gather": ops["all_gather"], "unit_buckets": len(unit.buckets)}
