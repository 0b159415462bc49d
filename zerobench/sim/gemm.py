"""A GEMM's time from its shape: tile and wave quantisation, the per-tile prologue, split-K and the launch.

NVIDIA's "Matrix Multiplication Background" guide explains why a GEMM of a given (m, n, k) falls short of
the device's peak. Its output is cut into tiles, and each tile is one thread block, which runs on one SM.
Tiles that overhang the matrix still cost a whole tile (tile quantisation). The blocks run in waves of one
block per SM, and a last, partial wave costs a whole wave (wave quantisation). Each tile also pays a fixed
cost before its main loop over k streams at full speed. That cost is ``k_overhead``, in units of k.

Here a tile of Tm x Tn over k costs ``2·Tm·Tn·(k + k_overhead) / (peak / SMs x tile_eff)``. The GEMM costs
``launch + waves x that``, and cuBLAS picks the fastest of its tile shapes. Where the output has too few
tiles to fill the SMs, it may split k into S parts (split-K), at the cost of a reduction kernel.

The constants are fitted on one published GEMM benchmark, never on a training figure. The source is XLA's
measured bf16 matmul table for H100 (sm_90): 73 of its (b, m, n, k) entries from 256 to 4096 a side.
Over those entries the fit has a median error of 4.2% and a worst of 28%: the worst are skinny shapes
with k = 4096, which cuBLAS splits in ways this model does not list. On the table, the model puts a
4096³ GEMM at 0.77 of peak (the table measures 0.79), and a GEMM of 16k x 12k x 4k at 0.82. Other devices keep the fitted launch,
prologue and split-K costs ([assumed]: the same kernel structure). Their ``tile_eff`` is set so that a
large square GEMM lands on the device's own published ceiling (``StatedDevice.gemm_eff``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

TILES = ((256, 128), (128, 256), (128, 128), (64, 128), (128, 64))
"""Output tiles cuBLAS chooses among for half-precision GEMMs (the guide's examples use 256x128 and smaller)."""
SPLITS = (1, 2, 4, 8)
MIN_SPLIT_K = 256
"""Split-K keeps at least this much of k per split."""

XLA_SM90 = (
    "XLA's default matmul performance table for sm_90 (bf16xbf16->bf16), "
    "tensorflow/tensorflow third_party/xla/xla/service/gpu/model/matmul_interpolator_data.h"
)
H100_FIT = dict(tile_eff=0.853, k_overhead=146.2, launch_s=5.40e-6, split_k_s=3.87e-6)
"""Least squares on log time over 73 of ``XLA_SM90``'s entries (132 SMs, 989 TFLOP/s)."""


@dataclass(frozen=True)
class GemmModel:
    """One device's GEMM cost model (see the module docstring)."""

    sms: int
    tile_eff: float
    """Fraction of the per-SM peak a tile's main loop reaches."""
    k_overhead: float = H100_FIT["k_overhead"]
    launch_s: float = H100_FIT["launch_s"]
    split_k_s: float = H100_FIT["split_k_s"]

    @functools.lru_cache(maxsize=4096)  # noqa: B019 (frozen, hashable: the cache is per model and shape)
    def compute_seconds(self, m: int, n: int, k: int, batch: int, peak: float) -> float:
        """Seconds of the tiles' arithmetic (no launch): the fastest tile shape and split."""
        per_sm = peak / self.sms * self.tile_eff
        best = math.inf
        for tm, tn in TILES:
            tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
            for s in SPLITS:
                if s > 1 and (batch > 1 or k / s < MIN_SPLIT_K):
                    continue
                waves = math.ceil(tiles * s / self.sms)
                t = waves * 2 * tm * tn * (k / s + self.k_overhead) / per_sm + (self.split_k_s if s > 1 else 0.0)
                best = min(best, t)
        return best

    def efficiency(self, m: int, n: int, k: int, batch: int, peak: float) -> float:
        """Achieved fraction of ``peak`` including the launch (what a benchmark of this shape reports)."""
        t = self.launch_s + self.compute_seconds(m, n, k, batch, peak)
        return 2 * m * n * k * batch / t / peak


def for_ceiling(sms: int, ceiling: float, peak: float) -> GemmModel:
    """The model for a device with ``sms`` SMs whose large square GEMM (8192³) reaches ``ceiling`` of peak:
    ``tile_eff`` solved so that the shape-dependent losses land exactly there."""
    unit = GemmModel(sms=sms, tile_eff=1.0)
    return GemmModel(sms=sms, tile_eff=ceiling / unit.efficiency(8192, 8192, 8192, 1, peak))
