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


def _ds3_ledger(rank, world_size):
    import torch

    from zerobench.distributed.mesh import build_mesh
    from zerobench.metrics.comm import CommLedger
    from zerobench.models.sizes import preset
    from zerobench.peers.deepspeed_peer import DeepSpeedSystem
    from zerobench.train.config import TrainConfig
    from zerobench.train.data import SyntheticTokens

    cfg = TrainConfig(model=preset("tiny"), dp=world_size, system="deepspeed-3", kernels="reference")
    s = DeepSpeedSystem("deepspeed-3", cfg, build_mesh(1, world_size), CommLedger(), torch.device("cpu"))
    data = SyntheticTokens(cfg.model.vocab, cfg.model.seq, seed=cfg.seed)
    for step in range(2):
        x, y = data.micro_batch(step, rank, world_size, 0, 2)
        s.forward_backward(x, y)
    params = list(s.engine.module.parameters())
    return {
        "numel": sum(p.ds_numel for p in params),
        "persistent": len(getattr(s.engine.optimizer, "persistent_parameters", [])),
        "ledger": s.memory_ledger(),
    }


@pytest.mark.slow  # DeepSpeed's initialise in two ranks: 8 s on a quiet machine, over a minute under load
def test_deepspeed_3_shards_every_parameter_and_its_ledger_counts_its_gradient_buffer():
    """At the default tiny preset DeepSpeed's persistence threshold (1e5 elements) kept all 28 parameters whole on
    every rank, so deepspeed-3 did not shard like stage 3; and its ledger missed the flat buffer its gradient
    partitions live in. fp32 at DP 2: parameters, gradients and its own fp32 copy at 4 bytes a half, Adam 8."""
    pytest.importorskip("deepspeed")
    got, _ = run_distributed(_ds3_ledger, 2)
    half = got["numel"] // 2
    assert got["persistent"] == 0
    assert got["ledger"]["params"] == got["ledger"]["grads"] == got["ledger"]["master"] == 4 * half, got
    assert got["ledger"]["optimizer_states"] == 8 * half, got
