"""How users drive a training loop beyond forward-backward-step, run against the engine in spawned ranks and
compared with single-process ``torch.optim.AdamW`` training (``tests/helpers/user_models.py``):

- evaluation between steps: ``eval()`` and a forward under ``torch.no_grad()`` after every step (at stage 3
  a forward with no backward to follow: its units are gathered and freed again), then training goes on;
- two forwards before one backward (two halves of the batch, the mean of their losses): one backward pass
  through two graphs of the same parameters, as contrastive or multi-view losses do.
"""

from __future__ import annotations

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
    return out
