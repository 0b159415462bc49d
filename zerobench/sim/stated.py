"""Stated hardware: the figures a profile of a GPU cluster we cannot run is built from, each with its source.

A ``StatedDevice`` is data: peaks and bandwidths from vendor data sheets, achieved fractions from published
measurements (nccl-tests, GEMM benchmarks), and assumptions marked as such. ``stated_profile`` turns one
into a ``Profile`` the replay can use (``zerobench.sim.gpu_costs``). The one free factor per device,
``compute_scale`` (how much slower the framework's kernels run than the roofline of their FLOPs and bytes),
is fitted on a non-ZeRO anchor in ``zerobench.sim.paper`` and printed with it; every ZeRO figure of the
paper stays out of the fit.

Sources (cited by address; figures are read from them, nothing is copied):
- [v100-ds] NVIDIA Tesla V100 data sheet: 125 TFLOP/s fp16 tensor core (SXM3 32 GB, 130 in DGX-2H's
  higher-clocked V100s, which is what Megatron-LM's "39 TFLOP/s = 30% of peak" implies), 15.7 TFLOP/s fp32,
  900 GB/s HBM2.
- [volta-wp] NVIDIA Tesla V100 GPU Architecture whitepaper (2017), Table 1: peak FP16 (non-Tensor) 31.4 TFLOP/s
  on the SXM2 V100; taken at the same clock ratio as the tensor-core peak here.
- [dgx2] NVIDIA DGX-2 data sheet and the ZeRO paper's §10.1: 16 GPUs on NVSwitch, 8 x 100 Gb/s EDR
  InfiniBand per node; PCIe gen3 x16 to the host.
- [a100-ds], [h100-ds] NVIDIA A100 (312 TFLOP/s bf16, 2.0 TB/s HBM2e, 80 GB; the 40 GB SXM part 1,555 GB/s
  HBM2) and H100 SXM (989 TFLOP/s
  dense bf16, 3.35 TB/s HBM3, 80 GB) data sheets; DGX A100 (8 x 200 Gb/s HDR) and DGX H100 (8 x 400 Gb/s NDR).
- [gemm-v100] Baidu DeepBench's V100 training GEMMs (https://github.com/baidu-research/DeepBench,
  results/train/DeepBench_NV_V100.xlsx at da81ba7, sheet "Results - FP16 ip, Mixed math": cublasGemmEx with
  tensor cores, CUDA 10.1, a DGX-1's V100-SXM2, 125 TFLOP/s). Its 76 GEMMs with every side at least 512 run
  at 59-112 TFLOP/s; the fastest, 4096 x 7000 x 4096, at 112.3 (0.898). The GEMM model's ceiling is fitted
  on those 76 (least squares on log efficiency, as the H100's on XLA's table): 0.849 at 8192^3, median
  error 3.3% over them;
  NVIDIA's "Matrix Multiplication Background" guide
  (https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/) for why smaller
  GEMMs fall below it (tile and wave quantisation, arithmetic intensity: the roofline used here).
- [nccl-issue] Issue #22's stated figures: 8 x V100 NVLink all-reduce plateaus near 130 GB/s bus bandwidth;
  100 Gb/s IB gives about 12 GB/s per card.
- [nccl-tune] NCCL 2.8's tuning model (NVIDIA/nccl src/graph/tuning.cc): every collective's latency per step and
  protocol, and its bus bandwidth on sm80 capped at 235 GB/s (``zerobench.sim.nccl``).
- [gemm-xla] XLA's measured bf16 matmul table for H100 (``zerobench.sim.gemm``): the H100's GEMM ceiling, and the
  tile, prologue and launch costs every device's GEMMs are modelled with.
- [fa2] Dao 2023, FlashAttention-2 (arXiv 2307.08691): "optimized GEMM can reach up to 80-90% of the theoretical
  maximum device throughput" on A100 (§1).
- [sms] SM counts from the data sheets: V100 80, A100 108, H100 SXM 132.
- [mamf] S. Bekman, ml-engineering, compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS comparison
  table": the best bf16 ``matmul`` over a search of shapes, CUDA 12.1. A100 SXM 267.9 of 312 TFLOP/s (85.9%);
  H100 SXM 792.1 of 989 (80.1%).
- [nccl-channels] The channels NCCL runs a collective on (one thread block, so one SM, each), as published
  NCCL_DEBUG=INFO logs print them ("Channel 23/24"): 24 on an 8-GPU HGX A100 with NVSwitch
  (https://github.com/NVIDIA/nccl-tests/issues/100), 16 on H100 nodes in a 24-rank ring across three
  (https://github.com/NVIDIA/nccl/issues/1453). NCCL picks the count by topology and version: taking each
  figure for every node count of its device class is [assumed]. None found for a DGX-2's V100s.
- [mlperf-dgx2] MLPerf Training v0.6, NVIDIA's closed-division results
  (https://github.com/mlcommons/training_results_v0.6 at f312518, ``NVIDIA/results/dgx2_ngc19.05_*`` and
  ``dgx2h_ngc19.05_*``, systems ``dgx2_ngc19.05_pytorch.json`` and ``dgx2h_ngc19.05_pytorch.json``): the same five
  benchmarks in the same containers (PyTorch/MXNet 19.05, CUDA 10.1, cuBLAS 10.2, NCCL 2.4.6) on one DGX-2 (16
  "Tesla V100-SXM3-32GB", Xeon 8168) and one DGX-2H (16 "Tesla V100-SXM3-32GB-H", Xeon 8174). Median training
  epoch, DGX-2H's over DGX-2's: Transformer 192.37 / 216.82 s = 0.887, GNMT 146.92 / 162.66 = 0.903, ResNet-50
  52.00 / 57.08 = 0.911, SSD 12.70 / 13.92 = 0.912, Mask R-CNN 367.49 / 389.97 = 0.942. Their median, 0.911, is
  the DGX-2's speed relative to the DGX-2H; the epochs include what does not scale with the GPU's clock, so the
  GPU-bound part differs by at least that much.
- [assumed] Assumptions with no measurement behind them here; each is named where used.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StatedDevice:
    """One GPU node type, as stated figures (SI units: FLOP/s, bytes/s, seconds)."""

    name: str
    """What the profile is for, e.g. ``V100-SXM3-32GB DGX-2 (stated)``."""
    peak_flops: float
    """Dense fp16/bf16 tensor-core peak per GPU."""
    peak_flops_fp32: float
    """fp32 (or TF32 where the framework uses it) peak per GPU."""
    hbm_bw: float
    """Device memory bandwidth per GPU."""
    mem_bytes: float
    """Device memory per GPU."""
    gpus_per_node: int
    """GPUs per node (one NVLink/NVSwitch domain)."""
    sms: int
    """Streaming multiprocessors (the GEMM model's waves)."""
    gemm_eff: float
    """Fraction of ``peak_flops`` a large square GEMM (8192³) reaches: the GEMM model is scaled to it."""
    gemm_max: float | None
    """Best fraction of ``peak_flops`` any half-precision GEMM reaches (a published search over shapes): no GEMM
    is charged faster, whatever the shape model extrapolates to beyond the shapes it was fitted on."""
    mem_eff: float
    """Fraction of ``hbm_bw`` an elementwise kernel reaches (the roofline's memory ceiling)."""
    kernel_floor_s: float
    """Shortest time of any kernel (launch and tail)."""
    intra_busbw: float
    """All-reduce bus bandwidth inside a node (nccl-tests' busbw plateau), Simple protocol."""
    nic_bw: float
    """Achieved bandwidth of one network card."""
    nics_per_node: int
    """Network cards per node; every GPU of the node shares them."""
    host_bw: float
    """Device <-> host copy bandwidth per GPU (pinned memory)."""
    peak_flops_fp16_simt: float | None = None
    """Half-precision peak off the tensor cores (the CUDA cores' FMAs), for programs whose GEMMs leave them on
    shapes they cannot tile (``Stack.tensor_core_multiple``); None where no such program runs on the device."""
    relative_speed: float = 1.0
    """Measured speed of this node relative to the node its device class's ``compute_scale`` is fitted on, where
    both sell the same GPU at other clocks and power (a DGX-2 against Megatron-LM's DGX-2H), divided by the ratio
    of their ``peak_flops``: the part of the difference the data sheets' peaks do not state. Device times are
    divided by it (``StatedProfile.scale``); 1 where no such figure is published."""
    nccl_channels: int | None = None
    """Thread blocks (one SM each) NCCL runs a collective on, on this node: while a data-parallel collective
    overlaps the compute, the compute has ``nccl_channels / sms`` fewer SMs (``StatedProfile.interference``).
    None: no published figure, no share charged."""
    adam_bytes_per_element: float = 32.0
    """Bytes one fused Adam step moves per parameter: fp32 master, momentum, variance read and written (24),
    the 2-byte gradient read, the 2-byte parameter written, and the 4-byte fp32 gradient it works on
    [assumed: apex FusedAdam-style kernel, memory bound]."""
    compute_scale: float = 1.0
    """The free factor: compute time = roofline time x this (fitted per device on a non-ZeRO anchor)."""
    hbm_bw_by_mem: dict[int, float] = field(default_factory=dict)
    """Device memory in GB -> ``hbm_bw``, for the same GPU sold with another memory size (``with_memory``)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Field name -> where its value comes from."""

    def with_memory(self, gb: int) -> StatedDevice:
        """The same node with ``gb`` GB cards: that part's memory and, where it differs, its HBM bandwidth."""
        if gb * 1e9 == self.mem_bytes:
            return self
        if gb not in self.hbm_bw_by_mem:
            raise ValueError(f"{self.name} states no {gb} GB part: add its HBM bandwidth to hbm_bw_by_mem")
        return dataclasses.replace(self, mem_bytes=gb * 1e9, hbm_bw=self.hbm_bw_by_mem[gb])

    @property
    def node_net_bw(self) -> float:
        return self.nic_bw * self.nics_per_node


_V100_SOURCES = {
    "peak_flops": "[v100-ds] 125 TFLOP/s fp16 tensor core (SXM3)",
    "peak_flops_fp32": "[v100-ds] 15.7 TFLOP/s fp32",
    "peak_flops_fp16_simt": "[volta-wp] 31.4 TFLOP/s FP16 off the tensor cores (at 125 TFLOP/s's clock)",
    "hbm_bw": "[v100-ds] 900 GB/s HBM2",
    "mem_bytes": "[v100-ds] 32 GB (the paper's GB = 1e9 bytes)",
    "gpus_per_node": "[dgx2] 16 V100 on NVSwitch",
    "gemm_eff": "[gemm-v100] fitted on DeepBench's 76 V100 fp16 GEMMs with every side >= 512: 0.849",
    "gemm_max": "[gemm-v100] DeepBench's fastest V100 fp16 GEMM, 112.3 of 125 TFLOP/s (4096 x 7000 x 4096): 0.898",
    "mem_eff": "[assumed] elementwise kernels at 80% of HBM bandwidth",
    "kernel_floor_s": "[assumed] 5 us per kernel (launch latency; PyTorch eager issues one per op)",
    "intra_busbw": "[nccl-issue] ~130 GB/s all-reduce bus bandwidth over NVLink/NVSwitch",
    "latency": "[nccl-tune] NCCL's per-step latencies (``zerobench.sim.nccl``)",
    "sms": "[sms] 80",
    "nic_bw": "[nccl-issue] 100 Gb/s EDR IB gives about 12 GB/s per card",
    "nics_per_node": "[dgx2] 8 x 100 Gb/s EDR per DGX-2",
    "host_bw": "[assumed] 12 GB/s pinned copies over PCIe gen3 x16 [dgx2]",
}


def _v100(name: str, peak: float, note: str) -> StatedDevice:
    return StatedDevice(
        name=name,
        peak_flops=peak,
        peak_flops_fp32=15.7e12,
        peak_flops_fp16_simt=31.4e12 * peak / 125e12,
        hbm_bw=900e9,
        mem_bytes=32e9,
        gpus_per_node=16,
        sms=80,
        gemm_eff=0.849,
        gemm_max=112.3 / 125,
        mem_eff=0.8,
        kernel_floor_s=5e-6,
        intra_busbw=130e9,
        nic_bw=12e9,
        nics_per_node=8,
        host_bw=12e9,
        sources={**_V100_SOURCES, "peak_flops": note},
    )


DGX2_VS_DGX2H = 0.911
"""[mlperf-dgx2] The median of five MLPerf v0.6 benchmarks' DGX-2H/DGX-2 epoch-time ratios (0.887-0.942)."""


DEVICES: dict[str, StatedDevice] = {
    # The ZeRO paper's cluster: 25 DGX-2 (V100-SXM3-32GB).
    # Its V100s are the DGX-2H's at 350 W and lower clocks: measured 0.911 of its speed, of which the peaks say 125/130.
    "v100-dgx2": dataclasses.replace(
        _v100("V100-SXM3-32GB DGX-2 (stated)", 125e12, _V100_SOURCES["peak_flops"]),
        relative_speed=DGX2_VS_DGX2H / (125 / 130),
        sources={
            **_V100_SOURCES,
            "relative_speed": "[mlperf-dgx2] 0.911 of a DGX-2H's speed (median of 5 MLPerf v0.6 benchmarks), over "
            "the peaks' 125/130",
        },
    ),
    # Megatron-LM's 2019 cluster: DGX-2H (the same node with 450 W, higher-clocked V100s).
    "v100-dgx2h": _v100(
        "V100-SXM3-32GB DGX-2H (stated)",
        130e12,
        "[v100-ds] 130 TFLOP/s: Megatron-LM states 39 TFLOP/s is 30% of peak on its DGX-2H",
    ),
    "a100-dgx": StatedDevice(
        name="A100-SXM4-80GB DGX A100 (stated, uncalibrated)",
        peak_flops=312e12,
        peak_flops_fp32=156e12,
        hbm_bw=2.0e12,
        mem_bytes=80e9,
        gpus_per_node=8,
        sms=108,
        nccl_channels=24,
        gemm_eff=0.85,
        gemm_max=267.9 / 312,
        hbm_bw_by_mem={40: 1.555e12},
        mem_eff=0.8,
        kernel_floor_s=4e-6,
        intra_busbw=230e9,
        nic_bw=24e9,
        nics_per_node=8,
        host_bw=24e9,
        sources={
            "peak_flops": "[a100-ds] 312 TFLOP/s bf16; 156 TF32",
            "hbm_bw": "[a100-ds] 2.0 TB/s",
            "hbm_bw_by_mem": "[a100-ds] the A100 40GB SXM: 1,555 GB/s HBM2",
            "sms": "[sms] 108",
            "nccl_channels": "[nccl-channels] 24 (8-GPU HGX A100, NVSwitch); other node counts [assumed]",
            "gemm_eff": "[fa2] 'up to 80-90%' of peak for optimized GEMMs on A100: 0.85",
            "gemm_max": "[mamf] A100 SXM: 267.9 of 312 TFLOP/s at its best shape (CUDA 12.1)",
            "intra_busbw": (
                "[nccl-tune] NCCL caps sm80's bus bandwidth at 235 GB/s; 230 GB/s over NVLink3 "
                "(600 GB/s per GPU) [assumed]"
            ),
            "nic_bw": "[a100-ds] 200 Gb/s HDR = 25 GB/s line rate; 24 GB/s achieved [assumed]",
            "host_bw": "[assumed] PCIe gen4 x16 pinned copies",
        },
    ),
    "h100-dgx": StatedDevice(
        name="H100-SXM5-80GB DGX H100 (stated, uncalibrated)",
        peak_flops=989e12,
        peak_flops_fp32=495e12,
        hbm_bw=3.35e12,
        mem_bytes=80e9,
        gpus_per_node=8,
        sms=132,
        nccl_channels=16,
        gemm_eff=0.822,
        gemm_max=792.1 / 989,
        mem_eff=0.8,
        kernel_floor_s=3e-6,
        intra_busbw=450e9,
        nic_bw=48e9,
        nics_per_node=8,
        host_bw=50e9,
        sources={
            "peak_flops": "[h100-ds] 989 TFLOP/s dense bf16; 495 TF32",
            "hbm_bw": "[h100-ds] 3.35 TB/s",
            "sms": "[sms] 132",
            "nccl_channels": "[nccl-channels] 16 (H100 nodes, a 24-rank ring across three); other counts [assumed]",
            "gemm_eff": "[gemm-xla] the model fitted on XLA's H100 table puts an 8192^3 bf16 GEMM at 0.822",
            "gemm_max": "[mamf] H100 SXM: 792.1 of 989 TFLOP/s at its best shape (CUDA 12.1)",
            "intra_busbw": "[assumed] ~450 GB/s all-reduce bus bandwidth over NVLink4 (900 GB/s per GPU)",
            "nic_bw": (
                "[h100-ds] 400 Gb/s NDR = 50 GB/s line rate; 48 GB/s achieved [assumed]; the published "
                "H100 rows (llm-foundry) do not state their network: a DGX H100's is taken [assumed]"
            ),
            "host_bw": "[assumed] PCIe gen5 x16 pinned copies",
        },
    ),
}
"""Stated devices by the name ``--profile`` takes (the ``cluster.hardware`` of the paper's suites)."""
