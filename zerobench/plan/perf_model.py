"""A stated performance model: compute from FLOPs at an efficiency, plus α–β communication per link class.

step time = compute + MP communication (not overlapped: Megatron's all-reduces sit on the critical path)
            + DP communication not hidden behind backward (a fraction ``dp_overlap`` of the backward
            compute can hide it; stage 1's all-gather and stage 3's forward gathers count as exposed
            except for that overlap too).
compute    = hardware FLOPs per GPU (Megatron count, with recompute when checkpointing) / (peak x efficiency).
ring collectives over n ranks: α·(n−1)·k + bytes moved / β, with bytes moved per the paper's accounting
(k = 2 steps for an all-reduce). MP groups inside a node use the intra-node bandwidth; DP traffic leaves
the node, and all GPUs of a node share its network bandwidth.

Nothing here is fitted to the paper's outcomes: the defaults are the hardware's data-sheet figures and an
efficiency assumption (``efficiency``), which may be calibrated from measured rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerobench.models.sizes import flops_per_token
from zerobench.plan.comm_model import comm_per_gpu
from zerobench.plan.memory_model import PlanConfig


@dataclass(frozen=True)
class Hardware:
    """A GPU node type."""

    name: str
    peak_flops: float
    """Dense fp16/bf16 tensor-core peak per GPU (FLOP/s)."""
    gpus_per_node: int
    intra_bw: float
    """Per-GPU intra-node bandwidth (bytes/s, one direction)."""
    inter_bw_node: float
    """Network bandwidth per node (bytes/s), shared by its GPUs."""
    alpha_intra: float = 5e-6
    """Per-step latency inside a node (s)."""
    alpha_inter: float = 10e-6
    """Per-step latency across nodes (s)."""
    mem_bytes: float = 32e9


HARDWARE = {
    # The paper's DGX-2: 16 x V100-SXM3-32GB, NVSwitch 300 GB/s per link, 8 x 100 Gb/s EDR IB per node.
    "v100-dgx2": Hardware("V100 DGX-2", 125e12, 16, 150e9, 8 * 100e9 / 8, mem_bytes=32e9),
    # DGX A100: 8 x A100-80GB, NVLink 600 GB/s, 8 x 200 Gb/s HDR IB.
    "a100-dgx": Hardware("A100 DGX", 312e12, 8, 300e9, 8 * 200e9 / 8, mem_bytes=80e9),
    # DGX H100: 8 x H100-80GB, NVLink 900 GB/s, 8 x 400 Gb/s NDR IB.
    "h100-dgx": Hardware("H100 DGX", 989e12, 8, 450e9, 8 * 400e9 / 8, mem_bytes=80e9),
}


def project(
    p: PlanConfig, hw: Hardware, efficiency: float = 0.5, dp_overlap: float = 0.5, dtype_bytes: int = 2
) -> dict:
    m = p.model
    tokens_per_replica = p.micro_batch * m.seq
    hw_fpt = flops_per_token(m, recompute=p.checkpoint_activations)
    model_fpt = flops_per_token(m)
    flops_gpu = hw_fpt * tokens_per_replica / p.mp
    t_compute = flops_gpu / (hw.peak_flops * efficiency)
    comm = comm_per_gpu(p)
    # MP: inside a node while MP <= GPUs per node, else across nodes
    mp_bw = hw.intra_bw if p.mp <= hw.gpus_per_node else hw.inter_bw_node / hw.gpus_per_node
    mp_alpha = hw.alpha_intra if p.mp <= hw.gpus_per_node else hw.alpha_inter
    n_mp_collectives = m.layers * (6 if p.checkpoint_activations else 4)
    t_mp = (comm["mp_elements"] + comm["pa_elements"]) * dtype_bytes / mp_bw
    t_mp += n_mp_collectives * 2 * (p.mp - 1) * mp_alpha if p.mp > 1 else 0.0
    # DP: ranks of a DP group sit on different nodes when MP fills a node; bandwidth per GPU is the
    # node's network share, or intra-node when the whole DP group fits in one node.
    dp_in_node = p.dp * p.mp <= hw.gpus_per_node
    dp_bw = hw.intra_bw if dp_in_node else hw.inter_bw_node / min(hw.gpus_per_node, p.gpus)
    t_dp = comm["dp_elements"] * dtype_bytes / dp_bw + (
        2 * (p.dp - 1) * (hw.alpha_intra if dp_in_node else hw.alpha_inter)
    )
    t_bwd = t_compute * (2 / (4 if p.checkpoint_activations else 3))
    t_dp_exposed = max(0.0, t_dp - dp_overlap * t_bwd)
    step = t_compute + t_mp + t_dp_exposed
    hw_tflops = flops_gpu / step / 1e12
    model_tflops = model_fpt * tokens_per_replica / p.mp / step / 1e12
    return {
        "hardware": hw.name,
        "efficiency": efficiency,
        "dp_overlap": dp_overlap,
        "t_compute_s": t_compute,
        "t_mp_s": t_mp,
        "t_dp_s": t_dp,
        "t_dp_exposed_s": t_dp_exposed,
        "step_time_s": step,
        "hw_tflops_per_gpu": hw_tflops,
        "model_tflops_per_gpu": model_tflops,
        "aggregate_pflops": hw_tflops * p.gpus / 1e3,
    }
