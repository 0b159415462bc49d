"""``zerobench.zero.initialize`` driven as DeepSpeed's ``deepspeed.initialize`` is: a DeepSpeed config, the
model's parameters as the optimizer's group, a dataset turned into this rank's loader of micro-batches, an LR
scheduler built on the engine's optimizer, and DeepSpeed's loop (``engine(x)``, ``engine.backward``,
``engine.step``), against single-process ``torch.optim.AdamW`` over the same global batches (stages 0-3,
fp32, world 2); and ``python train.py`` with no launcher (a world of one)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.helpers.dist import run_distributed

pytestmark = pytest.mark.dist

MICRO, ACCUM, WORLD, SAMPLES = 2, 2, 2, 32
LR, WD, CLIP = 1e-2, 0.01, 0.5


SCHEDULER = {"type": "WarmupDecayLR", "params": {"total_num_steps": 6, "warmup_min_lr": 1e-3, "warmup_max_lr": LR,
                                                  "warmup_num_steps": 2, "warmup_type": "linear"}}


def _config(stage: int, scheduler: bool = False) -> dict:
    return {"train_batch_size": MICRO * ACCUM * WORLD, "train_micro_batch_size_per_gpu": MICRO,
            "gradient_clipping": CLIP, "steps_per_print": 100,
            "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.99], "weight_decay": WD}},
            "zero_optimization": {"stage": stage, "contiguous_gradients": True},
            **({"scheduler": SCHEDULER} if scheduler else {})}


def _data():
    import torch
    from torch.utils.data import TensorDataset

    g = torch.Generator().manual_seed(3)
    return TensorDataset(torch.randn(SAMPLES, 4, generator=g), torch.randn(SAMPLES, 1, generator=g))


def _model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))


def _schedule(opt):
    import torch

    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))


def _config_schedule(opt):
    """The config's ``SCHEDULER`` on a plain optimizer (zerobench's class, tested against DeepSpeed's own)."""
    from zerobench.zero.ds_scheduler import DEEPSPEED

    return DEEPSPEED[SCHEDULER["type"]](opt, **SCHEDULER["params"])


def _deepspeed_loop(rank: int, world: int, stage: int, mesh: bool = False, from_config: bool = False):
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    from zerobench.zero import initialize

    model = _model()
    group = init_device_mesh("cpu", (world,)) if mesh else None
    engine, optimizer, loader, scheduler = initialize(model, config=_config(stage, from_config),
                                                      model_parameters=model.parameters(), training_data=_data(),
                                                      lr_scheduler=None if from_config else _schedule, dp_group=group)
    assert optimizer is engine.optimizer and scheduler.optimizer is optimizer and engine.lr_scheduler is scheduler
    for x, y in loader:
        loss = F.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
    with engine.gathered_params():
        params = [p.detach().tolist() for p in model.parameters()]  # plain data across the process boundary
    return params, engine.global_steps, engine.get_lr(), len(loader)


def _reference(schedule=_schedule):
    """The same steps in one process: each step's global batch is every rank's micro-batches of the window."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DistributedSampler

    data, model = _data(), _model()
    order = [list(DistributedSampler(data, num_replicas=WORLD, rank=r)) for r in range(WORLD)]
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.99), weight_decay=WD)
    sched = schedule(opt)
    per_step = MICRO * ACCUM
    for k in range(len(order[0]) // per_step):
        idx = [i for r in range(WORLD) for i in order[r][k * per_step:(k + 1) * per_step]]
        x, y = data[idx]
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
    return [p.detach() for p in model.parameters()], k + 1, sched.get_last_lr()


@pytest.mark.parametrize("stage, mesh, from_config", [(0, False, False), (1, False, False), (2, False, False),
                                                       (3, False, False), (3, True, False), (1, False, True),
                                                       (3, False, True)])
def test_deepspeeds_loop_from_a_deepspeed_config_matches_one_process(stage, mesh, from_config):
    """``mesh``: the DP group given as a 1-D DeviceMesh, as apply_zero takes it. ``from_config``: the scheduler is
    the config's ``scheduler`` section (DeepSpeed's WarmupDecayLR) instead of the caller's callable."""
    ref, steps, lr = _reference(_config_schedule if from_config else _schedule)
    for params, got_steps, got_lr, batches in run_distributed(_deepspeed_loop, WORLD, stage, mesh, from_config,
                                                              timeout=180):
        assert batches == SAMPLES // WORLD // MICRO and got_steps == steps == 4
        assert got_lr == pytest.approx(lr)  # the scheduler was stepped once per optimizer step
        assert max((torch.tensor(p) - q).abs().max().item() for p, q in zip(params, ref)) < 1e-5


SCRIPT = """
import torch, torch.distributed as dist
from zerobench.zero import initialize
model = torch.nn.Linear(4, 1)
engine, opt, _, _ = initialize(model, config={"train_batch_size": 2, "optimizer": {"type": "AdamW"},
                                              "zero_optimization": {"stage": 2}})
engine.backward(engine(torch.ones(2, 4)).sum())
engine.step()
print(dist.get_world_size(), engine.global_steps, engine.zero_optimization_stage())
"""


def test_a_plain_python_process_is_a_world_of_one():
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") and not k.startswith("SLURM")}
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["1", "1", "2"]


@pytest.mark.parametrize("kwargs, words", [
    ({"optimizer": "client"}, "a client optimizer is not taken"),
    ({"lr_scheduler": "built"}, "lr_scheduler must be a callable fn(optimizer)"),
    ({"config": None}, "give config="),
])
def test_what_initialize_does_not_take_is_one_line(kwargs, words):
    from zerobench.config import ConfigError
    from zerobench.zero import initialize

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    given = {"config": _config(2)}
    given.update({k: {"client": opt, "built": torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)}.get(v, v)
                  for k, v in kwargs.items()})
    with pytest.raises(ConfigError) as e:
        initialize(model, **given)
    assert words in str(e.value) and "\n" not in str(e.value)


def _resume(rank: int, world: int, stage: int, root: str):
    """Two steps, a checkpoint, two more; then fresh engines loading that checkpoint as DeepSpeed's callers do."""
    import warnings

    import torch.nn.functional as F

    from zerobench.zero import initialize

    def engine(scheduler: bool = True):
        model = _model()
        eng, _, loader, sched = initialize(model, config=_config(stage, scheduler), training_data=_data())
        return eng, list(loader), sched

    def train(eng, batches):
        for x, y in batches:
            eng.backward(F.mse_loss(eng(x), y))
            eng.step()
        with eng.gathered_params():
            return [p.detach().clone() for p in eng.module.parameters()], eng.get_lr()

    first, batches, sched = engine()
    train(first, batches[:2 * ACCUM])
    first.save_checkpoint(root, tag="two")
    at_save = sched.state_dict()
    whole, whole_lr = train(first, batches[2 * ACCUM:])
    resumed, _, sched = engine()
    resumed.load_checkpoint(root)
    loaded = sched.state_dict()
    params, lr = train(resumed, batches[2 * ACCUM:])
    kept, _, sched = engine()
    kept.load_checkpoint(root, load_lr_scheduler_states=False)
    no_state = sched.state_dict()
    plain, _, _ = engine(scheduler=False)
    plain.save_checkpoint(f"{root}-plain")
    late, _, _ = engine()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        late.load_checkpoint(f"{root}-plain")
    diff = max((a - b).abs().max().item() for a, b in zip(params, whole))
    return {"at_save": at_save, "loaded": loaded, "no_state": no_state, "lr": lr, "whole_lr": whole_lr,
            "diff": diff, "warned": [str(w.message) for w in caught]}


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_a_checkpoint_carries_the_schedulers_state(stage, tmp_path):
    """As DeepSpeed's: ``save_checkpoint`` saves ``engine.lr_scheduler``'s state, ``load_checkpoint`` restores it
    (not with ``load_lr_scheduler_states=False``), and training resumed from it is the uninterrupted run's."""
    for r in run_distributed(_resume, WORLD, stage, str(tmp_path / "ckpt"), timeout=180):
        assert r["at_save"] == r["loaded"] == {"last_batch_iteration": 1}
        assert r["no_state"] == {"last_batch_iteration": -1}
        assert r["lr"] == r["whole_lr"] and r["lr"] != [SCHEDULER["params"]["warmup_min_lr"]]
        assert r["diff"] < 1e-6
        assert any("holds no learning-rate scheduler state" in w for w in r["warned"]), r["warned"]
