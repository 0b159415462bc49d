"""Activation checkpointing keeps ``torch.utils.checkpoint``'s contract (its own tests' cases), in one process.

Each case was silently wrong before: the recompute ran outside the forward's autocast (fp32 activations
differentiated for a bf16 forward: 7.5e-3 off); ``torch.autograd.grad`` through a checkpointed block filled every
``.grad`` of the block (a following step saw twice its gradient); a block input changed in place after its forward
gave wrong gradients without a word; and a second argument of a block was taken as its forward function. Extra
arguments now reach the recompute, so a stateful one (an HF ``DynamicCache``, updated a second time by the
recompute) is refused.
"""

from __future__ import annotations

import copy
import enum

import pytest
import torch
from torch import nn

from zerobench.parallel.checkpointing import apply_activation_checkpointing
from zerobench.parallel.config import ActivationConfig

CONFIGS = {
    "recompute": ActivationConfig(checkpoint=True),
    "contiguous": ActivationConfig(checkpoint=True, contiguous=True),
    "cpu": ActivationConfig(checkpoint=True, cpu_offload=True),
}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.out = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x, scale=1.0, mask=None):
        h = torch.nn.functional.dropout(torch.nn.functional.gelu(self.fc(x)), 0.2, self.training)
        if mask is not None:
            h = h * mask
        return x + scale * self.out(h)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.blocks = nn.ModuleList(Block() for _ in range(3))

    def forward(self, x, **kw):
        h = self.embed(x)
        for b in self.blocks:
            h = b(h, **kw)
        return h.pow(2).mean()


def _pair(cfg: ActivationConfig | None = None):
    torch.manual_seed(0)
    plain = Model()
    ckpt = copy.deepcopy(plain)
    store = apply_activation_checkpointing(ckpt, cfg or CONFIGS["recompute"])
    return plain, ckpt, store


def _grads(model, x, seed=1, **kw):
    torch.manual_seed(seed)  # the same dropout masks in both models
    model(x, **kw).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


X = torch.randn(5, 4, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_recompute_runs_under_the_forwards_autocast(name):
    plain, ckpt, _ = _pair(CONFIGS[name])
    dtypes = []
    ckpt.blocks[1].fc.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.manual_seed(1)
        plain_loss = plain(X)
        torch.manual_seed(1)
        ckpt_loss = ckpt(X)
    plain_loss.backward()
    ckpt_loss.backward()  # outside autocast, as training loops call it
    assert dtypes == [torch.bfloat16, torch.bfloat16]  # the forward, then the recompute
    assert _same({n: p.grad for n, p in plain.named_parameters()}, {n: p.grad for n, p in ckpt.named_parameters()})


def test_autograd_grad_through_a_checkpointed_block_is_refused_and_fills_no_grad():
    _, ckpt, _ = _pair()
    with pytest.raises(RuntimeError) as e:
        torch.autograd.grad(ckpt(X), [ckpt.embed.weight])
    assert "torch.autograd.grad or backward(inputs=...) through activation-checkpointed block" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(RuntimeError, match="through activation-checkpointed block"):
        ckpt(X).backward(inputs=[ckpt.embed.weight])
    assert [n for n, p in ckpt.named_parameters() if p.grad is not None] == []


def test_an_input_changed_in_place_after_its_forward_is_refused():
    """Plain recompute keeps the input itself (M_D and P_a+cpu keep a copy, which an edit cannot reach)."""
    plain, ckpt, _ = _pair()
    for model in (plain, ckpt):
        x = torch.randn(5, 8, requires_grad=True)
        h = x * 1.0
        out = model.blocks[0](h).sum()
        h.mul_(0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.backward()


def test_a_mask_changed_in_place_after_its_forward_is_refused():
    _, ckpt, _ = _pair()
    mask = torch.ones(5, 16)
    out = ckpt(X, mask=mask)
    mask.zero_()
    with pytest.raises(RuntimeError, match="modified by an inplace operation: an input of activation-checkpointed"):
        out.backward()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_blocks_other_arguments_reach_it_at_the_forward_and_the_recompute(name):
    plain, ckpt, _ = _pair(CONFIGS[name])
    mask = (torch.rand(5, 16, generator=torch.Generator().manual_seed(3)) > 0.3).float()
    assert _same(_grads(plain, X, scale=0.5, mask=mask), _grads(ckpt, X, scale=0.5, mask=mask))
    h = torch.randn(5, 8, requires_grad=True)
    outs = []
    for model in (plain, ckpt):
        torch.manual_seed(4)
        outs.append(model.blocks[0](h, 0.5))  # a second positional argument was taken as the forward function
    assert torch.equal(outs[0], outs[1])
    with pytest.raises(ValueError, match="got an argument besides its input that needs a gradient"):
        ckpt.blocks[0](h, torch.tensor(2.0, requires_grad=True))


def test_a_block_after_frozen_embeddings_runs_plainly_and_trains_right():
    """Its parameters stay in the loss's own graph: the engine sees there that a plain ``loss.backward()`` trains
    them (with every trained parameter inside recomputes, it would see none)."""
    plain, ckpt, store = _pair()
    for m in (plain, ckpt):
        m.embed.requires_grad_(False)
    assert _same(_grads(plain, X), _grads(ckpt, X))
    assert store.peak["activation_checkpoints"] == 2 * X.shape[0] * 8 * 4  # blocks 1 and 2


class Cache:
    """A stateful argument, as HF's ``DynamicCache``: each call appends."""

    def __init__(self):
        self.seen = []


class Wrapped(nn.Module):
    """A block taking a config object and a shared module as arguments (stateless: they may reach the recompute)."""

    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x, mode=None, act=None):
        return act(self.block(x)) if mode is Mode.ACT else self.block(x)


class Mode(enum.Enum):
    PLAIN = 0
    ACT = 1


def test_a_stateful_or_nested_gradient_argument_is_refused():
    _, ckpt, _ = _pair()
    h = torch.randn(5, 8, requires_grad=True)
    for stateful, name in ((Cache(), "Cache"), (torch.Generator(), "Generator")):
        with pytest.raises(ValueError) as e:
            ckpt.blocks[0](h, 1.0, stateful)
        assert f"got a {name} argument, which the recompute would use a second time" in str(e.value)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="got an argument besides its input that needs a gradient"):
        ckpt.blocks[0](h, 1.0, (torch.ones(16, requires_grad=True),))


def test_stateless_objects_reach_the_recompute():
    """An enum, a module and a function as arguments: refused by the first version of the argument check."""
    torch.manual_seed(0)
    plain = nn.Module()
    plain.blocks = nn.ModuleList([Wrapped(), Wrapped()])
    ckpt = copy.deepcopy(plain)
    apply_activation_checkpointing(ckpt, CONFIGS["recompute"])
    grads = []
    for model in (plain, ckpt):
        h = torch.randn(5, 8, generator=torch.Generator().manual_seed(5), requires_grad=True)
        torch.manual_seed(1)
        for b in model.blocks:
            h = b(h, Mode.ACT, act=nn.Tanh())
        h.pow(2).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert _same(*grads)


def test_without_anything_to_differentiate_the_block_runs_plainly():
    _, ckpt, store = _pair()
    ckpt.requires_grad_(False)
    assert not ckpt(X).requires_grad
    assert store.peak["activation_checkpoints"] == 0
