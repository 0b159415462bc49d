"""The megatron-core peer on CPU, as far as Megatron runs there: its GPT built at TP 1 with zerobench's parameter
count and weights, one forward and backward through its wrappers to zerobench's loss, its DDP and optimizer
configured for Megatron's mixed precision, and the one-line refusal of its CUDA-only optimizer. Training with it
(the optimizer's step) runs on a GPU only (``scripts/gpu_first.sh``'s table)."""

from __future__ import annotations

import importlib.util

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.megatron_core import build_without_optimizer
from zerobench.bench.peers import PeersConfig, train_config
from zerobench.peers.registry import SHARDING

pytestmark = [
    pytest.mark.dist,
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed"),
]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_megatron_core_peer_builds_zerobench_gpt_with_megatrons_recipe(precision):
    (got,) = run_distributed(build_without_optimizer, 1, precision)
    assert got["megatron_params"] == got["zerobench_params"] == got["formula"]
    assert got["param_dtypes"] == [f"torch.{'float32' if precision == 'fp32' else 'bfloat16'}"]
    mixed = precision == "bf16"
    assert got["grad_reduce_in_fp32"] is mixed and got["main_grad_dtypes"] == ["torch.float32"]
    assert got["optimizer"] == {
        "optimizer": "adam",
        "lr": 1e-3,
        "weight_decay": train_config(PeersConfig(systems=("torch-ddp",)), "torch-ddp").zero.optimizer.weight_decay,
        "adam_beta1": 0.9,
        "adam_beta2": 0.95,
        "adam_eps": 1e-8,
        "bf16": mixed,
        "clip_grad": 0.0,
        "use_distributed_optimizer": False,
    }
    assert got["embedding_equal"]
    # a forward and backward through the peer's wrappers: zerobench's loss on the same tokens (bf16 rounds per op)
    assert abs(got["loss"] - got["zerobench_loss"]) <= (1e-5 if precision == "fp32" else 2e-2) * got["zerobench_loss"]
    assert got["main_grads_nonzero"]
    assert got["refused"].startswith("ConfigError: megatron-core: megatron-core's optimizer runs on CUDA only")


def test_megatron_core_and_fsdp2_compiled_are_registered_with_their_sharding():
    assert SHARDING["megatron-core"] == 0 and SHARDING["fsdp2-compiled"] == 3
    p = PeersConfig(systems=("torch-ddp", "megatron-core", "fsdp2-compiled"), precision="bf16", memory_run=False)
    p.validate()
    assert "megatron-core" not in PeersConfig().candidates() and "fsdp2-compiled" not in PeersConfig().candidates()
    assert train_config(p, "megatron-core").system == "megatron-core"
    assert train_config(p, "fsdp2-compiled").zero.precision.value == "bf16"
