"""Stated GPU profiles (``zerobench/sim/stated.py``, ``gpu_costs.py``): where a group sits on the cluster and
what that costs, the compute roofline, and the one fitted factor. No processes, no GPU."""

from __future__ import annotations

import dataclasses

import pytest

from zerobench.sim.gpu_costs import StatedProfile
from zerobench.sim.stated import DEVICES

DGX2 = StatedProfile(DEVICES["v100-dgx2"])
SHAPE = dict(b=8, s=1024, h=8192, heads=64, vocab=51200, tp=1, dtype="fp16", kernels="auto", checkpoint=False,
             ranks=1, threads=1)


def test_every_stated_figure_names_its_source():
    for dev in DEVICES.values():
        for name in ("peak_flops", "hbm_bw", "gemm_eff", "intra_busbw", "nic_bw", "host_bw"):
            assert dev.sources.get(name), f"{dev.name}: {name} has no source"


@pytest.mark.parametrize("group,dim,tp,per_node,nodes,busbw", [
    (25, "dp", 16, 1, 25, 6e9),     # the paper's MP 16: 16 DP rings share a DGX-2's 8 x 12 GB/s
    (128, "dp", 1, 16, 8, 96e9),    # DP only: one group per node has all of its cards
    (100, "dp", 4, 4, 25, 24e9),    # MP 4: four groups share the cards
    (16, "tp", 16, 16, 1, 130e9),   # MP inside the node: NVSwitch
    (32, "tp", 32, 16, 2, 96e9),    # MP across two nodes
    (4, "dp", 4, 4, 1, 130e9),      # a 16-GPU world fits in one node
])
def test_placement_and_bus_bandwidth_on_a_dgx2(group, dim, tp, per_node, nodes, busbw):
    assert DGX2.placement(group, dim, tp) == (per_node, nodes)
    assert DGX2.bus_bandwidth(group, dim, tp) == pytest.approx(busbw)


def test_collective_time_is_latency_plus_bus_bytes():
    n, nbytes = 25, 1e9
    t = DGX2.collective("all_reduce", n, 400, nbytes, dim="dp", tp=16)
    assert t == pytest.approx(DEVICES["v100-dgx2"].inter_alpha_s + 2 * (n - 1) / n * nbytes / 6e9)
    rs = DGX2.collective("reduce_scatter", n, 400, nbytes, dim="dp", tp=16)
    assert rs == pytest.approx(DEVICES["v100-dgx2"].inter_alpha_s + (n - 1) / n * nbytes / 6e9)
    assert DGX2.collective("all_reduce", 1, 400, nbytes) == 0.0


def test_a_large_block_runs_near_its_gemm_ceiling_and_backward_costs_twice():
    fwd = DGX2.op_time("block_fwd", **SHAPE)
    gemm_flops = 24 * 8 * 1024 * 8192**2 + 4 * 8 * 1024**2 * 8192
    ceiling = gemm_flops / (125e12 * DEVICES["v100-dgx2"].gemm_eff)
    assert ceiling < fwd < 1.3 * ceiling  # the GEMMs dominate; elementwise passes add the rest
    bwd = DGX2.op_time("block_bwd", **SHAPE)
    assert bwd == pytest.approx(2 * fwd)
    assert DGX2.op_time("block_bwd", **{**SHAPE, "checkpoint": True}) == pytest.approx(bwd + fwd)


def test_tensor_parallel_shards_the_compute():
    one = DGX2.op_time("block_fwd", **SHAPE)
    sixteen = DGX2.op_time("block_fwd", **{**SHAPE, "tp": 16})
    assert one / 16 < sixteen < one / 8  # smaller GEMMs run further from the ceiling, LayerNorms are not split


def test_compute_scale_multiplies_compute_and_not_the_network():
    slow = DGX2.with_scale(2.0)
    assert slow.op_time("head_fwd", **SHAPE) == pytest.approx(2 * DGX2.op_time("head_fwd", **SHAPE))
    assert slow.cost("adamw", 1, 1e9) == pytest.approx(2 * DGX2.cost("adamw", 1, 1e9))
    assert slow.collective("all_gather", 8, 8, 1e8, "dp") == DGX2.collective("all_gather", 8, 8, 1e8, "dp")


def test_unknown_pieces_are_named():
    with pytest.raises(KeyError, match="no op attention"):
        DGX2.op_time("attention", **SHAPE)
    with pytest.raises(KeyError, match="no cost"):
        DGX2.cost("nvme", 1, 10)


def test_fp32_uses_the_fp32_peak():
    fp32 = DGX2.op_time("block_fwd", **{**SHAPE, "dtype": "fp32"})
    assert fp32 > 5 * DGX2.op_time("block_fwd", **SHAPE)


def test_stated_devices_are_frozen_data():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEVICES["v100-dgx2"].peak_flops = 1.0  # type: ignore[misc]
