"""DeepSpeed's learning-rate schedules (``zero/compat/deepspeed/lr_schedules.py``, ``zero/compat/deepspeed/lr_schedules.py``) step by step against
DeepSpeed's own classes on two param groups: every learning rate (and OneCycle's betas) over the schedule, from
the one the constructor writes to past the end; state saved at one batch and loaded into a fresh schedule; and
bad arguments as one line. No processes."""

from __future__ import annotations

import math

import pytest
import torch

from zerobench.config import ConfigError
from zerobench.zero.compat.deepspeed.lr_schedules import DEEPSPEED

CASES = [
    ("WarmupLR", {}),
    ("WarmupLR", {"warmup_min_lr": 1e-5, "warmup_max_lr": 3e-3, "warmup_num_steps": 7, "warmup_type": "linear"}),
    ("WarmupLR", {"warmup_min_lr": [0.0, 1e-4], "warmup_max_lr": [1e-3, 2e-3], "warmup_num_steps": 5}),
    ("WarmupLR", {"warmup_num_steps": 1}),
    ("WarmupDecayLR", {"total_num_steps": 30, "warmup_num_steps": 6}),
    ("WarmupDecayLR", {"total_num_steps": 20, "warmup_min_lr": 1e-4, "warmup_num_steps": 5, "warmup_type": "linear"}),
    ("WarmupDecayLR", {"total_num_steps": 4, "warmup_num_steps": 10}),
    ("WarmupCosineLR", {"total_num_steps": 25, "warmup_num_steps": 5}),
    (
        "WarmupCosineLR",
        {
            "total_num_steps": 25,
            "warmup_num_steps": 5,
            "warmup_min_ratio": 0.1,
            "cos_min_ratio": 0.05,
            "warmup_type": "linear",
        },
    ),
    ("WarmupCosineLR", {"total_num_steps": 3, "warmup_num_steps": 8}),
    ("LRRangeTest", {}),
    (
        "LRRangeTest",
        {
            "lr_range_test_min_lr": [1e-4, 2e-4],
            "lr_range_test_step_size": 3,
            "lr_range_test_step_rate": 2.5,
            "lr_range_test_staircase": True,
        },
    ),
    ("OneCycle", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-2, "cycle_first_step_size": 6}),
    (
        "OneCycle",
        {
            "cycle_min_lr": 1e-4,
            "cycle_max_lr": 1e-2,
            "cycle_first_step_size": 5,
            "cycle_second_step_size": 3,
            "cycle_first_stair_count": 2,
            "cycle_second_stair_count": 3,
            "decay_step_size": 2,
            "decay_lr_rate": 0.5,
            # small enough that beta1 stays below 1 over the trace (a larger rate is refused: the test below)
            "decay_mom_rate": 0.003,
            "cycle_min_mom": 0.85,
            "cycle_max_mom": 0.95,
        },
    ),
    (
        "OneCycle",
        {
            "cycle_min_lr": [1e-4, 1e-3],
            "cycle_max_lr": [1e-2, 2e-2],
            "cycle_first_step_size": 4,
            "cycle_momentum": False,
            "decay_step_size": 3,
            "decay_lr_rate": 0.2,
        },
    ),
]
STEPS = 40


def _optimizer():
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
    return torch.optim.AdamW([{"params": [a]}, {"params": [b], "lr": 5e-3}], lr=1e-3, betas=(0.9, 0.999))


def _trace(schedule, steps: int = STEPS) -> list:
    """The (lr, betas) of every group as the constructor left them, then after each ``step()``."""
    opt = schedule.optimizer
    out = [[(g["lr"], tuple(g["betas"])) for g in opt.param_groups]]
    for _ in range(steps):
        schedule.step()
        out.append([(g["lr"], tuple(g["betas"])) for g in opt.param_groups])
    return out


@pytest.fixture(scope="module")
def deepspeed_schedules():
    return pytest.importorskip("deepspeed.runtime.lr_schedules")


@pytest.mark.parametrize("name, params", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_each_schedule_writes_deepspeeds_learning_rates(deepspeed_schedules, name, params):
    theirs = _trace(getattr(deepspeed_schedules, name)(_optimizer(), **params))
    ours = _trace(DEEPSPEED[name](_optimizer(), **params))
    assert len({lr for step in ours for lr, _ in step}) > 1, "the schedule never moved: the comparison is vacuous"
    for k, (a, b) in enumerate(zip(ours, theirs)):
        for (lr, betas), (ref_lr, ref_betas) in zip(a, b):
            assert math.isclose(lr, ref_lr, rel_tol=1e-12, abs_tol=1e-18), (k, lr, ref_lr)
            assert betas == pytest.approx(ref_betas, rel=1e-12), (k, betas, ref_betas)


@pytest.mark.parametrize("name, params", [CASES[4], CASES[8], CASES[11], CASES[13]])
def test_state_saved_mid_schedule_resumes_it(name, params):
    first = DEEPSPEED[name](_optimizer(), **params)
    whole = _trace(first, 25)
    fresh = DEEPSPEED[name](_optimizer(), **params)
    second = DEEPSPEED[name](_optimizer(), **params)
    for _ in range(9):
        fresh.step()
    second.load_state_dict(fresh.state_dict())
    assert second.state_dict() == {"last_batch_iteration": 8}
    assert _trace(second, 16)[1:] == whole[10:]


def test_get_last_lr_is_what_was_written():
    s = DEEPSPEED["WarmupDecayLR"](_optimizer(), total_num_steps=10, warmup_num_steps=3, warmup_max_lr=0.01)
    assert s.get_last_lr() == [0.0, 0.0]  # index -1: warmup_min_lr, which the first optimizer step uses
    s.step()
    s.step()
    assert (
        s.get_last_lr()
        == [g["lr"] for g in s.optimizer.param_groups]
        == pytest.approx([0.01 * math.log(2) / math.log(3)] * 2)
    )


@pytest.mark.parametrize(
    "name, params, words",
    [
        ("WarmupLR", {"warmup_type": "cosine"}, "warmup_type 'cosine': give 'log' or 'linear'"),
        ("WarmupLR", {"warmup_num_steps": 0}, "warmup_num_steps: must be a positive integer"),
        ("WarmupLR", {"warmup_num_steps": 10.5}, "warmup_num_steps: must be a positive integer"),
        ("WarmupLR", {"warmup_max_lr": [1e-3, 1e-3, 1e-3]}, "warmup_max_lr: 3 values for 2 param groups"),
        ("WarmupDecayLR", {"total_num_steps": 0}, "total_num_steps: must be a positive integer"),
        ("WarmupDecayLR", {"total_num_steps": 10.5}, "total_num_steps: must be a positive integer, got 10.5"),
        ("WarmupCosineLR", {"total_num_steps": 9, "cos_min_ratio": "0"}, "cos_min_ratio: must be a number, got '0'"),
        ("LRRangeTest", {"lr_range_test_step_rate": None}, "lr_range_test_step_rate: must be a number, got None"),
        ("WarmupLR", {"warmup_max_lr": ["1e-3", 1e-3]}, "warmup_max_lr: must be a number, got '1e-3'"),
        ("OneCycle", {"cycle_min_lr": 0.1, "cycle_max_lr": 1.0, "decay_mom_rate": "0.1"}, "decay_mom_rate: must be a"),
        ("LRRangeTest", {"lr_range_test_step_size": -1}, "lr_range_test_step_size: must be a positive integer"),
        (
            "OneCycle",
            {"cycle_min_lr": 0.1, "cycle_max_lr": 1.0, "cycle_first_step_size": 0},
            "cycle_first_step_size must be > 0",
        ),
    ],
)
def test_bad_arguments_are_one_line(name, params, words):
    with pytest.raises(ConfigError) as e:
        DEEPSPEED[name](_optimizer(), **params)
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["WarmupDecayLR", "WarmupCosineLR"])
def test_a_whole_total_written_as_a_float_is_taken_as_deepspeed_takes_it(name):
    """JSON's ``1e1`` is the float 10.0, which DeepSpeed's schedules take; the rates are those of 10."""
    as_int, as_float = (DEEPSPEED[name](_optimizer(), total_num_steps=t, warmup_num_steps=3) for t in (10, 1e1))
    for _ in range(12):
        as_int.step(), as_float.step()
        assert as_float.get_last_lr() == as_int.get_last_lr()


@pytest.mark.parametrize("key", ["cycle_max_mom", "cycle_min_mom"])
def test_onecycle_momentum_of_one_or_more_is_refused_when_built(key):
    """A momentum of 1 was accepted and failed a cycle later (step 100 at step size 50; 4000 at DeepSpeed's 2000),
    with a message blaming ``decay_mom_rate`` when that was 0. Adam needs beta1 in [0, 1): it is refused at once,
    naming the key. Without momentum cycling the keys are not used and pass."""
    kw = dict(cycle_min_lr=0.1, cycle_max_lr=1.0, cycle_first_step_size=50, **{key: 1.0})
    with pytest.raises(ConfigError) as e:
        DEEPSPEED["OneCycle"](_optimizer(), **kw)
    assert f"OneCycle: {key} 1.0 is beta1" in str(e.value) and "\n" not in str(e.value)
    DEEPSPEED["OneCycle"](_optimizer(), cycle_momentum=False, **kw)


def test_onecycle_momentum_decay_past_one_is_refused_at_the_batch_naming_it():
    """DeepSpeed's OneCycle multiplies beta1 up after the cycle and trains on with beta1 above 1; the batch that
    would write it is one line naming decay_mom_rate, and the betas written before it stay."""
    s = DEEPSPEED["OneCycle"](
        _optimizer(),
        cycle_min_lr=0.1,
        cycle_max_lr=1.0,
        cycle_first_step_size=2,
        decay_step_size=1,
        decay_mom_rate=0.05,
    )
    with pytest.raises(ConfigError) as e:
        for _ in range(10):
            s.step()
    assert "OneCycle: decay_mom_rate 0.05 takes beta1 to 1.035 at batch 6" in str(e.value) and "\n" not in str(e.value)
    assert all(0 <= g["betas"][0] < 1 for g in s.optimizer.param_groups)


@pytest.mark.parametrize("name, params", CASES)
def test_a_tensor_learning_rate_steps_as_a_float_one(name, params):
    """torch optimizers take a group's ``lr`` as a tensor (what a compiled step reads). WarmupLR refused it as not a
    number where it defaults ``warmup_max_lr`` to the group's lr, and ``get_last_lr()`` returned the group's tensor
    itself, which the next step changed in place; torch's schedulers copy it. The rates are the float schedule's,
    written into the same tensors."""
    floats, tensors = _optimizer(), _optimizer()
    for group in tensors.param_groups:
        group["lr"] = torch.tensor(group["lr"], dtype=torch.float64)
    held = [group["lr"] for group in tensors.param_groups]
    a, b = DEEPSPEED[name](floats, **params), DEEPSPEED[name](tensors, **params)
    seen, want = [], []
    for _ in range(12):
        a.step(), b.step()
        seen.append(b.get_last_lr())
        want.append(a.get_last_lr())
    assert all(g["lr"] is t for g, t in zip(tensors.param_groups, held))  # filled in place, not replaced
    for got, expected in zip(seen, want):  # each as it was at its step, not the latest rate
        assert [float(x) for x in got] == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_warmup_cosine_has_deepspeeds_get_lr_ratio():
    """DeepSpeed's WarmupCosineLR answers ``get_lr_ratio()``, the factor on every group's lr; it had no such name."""
    opt = _optimizer()
    base = [g["lr"] for g in opt.param_groups]
    sched = DEEPSPEED["WarmupCosineLR"](opt, total_num_steps=20, warmup_num_steps=5, warmup_min_ratio=0.1)
    assert sched.get_lr_ratio() == 0.0
    for _ in range(25):
        sched.step()
        ratio = sched.get_lr_ratio()
        assert 0.0 <= ratio <= 1.0
        assert sched.get_last_lr() == pytest.approx([lr * ratio for lr in base], rel=1e-12)
