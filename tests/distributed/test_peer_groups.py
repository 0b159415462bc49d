"""The torch peers step the parameters zerobench decays with weight decay, and no others (a comparison of step
time and loss between engines that decay different parameters is not one)."""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed

pytestmark = pytest.mark.dist


def _decayed(rank, world_size):
    import torch

    from zerobench.distributed.mesh import build_mesh
    from zerobench.models.sizes import preset
    from zerobench.peers.torch_peers import TorchDDP, TorchFSDP1, TorchFSDP2
    from zerobench.train.config import TrainConfig

    mesh = build_mesh(1, world_size)
    out = {}
    for name, cls in (("fsdp1-full-shard", TorchFSDP1), ("fsdp1-shard-grad-op", TorchFSDP1), ("fsdp2", TorchFSDP2)):
        cfg = TrainConfig(model=preset("tiny"), dp=world_size, system=name, kernels="reference")
        groups = cls(name, cfg, mesh, None, torch.device("cpu")).optimizer.param_groups
        out[name] = sorted((len(g["params"]), g["weight_decay"]) for g in groups)
    cfg = TrainConfig(model=preset("tiny"), dp=world_size, system="torch-ddp", kernels="reference")
    out["torch-ddp"] = sorted(
        (len(g["params"]), g["weight_decay"])
        for g in TorchDDP("torch-ddp", cfg, mesh, None, torch.device("cpu")).optimizer.param_groups
    )
    return out


def test_fsdp1_decays_the_parameters_ddp_does():
    """FSDP1 (use_orig_params) grouped its parameters after wrapping, when each was a 1-D flat shard: none got weight
    decay, and its losses matched DDP's only because the loss-parity tolerance hid the difference."""
    got, _ = run_distributed(_decayed, 2)
    assert got["fsdp1-full-shard"] == got["fsdp1-shard-grad-op"] == got["fsdp2"] == got["torch-ddp"], got
    assert any(n > 0 and wd > 0 for n, wd in got["torch-ddp"])
