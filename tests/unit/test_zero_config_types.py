"""``ZeroConfig`` refuses, in one line naming the field, a value of the wrong type or direction that it would
otherwise have trained with silently: ``grad_accum_steps=1.5`` stepped every third micro-batch on twice the window's
mean gradient; ``find_unused_parameters="false"`` (a string from YAML or argparse) meant True; a loss-scale
``backoff_factor`` above 1 raised the scale at every overflow, so every step was skipped and the minimum that stops
training was never reached (``torch.amp.GradScaler`` asserts both factors' directions)."""

from __future__ import annotations

import pytest

from zerobench.config import ConfigError
from zerobench.zero.config import AdamWConfig, LossScaleConfig, LossScaleRule, ZeroConfig


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(grad_accum_steps=1.5), "ZeroConfig.grad_accum_steps must be an int, got 1.5 (float)"),
        (dict(bucket_numel=1e3), "ZeroConfig.bucket_numel must be an int, got 1000.0"),
        (dict(stage=True), "unknown ZeRO stage True"),
        (dict(find_unused_parameters="false"), "ZeroConfig.find_unused_parameters must be true or false, got 'false'"),
        (dict(prefetch="no"), "ZeroConfig.prefetch must be true or false"),
        (dict(overlap_comm=1), "ZeroConfig.overlap_comm must be true or false, got 1 (int)"),
        (dict(clip_grad_norm=True), "ZeroConfig.clip_grad_norm must be a number or None, got True (bool)"),
        (dict(nvme_path=3), "ZeroConfig.nvme_path must be a string or None"),
        (dict(optimizer=AdamWConfig(lr="1e-3")), "ZeroConfig.optimizer.lr must be a number, got '1e-3' (str)"),
        (dict(optimizer=AdamWConfig(betas=(0.9, "x"))), "ZeroConfig.optimizer.betas must be a pair (a number, a n"),
        (dict(loss_scale=LossScaleConfig(backoff_factor=4.0)), "loss-scale backoff factor must be in (0, 1), got 4.0"),
        (dict(loss_scale=LossScaleConfig(backoff_factor=0.0)), "loss-scale backoff factor must be in (0, 1)"),
        (dict(loss_scale=LossScaleConfig(growth_factor=0.5)), "loss-scale growth factor must be a finite number > 1"),
        (dict(loss_scale=LossScaleConfig(init_scale=0.0)), "initial loss scale must be a positive finite number"),
        (dict(loss_scale=LossScaleConfig(init_scale=-8.0)), "initial loss scale must be a positive finite number"),
        (dict(loss_scale=LossScaleConfig(init_scale=float("inf"))), "initial loss scale must be a positive finite"),
        (dict(loss_scale=LossScaleConfig(min_scale=2.0**20)), "minimum loss scale 1.04858e+06 is above the initial"),
        (dict(loss_scale=LossScaleConfig(hysteresis=2.5)), "loss_scale.hysteresis must be an int, got 2.5"),
    ],
)
def test_a_wrong_type_or_direction_is_one_line(kw, words):
    with pytest.raises(ConfigError) as e:
        ZeroConfig(**kw).validate()
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_what_the_types_admit_still_validates():
    """What callers pass that trained before the check: ints where numbers go, numpy's numbers and a 0-dim tensor
    (from a sweep's grid or a schedule), a ``Path`` for a directory."""
    from pathlib import Path

    import numpy as np
    import torch

    ZeroConfig(clip_grad_norm=1, optimizer=AdamWConfig(lr=1, betas=[0.9, 0.99])).validate()  # ints where numbers go
    ZeroConfig(stage=np.int64(2), grad_accum_steps=np.int32(4), optimizer=AdamWConfig(lr=np.float32(1e-3))).validate()
    ZeroConfig(optimizer=AdamWConfig(lr=torch.tensor(1e-3)), nvme_path=Path("/tmp")).validate()
    ZeroConfig(precision="fp16", loss_scale=LossScaleConfig(init_scale=1.0, min_scale=1.0)).validate()
    # a static scale never moves: its factors and minimum are not read
    ZeroConfig(loss_scale=LossScaleConfig(init_scale=0.5, rule=LossScaleRule.STATIC)).validate()


@pytest.mark.parametrize(
    "model, config, words",
    [
        (None, {"stage": 2}, "apply_zero's config must be a ZeroConfig"),
        (None, ZeroConfig(grad_accum_steps=1.5), "ZeroConfig.grad_accum_steps must be an int"),
        ("not a module", ZeroConfig(), "apply_zero's model must be a torch.nn.Module, not function"),
    ],
)
def test_apply_zero_refuses_what_it_cannot_train_in_one_line(model, config, words):
    """A dict where the ``ZeroConfig`` goes was an ``AttributeError`` deep inside; a function where the model goes
    another (DeepSpeed's ``initialize`` takes a dict: the message says so)."""
    from torch import nn

    from zerobench.distributed.collectives import Group
    from zerobench.zero import apply_zero

    m = nn.Linear(2, 2) if model is None else (lambda x: x)
    with pytest.raises(ConfigError) as e:
        apply_zero(m, Group(None, "dp", 1, 0), config)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)
