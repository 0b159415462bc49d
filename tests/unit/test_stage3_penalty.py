"""A loss term over ``model.parameters()`` at stage 3 (an L2 penalty), computed inside ``engine.gathered_params()`` as
the docs say, with its backward inside the context too: trained as torch trains it on one process. Before, the
backward freed the units as an ordinary backward does, and the context's exit failed on the freed parameters with a
raw torch error."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zerobench.distributed.collectives import Group
from zerobench.zero import ZeroConfig, apply_zero
from zerobench.zero.config import AdamWConfig
from zerobench.zero.state.shards import full_parameters

ONE = Group(None, "dp", 1, 0)
ADAM = AdamWConfig(lr=1e-2, weight_decay=0.0)
X = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def loss_and_penalty(m: nn.Module) -> torch.Tensor:
    return m(X).pow(2).sum() + 0.5 * sum(p.pow(2).sum() for p in m.parameters())


def test_a_penalty_and_its_backward_inside_gathered_params_train_as_torch():
    m, ref = model(), model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=3, optimizer=ADAM), units=nn.Linear)
    opt = torch.optim.AdamW(ref.parameters(), lr=ADAM.lr, betas=ADAM.betas, eps=ADAM.eps, weight_decay=0.0)
    for _ in range(2):
        with engine.gathered_params():
            loss_and_penalty(m).backward()
        assert engine.step()
        loss_and_penalty(ref).backward()
        opt.step()
        opt.zero_grad()
    got = full_parameters(engine)
    for name, p in ref.named_parameters():
        torch.testing.assert_close(got[name], p.detach(), rtol=1e-5, atol=1e-6)
    assert all(p.numel() == 0 for p in m.parameters()), "the units are not freed after the context"


def test_a_step_inside_gathered_params_is_refused_and_one_after_it_trains():
    """At stage 3 the context's units hold the values gathered for it, and its exit writes changes back: a step
    inside would be undone by the exit (before, the exit failed with a raw torch error). Refused in one line; the
    same step after the exit trains as torch."""
    m, ref = model(), model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=3, optimizer=ADAM), units=nn.Linear)
    opt = torch.optim.AdamW(ref.parameters(), lr=ADAM.lr, betas=ADAM.betas, eps=ADAM.eps, weight_decay=0.0)
    with engine.gathered_params():
        loss_and_penalty(m).backward()
        try:
            engine.step()
            said = "stepped"
        except RuntimeError as e:
            said = str(e)
    assert said.startswith("step() inside gathered_params() at stage 3") and "\n" not in said, said
    assert engine.step()
    loss_and_penalty(ref).backward()
    opt.step()
    got = full_parameters(engine)
    for name, p in ref.named_parameters():
        torch.testing.assert_close(got[name], p.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_a_step_inside_a_discarding_context_is_refused(stage):
    """``gathered_params(writeback=False)`` (DeepSpeed's ``GatheredParameters`` with no ``modifier_rank``) puts back
    the values it saved at its exit: a step inside was undone there, parameters and master, while Adam's moments
    and the step count advanced (silently). Refused in one line; the step after the exit trains."""
    m = model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=stage, optimizer=ADAM))
    before = {n: v.clone() for n, v in full_parameters(engine).items()}
    m(X).pow(2).sum().backward()
    refused = pytest.raises(RuntimeError, match=r"^step\(\) inside gathered_params\(writeback=False\)")
    with engine.gathered_params(writeback=False), refused:
        engine.optimizer.step()
    assert engine.global_steps == 0
    engine.optimizer.step()
    assert max((full_parameters(engine)[n] - v).abs().max().item() for n, v in before.items()) > 1e-3


def test_a_refused_step_counts_nothing():
    """DeepSpeed's loop at stage 3 with two micro-batches a window: the window's last ``engine.step()`` inside
    ``gathered_params()`` is refused before it counts, so the retry after the exit ends the window and the next
    window's boundary is where DeepSpeed's is. Before, the refused call counted a micro-step and every later
    boundary came one micro-batch early."""
    from zerobench.zero import initialize

    cfg = {
        "train_micro_batch_size_per_gpu": 5,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": 3},
    }
    engine, _, _, _ = initialize(model=model(), config=cfg, units=nn.Linear)
    try:
        boundaries = []
        for micro in range(4):
            boundaries.append(engine.is_gradient_accumulation_boundary())
            engine.backward(engine(X).pow(2).sum())
            if micro == 1:
                with engine.gathered_params(), pytest.raises(RuntimeError, match=r"^step\(\) inside gathered_params"):
                    engine.step()
            engine.step()
        assert boundaries == [False, True, False, True], boundaries
        assert (engine.micro_steps, engine.global_steps) == (4, 2)
    finally:  # initialize made this process a world of one, as DeepSpeed's does: later tests in it need none
        torch.distributed.destroy_process_group()


def test_a_context_whose_gather_raised_leaves_no_refusal_behind(monkeypatch):
    """``gathered_params()`` counts as open once it has entered: a gather that raises on entry (a collective that
    failed) must not leave later steps refused as "inside gathered_params"."""
    from zerobench.zero.stage3.unit import ParamUnit

    m = model()
    engine = apply_zero(m, ONE, ZeroConfig(stage=3, optimizer=ADAM), units=nn.Linear)

    def broken(self):
        raise RuntimeError("gather failed")

    with monkeypatch.context() as patch:
        patch.setattr(ParamUnit, "finish_gather", broken)
        with pytest.raises(RuntimeError, match="gather failed"), engine.gathered_params():
            pass
    m(X).pow(2).sum().backward()
    assert engine.step()
