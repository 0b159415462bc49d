"""Torch calls a ported FSDP or DDP loop makes on the model's parameters (``zero/interop/foreign.py``): a torch
optimizer's ``step()`` is refused in one line, and ``torch.nn.utils.clip_grad_norm_`` over the model's parameters
clips the engine's window as FSDP's ``clip_grad_norm_`` does (both were silent: no update, a norm of 0)."""

from __future__ import annotations

import copy

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


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_torch_optimizer_on_the_models_parameters_is_refused(stage):
    m = model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=stage, optimizer=ADAM), units=nn.Linear)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m(torch.ones(2, 4)).sum().backward()
    with pytest.raises(RuntimeError, match=rf"SGD.step\(\) on parameters a ZeRO engine \(stage {stage}\) trains"):
        opt.step()
    other = nn.Linear(2, 2)  # an optimizer of anything else is untouched
    other(torch.ones(1, 2)).sum().backward()
    torch.optim.SGD(other.parameters(), lr=0.1).step()
    engine.destroy()  # the parameters are the user's again: so is stepping them
    m(torch.ones(2, 4)).sum().backward()
    opt.step()


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_torch_clip_grad_norm_over_the_model_clips_the_engines_window(stage):
    """The norm returned and the clipped step equal one process's torch training with the same clip."""
    m, ref = model(), model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=stage, optimizer=ADAM), units=nn.Linear)
    opt = torch.optim.AdamW(ref.parameters(), lr=ADAM.lr, betas=ADAM.betas, eps=ADAM.eps, weight_decay=0.0)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        m(x).pow(2).sum().backward()
        got = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
        engine.optimizer.step()
        engine.zero_grad()
        ref(x).pow(2).sum().backward()
        want = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        opt.step()
        opt.zero_grad()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for name, value in full_parameters(engine).items():
        torch.testing.assert_close(value, dict(ref.named_parameters())[name], rtol=1e-5, atol=1e-6)
    m(x).sum().backward()
    with pytest.raises(RuntimeError, match="given part of a ZeRO engine's trained parameters"):
        torch.nn.utils.clip_grad_norm_(list(m.parameters())[:2], 0.5)
    plain = copy.deepcopy(ref)  # parameters of no engine: torch's own function
    plain(x).sum().backward()
    assert torch.nn.utils.clip_grad_norm_(plain.parameters(), 1e9) > 0


def test_clip_grad_norm_edge_cases_answer_as_torchs():
    """``max_norm=inf`` measures the norm and clips nothing (it was refused); the norm lives on the engine's
    device. With no backward since ``zero_grad()`` it stays one line (torch returns 0 there, FSDP1 warns: a clip
    before any backward is a loop's bug, test_optimizer_api)."""
    m, ref = model(), model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=2, optimizer=ADAM), units=nn.Linear)
    with pytest.raises(RuntimeError, match="before this window's gradients are reduced"):
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    m(x).pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    norm = engine.clip_grad_norm_(float("inf"))
    assert norm.device == engine.device
    torch.testing.assert_close(norm, torch.nn.utils.clip_grad_norm_(ref.parameters(), float("inf")))
    assert engine._clip == 1.0  # nothing clipped
    with pytest.raises(Exception, match="needs a positive max_norm, got nan"):
        engine.clip_grad_norm_(float("nan"))


def torch_own_clip():
    """torch's ``clip_grad_norm_`` itself, as a script that imported it by name before any engine holds it."""
    f = torch.nn.utils.clip_grad_norm_
    return f.__wrapped__ if getattr(f, "zerobench_routed", False) else f


@pytest.mark.parametrize("stage", [2, 3])
def test_a_clip_grad_norm_imported_before_the_engine_is_refused_where_grad_is_not_the_gradient(stage):
    """Bound before the first engine, torch's function returned 0 and clipped nothing at stages 2-3. It is refused in
    one line, and so are ``clip_grads_with_norm_`` and ``clip_grad_value_`` over the same parameters."""
    m = model()
    apply_zero(m, ONE, ZeroConfig(stage=stage, optimizer=ADAM), units=nn.Linear)
    clip = torch_own_clip()
    m(torch.ones(2, 4)).sum().backward()
    with pytest.raises(
        RuntimeError, match=rf"torch's clip_grads_with_norm_ reached parameters a ZeRO engine \(stage {stage}\)"
    ):
        clip(m.parameters(), 0.5)
    with pytest.raises(RuntimeError, match=r"Clip with engine\.clip_grad_norm_"):
        torch.nn.utils.clip_grads_with_norm_(m.parameters(), 0.5, torch.tensor(1.0))
    with pytest.raises(RuntimeError, match="torch's clip_grad_value_ reached parameters"):
        torch.nn.utils.clip_grad_value_(m.parameters(), 0.1)
    plain = model()  # parameters of no engine: torch's own functions, untouched
    plain(torch.ones(2, 4)).sum().backward()
    want = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in plain.parameters()]))
    torch.testing.assert_close(clip(plain.parameters(), 1e9), want)
    torch.nn.utils.clip_grad_value_(plain.parameters(), 1e-3)
    assert max(p.grad.abs().max() for p in plain.parameters()) <= 1e-3


def test_torchs_own_clip_passes_where_grad_is_the_whole_gradient_and_is_refused_under_fp16():
    """At stage 0 on one rank in fp32, ``.grad`` is the averaged gradient the step reads: torch's own clip (bound
    early) clips it and the step matches one process's torch training. Under fp16 ``.grad`` is times the loss scale,
    so the same call is refused."""
    m, ref = model(), model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=0, optimizer=ADAM), units=nn.Linear)
    clip = torch_own_clip()
    opt = torch.optim.AdamW(ref.parameters(), lr=ADAM.lr, betas=ADAM.betas, eps=ADAM.eps, weight_decay=0.0)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    for max_norm in (0.5, 0.05):
        m(x).pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
        torch.testing.assert_close(clip(m.parameters(), max_norm), clip(ref.parameters(), max_norm))
        engine.optimizer.step()
        engine.zero_grad()
        opt.step()
        opt.zero_grad()
    for name, value in full_parameters(engine).items():
        torch.testing.assert_close(value, dict(ref.named_parameters())[name], rtol=1e-4, atol=1e-5)
    half = model()
    fp16 = apply_zero(half, ONE, ZeroConfig(stage=0, precision="fp16", optimizer=ADAM), units=nn.Linear)
    fp16.backward(half(torch.ones(2, 4, dtype=torch.float16)).float().sum())
    with pytest.raises(RuntimeError, match=r"a ZeRO engine \(stage 0\) trains, whose \.grad is not"):
        clip(half.parameters(), 0.5)
