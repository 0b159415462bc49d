"""A refused load changes nothing, on any rank: every file is read and checked, and the ranks agree, before the
engine, the model or the scheduler is touched (``zerobench/zero/state/shards.py:load_shard_state_dicts``).

Before, DeepSpeed's ``load_checkpoint`` into a model with one more buffer raised only after the fp32 master, the
step counts and the learning rate were the checkpoint's (the scheduler still this engine's), so a "resume, or else
start fresh" script trained on a mixture; and a rank whose shards did not cover its partition raised alone, after
the other rank had loaded."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.dist import run_distributed
from tests.helpers.ds_checkpoint import ADAM, BNNet, _bn_train

pytestmark = pytest.mark.dist


class WiderNet(BNNet):
    """BNNet with one more buffer: a checkpoint of BNNet lacks it."""

    def __init__(self):
        super().__init__()
        self.register_buffer("extra", torch.zeros(3))


def _state(engine) -> dict:
    from zerobench.zero.state.shards import full_parameters

    with engine.gathered_params(writeback=False):
        module = {k: v.clone() for k, v in engine.module.state_dict().items()}
    return {
        "master": {k: v.clone() for k, v in full_parameters(engine).items()},
        "module": module,
        "step": engine.adamw.step_count,
        "global_steps": engine.global_steps,
        "lr": [g["lr"] for g in engine.optimizer.param_groups],
        "sched": engine.lr_scheduler.state_dict()["last_epoch"],
    }


def _same(a: dict, b: dict) -> bool:
    tensors = all(torch.equal(a[k][n], b[k][n]) for k in ("master", "module") for n in a[k])
    return tensors and all(a[k] == b[k] for k in ("step", "global_steps", "lr", "sched"))


def _engine(model: nn.Module, stage: int):
    from tests.helpers.ds import ds_apply_zero
    from zerobench.zero import ZeroConfig

    torch.manual_seed(7)
    engine = ds_apply_zero(model, None, ZeroConfig(stage=stage, bucket_numel=64, optimizer=ADAM))
    sched = torch.optim.lr_scheduler.LambdaLR(engine.optimizer, lambda s: 1.0 / (1 + s))
    engine.lr_scheduler = sched
    return engine


def _worker(rank: int, world: int, stage: int, root: str) -> dict:
    from zerobench.zero.state.shards import load_shard_state_dicts, shard_state_dict

    torch.manual_seed(0)
    saved = _engine(BNNet(), stage)
    _bn_train(saved, rank, range(3))
    saved.lr_scheduler.step()
    saved.save_checkpoint(root, tag="t")
    out = {}
    # a model with one more buffer: refused under strict loading, after every check, before any change
    wider = _engine(WiderNet(), stage)
    _bn_train(wider, rank, range(1))
    before = _state(wider)
    try:
        wider.load_checkpoint(root, tag="t")
        out["strict"] = "loaded"
    except ValueError as e:
        out["strict"] = str(e)
    out["strict_unchanged"] = _same(before, _state(wider))
    # the same engine loads it once the extra buffer may be skipped
    wider.load_checkpoint(root, tag="t", load_module_strict=False)
    out["then_loaded"] = wider.adamw.step_count == saved.adamw.step_count
    # rank 1's shards leave its partition short, rank 0's are whole: both refuse, neither changes
    fresh = _engine(BNNet(), stage)
    _bn_train(fresh, rank, range(1))
    shard = shard_state_dict(saved)
    before = _state(fresh)
    try:
        load_shard_state_dicts(fresh, [] if rank == 1 else [shard])
        out["short"] = "loaded"
    except ValueError as e:
        out["short"] = str(e)
    out["short_unchanged"] = _same(before, _state(fresh))
    return out


@pytest.mark.parametrize("stage", [0, 3])
def test_a_refused_load_changes_nothing_on_any_rank(stage, tmp_path):
    for rank, r in enumerate(run_distributed(_worker, 2, stage, str(tmp_path), timeout=180)):
        assert "load it with load_module_strict=False" in r["strict"], r
        assert r["strict_unchanged"], r
        assert r["then_loaded"], r
        expected = "covers" if rank == 1 else "another rank refused"
        assert expected in r["short"], r
        assert r["short_unchanged"], r
