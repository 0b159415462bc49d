"""A ``.grad`` assigned by the user on two ranks, where it would be ignored or the replicas would step apart: refused
on every rank in one line (``zero/grads/replaced.py``); and DeepSpeed's ``safe_set_full_grad``, which sets a
gradient at every stage."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from tests.helpers.dist import run_distributed
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
        (0, False, "set with no backward in this window .* never averaged over the 2 DP ranks"),
    ],
)
def test_on_several_ranks_what_would_be_ignored_or_diverge_is_refused(stage, backward, says):
    for msg in run_distributed(_on_two_ranks, 2, stage, backward, timeout=120):
        assert "\n" not in msg and msg.startswith("step(): parameter '0.weight''s .grad was "), msg
        assert re.search(says, msg), msg


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


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_safe_set_full_grad_is_the_gradient_the_step_trains_on(stage):
    """DeepSpeed's ``safe_set_full_grad`` at every stage on two ranks: read back as set, and two steps on set
    gradients end where torch's AdamW does on them."""
    for r in run_distributed(_set_full_grad, 2, stage, timeout=120):
        assert r["roundtrip"] and r["diff"] < 1e-5, r
