"""A collective's time as NCCL's own cost model computes it: latency + bytes / bandwidth, per algorithm and
protocol, and the fastest of them is the one that runs.

The figures are NCCL's, read from its tuning model (NVIDIA/nccl ``src/graph/tuning.cc``, NCCL 2.8, the
release of 2020-2021), ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``:

- Ring, for every collective. The data takes ``nsteps`` steps: 2(n-1) for an all-reduce, n-1 for an
  all-gather or a reduce-scatter. ``nInter`` of them cross nodes: 2(N-1), or N-1. The latency is a base, plus
  a per-step latency for each intra-node step (NVLink) and each network step. The bus bandwidth is the
  topology's for Simple. LL carries 1/4 of it across nodes or in an all-reduce, and 1/3 otherwise. LL128
  carries 0.92 of it, or 0.7 with fewer than two ranks per node. The algorithm bandwidth is
  busBw x n / nsteps. A multi-node Simple ring all-reduce pays 1.9x its latency beyond n/16 x 64 KiB.
- Tree, for an all-reduce. The bandwidth is min(0.9 x busBw, the tree cap): 80 GB/s beyond two nodes
  (105 for LL128 on sm80), and 110 (130) within two. These caps are one figure per node count, a simplification
  of NCCL's per-channel caps times the channel count (``perChMaxTreeBws``, Volta's 10 GB/s beyond two nodes
  times 8 channels is the 80). LL takes 1/3.8 of it and LL128 0.915. The algorithm
  bandwidth is half of that. The latency is 2·((ranks per node - 1)·intra + log2(N)·inter) steps, and
  medium sizes are corrected by NCCL's ``treeCorrectionFactor``.

The topology's bus bandwidth comes from the stated device (``StatedProfile.bus_bandwidth``). Inside a node
it is the NVLink/NVSwitch all-reduce plateau. Across nodes it is the share of the node's network cards
that this group's ranks on the node get, since every group of the dimension runs at once.
"""

from __future__ import annotations

import math

SOURCE = "NVIDIA/nccl src/graph/tuning.cc (NCCL 2.8): ncclTopoTuneModel, ncclTopoGetAlgoTime"
PROTOCOLS = ("LL", "LL128", "Simple")
BASE_LAT = {"tree": (4.4, 4.4, 0.0), "ring": (3.6, 10.0, 8.4)}
"""Microseconds, per protocol (LL, LL128, Simple)."""
HW_LAT = {
    "nvlink": {"tree": (0.52, 1.25, 28.0), "ring": (0.47, 1.9, 3.4)},
    "net": {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 9.6)},
}
"""Microseconds per step, per link kind, algorithm and protocol: 2.8's ``hwLat`` (the network tree's Simple step
is 28 us from 2.8.3 on; 2.7 had 50)."""
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.5, 0.6, 0.6, 0.7, 0.7, 0.8, 0.9, 0.9, 1.0),
    (0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.6, 0.6, 0.7, 0.8, 0.9),
)
"""Per protocol, by log2(bytes / 64): NCCL's static correction of the tree model at medium sizes."""


def _ring(op: str, n: int, nodes: int, nbytes: float, busbw: float, ppn: float) -> float:
    nsteps = 2 * (n - 1) if op == "all_reduce" else n - 1
    inter = 2 * (nodes - 1) if op == "all_reduce" else nodes - 1
    best = math.inf
    for p, proto in enumerate(PROTOCOLS):
        intra_lat = HW_LAT["nvlink"]["ring"][p] * (1.8 if nodes > 1 and proto == "LL" else 1.0)
        per_step = HW_LAT["net" if nodes > 1 else "nvlink"]["ring"][p]
        lat = BASE_LAT["ring"][p] + (nsteps - inter) * intra_lat + inter * per_step
        if proto == "Simple" and nodes > 1 and op == "all_reduce" and nbytes >= n / 16 * 65536:
            lat *= 1.9  # NCCL's "plateau effect of ring"
        bw = busbw
        if proto == "LL":
            bw *= 1 / 4 if (nodes > 1 or op == "all_reduce") else 1 / 3
        elif proto == "LL128":
            bw *= 0.7 if ppn < 2 else 0.92
        best = min(best, lat * 1e-6 + nbytes / (bw * n / nsteps))
    return best


def _tree(n: int, nodes: int, nbytes: float, busbw: float) -> float:
    ppn = n / nodes
    best = math.inf
    log_size = int(math.log2(max(nbytes / 64, 1)))
    for p, proto in enumerate(PROTOCOLS):
        cap = (105e9 if proto == "LL128" else 80e9) if nodes > 2 else (130e9 if proto == "LL128" else 110e9)
        bw = min(busbw * 0.9, cap)
        if proto == "LL":
            bw /= 3.8
        elif proto == "LL128":
            bw *= 7 / 9 if nodes == 1 else 0.915
        if log_size < 22:
            bw *= TREE_CORRECTION[p][log_size]
        link = "net" if nodes > 1 else "nvlink"
        intra = HW_LAT["nvlink"]["tree"][p]
        lat = BASE_LAT["tree"][p] + 2 * ((ppn - 1) * intra + math.log2(nodes) * HW_LAT[link]["tree"][p] * (nodes > 1))
        best = min(best, lat * 1e-6 + nbytes / (bw * 0.5))
    return best


def seconds(op: str, n: int, nodes: int, nbytes: float, busbw: float) -> float:
    """NCCL's predicted time of ``op`` (all_reduce, all_gather, reduce_scatter) over ``n`` ranks on ``nodes``
    nodes moving ``nbytes`` (the collective's full size), with ``busbw`` the topology's Simple-protocol bus
    bandwidth: the fastest algorithm and protocol."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    t = _ring(op, n, nodes, nbytes, busbw, n / nodes)
    if op == "all_reduce" and nodes > 1:
        t = min(t, _tree(n, nodes, nbytes, busbw))
    return t
