"""A stated device as a ``Profile``: each piece of a step costed from its FLOPs and bytes, each collective
from where its group sits on the cluster.

Compute: every kernel of the piece (Megatron's GPT block, per TP rank) costs its roofline time,
``max(FLOPs / (peak x gemm_eff), bytes / (HBM x mem_eff), kernel floor)``, times the device's fitted
``compute_scale``. The kernels of one block's forward at T = b x s tokens, h_p = h / tp, a_p = heads / tp,
d = h / heads:

- GEMMs: QKV (T x 3h_p x h), scores (a_p b batches of s x s x d), context (a_p b of s x d x s), the
  attention projection (T x h x h_p), the MLP's two (T x 4h_p x h, T x h x 4h_p); backward runs two GEMMs
  of the same size for each (input and weight gradients), and the recompute the forward once more;
- elementwise (2-byte elements; each "pass" reads or writes the tensor once): 15 passes over T x h (two
  LayerNorms, two dropouts with their masks, two residual adds), 8 over T x h_p (splitting and merging
  heads), 8.5 over a_p b s^2 (scale, mask, softmax, dropout: PyTorch 1.x eager, unfused), 4 over T x 4h_p
  (bias, GeLU); backward twice the passes;
- the head: the LM-head GEMM (T x V/tp x h), the final LayerNorm and a vocab-parallel cross-entropy over
  T x V/tp in fp32 (6 passes forward, 3 backward); the embedding: gather, position add and dropout
  (7.5 passes over T x h), and in backward the gradient of the (V/tp x h) table written once.

Communication: a group of n ranks along ``dp`` (ranks ``tp`` apart) or ``tp`` (adjacent ranks) either fits
in one node (NVLink/NVSwitch: ``intra_busbw``) or spans nodes with k of its ranks per node. Every group of
that dimension communicates at once (all TP ranks reduce the same bucket together), so the
``gpus_per_node / k`` groups on a node share its network cards: bus bandwidth ``node_net_bw x k /
gpus_per_node`` (at most ``intra_busbw``). On a DGX-2 with MP 16, 16 DP rings share 8 x 12 GB/s: 6 GB/s
per GPU, the term a single efficiency cannot capture. Time = latency + bytes x (2(n-1)/n for an
all-reduce, (n-1)/n otherwise) / bus bandwidth (nccl-tests' definition of bus bandwidth).
"""

from __future__ import annotations

import dataclasses

from zerobench.sim.profile import Profile
from zerobench.sim.stated import StatedDevice

_ELEM = {"fp16": 2, "bf16": 2, "fp32": 4}


class StatedProfile(Profile):
    """The ``Profile`` of a ``StatedDevice`` (costs computed, not looked up)."""

    def __init__(self, dev: StatedDevice):
        super().__init__(device=dev.name, cores=1, sources=dict(dev.sources))
        self.dev = dev

    def with_scale(self, compute_scale: float) -> StatedProfile:
        return StatedProfile(dataclasses.replace(self.dev, compute_scale=compute_scale))

    # -- compute -------------------------------------------------------------------------------
    def _peak(self, dtype: str) -> float:
        return self.dev.peak_flops_fp32 if dtype == "fp32" else self.dev.peak_flops

    def _gemm(self, m: float, n: float, k: float, batch: float, elem: int, peak: float) -> float:
        d = self.dev
        flops, nbytes = 2 * m * n * k * batch, elem * (m * k + k * n + m * n) * batch
        return max(flops / (peak * d.gemm_eff), nbytes / (d.hbm_bw * d.mem_eff), d.kernel_floor_s)

    def _stream(self, nbytes: float, kernels: int = 1) -> float:
        d = self.dev
        return max(nbytes / (d.hbm_bw * d.mem_eff), kernels * d.kernel_floor_s)

    def _block(self, b: int, s: int, h: int, heads: int, tp: int, elem: int, peak: float, backward: bool) -> float:
        T, hp, ap, dh = b * s, h // tp, heads // tp, h // heads
        gemms = [(T, 3 * hp, h, 1), (s, s, dh, ap * b), (s, dh, s, ap * b), (T, h, hp, 1), (T, 4 * hp, h, 1),
                 (T, h, 4 * hp, 1)]
        passes = [(T * h, 15, 8), (T * hp, 8, 4), (ap * b * s * s, 8.5, 4), (T * 4 * hp, 4, 2)]
        per = 2 if backward else 1
        t = per * sum(self._gemm(m, n, k, bt, elem, peak) for m, n, k, bt in gemms)
        return t + sum(self._stream(per * n * p * elem, per * kern) for n, p, kern in passes)

    def op_time(self, name: str, *, b: int, s: int, h: int, heads: int, vocab: int, tp: int, dtype: str,
                kernels: str, checkpoint: bool, ranks: int, threads: int) -> float:
        elem, peak, T, vp = _ELEM[dtype], self._peak(dtype), b * s, vocab // tp
        if name == "block_fwd":
            t = self._block(b, s, h, heads, tp, elem, peak, backward=False)
        elif name == "block_bwd":
            t = self._block(b, s, h, heads, tp, elem, peak, backward=True)
            if checkpoint:
                t += self._block(b, s, h, heads, tp, elem, peak, backward=False)
        elif name == "head_fwd":
            t = self._gemm(T, vp, h, 1, elem, peak) + self._stream(T * h * 2 * elem, 2) + self._stream(T * vp * 6 * 4, 6)
        elif name == "head_bwd":
            t = 2 * self._gemm(T, vp, h, 1, elem, peak) + self._stream(T * h * 4 * elem, 4) + self._stream(T * vp * 3 * 4, 3)
        elif name == "embed_fwd":
            t = self._stream(T * h * 7.5 * elem, 3)
        elif name == "embed_bwd":
            t = self._stream(T * h * 3 * elem + vp * h * elem, 2)
        else:
            raise KeyError(f"the stated profile of {self.device} has no op {name}")
        return t * self.dev.compute_scale

    def cost(self, name: str, ranks: int, n: float) -> float:
        """The engine's per-element work on the device: Adam per element, copy/add/memset per byte."""
        passes = {"adamw": self.dev.adam_bytes_per_element, "copy": 2, "add": 3, "memset": 1}
        if name not in passes:
            raise KeyError(f"the stated profile of {self.device} has no cost {name}")
        return self._stream(n * passes[name]) * self.dev.compute_scale if n > 0 else 0.0

    def transfer(self, ranks: int, nbytes: float) -> float:
        return nbytes / self.dev.host_bw + self.dev.kernel_floor_s if nbytes > 0 else 0.0

    # -- communication -------------------------------------------------------------------------
    def placement(self, group: int, dim: str, tp: int) -> tuple[int, int]:
        """(ranks of one group per node, nodes the group spans)."""
        gpn = self.dev.gpus_per_node
        stride = 1 if dim == "tp" else tp
        per_node = max(1, min(group, gpn // stride)) if stride <= gpn else 1
        return per_node, -(-group // per_node)

    def bus_bandwidth(self, group: int, dim: str, tp: int) -> float:
        per_node, nodes = self.placement(group, dim, tp)
        if nodes == 1:
            return self.dev.intra_busbw
        return min(self.dev.intra_busbw, self.dev.node_net_bw * per_node / self.dev.gpus_per_node)

    def collective(self, op: str, group: int, ranks: int, nbytes: float, dim: str = "dp", tp: int = 1) -> float:
        if group <= 1 or nbytes <= 0:
            return 0.0
        _, nodes = self.placement(group, dim, tp)
        alpha = self.dev.intra_alpha_s if nodes == 1 else self.dev.inter_alpha_s
        factor = 2 * (group - 1) / group if op == "all_reduce" else (group - 1) / group
        return alpha + nbytes * factor / self.bus_bandwidth(group, dim, tp)
