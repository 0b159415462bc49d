"""Parameter count and FLOPs formulas equal the module and a hand count."""

from __future__ import annotations

import pytest
import torch

from zerobench.config import ConfigError
from zerobench.models.gpt import GPT, GPTConfig
from zerobench.models.sizes import PRESETS, flops_per_token, num_params, preset


@pytest.mark.parametrize(
    "cfg",
    [*PRESETS.values(), GPTConfig(layers=3, hidden=48, heads=6, vocab=1000, seq=17)],
    ids=[*PRESETS, "odd"],
)
def test_num_params_equals_module(cfg):
    with torch.device("meta"):
        model = GPT(cfg)
    assert num_params(cfg) == sum(p.numel() for p in model.parameters())


def test_small_preset_is_about_100m():
    assert 90e6 < num_params(PRESETS["small"]) < 110e6


def test_flops_hand_count():
    # L=1, h=2, s=3, V=5. Forward matmul FLOPs per token: QKV 2*h*3h=24, proj 2*h*h=8, fc 2*h*4h=32,
    # fc2 2*4h*h=32 -> 96 = 24h^2; scores QK^T 2*s*h=12 and AV 2*s*h=12 -> 24 = 4sh; head 2*V*h = 20.
    cfg = GPTConfig(layers=1, hidden=2, heads=1, vocab=5, seq=3)
    fwd_block, head = 96 + 24, 20
    assert flops_per_token(cfg) == 3 * (fwd_block + head)
    assert flops_per_token(cfg, recompute=True) == 4 * fwd_block + 3 * head


def test_flops_matches_megatron_closed_form():
    cfg = PRESETS["small"]
    L, h, s, V = cfg.layers, cfg.hidden, cfg.seq, cfg.vocab
    megatron = 72 * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))  # Narayanan et al. 2021, per token
    assert flops_per_token(cfg) == pytest.approx(megatron)


def test_forward_shapes_and_loss():
    cfg = PRESETS["tiny"]
    model = GPT(cfg)
    x = torch.randint(0, cfg.vocab, (2, cfg.seq))
    assert model(x).shape == (2, cfg.seq, cfg.vocab)
    loss = model(x, torch.randint(0, cfg.vocab, (2, cfg.seq)))
    # at init the prediction is near-uniform: loss ~ ln(V)
    assert abs(loss.item() - torch.log(torch.tensor(float(cfg.vocab))).item()) < 0.5
    assert model.lm_head.weight is model.wte.weight


def test_invalid_model_configs():
    with pytest.raises(ConfigError, match="not divisible by heads"):
        GPT(GPTConfig(hidden=64, heads=5))
    with pytest.raises(ConfigError, match="unknown model preset"):
        preset("huge")
