"""A ``.grad`` assigned by the user on two ranks, where it would be ignored or the replicas would step apart: refused
on every rank in one line (``zero/grads/replaced.py``); DeepSpeed's ``safe_set_full_grad``, which sets a gradient at
every stage; and the loss-scale names of DeepSpeed's fp16 optimizer on ``engine.optimizer``, driven the way
DeepSpeed's own tests drive them: ``.grad`` set by hand, then ``step()``
(``tests/unit/runtime/half_precision/test_dynamic_loss_scale.py`` in DeepSpeed's repository)."""

from __future__ import annotations

import contextlib
import math
import re

import pytest
import torch
from torch import nn

from tests.helpers.dist import run_distributed
from tests.helpers.tiers import STAGES
from zerobench.distributed.collectives import Group
from zerobench.zero import ZeroConfig, apply_zero

pytestmark = pytest.mark.dist


def _on_two_ranks(rank: int, world: int, stage: int, backward: bool) -> str:
    from tests.unit.test_replaced_grads import ADAM, X, model

    m = model()
    engine = apply_zero(m, Group.of(None, "dp"), ZeroConfig(stage=stage, optimizer=ADAM))
    if backward:
        m(X[rank::world]).pow(2).sum().backward()
    p = next(m.parameters())
    p.grad = torch.zeros_like(p)
    try:
        engine.step()
    except RuntimeError as e:
        return str(e)
    return "stepped"


@pytest.mark.parametrize(
    "stage, backward, says",
    [
        (1, True, "at stage 1 on 2 ranks the step reads the gradient this rank reduced into its shard"),
        (0, False, "with no backward in this window, but .* never averaged over the 2 DP ranks, so the replicas would"),
    ],
)
def test_on_several_ranks_what_would_be_ignored_or_diverge_is_refused(stage, backward, says):
    for msg in run_distributed(_on_two_ranks, 2, stage, backward, timeout=120):
        assert "\n" not in msg and msg.startswith("step(): the .grad of parameter '0.weight' was "), msg
        assert re.search(says, msg), msg


def _zeros_with_no_backward(rank: int, world: int, stage: int) -> dict:
    """One trained step on the global batch, then ``zero_grad(set_to_none=False)`` and two steps with no backward:
    the parameters, and how far the no-backward steps moved them."""
    from tests.unit.test_replaced_grads import ADAM, X, model
    from zerobench.zero.state.shards import full_parameters

    m = model()
    engine = apply_zero(m, Group.of(None, "dp"), ZeroConfig(stage=stage, optimizer=ADAM))
    m(X[rank::world]).pow(2).sum().mul(world).backward()  # the mean over ranks is the global batch's sum
    engine.optimizer.step()
    before = {n: v.clone() for n, v in full_parameters(engine).items()}
    for _ in range(2):
        engine.optimizer.zero_grad(set_to_none=False)
        engine.optimizer.step()
    after = full_parameters(engine)
    moved = max((after[n] - before[n]).abs().max().item() for n in after)
    return {"params": {n: v.tolist() for n, v in after.items()}, "moved": moved}  # plain data across processes


@pytest.mark.parametrize("stage", STAGES)
def test_zeros_with_no_backward_step_on_every_rank_as_torch(stage):
    """``zero_grad(set_to_none=False)`` then ``step()`` with no backward, on two ranks: every rank steps on the zeros,
    as torch's AdamW does on one process (momentum moves the parameters), and the replicas agree."""
    from tests.unit.test_replaced_grads import X, model, reference

    ref = model()
    opt = reference(ref)
    ref(X).pow(2).sum().backward()
    opt.step()
    for _ in range(2):
        opt.zero_grad(set_to_none=False)
        opt.step()
    for r in run_distributed(_zeros_with_no_backward, 2, stage, timeout=120):
        assert r["moved"] > 1e-3, r["moved"]
        for name, p in ref.named_parameters():
            torch.testing.assert_close(torch.tensor(r["params"][name]), p.detach(), rtol=1e-5, atol=1e-6)


def _written_on_one_rank(rank: int, world: int, stage: int, how: str) -> str:
    from tests.unit.test_replaced_grads import ADAM, X, model

    m = model()
    engine = apply_zero(m, Group.of(None, "dp"), ZeroConfig(stage=stage, optimizer=ADAM))
    m(X[rank::world]).pow(2).sum().backward()
    engine.optimizer.step()
    engine.optimizer.zero_grad(set_to_none=False)
    p = next(m.parameters())
    if rank == 1 and how == "in place":
        p.grad.copy_(torch.ones_like(p))
    elif rank == 1:
        p.grad = torch.ones_like(p)
    try:
        engine.optimizer.step()
    except RuntimeError as e:
        return str(e)
    return "stepped"


@pytest.mark.parametrize("stage, how", [(0, "in place"), (0, "assigned"), (1, "in place")])
def test_a_grad_set_with_no_backward_on_one_rank_is_refused_on_every_rank(stage, how):
    """Rank 1 alone sets a ``.grad`` with no backward: it is never averaged, so the replicas would step apart. Every
    rank refuses in one line, the other naming the rank, so no rank goes on alone into the step's collectives (a
    hang until the timeout). Before, rank 0 returned as if nothing happened while rank 1 raised, or, written in
    place, both ignored it."""
    zero, one = run_distributed(_written_on_one_rank, 2, stage, how, timeout=120)
    assert "\n" not in zero and "\n" not in one, (zero, one)
    assert zero.startswith("step(): a .grad was set with no backward in this window on rank 1"), zero
    assert one.startswith("step(): the .grad of parameter '0.weight' was "), one
    assert "never averaged over the 2 DP ranks, so the replicas would step apart" in one, one


def _reader_on_rank_0(rank: int, world: int, stage: int) -> str:
    from tests.unit.test_replaced_grads import ADAM, X, model
    from zerobench.zero.compat.deepspeed.tensor_fragment import safe_get_full_grad

    m = model()
    engine = apply_zero(m, Group.of(None, "dp"), ZeroConfig(stage=stage, optimizer=ADAM))
    m(X[rank::world]).pow(2).sum().backward()
    engine.optimizer.step()
    engine.optimizer.zero_grad()
    got = repr(safe_get_full_grad(next(m.parameters()))) if rank == 0 else "no call"
    engine.optimizer.step()  # every rank: a no-op, agreed
    return got


@pytest.mark.parametrize("stage", [0, 1])
def test_a_gradient_read_on_one_rank_in_a_window_with_no_backward_is_local(stage):
    """``safe_get_full_grad`` on rank 0 alone (logging) after ``zero_grad()``: no gradient, answered locally. A
    reader called on some ranks alone must not enter the ranks' agreement (it would pair with their next
    collective)."""
    assert run_distributed(_reader_on_rank_0, 2, stage, timeout=120) == ["None", "no call"]


def _read_zeros(rank: int, world: int, stage: int) -> list:
    from tests.unit.test_replaced_grads import ADAM, X, model
    from zerobench.zero.compat.deepspeed.tensor_fragment import safe_get_full_grad

    m = model()
    engine = apply_zero(m, Group.of(None, "dp"), ZeroConfig(stage=stage, optimizer=ADAM))
    m(X[rank::world]).pow(2).sum().backward()
    engine.optimizer.step()
    engine.optimizer.zero_grad(set_to_none=False)
    got = safe_get_full_grad(next(m.parameters()))
    return None if got is None else [list(got.shape), got.abs().max().item()]


@pytest.mark.parametrize("stage", [0, 2])
def test_a_reader_sees_the_zeros_the_next_step_trains_on(stage):
    """``zero_grad(set_to_none=False)`` and no backward, on two ranks: ``safe_get_full_grad`` reads the zeros the next
    step trains on, as on one process, without settling anything (it may be called on some ranks alone)."""
    assert run_distributed(_read_zeros, 2, stage, timeout=120) == [[[8, 4], 0.0]] * 2


def _tp_only(rank: int, world: int, how: str) -> float:
    import torch.distributed as dist

    from tests.unit.test_replaced_grads import ADAM, model
    from zerobench.zero.compat.deepspeed.tensor_fragment import safe_get_full_grad

    alone = [dist.new_group([r]) for r in range(world)]
    m = model()
    engine = apply_zero(
        m, Group.of(alone[rank], "dp"), ZeroConfig(stage=0, optimizer=ADAM), tp_group=Group.of(None, "tp")
    )
    before = next(m.parameters()).detach().clone()
    for p in m.parameters():
        if how == "assigned":
            p.grad = torch.ones_like(p)
        else:
            p.grad.copy_(torch.ones_like(p))
    read = safe_get_full_grad(next(m.parameters()))  # no DP peers: the .grad set, read before the step
    assert read is not None and torch.equal(read, torch.ones_like(read)), read
    engine.optimizer.step()
    return (next(m.parameters()) - before).abs().max().item()


@pytest.mark.parametrize("how", ["assigned", "in place"])
def test_with_one_dp_rank_a_grad_set_with_no_backward_steps_under_tp(how):
    """DP 1 x TP 2: a ``.grad`` set with no backward is averaged with nobody, so every TP rank steps it (as one
    process would). Refusing it said "never averaged over the 1 DP ranks"."""
    moved = run_distributed(_tp_only, 2, how, timeout=120)
    assert all(abs(x - ADAM_LR) < 1e-6 for x in moved), moved


ADAM_LR = 1e-2
"""One AdamW step from zero moments on a constant gradient moves each element by the learning rate."""


def _cleared_unalike(rank: int, world: int) -> str:
    from tests.unit.test_replaced_grads import ADAM, X, model

    m = model()
    engine = apply_zero(m, Group.of(None, "dp"), ZeroConfig(stage=0, optimizer=ADAM))
    m(X[rank::world]).pow(2).sum().backward()
    engine.optimizer.step()
    engine.optimizer.zero_grad(set_to_none=rank == 1)
    try:
        engine.optimizer.step()
    except RuntimeError as e:
        return str(e)
    return "stepped"


def test_ranks_that_would_step_and_ranks_that_would_not_refuse_alike():
    """Rank 0 keeps zeros (``zero_grad(set_to_none=False)``), rank 1 clears to None: torch would step rank 0 only,
    and the replicas would part. Both refuse in one line, so neither goes on into the step's collectives alone."""
    for msg in run_distributed(_cleared_unalike, 2, timeout=120):
        assert "\n" not in msg and msg.startswith("step(): with no backward in this window, some ranks hold"), msg


def _ds_engine(fp16: dict, stage: int = 0):
    from zerobench.zero import initialize

    torch.manual_seed(0)
    cfg = {
        "train_batch_size": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1.5e-4}},
        "fp16": {"enabled": True, "loss_scale": 0, **fp16},
        "zero_optimization": {"stage": stage},
    }
    engine, optim, _, _ = initialize(config=cfg, model=nn.Linear(1, 1), model_parameters=None)
    return engine, optim


def _step_with(engine, values) -> None:
    """DeepSpeed's tests' way: every ``.grad`` set to ``value``, then ``step()`` (no backward)."""
    for value in values:
        for p in engine.module.parameters():
            p.grad = torch.full_like(p, value)
        engine.step()


def test_deepspeeds_fp16_optimizer_names_follow_its_scale():
    run_distributed(_fp16_names, 1, timeout=120)


def _fp16_names(rank: int, world: int) -> None:
    engine, optim = _ds_engine({"initial_scale_power": 8, "loss_scale_window": 2})
    assert optim is engine.optimizer and optim.dynamic_loss_scale is True
    assert (optim.cur_scale, optim.loss_scale, optim.scale_window, optim.min_loss_scale, optim.cur_iter) == (
        256,
        256,
        2,
        1,
        0,
    )
    want = 256
    for i, value in enumerate((0.05, -0.02, 0.03, 0.01, -0.04, 0.02)):  # clean: grows after steps 3, 5, 7, ...
        _step_with(engine, [value])
        assert (optim.cur_scale, optim.cur_iter) == (want, i + 1), i
        if optim.cur_iter % 2 == 0:
            want *= 2
    engine, optim = _ds_engine({"initial_scale_power": 4, "loss_scale_window": 2})
    for i, value in enumerate([math.inf, -math.inf] + [math.nan] * 4):  # every overflow halves, down to 1, no raise
        with pytest.warns(RuntimeWarning) if i >= 4 else contextlib.nullcontext():
            _step_with(engine, [value])
        assert (optim.cur_scale, optim.cur_iter, engine.skipped_steps) == (max(16 / 2 ** (i + 1), 1), i + 1, i + 1)
    engine, optim = _ds_engine({"initial_scale_power": 8, "loss_scale_window": 2})
    _step_with(engine, [math.inf, math.nan])
    assert (optim.cur_scale, optim.cur_iter) == (64, 2)
    _step_with(engine, [0.01, -0.02, 0.03])  # window + 1 clean steps grow it once
    assert (optim.cur_scale, optim.cur_iter) == (128, 5)
    _step_with(engine, [math.inf])
    assert (optim.cur_scale, optim.cur_iter) == (64, 6)
    optim.cur_scale = 1024  # DeepSpeed's setter
    assert engine.loss_scale == 1024
    view = optim.loss_scale_config  # where DeepSpeed 0.19.8 keeps the same figures
    assert (view.cur_scale, view.cur_iter, view.scale_window, view.dynamic_loss_scale) == (1024, 6, 2, True)
    engine, optim = _ds_engine({"initial_scale_power": 8, "loss_scale_window": 2}, stage=1)
    _step_with(engine, [math.inf])  # a ZeRO optimizer's scale keeps DeepSpeed's hysteresis 2: skipped, not backed off
    assert (optim.cur_scale, optim.cur_iter, engine.skipped_steps) == (256, 1, 1)
    _step_with(engine, [math.inf])
    assert optim.cur_scale == 128


def _set_full_grad(rank: int, world: int, stage: int) -> dict:
    from tests.unit.test_replaced_grads import ADAM, X, model, reference
    from zerobench.zero.compat.deepspeed.tensor_fragment import safe_get_full_grad, safe_set_full_grad
    from zerobench.zero.state.shards import full_parameters

    m, ref = model(), model()
    engine = apply_zero(m, Group.of(None, "dp"), ZeroConfig(stage=stage, optimizer=ADAM), units=nn.Linear)
    opt = reference(ref)
    gen = torch.Generator().manual_seed(3)
    out = {"roundtrip": True}
    for _ in range(2):
        m(X[rank::world]).pow(2).sum().backward()
        for name, q in ref.named_parameters():
            g = torch.randn(q.shape, generator=gen)  # the same on every rank
            p = dict(m.named_parameters())[name]
            safe_set_full_grad(p, g)
            out["roundtrip"] &= torch.allclose(safe_get_full_grad(p), g, rtol=1e-6, atol=1e-7)
            q.grad = g
        assert engine.step()
        opt.step()
        opt.zero_grad()
    got = full_parameters(engine)
    out["diff"] = max((got[n] - q.detach()).abs().max().item() for n, q in ref.named_parameters())
    return out


def _roundtrip_low_precision(rank: int, world: int, stage: int, precision: str) -> bool:
    """DeepSpeed's tensor-fragment test's check: a gradient set in the training dtype reads back equal."""
    from tests.unit.test_replaced_grads import ADAM, X, model
    from zerobench.zero.compat.deepspeed.tensor_fragment import safe_get_full_grad, safe_set_full_grad

    m = model()
    cfg = ZeroConfig(stage=stage, optimizer=ADAM, precision=precision)
    engine = apply_zero(m, Group.of(None, "dp"), cfg, units=nn.Linear)
    dtype = engine.param_dtype
    engine.backward(m(X[rank::world].to(dtype)).pow(2).sum())
    gen = torch.Generator().manual_seed(4)
    values = {zp.name: torch.rand(zp.slot.shape, generator=gen).to(dtype) for zp in engine.zparams}
    for n, p in m.named_parameters():
        safe_set_full_grad(p, values[n])
    same = all(torch.equal(safe_get_full_grad(p), values[n]) for n, p in m.named_parameters())
    return same and engine.step()


@pytest.mark.parametrize("stage", [1, 3])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_gradient_set_in_the_training_dtype_reads_back_equal(stage, precision):
    assert all(run_distributed(_roundtrip_low_precision, 2, stage, precision, timeout=120))


@pytest.mark.parametrize("stage", STAGES)
def test_safe_set_full_grad_is_the_gradient_the_step_trains_on(stage):
    """DeepSpeed's ``safe_set_full_grad`` at every stage on two ranks: read back as set, and two steps on set
    gradients end where torch's AdamW does on them."""
    for r in run_distributed(_set_full_grad, 2, stage, timeout=120):
        assert r["roundtrip"] and r["diff"] < 1e-5, r
