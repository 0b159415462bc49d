"""``zerobench.zero.initialize`` driven as DeepSpeed's ``deepspeed.initialize`` is: a DeepSpeed config, the
model's parameters as the optimizer's group, a dataset turned into this rank's loader of micro-batches, an LR
scheduler built on the engine's optimizer, and DeepSpeed's loop (``engine(x)``, ``engine.backward``,
``engine.step``), against single-process ``torch.optim.AdamW`` over the same global batches (stages 0-3,
fp32, world 2); and ``python train.py`` with no launcher (a world of one)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.dist import run_distributed
from tests.helpers.plain_python import run_plain_python
from tests.helpers.tiers import tiered

pytestmark = pytest.mark.dist

MICRO, ACCUM, WORLD, SAMPLES = 2, 2, 2, 32
LR, WD, CLIP = 1e-2, 0.01, 0.5


SCHEDULER = {
    "type": "WarmupDecayLR",
    "params": {
        "total_num_steps": 6,
        "warmup_min_lr": 1e-3,
        "warmup_max_lr": LR,
        "warmup_num_steps": 2,
        "warmup_type": "linear",
    },
}


def _config(stage: int, scheduler: bool = False) -> dict:
    return {
        "train_batch_size": MICRO * ACCUM * WORLD,
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_clipping": CLIP,
        "steps_per_print": 100,
        "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.99], "weight_decay": WD}},
        "zero_optimization": {"stage": stage, "contiguous_gradients": True},
        **({"scheduler": SCHEDULER} if scheduler else {}),
    }


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
    from zerobench.zero.compat.deepspeed.lr_schedules import DEEPSPEED

    return DEEPSPEED[SCHEDULER["type"]](opt, **SCHEDULER["params"])


def _client_adamw(params):
    return torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.99), weight_decay=WD)


def _deepspeed_loop(rank: int, world: int, stage: int, mesh: bool = False, source: str = "callable"):
    """``source`` of the optimizer and scheduler: ``callable`` (the config's optimizer, ``lr_scheduler=fn``),
    ``config`` (the config's optimizer and scheduler), ``client`` (a built AdamW and a scheduler built on it, as
    Hugging Face Accelerate hands them; no optimizer section), ``client_fn`` (``optimizer=fn(params)``)."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    from zerobench.zero import initialize

    model = _model()
    group = init_device_mesh("cpu", (world,)) if mesh else None
    config, client, sched = _config(stage, source == "config"), None, None if source == "config" else _schedule
    if source.startswith("client"):
        del config["optimizer"]
        client = _client_adamw(model.parameters()) if source == "client" else _client_adamw
        sched = _schedule(client) if source == "client" else _schedule
    engine, optimizer, loader, scheduler = initialize(
        model,
        config=config,
        model_parameters=model.parameters(),
        optimizer=client,
        training_data=_data(),
        lr_scheduler=sched,
        dp_group=group,
    )
    assert optimizer is engine.optimizer and scheduler.optimizer is optimizer and engine.lr_scheduler is scheduler
    # DeepSpeed's loader keeps its sampler as data_sampler: scripts reshuffle with loader.data_sampler.set_epoch(e)
    assert loader.data_sampler is loader.sampler and hasattr(loader.data_sampler, "set_epoch")
    returned = []
    for x, y in loader:
        loss = F.mse_loss(engine(x), y)
        returned.append((engine.backward(loss) / loss).item())
        engine.step()
    with engine.gathered_params():
        params = [p.detach().tolist() for p in model.parameters()]  # plain data across the process boundary
    return params, engine.global_steps, engine.get_lr(), len(loader), returned


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
        idx = [i for r in range(WORLD) for i in order[r][k * per_step : (k + 1) * per_step]]
        x, y = data[idx]
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        sched.step()
    return [p.detach() for p in model.parameters()], k + 1, sched.get_last_lr()


SLOW = pytest.mark.slow  # the same wiring at more stages: the full tier


@pytest.mark.parametrize(
    "stage, mesh, source",
    [
        (0, False, "callable"),
        pytest.param(1, False, "callable", marks=SLOW),
        pytest.param(2, False, "callable", marks=SLOW),
        (3, False, "callable"),
        (3, True, "callable"),
        pytest.param(1, False, "config", marks=SLOW),
        (3, False, "config"),
        pytest.param(0, False, "client", marks=SLOW),
        (3, False, "client"),
        pytest.param(2, False, "client_fn", marks=SLOW),
    ],
)
def test_deepspeeds_loop_from_a_deepspeed_config_matches_one_process(stage, mesh, source):
    """``mesh``: the DP group given as a 1-D DeviceMesh, as apply_zero takes it. ``source``: where the optimizer
    and the scheduler come from (``_deepspeed_loop``); the config's is DeepSpeed's WarmupDecayLR."""
    ref, steps, lr = _reference(_config_schedule if source == "config" else _schedule)
    for params, got_steps, got_lr, batches, returned in run_distributed(
        _deepspeed_loop, WORLD, stage, mesh, source, timeout=180
    ):
        assert batches == SAMPLES // WORLD // MICRO and got_steps == steps == 4
        assert returned == pytest.approx([1 / ACCUM] * batches)  # backward() returns loss / gas, as DeepSpeed's
        assert got_lr == pytest.approx(lr)  # the scheduler was stepped once per optimizer step
        assert max((torch.tensor(p) - q).abs().max().item() for p, q in zip(params, ref)) < 1e-5


SCRIPT = """
import argparse, json, sys, torch, torch.distributed as dist
from zerobench.zero import initialize
model = torch.nn.Linear(4, 1)
config = {"train_batch_size": 2, "optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 2}}
if sys.argv[1] == "zerobench":  # zerobench's order
    engine, opt, _, _ = initialize(model, config)
elif sys.argv[1] == "args":  # DeepSpeed's tutorials: deepspeed.add_config_arguments(parser) -> args.deepspeed_config
    open(sys.argv[2], "w").write(json.dumps(config))
    args = argparse.Namespace(deepspeed=True, deepspeed_config=sys.argv[2], local_rank=-1)
    engine, opt, _, _ = initialize(args=args, model=model, model_parameters=model.parameters())
else:  # deepspeed.initialize's positional order: args, model, optimizer, model_parameters
    engine, opt, _, _ = initialize(None, model, None, model.parameters(), config=config)
loss = engine(torch.ones(2, 4)).sum()
assert torch.equal(engine.backward(loss), loss)  # DeepSpeed's: loss / gradient_accumulation_steps() (1 here)
engine.step()
print(dist.get_world_size(), engine.global_steps, engine.zero_optimization_stage())
print(engine.train_micro_batch_size_per_gpu(), engine.train_batch_size(), engine.skipped_steps, engine.get_mom())
from zerobench.zero import ZeroConfig, apply_zero, as_deepspeed
try:
    as_deepspeed(apply_zero(torch.nn.Linear(2, 2), None, ZeroConfig(stage=1))).train_batch_size()
except Exception as e:
    print(type(e).__name__, "|", e)
"""


WEIGHT_DECAY_SCRIPT = """
import sys, torch
from torch import nn
import zerobench.zero as Z
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(3, 2), nn.LayerNorm(2))
model[1].bias.data.fill_(0.25)
model[1].bias.requires_grad_(False)
before = [p.detach().clone() for p in model.parameters()]
config = {"train_batch_size": 1, "gradient_clipping": 0.0, "zero_optimization": {"stage": int(sys.argv[1])},
          "optimizer": {"type": "AdamW", "params": {"lr": 1.0, "weight_decay": 0.5}}}
engine, *_ = Z.initialize(model=model, config=config)
engine.backward((engine(torch.zeros(1, 3)) * 0).sum())  # zero gradients: the step is the weight decay alone
engine.step()
with engine.gathered_params():
    print([round((p / b).mean().item(), 6) for p, b in zip(model.parameters(), before)])
"""


@pytest.mark.parametrize("stage", [0, pytest.param(3, marks=SLOW)])
def test_without_model_parameters_the_configs_weight_decay_reaches_every_parameter(stage):
    """DeepSpeed's engine takes ``module.parameters()`` where ``model_parameters`` is not given, so the config's
    weight decay reaches biases and norms too (before, zerobench's own default left out every parameter of fewer
    than 2 dimensions). With zero gradients, lr 1 and weight decay 0.5, AdamW halves each trained parameter; the
    frozen one stays."""
    r = run_plain_python("-c", WEIGHT_DECAY_SCRIPT, str(stage))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[-2] == "[0.5, 0.5, 0.5, 1.0]"  # Linear weight, bias; LayerNorm weight; frozen bias


@pytest.mark.parametrize(
    "call", ["zerobench", pytest.param("args", marks=SLOW), pytest.param("deepspeed_positional", marks=SLOW)]
)
def test_a_plain_python_process_is_a_world_of_one(call, tmp_path):
    """And each way of calling it: zerobench's ``initialize(model, config)``, DeepSpeed's ``args.deepspeed_config``
    and DeepSpeed's positional order."""
    r = run_plain_python("-c", SCRIPT, call, str(tmp_path / "ds.json"))
    assert r.returncode == 0, r.stderr[-2000:]
    counters, batch, error = r.stdout.splitlines()
    assert counters.split() == ["1", "1", "2"]
    assert batch == "2 2 0 [(0.9, 0.999)]"  # DeepSpeed's batch queries, skipped steps and betas
    assert error == (
        "ConfigError | train_micro_batch_size_per_gpu(): this engine was given no batch size (initialize() reads it "
        "from the config; as_deepspeed(engine, micro_batch=N) takes it)"
    )


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"optimizer": "sgd"}, "a client SGD cannot be taken: the ZeRO engine's update is AdamW's"),
        ({"optimizer": "adam_l2"}, "adds weight_decay 0.1 to the gradient (L2)"),
        ({"optimizer": "stepped"}, "the client optimizer has already stepped"),
        ({"optimizer": "differentiable"}, "param_groups[0] sets differentiable=True, which the ZeRO engine's AdamW"),
        ({"optimizer": "sgd_fn"}, "a client SGD cannot be taken"),
        ({"optimizer": 3}, "optimizer= must be a torch.optim.AdamW or a callable"),
        ({"lr_scheduler": "built"}, "lr_scheduler must be a callable fn(optimizer) -> scheduler, or one built on the"),
        ({"optimizer": "adamw", "lr_scheduler": "built"}, "or one built on the optimizer passed as optimizer="),
        ({"config": None}, "give config="),
        ({"mpu": object()}, "mpu= (object) has no get_model_parallel_group()"),
        ({"mesh_param": (2, 1)}, "mesh_param= (DeepSpeed's device-mesh shape) is not taken"),
        ({"args": "ds_args"}, "came both in args.deepspeed_config and as config="),
        ({"dist_init_required": False}, "dist_init_required=False but no process group exists"),
    ],
)
def test_what_initialize_does_not_take_is_one_line(kwargs, words):
    """Each is refused before any process group is touched."""
    from zerobench.config import ConfigError
    from zerobench.zero import initialize

    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stepped = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    stepped.step()
    model.zero_grad()
    clients = {
        "sgd": opt,
        "adam_l2": torch.optim.Adam(model.parameters(), weight_decay=0.1),
        "stepped": stepped,
        "sgd_fn": lambda ps: torch.optim.SGD(ps, lr=0.1),
        "adamw": torch.optim.AdamW(model.parameters()),
        "differentiable": torch.optim.AdamW(model.parameters(), differentiable=True),
        "built": torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
    }
    clients["ds_args"] = __import__("argparse").Namespace(deepspeed_config="ds.json")
    given = {"config": _config(2)}
    given.update({k: clients.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()})
    with pytest.raises(ConfigError) as e:
        initialize(model=model, **given)
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("case", ["no_model", "untested_optimizer", "scheduler_on_another_optimizer"])
def test_where_deepspeed_asserts_initialize_raises_an_assertion_error(case):
    """DeepSpeed's tests expect an ``AssertionError`` for ``initialize(model=None)`` (``TestNoModel``), a client
    optimizer ZeRO has not tested (``TestZeroAllowUntestedOptimizer``) and a client scheduler built on another
    optimizer beside the config's (``TestClientLrScheduler``); each was a plain ``ConfigError`` here. Still one
    line, and still a ``ConfigError``."""
    from zerobench.config import ConfigError
    from zerobench.zero import initialize

    model = _model()
    config = {"train_batch_size": 1, "optimizer": {"type": "Adam"}, "zero_optimization": {"stage": 2}}
    other = torch.optim.Adam(_model().parameters())
    given = {
        "no_model": dict(model=None),
        "untested_optimizer": dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)),
        "scheduler_on_another_optimizer": dict(
            model=model, lr_scheduler=torch.optim.lr_scheduler.LambdaLR(other, lambda s: 1.0)
        ),
    }[case]
    with pytest.raises(AssertionError) as e:
        initialize(config={**config, "zero_allow_untested_optimizer": False}, **given)
    assert isinstance(e.value, ConfigError) and "\n" not in str(e.value), str(e.value)
    if case == "untested_optimizer":
        assert "zero_allow_untested_optimizer does not change that" in str(e.value)


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
    train(first, batches[: 2 * ACCUM])
    first.save_checkpoint(root, tag="two")
    at_save = sched.state_dict()
    whole, whole_lr = train(first, batches[2 * ACCUM :])
    resumed, _, sched = engine()
    resumed.load_checkpoint(root)
    loaded = sched.state_dict()
    params, lr = train(resumed, batches[2 * ACCUM :])
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
    return {
        "at_save": at_save,
        "loaded": loaded,
        "no_state": no_state,
        "lr": lr,
        "whole_lr": whole_lr,
        "diff": diff,
        "warned": [str(w.message) for w in caught],
    }


@pytest.mark.parametrize("stage", tiered((0, 2, 3), fast=(3,)))
def test_a_checkpoint_carries_the_schedulers_state(stage, tmp_path):
    """As DeepSpeed's: ``save_checkpoint`` saves ``engine.lr_scheduler``'s state, ``load_checkpoint`` restores it
    (not with ``load_lr_scheduler_states=False``), and training resumed from it is the uninterrupted run's."""
    for r in run_distributed(_resume, WORLD, stage, str(tmp_path / "ckpt"), timeout=180):
        assert r["at_save"] == r["loaded"] == {"last_batch_iteration": 1}
        assert r["no_state"] == {"last_batch_iteration": -1}
        assert r["lr"] == r["whole_lr"] and r["lr"] != [SCHEDULER["params"]["warmup_min_lr"]]
        assert r["diff"] < 1e-6
        assert any("holds no learning-rate scheduler state" in w for w in r["warned"]), r["warned"]


TIMEOUT_SCRIPT = """
import torch, torch.distributed as dist
from zerobench.zero import initialize
initialize(torch.nn.Linear(4, 1), {"train_batch_size": 1, "optimizer": {"type": "AdamW"}})
backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
print(backend.options._timeout.total_seconds())
"""


@pytest.mark.parametrize("launched", tiered((False, True), fast=(True,)))
@pytest.mark.parametrize("minutes", tiered((None, "2"), fast=("2",)))
def test_the_group_initialize_creates_has_deepspeeds_timeout(launched, minutes):
    """The process group ``initialize`` created had a 5-minute collective timeout, whatever the user set: a rank 0
    evaluating or saving for longer killed the job. It is now DeepSpeed's: 30 minutes, or DEEPSPEED_TIMEOUT."""
    import os
    import socket
    import subprocess
    import sys

    from tests.helpers.plain_python import LAUNCHER_VARS

    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("SLURM")}
    if launched:  # torchrun's variables, a world of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if minutes is not None:
        env["DEEPSPEED_TIMEOUT"] = minutes
    r = subprocess.run([sys.executable, "-c", TIMEOUT_SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert float(r.stdout.split()[-1]) == 60 * float(minutes or 30)


def _initialize_twice(rank: int, world: int, stage: int, destroy_first: bool):
    """DeepSpeed's tests build a second engine on the same model (``test_load_immediate_save``): train two steps,
    ``initialize`` again, train on. Returns what the second engine started from against what the first left, the
    warnings, what the first engine says when used, and whether the second trains."""
    import warnings

    import torch.nn.functional as F

    from zerobench.zero import initialize

    model = _model()
    config = _config(stage)
    config["train_batch_size"] = MICRO * WORLD  # no accumulation: every step() steps
    first, *_ = initialize(model, config=config, model_parameters=model.parameters())
    x, y = _data()[: MICRO * WORLD]
    mine = slice(rank * MICRO, (rank + 1) * MICRO)
    for _ in range(2):
        first.backward(F.mse_loss(first(x[mine]), y[mine]))
        first.step()
    with first.gathered_params():
        left = [p.detach().clone() for p in model.parameters()]
    if destroy_first:
        first.destroy()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second, *_ = initialize(model, config=config, model_parameters=model.parameters())
    with second.gathered_params():
        start = max((p.detach() - v).abs().max().item() for p, v in zip(model.parameters(), left))
    try:
        first.step()
        first_says = None
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        first_says = f"{type(e).__name__}: {e}"
    second.backward(F.mse_loss(second(x[mine]), y[mine]))
    second.step()
    with second.gathered_params():
        moved = max((p.detach() - v).abs().max().item() for p, v in zip(model.parameters(), left))
    return start, [str(w.message) for w in caught if "earlier engine" in str(w.message)], first_says, moved


@pytest.mark.parametrize("stage", tiered((0, 2, 3), fast=(3,)))
def test_a_second_initialize_on_one_model_takes_it_over(stage):
    """As DeepSpeed's second ``initialize`` on a model: the new engine starts from the values the first left (which
    is destroyed, saying so in a warning, none after an explicit ``destroy()``) and trains on. Before, it was
    refused ("already trained by a ZeRO engine")."""
    for destroy_first in (False, True):
        for start, warned, first_says, moved in run_distributed(_initialize_twice, WORLD, stage, destroy_first):
            assert start == 0.0 and moved > 1e-4, (start, moved)
            assert len(warned) == (0 if destroy_first else 1), warned
            assert first_says is not None and "destroy" in first_says and "\n" not in first_says, first_says


def _refused_takeovers(rank: int, world: int) -> dict:
    """A second ``initialize`` refused before the takeover (bad units) leaves the earlier engine training; one
    refused after it (a scheduler callable that raises on rank 1 only) leaves the model plain, with its values, on
    every rank (no engine left hooked to it); ``initialize`` and ``apply_zero`` on a part of a trained model are
    refused in one line."""
    import torch.nn.functional as F

    from zerobench.zero import ZeroConfig, apply_zero, engine_of, initialize

    model = _model()
    config = _config(3)
    config["train_batch_size"] = MICRO * WORLD
    first, *_ = initialize(model, config=config, model_parameters=model.parameters())
    x, y = _data()[: MICRO * WORLD]
    first.backward(F.mse_loss(first(x[:MICRO]), y[:MICRO]))
    first.step()
    out = {}
    try:
        initialize(model, config=config, model_parameters=model.parameters(), units=["no_such_layer"])
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        out["units"] = f"{type(e).__name__}: {e}"
    out["first_alive"] = engine_of(model) is first and not first.destroyed
    for name, call in (
        ("part_initialize", lambda: initialize(model[0], config=config)),
        ("part_apply", lambda: apply_zero(model[0], None, ZeroConfig(stage=3))),
    ):
        try:
            call()
        except Exception as e:  # noqa: BLE001 - the message is what is checked
            out[name] = f"{type(e).__name__}: {e}"
    with first.gathered_params():
        left = [p.detach().clone() for p in model.parameters()]

    def scheduler(opt):
        if rank == 1:
            raise RuntimeError("a scheduler that fails")
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)

    try:
        initialize(model, config=config, model_parameters=model.parameters(), lr_scheduler=scheduler)
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        out["scheduler"] = f"{type(e).__name__}: {e}"
    out["plain"] = engine_of(model) is None and all(engine_of(p) is None for p in model.parameters())
    out["values"] = max((p.detach() - v).abs().max().item() for p, v in zip(model.parameters(), left))
    return out


def test_a_refused_second_initialize_leaves_the_model_whole():
    r0, r1 = run_distributed(_refused_takeovers, WORLD)
    for r in (r0, r1):
        assert r["units"].startswith("ConfigError: ") and r["first_alive"], r
        for part in ("part_initialize", "part_apply"):
            assert r[part].startswith("ConfigError: ") and "destroy" in r[part] and "\n" not in r[part], r
        assert r["plain"] and r["values"] == 0.0, r
    assert r1["scheduler"] == "RuntimeError: a scheduler that fails", r1
    assert r0["scheduler"].startswith("ConfigError: initialize failed on another rank"), r0
