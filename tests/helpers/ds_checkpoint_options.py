"""Rank workers for DeepSpeed's checkpoint options on the engine: ``load_checkpoint(..., load_optimizer_states=False)``,
``load_module_only=True``, ``load_module_strict=False``, ``load_lr_scheduler_states``, and ``save_checkpoint(...,
save_latest=False, exclude_frozen_parameters=True)``, called as DeepSpeed's tests call them.

Engine A trains and saves. Engines B, C and D start from another initialisation, take one step of their own (their
own moments, step count and learning rate), then load A's checkpoint with an option: what the option loads must be
A's, what it leaves must be their own, bit for bit.
"""

from __future__ import annotations

import torch

from tests.helpers.ds import ds_apply_zero
from tests.helpers.ds_checkpoint import ADAM, BNNet, _bn_state, _bn_train
from tests.helpers.scenarios import dp_groups
from zerobench.zero import ZeroConfig
from zerobench.zero.state.shards import full_parameters


def _engine(group, stage: int, seed: int):
    torch.manual_seed(seed)
    return ds_apply_zero(BNNet(), group, ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=200))


def _moments(engine) -> list[torch.Tensor]:
    ms, vs = engine.adamw.moments()
    return [t.detach().clone() for t in (*ms, *vs)]


def _diff(a: dict, b: dict) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _own_state(engine) -> dict:
    """What a module-only load must leave alone: moments, step count, counters, learning rate."""
    return {
        "moments": _moments(engine),
        "step": engine.adamw.step_count,
        "global": engine.global_steps,
        "skipped": engine.skipped_steps,
        "lr": engine.get_lr(),
    }


def _kept(engine, own: dict) -> dict:
    return {
        "moments_kept": all(torch.equal(x, y) for x, y in zip(_moments(engine), own["moments"])),
        "step": (engine.adamw.step_count, own["step"]),
        "global": (engine.global_steps, own["global"]),
        "skipped": (engine.skipped_steps, own["skipped"]),
        "lr": (engine.get_lr(), own["lr"]),
    }


def _after_one_step(group, stage: int, rank: int):
    engine = _engine(group, stage, seed=1)
    _bn_train(engine, rank, range(7, 8))
    engine.optimizer.param_groups[0]["lr"] = 2e-3
    return engine


def ds_load_options(rank: int, world: int, stage: int, save_dir: str) -> dict:
    group = dp_groups(rank, world, [world])[world]
    a = _engine(group, stage, seed=0)
    _bn_train(a, rank, range(3))
    a.optimizer.param_groups[0]["lr"] = 5e-3
    a.scaler.skipped_steps = 2  # as if two of its fp16 steps had overflowed: DeepSpeed's counter, saved with it
    a.save_checkpoint(save_dir, tag="full")
    a.save_checkpoint(save_dir, tag="nofrozen", save_latest=False, exclude_frozen_parameters=True)
    saved_master = full_parameters(a)
    with a.gathered_params():
        saved_state = _bn_state(a.module)
    saved_state = _rank0(saved_state, group)
    with open(f"{save_dir}/latest") as f:
        out: dict = {"latest": f.read()}  # save_latest=False left it at "full"

    for key, kwargs in (
        ("no_optimizer", {"load_optimizer_states": False, "load_lr_scheduler_states": False}),
        ("module_only", {"load_module_only": True}),
    ):
        b = _after_one_step(group, stage, rank)
        own = _own_state(b)
        path, client = b.load_checkpoint(save_dir, **kwargs)
        with b.gathered_params():
            state = _bn_state(b.module)
        out[key] = {
            "master": _diff(full_parameters(b), saved_master),
            "module": _diff(state, saved_state),
            "path": path.rsplit("/", 1)[-1],
            "client": client,
            **_kept(b, own),
        }

    d = _after_one_step(group, stage, rank)
    with d.gathered_params():
        frozen_before = {k: v for k, v in _bn_state(d.module).items() if k.startswith("frozen.")}
    try:
        d.load_checkpoint(save_dir, tag="nofrozen")
        out["strict_error"] = None
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        out["strict_error"] = f"{type(e).__name__}: {e}"
    d.load_checkpoint(save_dir, tag="nofrozen", load_module_strict=False)
    with d.gathered_params():
        state = _bn_state(d.module)
    out["not_strict"] = {
        "master": _diff(full_parameters(d), saved_master),
        "frozen_kept": _diff({k: state[k] for k in frozen_before}, frozen_before),
        "buffers": _diff(
            {k: state[k] for k in state if k.startswith("bn.")},
            {k: saved_state[k] for k in state if k.startswith("bn.")},
        ),
        "step": d.adamw.step_count,
        "lr": d.get_lr(),
    }
    return out


def _rank0(state: dict, group) -> dict:
    """DP rank 0's module state (BatchNorm statistics evolve per rank; the checkpoint holds rank 0's)."""
    box = [state]
    torch.distributed.broadcast_object_list(box, src=torch.distributed.get_global_rank(group.pg, 0), group=group.pg)
    return box[0]
