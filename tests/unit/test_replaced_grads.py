"""A ``.grad`` assigned by the user (``p.grad = g``) after backward, or with no backward (``zero/grads/replaced.py``),
on one process: stepped as torch's optimizer steps it where ``.grad`` is the engine's whole gradient, refused in one
line elsewhere. Both used to be silent: the step trained on the engine's buffer and the assignment was lost. Two
ranks, and DeepSpeed's fp16 optimizer names driven as DeepSpeed's tests drive them:
``tests/distributed/test_replaced_grads.py``."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from zerobench.distributed.collectives import Group
from zerobench.zero import ZeroConfig, apply_zero
from zerobench.zero.config import AdamWConfig
from zerobench.zero.state.shards import full_parameters

ONE = Group(None, "dp", 1, 0)
ADAM = AdamWConfig(lr=1e-2, weight_decay=0.0)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def reference(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(m.parameters(), lr=ADAM.lr, betas=ADAM.betas, eps=ADAM.eps, weight_decay=0.0)


def surgery(g: torch.Tensor) -> torch.Tensor:
    """A new tensor, not ``g`` changed in place: what ``p.grad = ...`` assigns."""
    return g.sign() * g.abs().sqrt() + 0.01


def assert_trained_alike(engine, ref: nn.Module) -> None:
    got = full_parameters(engine)
    for name, p in ref.named_parameters():
        torch.testing.assert_close(got[name], p.detach(), rtol=1e-5, atol=1e-6)


def step_both(engine, opt: torch.optim.Optimizer) -> None:
    """One applied engine step and one torch step, each window cleared after."""
    assert engine.step()
    opt.step()
    opt.zero_grad()


X = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("stage", [0, 1])
def test_a_grad_assigned_after_backward_is_the_one_stepped(stage):
    """Gradient surgery by assignment, three steps: the engine ends where torch's AdamW does with the same surgery,
    and away from where it ends without it (the comparison is not vacuous)."""
    m, ref, plain = model(), model(), model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=stage, optimizer=ADAM))
    untouched = apply_zero(plain, ONE, ZeroConfig(stage=stage, optimizer=ADAM))
    opt = reference(ref)
    for _ in range(3):
        for net in (m, ref, plain):
            net(X).pow(2).sum().backward()
        for net in (m, ref):
            for p in net.parameters():
                p.grad = surgery(p.grad)
        assert engine.step() and untouched.step()
        opt.step()
        opt.zero_grad()
    assert_trained_alike(engine, ref)
    moved = max((a - b).abs().max().item() for a, b in zip(full_parameters(engine).values(), plain.parameters()))
    assert moved > 1e-3, "the surgery changed nothing: the test would pass with the assignment ignored"


@pytest.mark.parametrize("stage", [0, 1])
def test_engine_clipping_sees_the_assigned_grad(stage):
    m = model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=stage, optimizer=ADAM))
    m(X).pow(2).sum().backward()
    for p in m.parameters():
        p.grad = torch.ones_like(p)
    numel = sum(p.numel() for p in m.parameters())
    assert float(engine.clip_grad_norm_(1.0)) == pytest.approx(math.sqrt(numel))


@pytest.mark.parametrize("stage", [0, 1])
def test_grads_set_by_hand_with_no_backward_train_one_rank_as_torch(stage):
    """DeepSpeed's own fp16 tests set ``.grad`` and call ``step()`` with no backward. On one rank that is the
    gradient, as torch's optimizer takes it; before, the step reported False and nothing moved."""
    m, ref = model(), model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=stage, optimizer=ADAM))
    opt = reference(ref)
    gen = torch.Generator().manual_seed(2)
    m(X).pow(2).sum().backward()  # a first window through backward: stale values the hand-set window must not see
    engine.step()
    (ref(X).pow(2).sum()).backward()
    opt.step()
    opt.zero_grad()
    for _ in range(2):
        for p, q in zip(m.parameters(), ref.parameters()):
            p.grad = q.grad = torch.randn(p.shape, generator=gen)
        step_both(engine, opt)
    assert_trained_alike(engine, ref)


@pytest.mark.parametrize("stage", [2, 3])
def test_an_assigned_grad_at_stages_2_3_is_refused_in_one_line(stage):
    m = model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=stage, optimizer=ADAM), units=nn.Linear)
    m(X).pow(2).sum().backward()
    p = next(m.parameters())
    p.grad = torch.zeros_like(p)
    with pytest.raises(
        RuntimeError, match=rf"step\(\): the .grad of parameter '0.weight' was assigned .*at stage {stage}"
    ) as e:
        engine.step()
    assert "\n" not in str(e.value) and "safe_set_full_grad(param, value)" in str(e.value)


def test_an_assigned_grad_under_offload_is_refused_in_one_line():
    """Under optimizer offload the gradient went to the host during backward: ``.grad`` is no longer what steps."""
    m = model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=1, optimizer=ADAM, offload_optimizer="cpu"))
    m(X).pow(2).sum().backward()
    p = next(m.parameters())
    p.grad = torch.zeros_like(p)
    with pytest.raises(RuntimeError, match=r"was assigned .*under optimizer offload.*safe_set_full_grad") as e:
        engine.step()
    assert "\n" not in str(e.value)


def test_a_grad_set_to_none_after_backward_is_refused():
    """torch's optimizer would skip the parameter; the fused step cannot, and would step the gradient ``.grad`` no
    longer shows."""
    m = model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=0, optimizer=ADAM))
    m(X).pow(2).sum().backward()
    m[2].bias.grad = None
    with pytest.raises(
        RuntimeError, match=r"of parameter '2.bias' was set to None after backward.*requires_grad_\(False\)"
    ):
        engine.optimizer.step()


def test_in_place_changes_need_nothing():
    m, ref = model(), model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=0, optimizer=ADAM))
    opt = reference(ref)
    for net in (m, ref):
        net(X).pow(2).sum().backward()
        for p in net.parameters():
            p.grad.mul_(3.0)
    engine.step()
    opt.step()
    assert_trained_alike(engine, ref)


def test_a_grad_whose_data_was_replaced_still_trains_as_torch():
    """``p.grad.data = t`` moves the view object itself off the buffer: every later gradient would land beside it
    and every later step train on the stale buffer (1e-2 from torch after four steps)."""
    m, ref = model(), model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=0, optimizer=ADAM))
    opt = reference(ref)
    for step in range(4):
        for net in (m, ref):
            net(X).pow(2).sum().backward()
            if step == 0:
                for p in net.parameters():
                    p.grad.data = p.grad.data.clone()
        step_both(engine, opt)
    assert_trained_alike(engine, ref)


@pytest.mark.parametrize("stage", [0, 1])
def test_with_no_backward_grads_written_in_place_and_assigned_both_train(stage):
    """After ``zero_grad(set_to_none=False)`` some gradients written into ``.grad`` in place, one assigned: torch
    steps all of them, and so does the engine (the assignment must not wipe the in-place ones)."""
    m, ref = model(), model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=stage, optimizer=ADAM))
    opt = reference(ref)
    gen = torch.Generator().manual_seed(5)
    engine.zero_grad(set_to_none=False)
    for k, (p, q) in enumerate(zip(m.parameters(), ref.parameters())):
        g = torch.randn(p.shape, generator=gen)
        q.grad = g.clone()
        if k == 0:
            p.grad = g
        else:
            p.grad.copy_(g)
    assert engine.step()
    opt.step()
    assert_trained_alike(engine, ref)


def test_a_discarded_window_leaves_no_clip_nor_unused_check_behind():
    """backward, clip, ``zero_grad()``: that window is gone, its clip coefficient and its unused-parameter check
    with it; gradients then set by hand step unclipped, as torch's."""
    m, ref = model(), model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=0, optimizer=ADAM))
    opt = reference(ref)
    m[2](torch.tanh(m[0](X))).sum().backward()  # every parameter used
    engine.clip_grad_norm_(1e-3)
    engine.zero_grad()
    gen = torch.Generator().manual_seed(6)
    for p, q in zip(m.parameters(), ref.parameters()):
        p.grad = q.grad = torch.randn(p.shape, generator=gen)
    assert engine.step()
    opt.step()
    assert_trained_alike(engine, ref)
    unused = nn.ModuleDict({"a": nn.Linear(4, 1), "b": nn.Linear(4, 1)})
    e2 = apply_zero(unused, ONE, ZeroConfig(stage=1, optimizer=ADAM))
    unused["a"](X).sum().backward()  # "b" unused: a step now would refuse it
    e2.zero_grad()
    for p in unused.parameters():
        p.grad = torch.ones_like(p)
    assert e2.step()  # the hand-set window has every gradient


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_autograd_grad_over_the_parameters_is_torchs(stage):
    """``torch.autograd.grad(out, model.parameters())`` reads the graph and never accumulates: it used to fail inside
    the engine's hook (torch refuses a leaf node while autograd.grad runs)."""
    m, ref = model(), model()
    apply_zero(m, ONE, ZeroConfig(stage=stage, optimizer=ADAM), units=nn.Linear)
    got = torch.autograd.grad(m(X).pow(2).sum(), list(m.parameters()))
    want = torch.autograd.grad(ref(X).pow(2).sum(), list(ref.parameters()))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    assert all(p.grad is None or not p.grad.any() for p in m.parameters())  # nothing accumulated


def test_safe_get_full_grad_reads_a_hand_set_grad():
    from zerobench.zero.compat.deepspeed.tensor_fragment import safe_get_full_grad

    m = model()
    apply_zero(m, ONE, ZeroConfig(stage=0, optimizer=ADAM))
    p = next(m.parameters())
    p.grad = torch.full_like(p, 0.5)
    torch.testing.assert_close(safe_get_full_grad(p), torch.full_like(p, 0.5))


@pytest.mark.parametrize("stage, offload", [(0, "none"), (1, "none"), (1, "cpu")])
def test_a_step_with_no_gradient_at_all_changes_nothing(stage, offload):
    """No backward and nothing assigned since ``zero_grad()`` (or ever): no step, as before; the zeros of
    ``zero_grad(set_to_none=False)`` are no gradient either (a step on them would move by weight decay)."""
    m = model()
    cfg = ZeroConfig(stage=stage, optimizer=AdamWConfig(lr=1e-2, weight_decay=0.1), offload_optimizer=offload)
    engine = apply_zero(m, ONE, cfg)
    before = {n: v.clone() for n, v in full_parameters(engine).items()}
    assert engine.step() is False
    engine.zero_grad(set_to_none=False)
    assert engine.step() is False
    for name, value in full_parameters(engine).items():
        assert torch.equal(value, before[name]), name
    with pytest.raises(RuntimeError, match=r"clip_grad_norm_\(\) before this window's gradients are reduced"):
        engine.clip_grad_norm_(1.0)


def test_a_moved_view_is_rebuilt_when_the_window_is_zeroed():
    """``p.grad.data = t`` then ``zero_grad(set_to_none=False)`` with no step between: the view put back must be the
    buffer's, zeroed, or the next backward adds onto the old gradient."""
    m, ref = model(), model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=0, optimizer=ADAM))
    opt = reference(ref)
    for net in (m, ref):
        net(X).pow(2).sum().backward()
        for p in net.parameters():
            p.grad.data = p.grad.data.clone()
    engine.zero_grad(set_to_none=False)
    opt.zero_grad(set_to_none=False)
    assert all(not p.grad.any() for p in m.parameters())
    for _ in range(2):
        for net in (m, ref):
            net(X).pow(2).sum().backward()
        engine.step()
        opt.step()
        opt.zero_grad()
    assert_trained_alike(engine, ref)


def test_a_transposed_alias_of_the_grad_is_stepped_as_torch():
    """``p.grad = p.grad.t()`` on a square weight: the same memory in another layout, copied as a value."""
    torch.manual_seed(0)
    m, ref = nn.Linear(4, 4), nn.Linear(4, 4)
    ref.load_state_dict(m.state_dict())
    engine = apply_zero(m, ONE, ZeroConfig(stage=0, optimizer=ADAM))
    opt = reference(ref)
    for net in (m, ref):
        net(X).pow(2).sum().backward()
        net.weight.grad = net.weight.grad.t()
    engine.step()
    opt.step()
    assert_trained_alike(engine, ref)


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")  # torch's, on both sides
@pytest.mark.parametrize("stage", [0, 1])
def test_a_create_graph_backward_steps_as_torch(stage):
    """``loss.backward(create_graph=True)``: the gradient's value lands in the buffer, not its history (the buffer
    taking one failed stage 0's unused-parameter flag with an in-place error on a leaf)."""
    m, ref = model(), model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=stage, optimizer=ADAM))
    opt = reference(ref)
    for net in (m, ref):
        net(X).pow(2).sum().backward(create_graph=True)
    assert engine.step()
    opt.step()
    assert_trained_alike(engine, ref)
    assert not engine.grads.full.data.requires_grad


def _trained_once(stage: int, **config):
    """An engine and a torch reference after one step each on the same batch: the optimizers hold momentum."""
    m, ref = model(), model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=stage, optimizer=ADAM, **config))
    opt = reference(ref)
    m(X).pow(2).sum().backward()
    ref(X).pow(2).sum().backward()
    engine.optimizer.step()
    opt.step()
    return m, engine, ref, opt


def _moved_from(engine, before: dict) -> float:
    return max((full_parameters(engine)[n] - v).abs().max().item() for n, v in before.items())


@pytest.mark.parametrize("stage, offload", [(0, "none"), (1, "none"), (2, "none"), (3, "none"), (1, "cpu")])
def test_zero_grad_keeping_zeros_then_a_step_with_no_backward_steps_as_torch(stage, offload):
    """``zero_grad(set_to_none=False)`` then ``step()`` with no backward: torch's AdamW steps on the zeros (momentum
    moves the parameters), twice here. Before, the engine did not step, silently."""
    _, engine, ref, opt = _trained_once(stage, offload_optimizer=offload)
    before = {n: v.clone() for n, v in full_parameters(engine).items()}
    for _ in range(2):
        engine.optimizer.zero_grad(set_to_none=False)
        opt.zero_grad(set_to_none=False)
        engine.optimizer.step()
        opt.step()
    assert_trained_alike(engine, ref)
    assert _moved_from(engine, before) > 1e-3, "momentum moved nothing: the test would pass with no step"


@pytest.mark.parametrize("stage, offload", [(0, "none"), (1, "none"), (1, "cpu")])
def test_grads_written_in_place_with_no_backward_train_as_torch(stage, offload):
    """After ``zero_grad(set_to_none=False)`` a loop writes ``.grad`` in place (``p.grad.copy_(g)``) and steps with no
    backward: torch trains on what ``.grad`` holds. Before, the engine ignored the writes and did not step."""
    m, engine, ref, opt = _trained_once(stage, offload_optimizer=offload)
    gen = torch.Generator().manual_seed(4)
    engine.optimizer.zero_grad(set_to_none=False)
    opt.zero_grad(set_to_none=False)
    for p, q in zip(m.parameters(), ref.parameters()):
        value = torch.randn(p.shape, generator=gen)
        p.grad.copy_(value)
        q.grad.copy_(value)
    engine.optimizer.step()
    opt.step()
    assert_trained_alike(engine, ref)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_with_no_backward_and_every_grad_none_nothing_steps(stage):
    """Where torch's ``.grad`` is None, torch's AdamW skips every parameter, momentum and weight decay included: a
    fresh engine, even after ``zero_grad(set_to_none=False)`` (torch leaves a None ``.grad`` alone), and a trained
    window cleared with ``zero_grad()``. The engine does not step either."""
    decay = AdamWConfig(lr=1e-2, weight_decay=0.1)
    m = model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=stage, optimizer=decay))
    before = {n: v.clone() for n, v in full_parameters(engine).items()}
    engine.optimizer.zero_grad(set_to_none=False)
    engine.optimizer.step()
    assert _moved_from(engine, before) == 0.0
    m(X).pow(2).sum().backward()
    engine.optimizer.step()
    engine.optimizer.zero_grad()
    engine.optimizer.zero_grad(set_to_none=False)  # over None: stays None
    before = {n: v.clone() for n, v in full_parameters(engine).items()}
    engine.optimizer.step()
    assert _moved_from(engine, before) == 0.0
    if stage <= 1:  # after a backward, every .grad set to None by hand, then zero_grad(set_to_none=False): no gradient
        m(X).pow(2).sum().backward()
        engine.optimizer.step()
        for p in m.parameters():
            p.grad = None
        engine.optimizer.zero_grad(set_to_none=False)  # (.grad is the engine's zero view again, usable in place)
        before = {n: v.clone() for n, v in full_parameters(engine).items()}
        engine.optimizer.step()
        assert _moved_from(engine, before) == 0.0
    if stage <= 1:  # zeros kept, then every .grad set to None by hand: torch skips them all, then and after
        m(X).pow(2).sum().backward()
        engine.optimizer.step()
        engine.optimizer.zero_grad(set_to_none=False)
        for p in m.parameters():
            p.grad = None
        before = {n: v.clone() for n, v in full_parameters(engine).items()}
        engine.optimizer.step()
        engine.optimizer.zero_grad(set_to_none=False)
        engine.optimizer.step()
        assert _moved_from(engine, before) == 0.0


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_step_after_no_sync_passes_cleared_by_zero_grad_is_a_no_op(stage):
    """A micro-batch under ``no_sync()``, then ``zero_grad()`` (a bad batch dropped), then ``step()``: torch's step has
    no ``.grad`` to read and does nothing. Before, the engine refused it as a window missing its synchronising
    backward."""
    m = model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=stage, optimizer=AdamWConfig(lr=1e-2, weight_decay=0.1)))
    before = {n: v.clone() for n, v in full_parameters(engine).items()}
    with engine.no_sync():
        m(X).pow(2).sum().backward()
    engine.optimizer.zero_grad()
    engine.optimizer.step()
    assert _moved_from(engine, before) == 0.0
