"""Stated GPU profiles (``zerobench/sim/stated.py``, ``gpu_costs.py``): where a group sits on the cluster and
what that costs, the compute roofline, and the one fitted factor. No processes, no GPU."""

from __future__ import annotations

import dataclasses

import pytest

from zerobench.sim.gpu_costs import StatedProfile
from zerobench.sim.stated import DEVICES

DGX2 = StatedProfile(DEVICES["v100-dgx2"])
SHAPE = dict(
    b=8, s=1024, h=8192, heads=64, vocab=51200, tp=1, dtype="fp16", kernels="auto", checkpoint=False, ranks=1, threads=1
)


def test_every_stated_figure_names_its_source():
    for dev in DEVICES.values():
        for name in ("peak_flops", "hbm_bw", "gemm_eff", "intra_busbw", "nic_bw", "host_bw"):
            assert dev.sources.get(name), f"{dev.name}: {name} has no source"


@pytest.mark.parametrize(
    "group,dim,tp,per_node,nodes,busbw",
    [
        (25, "dp", 16, 1, 25, 6e9),  # the paper's MP 16: 16 DP rings share a DGX-2's 8 x 12 GB/s
        (128, "dp", 1, 16, 8, 96e9),  # DP only: one group per node has all of its cards
        (100, "dp", 4, 4, 25, 24e9),  # MP 4: four groups share the cards
        (16, "tp", 16, 16, 1, 130e9),  # MP inside the node: NVSwitch
        (32, "tp", 32, 16, 2, 96e9),  # MP across two nodes
        (4, "dp", 4, 4, 1, 130e9),  # a 16-GPU world fits in one node
    ],
)
def test_placement_and_bus_bandwidth_on_a_dgx2(group, dim, tp, per_node, nodes, busbw):
    assert DGX2.placement(group, dim, tp) == (per_node, nodes)
    assert DGX2.bus_bandwidth(group, dim, tp) == pytest.approx(busbw)


def test_collective_time_is_ncclss_latency_plus_bus_bytes():
    """A large all-reduce over 25 nodes (MP 16: 6 GB/s per ring) runs NCCL's ring with the Simple protocol: its
    base latency, 9.6 us per network step (2(n-1) steps, x1.9 for the ring's plateau), plus the bus bytes."""
    n, nbytes = 25, 1e9
    t = DGX2.collective("all_reduce", n, 400, nbytes, dim="dp", tp=16)
    lat = (8.4 + 2 * (n - 1) * 9.6) * 1.9 * 1e-6
    assert t == pytest.approx(lat + 2 * (n - 1) / n * nbytes / 6e9)
    rs = DGX2.collective("reduce_scatter", n, 400, nbytes, dim="dp", tp=16)
    assert rs == pytest.approx((8.4 + (n - 1) * 9.6) * 1e-6 + (n - 1) / n * nbytes / 6e9)
    assert DGX2.collective("all_reduce", 1, 400, nbytes) == 0.0


def test_nccl_latencies_are_nccl_2_8s():
    """``sim/nccl.py`` says it is NCCL 2.8's tuning model: its latency tables are that release's, as
    NVIDIA/nccl v2.8.4-1 ``src/graph/tuning.cc`` states them (``baseLat`` line 56, ``hwLat`` lines 63-70:
    NVLink, then the network; tree then ring; LL, LL128, Simple). 2.7.8 had 1.2 and 50 where 2.8 has 1.25 and 28."""
    from zerobench.sim import nccl

    assert nccl.BASE_LAT == {"tree": (4.4, 4.4, 0.0), "ring": (3.6, 10.0, 8.4)}
    assert nccl.HW_LAT["nvlink"] == {"tree": (0.52, 1.25, 28.0), "ring": (0.47, 1.9, 3.4)}
    assert nccl.HW_LAT["net"] == {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 9.6)}


def test_collective_latency_grows_with_the_ring():
    """A small all-gather is latency: NCCL's ring takes n-1 steps, so 1536 ranks pay about 4x what 384 do."""
    a100 = StatedProfile(DEVICES["a100-dgx"])
    small = [a100.collective("all_gather", n, n, 64e3, "dp", 1) for n in (384, 768, 1536)]
    assert small[0] < small[1] < small[2] and small[2] / small[0] == pytest.approx(4, rel=0.1)
    big = [a100.collective("all_gather", n, n, 4e9, "dp", 1) for n in (384, 1536)]
    assert big[1] / big[0] < 1.2  # a large one is bandwidth: the ring's bus bytes barely grow


def test_deepspeed_2021s_list_collectives_copy_every_tensor_and_zero_and_divide_it():
    """DeepSpeed 2021's list collectives make torch's ProcessGroupNCCL copy each of ``world`` tensors out of (all-gather)
    or into (reduce-scatter) a flat buffer: a kernel per rank, together moving the whole tensor once (read and write).
    Each gather's output is zeroed first (torch.zeros of the gathered size), and each gradient is divided by the
    data-parallel size in place before its reduce-scatter. They are the program's copies beside NCCL's time, scaled as
    every elementwise kernel is; TP collectives and other programs have none."""
    import dataclasses as dc

    from zerobench.sim.software import DEEPSPEED_2021, STACKS

    assert DEEPSPEED_2021.list_copies and DEEPSPEED_2021.zeroed_gathers and DEEPSPEED_2021.predivided_grads
    dev = dc.replace(DEVICES["a100-dgx"], compute_scale=1.04)
    plain = StatedProfile(dev, "megatron-2021")
    ds = StatedProfile(dev, dc.replace(STACKS["megatron-2021"], zero=DEEPSPEED_2021))
    bw, floor = dev.hbm_bw * dev.mem_eff, dev.kernel_floor_s
    for op in ("all_gather", "reduce_scatter"):
        assert ds.collective(op, 768, 768, 1e8) == plain.collective(op, 768, 768, 1e8)  # NCCL's time alone
        assert plain.collective_copies(op, 768, 1e8) == 0.0
    # a small tensor over many ranks: the copies are a floor per rank; the memset is one floor
    assert ds.collective_copies("all_gather", 1536, 1e6) == pytest.approx((1536 * floor + floor) * 1.04)
    # a large one: the copies and the memset are bytes (2 and 1 passes), the division 2 passes
    big = 4 * 12288**2 * 2  # GPT-3 175B's first MLP weight in fp16
    assert ds.collective_copies("all_gather", 128, big) == pytest.approx(3 * big / bw * 1.04)
    assert ds.collective_copies("reduce_scatter", 128, big) == pytest.approx(4 * big / bw * 1.04)
    assert ds.collective_copies("all_reduce", 128, big) == ds.collective_copies("all_gather", 128, big, "tp") == 0.0


def test_fsdp_divides_each_gradient_before_and_its_shard_after_the_reduce_scatter():
    """PyTorch FSDP (torch 1.13-2.1, no communication hook, as llm-foundry's Composer runs it) divides the whole
    unsharded gradient in place by a predivide factor, reduce-scatters it, then divides the shard by the rest of the
    world size where that is above 1. Its factor is torch's own, and the divisions are 2 passes over the whole
    gradient and over the shard, in the reduction's type; its gathers copy nothing."""
    import dataclasses as dc

    from torch.distributed.algorithms._comm_hooks.default_hooks import DefaultState

    from zerobench.sim.software import FSDP_TORCH, STACKS, fsdp_postdivide_factor, fsdp_predivide_factor

    for world in (1, 2, 3, 4, 6, 8, 12, 24, 32, 64, 96, 128, 384, 512, 1120, 2240):
        assert fsdp_predivide_factor(world) == DefaultState._get_gradient_predivide_factor(world), world
    assert fsdp_predivide_factor(64) == fsdp_postdivide_factor(64) == 8 and fsdp_postdivide_factor(2) == 1
    for name in ("llm-foundry", "llm-foundry-flash2"):
        assert STACKS[name].zero is FSDP_TORCH
    dev = dc.replace(DEVICES["h100-dgx"], compute_scale=1.1)
    fsdp = StatedProfile(dev, "llm-foundry", grad_elem=4)
    bw = dev.hbm_bw * dev.mem_eff
    grad = 4 * 321e6  # one 13B block's fp32 gradient
    assert fsdp.collective_copies("reduce_scatter", 64, grad) == pytest.approx((2 * grad + 2 * grad / 64) / bw * 1.1)
    assert fsdp.collective_copies("reduce_scatter", 2, grad) == pytest.approx(2 * grad / bw * 1.1)  # no shard divide
    assert fsdp.collective_copies("all_gather", 64, grad) == fsdp.collective_copies("reduce_scatter", 1, grad) == 0.0


def test_deepspeed_2020s_zero2_reductions_block_backward_and_its_gathers_copy_out():
    """The paper's ZeRO (DeepSpeed 0.2's ZeRO-2, ``overlap_comm`` at its default, false) reduces each bucket in the
    compute stream's order: no reduction overlaps compute, and each is on the critical path. It divides each bucket
    in place before its reduce (2 passes); only its post-step all-gather is a list collective (2 passes of copies,
    a kernel per rank). zerobench's engine, on the same device and GPT, overlaps the reductions with backward; and a
    run without ZeRO (Megatron-LM's own all-reduce) is the same on both stacks."""
    import dataclasses as dc

    from zerobench.sim import paper as P
    from zerobench.sim import paper_runs as R
    from zerobench.sim.simulate import simulate
    from zerobench.sim.software import DEEPSPEED_2020, STACKS, ZeroMachinery

    assert P.PAPER_STACK == "megatron-2019+deepspeed-0.2" and STACKS[P.PAPER_STACK].zero is DEEPSPEED_2020
    assert DEEPSPEED_2020.blocking_reduce and DEEPSPEED_2020.predivided_grads
    assert DEEPSPEED_2020.list_copies == ("all_gather",) and not DEEPSPEED_2020.sync_per_module
    dev = dc.replace(DEVICES["v100-dgx2"], compute_scale=1.2)
    scale = 1.2 / dev.relative_speed  # the DGX-2's measured speed against the fit's DGX-2H
    ds = StatedProfile(dev, P.PAPER_STACK)
    own = StatedProfile(dev, dc.replace(STACKS[P.PAPER_STACK], zero=ZeroMachinery()))  # zerobench's engine
    bw = dev.hbm_bw * dev.mem_eff
    assert ds.collective_copies("reduce_scatter", 25, 1e9) == pytest.approx(2 * 1e9 / bw * scale)
    assert ds.collective_copies("all_gather", 25, 1e9) == pytest.approx(2 * 1e9 / bw * scale)
    assert own.collective_copies("all_gather", 25, 1e9) == own.collective_copies("reduce_scatter", 25, 1e9) == 0.0

    run = next(r for r in P._rows("paper/fig2") if r["label"] == "40B ZeRO")
    cfg = R.train_config(run)
    blocking, overlapped = simulate(cfg, ds), simulate(cfg, own)

    def reduces(res):
        tasks = res["timeline"].tasks
        return [t for t in tasks if t.category == "dp_comm" and t.name.startswith("reduce bucket")]

    def overlap(res):  # seconds of compute that run while a reduction is in flight
        comp = [t for t in res["timeline"].tasks if t.stream == "compute" and t.category == "compute"]
        return sum(max(0.0, min(c.end, r.end) - max(c.start, r.start)) for r in reduces(res) for c in comp)

    assert len(reduces(blocking)) == len(reduces(overlapped)) > 10
    assert overlap(blocking) == 0.0 and overlap(overlapped) > 0.5 * sum(t.seconds for t in reduces(overlapped))
    assert blocking["step_time_s"] > overlapped["step_time_s"]
    assert blocking["breakdown_s"]["dp_comm"] >= sum(t.seconds for t in reduces(blocking)) * (1 - 1e-9)

    base = next(r for r in P._rows("paper/fig2") if r["label"] == "40B Baseline")
    assert simulate(R.train_config(base), ds)["step_time_s"] == simulate(R.train_config(base), own)["step_time_s"]
    stage0 = R.train_config({**run, "stage": 0})  # the engine's all-reduces, bucket by bucket: untouched
    assert len(reduces(simulate(stage0, own))) > 10
    assert simulate(stage0, ds)["step_time_s"] == simulate(stage0, own)["step_time_s"]


def test_deepspeed_2020s_zero1_reduce_scatters_a_list_after_backward():
    """DeepSpeed 0.2's stage 1 (the paper's P_os, Fig 8's C1 and C2) is other code: its reduce-scatter takes a list
    of world inputs, so torch copies them into a flat buffer (2 passes, a kernel per rank) besides the scaling; no
    reduction overlaps backward either."""
    import dataclasses as dc

    from zerobench.sim import paper as P
    from zerobench.sim import paper_runs as R
    from zerobench.sim.simulate import simulate
    from zerobench.sim.software import DEEPSPEED_2020

    z1 = DEEPSPEED_2020.at(1)
    assert z1 is DEEPSPEED_2020.stage1 and DEEPSPEED_2020.at(2) is DEEPSPEED_2020 is DEEPSPEED_2020.at(None)
    assert z1.blocking_reduce and z1.list_copies == ("all_gather", "reduce_scatter")
    dev = dc.replace(DEVICES["v100-dgx2"], compute_scale=1.2)
    scale = 1.2 / dev.relative_speed  # the DGX-2's measured speed against the fit's DGX-2H
    ds = StatedProfile(dev, P.PAPER_STACK)
    bw = dev.hbm_bw * dev.mem_eff
    assert ds.collective_copies("reduce_scatter", 25, 1e9, stage=1) == pytest.approx(4 * 1e9 / bw * scale)
    assert ds.collective_copies("reduce_scatter", 25, 1e9, stage=2) == pytest.approx(2 * 1e9 / bw * scale)
    c1 = R.train_config({**P._c_config("C1"), **P.FIG8_RUN, "micro_batch": 2})
    assert c1.zero.stage == 1
    res = simulate(c1, ds)
    tasks = res["timeline"].tasks
    comp = [t for t in tasks if t.stream == "compute" and t.category == "compute"]
    red = [t for t in tasks if t.category == "dp_comm" and t.name.startswith("reduce bucket")]
    assert red and all(c.end <= r.start or c.start >= r.end for r in red for c in comp)
    assert any(t.name.startswith("reduce bucket") and t.name.endswith(": copies") for t in tasks)


def test_a_large_block_runs_near_its_gemm_ceiling_and_backward_costs_twice():
    """Megatron's 2019 block (score GEMMs materialised): near the GEMM ceiling, and backward is twice the forward up
    to the quantisation of its differently shaped GEMMs (data gradient m x k x n, weight gradient k x n over m) and
    the elementwise passes whose gradients are counted op by op (the scores', the bias additions')."""
    dev = DEVICES["v100-dgx2"]
    paper = StatedProfile(dev, "megatron-2019")
    fwd = paper.op_time("block_fwd", **SHAPE)
    gemm_flops = 24 * 8 * 1024 * 8192**2 + 4 * 8 * 1024**2 * 8192
    ceiling = gemm_flops / (125e12 * dev.gemm_eff)
    assert ceiling < fwd < 1.3 * ceiling  # the GEMMs dominate; elementwise passes add the rest
    bwd = paper.op_time("block_bwd", **SHAPE)
    att, st = paper.stack.attention, paper.stack
    b, s, h, a = SHAPE["b"], SHAPE["s"], SHAPE["h"], SHAPE["heads"]
    per_pass = 2 / (dev.hbm_bw * dev.mem_eff)
    counted = (
        b * a * s * s * (att.score_passes_bwd - 2 * att.score_passes)
        - 2 * b * s * h * (st.bias_adds[0] + st.bias_adds[1])
    ) * (per_pass)
    assert bwd - counted == pytest.approx(2 * fwd, rel=0.03)
    assert paper.op_time("block_bwd", **{**SHAPE, "checkpoint": True}) == pytest.approx(bwd + fwd)


@pytest.mark.parametrize("stack, fwd_passes, bwd_passes", [("megatron-2019", 10.5, 9.5), ("megatron-2021", 4.5, 5.5)])
def test_materialized_scores_backward_passes_are_counted_op_by_op(stack, fwd_passes, bwd_passes):
    """The scores' elementwise backward is what each op's gradient moves, not twice the forward: 2019's eager
    scale, mask product and subtraction, softmax and dropout 10.5 forward and 9.5 backward; 2021's fused
    scale+mask+softmax and dropout 4.5 and 5.5. The score GEMMs double."""
    dev = DEVICES["a100-dgx"]
    prof = StatedProfile(dev, stack)
    b, s, ap, dh = 4, 2048, 16, 128
    peak = dev.peak_flops
    gemms = prof._gemm(s, s, dh, ap * b, 2, peak) + prof._gemm(s, dh, s, ap * b, 2, peak)
    pass_s = b * ap * s * s * 2 / (dev.hbm_bw * dev.mem_eff)
    assert prof._attention(b, s, ap * dh, ap, dh, 2, peak, backward=False) == pytest.approx(gemms + fwd_passes * pass_s)
    assert prof._attention(b, s, ap * dh, ap, dh, 2, peak, backward=True) == pytest.approx(
        2 * gemms + bwd_passes * pass_s
    )


def test_bias_additions_of_their_own_cost_forward_passes_only():
    """A bias the program adds in a kernel of its own (Megatron-LM 2019: QKV's over T x 3h/tp and the MLP's over
    T x 4h/tp, the row-parallel linears' over T x h after the all-reduce; 4 kernels) costs its forward passes; its
    backward is the identity."""
    dev = DEVICES["v100-dgx2"]
    st = StatedProfile(dev, "megatron-2019").stack
    assert st.bias_adds == (4, 14, 4)
    bare = StatedProfile(dev, dataclasses.replace(st, bias_adds=(0.0, 0.0, 0)))
    full = StatedProfile(dev, st)
    b, s, h, heads, tp = 8, 1024, 1536, 16, 4
    args = (b, s, h, heads, tp, 2, dev.peak_flops)
    moved = b * s * (4 * h + 14 * h // tp) * 2 / (dev.hbm_bw * dev.mem_eff)
    got = full._block(*args, backward=False) - bare._block(*args, backward=False)
    assert got == pytest.approx(max(moved, 4 * dev.kernel_floor_s))
    assert full._block(*args, backward=True) == bare._block(*args, backward=True)


def test_flash_attention_never_touches_the_scores():
    """The unfused path pays the b·a·s² passes; flash pays half the score FLOPs (causal): forward and backward (2.5
    times the forward's FLOPs) together at the kernel's published forward+backward rate at the head dimension
    (FlashAttention-2 on an A100 at head dim 64: 140 TFLOP/s), split as its stated fractions split them."""
    shape = {**SHAPE, "h": 768, "heads": 12, "s": 2048, "b": 16}
    a100 = DEVICES["a100-dgx"]
    flash, unfused = StatedProfile(a100, "zerobench"), StatedProfile(a100, "megatron-2019")
    assert flash.op_time("block_fwd", **shape) < 0.6 * unfused.op_time("block_fwd", **shape)
    b, s, h = 16, 2048, 768
    fwd = flash._attention(b, s, h, 12, 64, 2, a100.peak_flops, backward=False) - flash.gemm.launch_s
    bwd = flash._attention(b, s, h, 12, 64, 2, a100.peak_flops, backward=True) - flash.gemm.launch_s
    causal_fwd = 2 * b * s * s * h
    assert fwd + bwd == pytest.approx(3.5 * causal_fwd / 140e12)
    att = flash.stack.attention
    assert bwd / fwd == pytest.approx(2.5 * att.fwd_eff["a100"] / att.bwd_eff["a100"])


def test_zerobenchs_sdpa_runs_cudnns_attention_on_h100_and_flashattention_2_on_a100():
    """zerobench's GPT calls SDPA, which torch 2.11 dispatches to cuDNN's attention on sm90 and FlashAttention-2 on
    sm80. cuDNN is charged FlashAttention-2's published forward+backward rate times cuDNN's advantage over it in the
    FlashAttention-3 paper's one benchmark (head dim 128, seq 2k: forward 484 against 298, backward 465 against 291),
    split between forward and backward as that benchmark's cuDNN bars split it. llm-foundry's flash rows, which ran
    flash-attn 2.4.2, keep FlashAttention-2's figures."""
    from zerobench.sim.software import SDPA_2026, SDPA_FLASH2, STACKS

    assert STACKS["zerobench"].attention is SDPA_2026 and STACKS["llm-foundry-flash2"].attention is SDPA_FLASH2

    def both(f, b):
        return 3.5 / (1 / f + 2.5 / b)

    advantage = both(484, 465) / both(298, 291)
    assert advantage == pytest.approx(1.605, abs=1e-3)
    for dh, fa2 in ((64, 232.0), (128, 265.0)):
        f, b = SDPA_2026.rates("h100", dh, 989e12)
        assert both(f, b) == pytest.approx(fa2 * advantage * 1e12) and b / f == pytest.approx(465 / 484)
    for cls, dh in (("a100", 64), ("a100", 128), ("v100", 64)):
        assert SDPA_2026.rates(cls, dh, 312e12) == SDPA_FLASH2.rates(cls, dh, 312e12)


def test_flash_rates_by_head_dimension():
    """Between the published head dimensions the forward+backward rate is interpolated, outside them the nearest
    is taken; a class with no published figure runs at its stated fractions of peak."""
    from zerobench.sim.software import SDPA_FLASH2, TRITON_FLASH

    def both(att, cls, dh):
        f, b = att.rates(cls, dh, 312e12)
        return 3.5 / (1 / f + 2.5 / b) / 1e12

    assert both(SDPA_FLASH2, "a100", 64) == pytest.approx(140)
    assert both(SDPA_FLASH2, "a100", 96) == pytest.approx(147.5)
    assert both(SDPA_FLASH2, "a100", 256) == pytest.approx(155)
    assert both(TRITON_FLASH, "h100", 128) == pytest.approx(108)
    assert both(TRITON_FLASH, "a100", 64) < both(SDPA_FLASH2, "a100", 64)  # FlashAttention 1 in Triton, slower
    assert both(SDPA_FLASH2, "a100", 32) == pytest.approx(140)
    assert SDPA_FLASH2.rates("v100", 64, 125e12) == (0.40 * 125e12, 0.30 * 125e12)
    # fp32: the published figures are half precision; the stated fractions of the fp32 peak apply
    assert SDPA_FLASH2.rates("a100", 64, 19.5e12, half=False) == (0.615 * 19.5e12, 0.60 * 19.5e12)
    fp32 = StatedProfile(DEVICES["a100-dgx"], "zerobench")
    t = fp32._attention(16, 2048, 768, 12, 64, 4, DEVICES["a100-dgx"].peak_flops_fp32, backward=False)
    assert t - fp32.gemm.launch_s == pytest.approx(
        2 * 16 * 2048**2 * 768 / (0.615 * DEVICES["a100-dgx"].peak_flops_fp32)
    )


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


# (b, m, n, k, TFLOP/s) from XLA's measured sm_90 bf16 matmul table (the GEMM model's source, zerobench/sim/gemm.py)
XLA_H100 = (
    (1, 4096, 4096, 4096, 783.3),
    (2, 4096, 4096, 4096, 807.7),
    (1, 2048, 2048, 2048, 632.0),
    (1, 4096, 4096, 256, 392.2),
    (1, 4096, 1024, 1024, 488.1),
    (4, 1024, 2048, 2048, 712.7),
    (1, 256, 2048, 256, 41.8),
    (1, 512, 256, 256, 11.5),
    (2, 512, 512, 2048, 216.5),
    (1, 4096, 512, 4096, 650.0),
    (1, 256, 4096, 4096, 412.0),
    (1, 1024, 256, 1024, 68.3),
)


def test_the_gemm_model_reproduces_its_published_benchmark():
    """The H100's GEMM model against entries of the table it was fitted on: small GEMMs are launch-bound, thin ones
    wave-quantised, large ones near 0.8 of peak."""
    import statistics

    h100 = StatedProfile(DEVICES["h100-dgx"])
    errs = [abs(h100.gemm.efficiency(m, n, k, b, 989e12) * 989 / tf - 1) for b, m, n, k, tf in XLA_H100]
    assert statistics.median(errs) < 0.08 and max(errs) < 0.3


# Baidu DeepBench, results/train/DeepBench_NV_V100.xlsx at da81ba7, sheet "Results - FP16 ip, Mixed math"
# (cublasGemmEx with tensor cores, CUDA 10.1, a DGX-1's V100-SXM2): every GEMM with all sides >= 512, as
# (m, n, k, TFLOP/s), in the sheet's order (its transposed variants included).
DEEPBENCH_V100 = (
    (1760, 7000, 1760, 89.4),
    (2048, 7000, 2048, 98.0),
    (2560, 7000, 2560, 103.8),
    (4096, 7000, 4096, 112.3),
    (1760, 7000, 1760, 94.1),
    (2048, 7000, 2048, 99.0),
    (2560, 7000, 2560, 96.5),
    (4096, 7000, 4096, 109.4),
    (1760, 7133, 1760, 97.8),
    (2048, 7133, 2048, 104.1),
    (2560, 7133, 2560, 105.2),
    (4096, 7133, 4096, 108.8),
    (5124, 9124, 1760, 94.4),
    (5124, 9124, 2048, 96.1),
    (5124, 9124, 2560, 96.6),
    (5124, 9124, 4096, 103.5),
    (5124, 9124, 1760, 95.0),
    (5124, 9124, 2048, 98.0),
    (5124, 9124, 2560, 92.1),
    (5124, 9124, 4096, 104.1),
    (3072, 7435, 1024, 102.6),
    (7680, 5481, 2560, 108.6),
    (1024, 700, 512, 40.8),
    (1024, 700, 512, 38.6),
    (7680, 24000, 2560, 104.8),
    (6144, 24000, 2048, 106.2),
    (4608, 24000, 1536, 98.6),
    (8448, 24000, 2816, 106.8),
    (3072, 24000, 1024, 93.8),
    (7680, 48000, 2560, 105.4),
    (6144, 48000, 2048, 107.3),
    (4608, 48000, 1536, 99.8),
    (8448, 48000, 2816, 107.6),
    (3072, 48000, 1024, 95.3),
    (7680, 24000, 2560, 95.7),
    (6144, 24000, 2048, 104.8),
    (4608, 24000, 1536, 93.3),
    (8448, 24000, 2816, 102.3),
    (3072, 24000, 1024, 89.7),
    (7680, 48000, 2560, 96.1),
    (6144, 48000, 2048, 105.7),
    (4608, 48000, 1536, 94.4),
    (8448, 48000, 2816, 102.8),
    (3072, 48000, 1024, 90.8),
    (512, 24000, 2816, 101.9),
    (512, 24000, 2048, 100.7),
    (512, 24000, 2560, 97.5),
    (512, 24000, 1530, 93.5),
    (1024, 24000, 2816, 102.6),
    (1024, 24000, 2048, 102.1),
    (1024, 24000, 2560, 100.7),
    (1024, 24000, 1530, 96.2),
    (512, 24000, 2816, 98.6),
    (512, 24000, 2048, 99.5),
    (512, 24000, 2560, 92.8),
    (512, 24000, 1530, 89.5),
    (1024, 24000, 2816, 99.4),
    (1024, 24000, 2048, 103.8),
    (1024, 24000, 2560, 95.1),
    (1024, 24000, 1530, 91.7),
    (512, 48000, 2816, 101.6),
    (512, 48000, 2048, 101.9),
    (512, 48000, 2560, 98.4),
    (512, 48000, 1530, 94.7),
    (1024, 48000, 2816, 107.7),
    (1024, 48000, 2048, 107.0),
    (1024, 48000, 2560, 105.6),
    (1024, 48000, 1530, 100.5),
    (512, 48000, 2816, 98.7),
    (512, 48000, 2048, 102.4),
    (512, 48000, 2560, 91.5),
    (512, 48000, 1530, 89.8),
    (1024, 48000, 2816, 104.1),
    (1024, 48000, 2048, 106.6),
    (1024, 48000, 2560, 98.9),
    (1024, 48000, 1530, 95.6),
)


def test_the_v100_gemm_ceiling_is_fitted_on_deepbench():
    """The V100's GEMM ceiling (``gemm_eff``) is the least-squares fit on log efficiency over DeepBench's V100 fp16
    GEMMs with every side >= 512, no GEMM above its fastest (``gemm_max``, 112.3 of 125 TFLOP/s); the model then
    reproduces them with a median error under 5%."""
    import math
    import statistics

    from zerobench.sim.gemm import for_ceiling

    dev = DEVICES["v100-dgx2"]
    assert dev.gemm_max == pytest.approx(max(tf for *_, tf in DEEPBENCH_V100) / 125, abs=1e-3)

    def residuals(eff):
        g = for_ceiling(dev.sms, eff, 125e12)
        return [
            math.log(min(g.efficiency(m, n, k, 1, 125e12), dev.gemm_max) * 125 / tf) for m, n, k, tf in DEEPBENCH_V100
        ]

    best = min((sum(r * r for r in residuals(i / 1000)), i / 1000) for i in range(750, 950))[1]
    assert dev.gemm_eff == pytest.approx(best, abs=0.001)
    assert statistics.median(abs(math.exp(r) - 1) for r in residuals(dev.gemm_eff)) < 0.05


def test_thin_tensor_parallel_gemms_lose_efficiency():
    """Megatron-LM 2019's 1.2B at TP 8: the QKV GEMM is 576 columns wide and the projection's k is 192, so they run
    further from the ceiling than at TP 1, and a block's forward shrinks by less than 8x."""
    v100 = StatedProfile(DEVICES["v100-dgx2h"], "megatron-2019")
    T, h = 8 * 1024, 1536
    eff = [v100.gemm.efficiency(T, 3 * h // tp, h, 1, 130e12) for tp in (1, 8)]
    proj = [v100.gemm.efficiency(T, h, h // tp, 1, 130e12) for tp in (1, 8)]
    assert eff[1] < eff[0] and proj[1] < 0.8 * proj[0]
    shape = {**SHAPE, "h": h, "heads": 16}
    assert v100.op_time("block_fwd", **shape) / v100.op_time("block_fwd", **{**shape, "tp": 8}) < 6


def test_a_wider_gradient_reduction_moves_more_bytes():
    """FSDP's DEFAULT mixed precision reduces bf16 gradients in fp32: the replay's reduce-scatters move 4 bytes per
    element, its gathers still 2."""
    from zerobench.sim.paper_runs import train_config
    from zerobench.sim.simulate import simulate

    cfg = train_config(
        dict(
            layers=4,
            hidden=1024,
            heads=16,
            vocab=50368,
            seq=2048,
            gpus=64,
            tp=1,
            micro_batch=1,
            precision="bf16",
            stage=3,
            bucket_size=None,
        )
    )
    dev = DEVICES["h100-dgx"]
    busy = {g: simulate(cfg, StatedProfile(dev, grad_elem=g))["busy_s"]["dp"] for g in (None, 4)}
    assert busy[4] > busy[None]


def test_no_gemm_runs_faster_than_the_best_shape_measured():
    """The H100's shape model is fitted on GEMMs up to 4096 a side; MPT-70b's run 16k x 24k x 8k. Past the fitted
    range it climbs above the best fraction of peak a published search over shapes found (``gemm_max``): no shape is
    charged faster than that, on any device that states one."""
    m, n, k = 16384, 3 * 8192, 8192
    h100 = DEVICES["h100-dgx"]
    assert StatedProfile(h100).gemm.efficiency(m, n, k, 1, h100.peak_flops) > h100.gemm_max  # extrapolated
    for dev in (h100, DEVICES["a100-dgx"]):
        for shape in ((m, n, k), (8192, 8192, 8192), (6144, 17920, 2816)):
            t = StatedProfile(dev)._gemm(*shape, 1, 2, dev.peak_flops)
            assert 2 * shape[0] * shape[1] * shape[2] / t / dev.peak_flops <= dev.gemm_max


def test_backward_sums_each_bias_gradient_over_the_tokens():
    """Each linear's bias gradient is its output gradient summed over the b x s tokens: backward reads
    T x (3h + h + 4h + h) once more than forward's passes double to, on every stack."""
    prof = StatedProfile(DEVICES["a100-dgx"], "llm-foundry")
    b, s, h = 4, 2048, 1024
    no_bias = dataclasses.replace(prof.stack, passes_h=0, passes_hp=0, passes_ffn=0, qkv_split_bwd=0)
    bare = StatedProfile(DEVICES["a100-dgx"], no_bias)
    args = (b, s, h, 16, 1, 2, DEVICES["a100-dgx"].peak_flops)
    fwd, bwd = bare._block(*args, backward=False), bare._block(*args, backward=True)
    lin = sum(bare._linear(b * s, n, kk, 2, args[-1], True) for n, kk in ((3 * h, h), (h, h), (4 * h, h), (h, 4 * h)))
    att = bare._attention(b, s, h, 16, 64, 2, args[-1], backward=True)
    dev = DEVICES["a100-dgx"]
    assert bwd - lin - att == pytest.approx(b * s * 9 * h * 2 / (dev.hbm_bw * dev.mem_eff))
    assert fwd < bwd


@pytest.mark.parametrize(
    "stack, passes", [("zerobench", 12), ("megatron-2021", 6), ("llm-foundry", 6), ("llm-foundry-flash2", 6)]
)
def test_joining_q_k_and_v_gradients_costs_backward_passes_only(stack, passes):
    """q, k and v are views of one projection's output, so their forward is free; backward joins their gradients:
    a concatenation (split, chunk) or a stack (unbind), plus a copy where the projection's view of the joined
    gradient is not one (zerobench). At TP 2 it shrinks with h/tp."""
    dev = DEVICES["a100-dgx"]
    st = StatedProfile(dev, stack).stack
    assert st.qkv_split_bwd == passes
    bare = StatedProfile(dev, dataclasses.replace(st, qkv_split_bwd=0.0))
    full = StatedProfile(dev, st)
    b, s, h, heads, tp = 4, 2048, 2048, 16, 2
    args = (b, s, h, heads, tp, 2, dev.peak_flops)
    assert full._block(*args, backward=False) == bare._block(*args, backward=False)
    moved = b * s * (h // tp) * passes * 2 / (dev.hbm_bw * dev.mem_eff)
    assert full._block(*args, backward=True) - bare._block(*args, backward=True) == pytest.approx(moved)


def test_a_smaller_card_of_the_same_gpu_has_its_own_hbm_bandwidth():
    """The A100 40GB SXM moves 1,555 GB/s, the 80GB 2.0 TB/s: the same node, its elementwise work slower."""
    a100 = DEVICES["a100-dgx"]
    small = a100.with_memory(40)
    assert (small.hbm_bw, small.mem_bytes) == (1.555e12, 40e9) and a100.with_memory(80) is a100
    assert small.peak_flops == a100.peak_flops and small.sources["hbm_bw_by_mem"]
    shape = {**SHAPE, "dtype": "bf16", "h": 1024, "heads": 16, "s": 2048, "b": 8}
    assert StatedProfile(small).op_time("embed_fwd", **shape) > StatedProfile(a100).op_time("embed_fwd", **shape)
    with pytest.raises(ValueError, match="states no 24 GB"):
        a100.with_memory(24)


def test_a_wider_reduction_casts_on_the_reducing_stream():
    """FSDP's DEFAULT casts each unit's bf16 gradients to fp32 on its post-backward stream before reducing them:
    2 bytes read and 4 written per element (1.5 x the 2-byte staging copy), ahead of the reduce-scatter on the DP
    stream, never on the compute stream."""
    from zerobench.sim.paper_runs import train_config
    from zerobench.sim.simulate import simulate

    keys = dict(layers=4, hidden=1024, heads=16, vocab=50368, seq=2048, gpus=64, tp=1, micro_batch=1)
    cfg = train_config(dict(keys, precision="bf16", stage=3, bucket_size=None))
    dev = DEVICES["h100-dgx"]
    tasks = {g: simulate(cfg, StatedProfile(dev, grad_elem=g))["timeline"].tasks for g in (None, 4)}
    casts = [t for t in tasks[4] if t.name.startswith("cast bucket")]
    copies = [t for t in tasks[4] if t.name == "staging copy"]
    assert not [t for t in tasks[None] if t.name.startswith("cast")]
    assert len(casts) == len(copies) > 0 and {t.stream for t in casts} == {"dp"}
    assert [c.seconds for c in casts] == pytest.approx([1.5 * c.seconds for c in copies])
    # the compute's own work is the same; only NCCL's share of the SMs, charged per collective second, grows
    compute = {
        g: sum(t.seconds for t in ts if t.stream == "compute" and t.category != "interference")
        for g, ts in tasks.items()
    }
    assert compute[4] == pytest.approx(compute[None])
    for ts in tasks.values():
        share = sum(t.seconds for t in ts if t.category == "interference")
        stated = dev.nccl_channels / dev.sms
        assert share == pytest.approx(stated * sum(t.seconds for t in ts if t.category == "dp_comm"))


def test_nccl_takes_its_channels_sms_from_the_compute_it_overlaps():
    """A DP collective runs on NCCL's channels, one SM each: a stated device charges the compute that share of its
    SMs for the collective's duration (24 of 108 on an A100 node, 16 of 132 on H100 nodes; none stated for a DGX-2).
    On a published FSDP row the step grows by at most that share of its DP communication, and the critical path
    names it."""
    from zerobench.sim import published_validate as V
    from zerobench.sim.published import load

    assert StatedProfile(DEVICES["a100-dgx"]).interference == pytest.approx(24 / 108)
    assert StatedProfile(DEVICES["h100-dgx"]).interference == pytest.approx(16 / 132)
    assert DGX2.interference == 0.0 and DEVICES["h100-dgx"].sources["nccl_channels"].startswith("[nccl-channels]")

    row = next(r for r in load() if r.id == "foundry-h100-13b-64gpu")
    prof = V._profile(row, 1.0)
    bare = dataclasses.replace(DEVICES[row.device].with_memory(row.gpu_mem_gb), nccl_channels=None)
    without = V._simulate(row, StatedProfile(bare, prof.stack, grad_elem=prof.grad_elem))
    got = V._simulate(row, prof)
    assert "interference" not in without["breakdown_s"] and got["breakdown_s"]["interference"] > 0
    from zerobench.sim.simulate import simulate

    dp_comm = sum(
        t.seconds for t in simulate(V.train_config(V.run_keys(row)), prof)["timeline"].tasks if t.category == "dp_comm"
    )
    grew = got["step_time_s"] - without["step_time_s"]
    assert 0 < grew <= prof.interference * dp_comm * (1 + 1e-9)


def test_llm_foundry_flash2_pays_its_unpadding_copies():
    """llm-foundry's FlashAttention-2 path gathers q, k and v into unpadded tokens and scatters the output back:
    9 passes over T x h/tp forward and 11 backward, each at the elementwise rate, on top of the same block with the
    same kernel and no copies; at TP 2 they shrink with h/tp, down to their kernels' launch floor."""
    from zerobench.sim.software import SDPA_FLASH2, STACKS

    dev = DEVICES["h100-dgx"]
    flash2 = STACKS["llm-foundry-flash2"]
    assert flash2.attention is SDPA_FLASH2 and flash2.attention_io[:2] == (9, 11)
    assert STACKS["llm-foundry"].attention_io == (0, 0, 0, 0)
    with_io = StatedProfile(dev, flash2)
    without = StatedProfile(dev, dataclasses.replace(flash2, attention_io=(0, 0, 0, 0)))
    b, s, h, heads = 4, 2048, 2048, 16
    for tp in (1, 2):
        args = (b, s, h, heads, tp, 2, dev.peak_flops)
        for backward, passes, kernels in ((False, 9, 20), (True, 11, 7)):
            extra = with_io._block(*args, backward=backward) - without._block(*args, backward=backward)
            moved = b * s * (h // tp) * passes * 2 / (dev.hbm_bw * dev.mem_eff)
            assert extra == pytest.approx(max(moved, kernels * dev.kernel_floor_s)), (tp, backward)


def test_composers_train_metrics_run_after_every_micro_batchs_backward():
    """llm-foundry's rows ran Composer, which evaluates MPT's two train metrics (cross entropy and perplexity) on each
    micro-batch's logits after its backward: 36 bytes per logit at the elementwise rate, once per micro-batch, on the
    compute stream once the backward's collectives are done, named ``metrics`` on the critical path. zerobench's
    loop and Megatron-LM compute none."""
    from zerobench.sim import published_validate as V
    from zerobench.sim.profile import LOOP_METRICS
    from zerobench.sim.published import load
    from zerobench.sim.simulate import simulate
    from zerobench.sim.software import STACKS

    assert STACKS["llm-foundry"].metric_bytes == STACKS["llm-foundry-flash2"].metric_bytes == 36
    assert STACKS["llm-foundry"].metric_kernels == STACKS["llm-foundry-flash2"].metric_kernels == 14
    assert {STACKS[k].metric_bytes for k in ("zerobench", "megatron-2019", "megatron-2021")} == {0}
    shape = dict(SHAPE, dtype="bf16")
    assert not StatedProfile(DEVICES["a100-dgx"]).has_op(LOOP_METRICS, **shape)
    with pytest.raises(KeyError, match="no op train_metrics"):
        StatedProfile(DEVICES["a100-dgx"]).op_time(LOOP_METRICS, **shape)

    row = next(r for r in load() if r.id == "foundry-a100-125m-8gpu-mb40")
    assert row.grad_accum == 2
    prof = V._profile(row, 1.0)
    assert prof.has_op(LOOP_METRICS, **shape)
    r = simulate(V.train_config(V.run_keys(row)), prof)
    tasks = r["timeline"].tasks
    metrics = [i for i, t in enumerate(tasks) if t.name == "train metrics"]
    assert r["breakdown_s"]["metrics"] == pytest.approx(sum(tasks[i].seconds for i in metrics))
    dev = prof.dev
    want = row.micro_batch * row.seq * row.vocab * 36 / (dev.hbm_bw * dev.mem_eff)
    assert len(metrics) == row.grad_accum
    for i in metrics:
        t = tasks[i]
        assert t.stream == "compute" and t.category == "metrics" and t.seconds == pytest.approx(want)
        # after the micro-batch's last backward piece and the wait for its collectives
        last_bwd = max(j for j in range(i) if tasks[j].name == "embed_bwd")
        assert t.start >= max(x.end for x in tasks[last_bwd:i] if x.stream == "dp")
    # stage 0 with accumulation: the first micro-batch has no collectives to wait for; each micro-batch's metrics
    # still come between its backward and the next micro-batch's forward
    ddp = V.train_config(dict(V.run_keys(row), stage=0, system="megatron", bucket_size=None))
    tasks = simulate(ddp, prof)["timeline"].tasks
    order = [t.name for t in tasks if t.name in ("embed_fwd", "embed_bwd", "train metrics")]
    assert order == ["embed_fwd", "embed_bwd", "train metrics"] * row.grad_accum
    zb = StatedProfile(dev, STACKS["zerobench"])
    assert not [t for t in simulate(V.train_config(V.run_keys(row)), zb)["timeline"].tasks if t.category == "metrics"]


def test_megatron_2019s_fp16_step_walks_every_tensor_and_reads_two_values_of_each():
    """Megatron-LM 2019's own step (zero_grad tensor by tensor, autograd's add into the zeroed gradients, DDP's divide
    and per-tensor copy back, FP16_Optimizer's overflow check, copies and unscale, mpu's clip_grad_norm) launches ten
    kernels per parameter tensor and reads two values of each on the host. Every TP rank holds a piece of every
    tensor, so the reads and the kernels' floors are the same at TP 1 and TP 8, while the bytes shrink with the
    pieces. The reads are host time, not scaled by ``compute_scale``; the kernels are. With ZeRO (stage 1-3) the engine
    steps instead, and the other programs step over flat buffers."""
    from zerobench.sim import published_validate as V
    from zerobench.sim.layout import engine_buckets
    from zerobench.sim.published import load
    from zerobench.sim.simulate import simulate
    from zerobench.sim.software import STACKS

    rows = {r.id: r for r in load()}
    scale = 1.25
    prof = V._profile(rows["meg19-1.2b-1gpu"], scale)
    dev, loop = prof.dev, STACKS["megatron-2019"].step_loop
    assert [op.read_back for op in loop.per_param].count(True) == 2 and len(loop.per_param) == 10
    bw = dev.hbm_bw * dev.mem_eff
    got = {}
    for rid in ("meg19-1.2b-1gpu", "meg19-1.2b-tp8"):
        row = rows[rid]
        cfg = V.train_config(V.run_keys(row))
        sizes = [x for b in engine_buckets(cfg) for x in b.param_sizes]
        assert len(sizes) == 12 * row.layers + 4  # every block's 12 tensors, the embeddings and the final norm
        r = simulate(cfg, prof)
        tasks = {t.name: t for t in r["timeline"].tasks}
        reads = tasks["host reads in the optimizer step"]
        # a read per tensor twice, the two TP flags read back, and DDP's synchronize: two kernel floors each
        assert reads.category == "host_sync" and reads.seconds == pytest.approx(
            (2 * len(sizes) + 2 + 1) * 2 * dev.kernel_floor_s
        )
        flags = tasks.get("the optimizer step's TP all-reduces")
        if row.tp == 1:
            assert flags is None
        else:
            want = 2 * prof.collective("all_reduce", row.tp, row.gpus, 4, dim="tp", tp=row.tp)
            assert flags.category == "mp_comm" and flags.seconds == pytest.approx(want) and want > 0
        kernels = sum(max(k * op.bytes_per_element / bw, dev.kernel_floor_s) for k in sizes for op in loop.per_param)
        flat = sum(max(sum(sizes) * b / bw, dev.kernel_floor_s) for b in (4, 28))  # DDP's divide, the fused update
        step = tasks["optimizer step, tensor by tensor"]
        assert step.category == "optimizer" and step.seconds == pytest.approx((kernels + flat) * scale)
        assert "optimizer step" not in tasks and r["breakdown_s"]["host_sync"] > 0
        got[rid] = (len(sizes), reads.seconds, step.seconds, sum(sizes))
    (n1, reads1, step1, elems1), (n8, reads8, step8, elems8) = got.values()
    assert n1 == n8 and reads1 == pytest.approx(reads8)
    assert elems8 < elems1 / 7 and step8 < step1 / 4
    assert step8 > len(loop.per_param) * n8 * dev.kernel_floor_s  # the floors stay: 10 x 484 kernels at TP 8

    row = rows["meg19-1.2b-tp8"]
    zero = V.train_config(dict(V.run_keys(row), stage=1))
    names = {t.name for t in simulate(zero, prof)["timeline"].tasks}
    assert "optimizer step" in names and "host reads in the optimizer step" not in names
    for other in ("megatron-2021", "zerobench"):
        assert STACKS[other].step_loop is None
        plain = StatedProfile(dev, STACKS[other])
        tasks = simulate(V.train_config(V.run_keys(row)), plain)["timeline"].tasks
        assert not [t for t in tasks if t.category == "host_sync"]


def test_flash_attn_unpadding_reads_six_values_a_layer_on_the_host():
    """llm-foundry's FlashAttention-2 path unpads q, k and v with flash-attn's unpad_input, whose nonzero and .item()
    make the host wait for the device twice each: six reads per block forward, the device idle for each round trip
    (two kernel floors, host time: not scaled by ``compute_scale``), none in the backward, whose recompute (with
    checkpointing) reads them again. The replay charges them after each block's forward, named ``host_sync``."""
    from zerobench.sim import published_validate as V
    from zerobench.sim.published import load
    from zerobench.sim.simulate import simulate
    from zerobench.sim.software import STACKS

    flash = STACKS["llm-foundry-flash2"]
    assert flash.host_reads == 6
    assert {STACKS[k].host_reads for k in STACKS if k != "llm-foundry-flash2"} == {0}
    dev = dataclasses.replace(DEVICES["h100-dgx"], compute_scale=1.3)
    with_reads, without = StatedProfile(dev, flash), StatedProfile(dev, dataclasses.replace(flash, host_reads=0))
    shape = dict(SHAPE, h=4096, heads=32, dtype="bf16")
    for name, ckpt, reads in (("block_fwd", False, 6), ("block_bwd", False, 0), ("block_bwd", True, 6)):
        s = dict(shape, checkpoint=ckpt)
        assert with_reads.host_reads(name, **s) == pytest.approx(reads * 2 * dev.kernel_floor_s), (name, ckpt)
        assert without.host_reads(name, **s) == 0.0
        assert with_reads.op_time(name, **s) == without.op_time(name, **s)  # the kernels alone
    row = next(r for r in load() if r.id == "foundry-h100ls-1b-512gpu")
    tasks = simulate(V.train_config(V.run_keys(row)), V._profile(row, 1.3))["timeline"].tasks
    reads = [t for t in tasks if t.name == "host reads in block_fwd"]
    assert len(reads) == row.layers * row.grad_accum and not row.recompute
    assert all(t.category == "host_sync" and t.seconds == pytest.approx(12 * dev.kernel_floor_s) for t in reads)


def test_megatron_2019_on_pytorch_1_1_copies_the_cuda_rng_state_around_every_block():
    """Megatron-LM 2019 forks its model-parallel RNG tracker around each layer's attention dropout (a get and a set
    of the CUDA RNG state, twice) and its activation checkpoint gets the state in the forward and gets, sets and
    sets it again around the recompute: 5 copies a layer forward, 7 backward with recompute. On its container's
    PyTorch 1.1 the state is 200 MTGP32 generators on the device, 824,000 bytes, and every get and set is a
    synchronous copy: the device idles for it (at the host bandwidth) and the host's next launch. The paper's own
    runs, on DeepSpeed 0.2's PyTorch 1.2, keep a seed and an offset on the host and pay nothing."""
    from zerobench.sim.software import STACKS

    meg, paper = STACKS["megatron-2019"], STACKS["megatron-2019+deepspeed-0.2"]
    assert meg.rng.state_bytes == 824_000 and paper.rng.state_bytes == 0
    assert {k for k in STACKS if STACKS[k].rng.state_bytes} == {"megatron-2019"}
    assert meg.sources["rng"] and paper.sources["rng"]
    dev = DEVICES["v100-dgx2h"]
    copy = 824_000 / dev.host_bw + dev.kernel_floor_s
    on11, on12 = StatedProfile(dev, meg), StatedProfile(dev, paper)
    for name, ckpt, copies in (
        ("block_fwd", False, 4),
        ("block_bwd", False, 0),
        ("block_fwd", True, 5),
        ("block_bwd", True, 7),
        ("head_fwd", True, 0),
    ):
        s = dict(SHAPE, checkpoint=ckpt)
        assert on11.host_reads(name, **s) == pytest.approx(copies * copy), (name, ckpt)
        assert on12.host_reads(name, **s) == 0.0
        assert on11.op_time(name, **s) == on12.op_time(name, **s)  # the kernels alone


def test_deepspeed_2021s_copies_follow_their_collective_and_the_compute_waits_for_them():
    """The program's copies around a DP collective run on the collective's stream right after it, and what waits for
    the collective (a block's forward after its unit's gather) waits for the copies too."""
    from zerobench.sim import published_validate as V
    from zerobench.sim.published import load
    from zerobench.sim.simulate import simulate

    row = next(r for r in load() if r.id == "nar21-z3-175b-384")
    keys = dict(V.run_keys(row), layers=3, hidden=256, heads=4, vocab=512, seq=128, gpus=64, micro_batch=1)
    tasks = simulate(V.train_config(keys), V._profile(row, 1.0))["timeline"].tasks
    copies = [i for i, t in enumerate(tasks) if t.name.endswith(": copies")]
    assert copies and all(tasks[i].category == "copy" and tasks[i].stream == "dp" for i in copies)
    for i in copies:
        prev = max(j for j in range(i) if tasks[j].stream == "dp")
        assert tasks[i].name == f"{tasks[prev].name}: copies" and tasks[prev].category == "dp_comm"
        assert tasks[i].start == pytest.approx(tasks[prev].end)
    fwd = [i for i, t in enumerate(tasks) if t.name == "block_fwd"]
    assert len(fwd) == 3
    for k, i in enumerate(fwd, start=1):  # block k-1's forward needs unit k, gathered per parameter
        gathered = [j for j in copies if j < i and tasks[j].name.startswith(f"gather unit {k}")]
        assert gathered and tasks[i].start >= max(tasks[j].end for j in gathered)


def test_a_dgx2s_device_times_are_the_dgx2hs_over_its_measured_speed():
    """MLPerf v0.6 measured the DGX-2 at 0.911 of the DGX-2H's speed; the peaks' 125/130 say 0.962 of it, and
    ``relative_speed`` divides the DGX-2's device times by the rest, so a GEMM-bound piece takes 1/0.911 as long."""
    import dataclasses as dc

    from zerobench.sim.stated import DGX2_VS_DGX2H

    h, d = (
        StatedProfile(dc.replace(DEVICES[k], compute_scale=1.0), "megatron-2019") for k in ("v100-dgx2h", "v100-dgx2")
    )
    assert d.dev.relative_speed == pytest.approx(DGX2_VS_DGX2H * 130 / 125)
    shape = dict(b=8, s=1024, h=4096, heads=32, vocab=51200, tp=1, dtype="fp16", kernels="reference")
    th, td = (p.op_time("block_fwd", **shape, checkpoint=False, ranks=1, threads=1) for p in (h, d))
    assert DGX2_VS_DGX2H <= th / td <= 1 / (DGX2_VS_DGX2H * 130 / 125)  # GEMMs at 0.911; HBM-bound kernels at 0.947
    assert h.cost("copy", 1, 1e9) / d.cost("copy", 1, 1e9) == pytest.approx(DGX2_VS_DGX2H * 130 / 125)


def test_cuda_10s_gemms_leave_the_tensor_cores_on_shapes_not_multiples_of_8():
    """CUDA 10's cuBLAS runs an FP16 GEMM on tensor cores only when M, N and K are multiples of 8: a GEMM with k = 100
    (a head of 100) runs at the CUDA cores' peak, about 4x slower where it is compute-bound; cuBLAS 11's programs
    do not pay it; and Megatron-LM's padded vocabulary keeps an MP-1 LM head aligned."""
    import dataclasses as dc

    from zerobench.sim.software import STACKS

    dev = dc.replace(DEVICES["v100-dgx2h"], compute_scale=1.0)
    old, new = (
        StatedProfile(dev, "megatron-2019"),
        StatedProfile(dev, dc.replace(STACKS["megatron-2019"], tensor_core_multiple=None)),
    )
    peak = dev.peak_flops
    slow, fast = old._gemm(8192, 8192, 100, 16, 2, peak), old._gemm(8192, 8192, 104, 16, 2, peak)
    assert slow / fast > 3 and new._gemm(8192, 8192, 100, 16, 2, peak) < 1.1 * fast
    head = dict(
        b=8, s=1024, h=1536, heads=16, tp=1, dtype="fp16", kernels="reference", checkpoint=False, ranks=1, threads=1
    )
    assert old.op_time("head_fwd", vocab=50257, **head) == pytest.approx(old.op_time("head_fwd", vocab=50304, **head))
