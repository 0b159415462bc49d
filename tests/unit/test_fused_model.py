"""``apply_fused_kernels`` on the plain GPT: same parameters, same state dict, same losses and gradients as
the unfused model (fp32, to 1e-5), with and without the fused attention softmax and dropout off."""

import copy

import pytest
import torch

from zerobench.models.gpt import GPT
from zerobench.models.sizes import PRESETS
from zerobench.parallel.fused import FusedLayerNorm, FusedMLP, apply_fused_kernels
from zerobench.train.data import SyntheticTokens


def _loss_and_grads(model, x, y):
    model.zero_grad()
    loss = model(x, y)
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("softmax_attention", [False, True])
def test_fused_model_matches_plain_model(softmax_attention):
    cfg = PRESETS["tiny"]
    torch.manual_seed(0)
    plain = GPT(cfg)
    fused = copy.deepcopy(plain)
    assert apply_fused_kernels(fused, "fused", softmax_attention=softmax_attention) == "fused"
    assert sum(isinstance(m, FusedLayerNorm) for m in fused.modules()) == 2 * cfg.layers + 1
    assert sum(isinstance(m, FusedMLP) for m in fused.modules()) == cfg.layers
    assert list(fused.state_dict()) == list(plain.state_dict())
    assert [n for n, _ in fused.named_parameters()] == [n for n, _ in plain.named_parameters()]
    x, y = SyntheticTokens(cfg.vocab, cfg.seq, seed=3).micro_batch(0, 0, 1, 0, 4)
    l0, g0 = _loss_and_grads(plain, x, y)
    l1, g1 = _loss_and_grads(fused, x, y)
    assert abs(l0 - l1) <= 1e-5
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-4, atol=1e-6, msg=n)


def test_reference_mode_leaves_the_model_alone():
    model = GPT(PRESETS["tiny"])
    before = [type(m) for m in model.modules()]
    assert apply_fused_kernels(model, "reference") == "reference"
    assert [type(m) for m in model.modules()] == before


@pytest.mark.parametrize(
    "norm",
    [
        lambda: torch.nn.LayerNorm((4, 8)),
        lambda: torch.nn.LayerNorm(8, elementwise_affine=False),
        lambda: torch.nn.LayerNorm(8, bias=False),
    ],
    ids=["two-dims", "no-affine", "no-bias"],
)
def test_layer_norms_the_kernel_cannot_compute_stay_torchs(norm):
    """The fused LayerNorm normalises the last dimension with a weight and a bias. A model's other LayerNorms were
    swapped too: a (4, 8) one gave outputs 3.08 off with no error, and one without affine parameters crashed in
    forward. They are now left as torch's, and the model's output is the plain model's."""
    torch.manual_seed(0)
    plain = torch.nn.Sequential(norm(), torch.nn.Linear(8, 8))
    if plain[0].weight is not None:
        with torch.no_grad():
            plain[0].weight.normal_()
    fused = copy.deepcopy(plain)
    assert apply_fused_kernels(fused, "fused") == "fused"
    assert type(fused[0]) is torch.nn.LayerNorm
    x = torch.randn(3, 4, 8)
    torch.testing.assert_close(fused(x), plain(x), rtol=0, atol=0)
