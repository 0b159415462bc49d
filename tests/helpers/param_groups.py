"""Param groups as users write them (``ds_apply_zero(param_groups=...)``), inside spawned ranks, against
single-process ``torch.optim.AdamW`` with the same groups and the same per-group ``LambdaLR``:

- three groups with their own lr, betas, eps and weight decay (one holds the embedding that the head ties
  to, one the vectors and scalars without decay), straddling buckets and DP shards;
- on the fused kernel, the reference path, and under ZeRO-Offload;
- a sharded checkpoint mid-schedule carries every group's hyperparameters into a fresh engine; an engine
  with other groups refuses it in one line; a trained parameter left out of the groups fails in one line
  on every rank, before any collective.
"""

from __future__ import annotations

import copy
import tempfile

import torch
from torch.optim.lr_scheduler import LambdaLR

from tests.helpers.ds import ds_apply_zero
from tests.helpers.user_models import ADAM, batches, compare, error_line, make_model, reference_loss, slice_of
from zerobench.distributed.collectives import Group
from zerobench.zero import ZeroConfig
from zerobench.zero.state.checkpoint import load_sharded, save_sharded
from zerobench.zero.state.shards import full_parameters

STEPS = 4
LAMBDAS = [lambda s: min(1.0, (s + 1) / 2), lambda s: 1.0, lambda s: 0.5**s]
"""Per group: a warm-up, a constant, a halving."""


def user_groups(model) -> list[dict]:
    """Block matrices at the config's hyperparameters; the tied embedding (= the head's weight) at a lower lr
    with other betas and decay; every vector and scalar without decay, at a higher lr and eps."""
    blocks = [p for b in model.blocks for p in b.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [
        {"params": blocks},
        {"params": [model.emb.weight], "lr": 3e-3, "betas": (0.8, 0.99), "weight_decay": 0.05},
        {"params": rest, "lr": 2e-2, "eps": 1e-6, "weight_decay": 0.0, "name": "no_decay"},
    ]


def reference(model, data, world: int) -> tuple[dict, list[list[float]]]:
    """torch's AdamW over ``user_groups`` with the same schedule: the parameters, and each step's lrs."""
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(
        user_groups(ref), lr=ADAM.lr, betas=ADAM.betas, eps=ADAM.eps, weight_decay=ADAM.weight_decay, foreach=False
    )
    sched, lrs = LambdaLR(opt, LAMBDAS), []
    for x, y in data:
        lrs.append([g["lr"] for g in opt.param_groups])
        reference_loss(ref, x, y, world).backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    return {n: p.detach().clone() for n, p in ref.named_parameters()}, lrs


def engine(model, group: Group, stage: int, groups=user_groups, **kw):
    cfg = ZeroConfig(stage=stage, bucket_numel=2000, optimizer=ADAM, **kw)
    return ds_apply_zero(copy.deepcopy(model), group, cfg, param_groups=groups)


def _hypers(eng) -> list[dict]:
    return [{k: v for k, v in g.items() if k != "params"} for g in eng.optimizer.param_groups]


def train(eng, sched, data, rank: int, world: int) -> list[list[float]]:
    lrs = []
    for x, y in data:
        lrs.append(eng.get_lr())
        eng.backward(eng.module(slice_of(x, rank, world), slice_of(y, rank, world)))
        eng.step()
        sched.step()
    return lrs


def run_param_groups(rank: int, world: int, stage: int) -> dict:
    group = Group.of(None, "dp")
    model = make_model("tied_root")
    data = batches(STEPS, 2 * world)
    ref, ref_lrs = reference(model, data, world)
    out: dict = {"ref_lrs": ref_lrs}
    variants = {"fused": {}, "reference_kernels": {"kernels": "reference"}}
    if stage > 0:
        variants["offload"] = {"offload_optimizer": "cpu"}
    for name, kw in variants.items():
        eng = engine(model, group, stage, **kw)
        out[f"{name}_lrs"] = train(eng, LambdaLR(eng.optimizer, LAMBDAS), data, rank, world)
        out[name] = compare(eng, model, ref)
    out.update(_resume(rank, world, stage, model, data, group))
    out["left_out"] = error_line(lambda: engine(model, group, stage, groups=lambda m: user_groups(m)[:2]))
    return out


def _resume(rank, world, stage, model, data, group) -> dict:
    """Two steps, a sharded checkpoint, two more steps in a fresh engine with its own scheduler: the same
    parameters as four steps straight; each group's lr comes back with the checkpoint."""
    straight = engine(model, group, stage)
    train(straight, LambdaLR(straight.optimizer, LAMBDAS), data, rank, world)
    first = engine(model, group, stage)
    sched = LambdaLR(first.optimizer, LAMBDAS)
    train(first, sched, data[:2], rank, world)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = [tmp] if rank == 0 else [None]
        torch.distributed.broadcast_object_list(path, 0)
        save_sharded(first, path[0])
        torch.distributed.barrier()
        second = engine(model, group, stage)
        sched2 = LambdaLR(second.optimizer, LAMBDAS)  # torch's order: the scheduler, then the optimizer's state
        sched2.load_state_dict(sched.state_dict())
        load_sharded(second, path[0])
        out["resumed_lrs"] = second.get_lr()
        out["saved_lrs"] = first.get_lr()
        train(second, sched2, data[2:], rank, world)
        a, b = full_parameters(straight), full_parameters(second)
        out["resume_diff"] = max((a[n] - b[n]).abs().max().item() for n in a)
        other = engine(model, group, stage, groups=None)
        out["other_groups"] = error_line(lambda: load_sharded(other, path[0]))
        swapped = engine(model, group, stage, groups=lambda m: [user_groups(m)[i] for i in (0, 2, 1)])
        before = _hypers(swapped)
        out["other_members"] = error_line(lambda: load_sharded(swapped, path[0]))
        out["other_members_kept"] = _hypers(swapped) == before  # group 0 matches: nothing may be restored
        torch.distributed.barrier()
    return out
