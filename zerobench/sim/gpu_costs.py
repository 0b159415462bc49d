"""A stated device as a ``Profile``. Each piece of a step is costed from the kernels a program runs on it
(``software.Stack``), and each collective from where its group sits on the cluster and what NCCL would do
with it.

Compute. Every kernel of the piece (Megatron's GPT block, per TP rank) is costed, and the sum is
multiplied by the device's fitted ``compute_scale`` (divided by its ``relative_speed`` where the node sells the
class's GPU at other clocks and power than the node the class was fitted on):

- GEMMs. A GEMM's time is the launch plus the larger of its tiles' arithmetic (``gemm.GemmModel``: tile and
  wave quantisation, per-tile prologue, split-K; never above the best fraction of peak a published search over
  shapes measured, ``StatedDevice.gemm_max``) and its bytes at HBM bandwidth. A block's forward at
  T = b x s tokens, h_p = h / tp runs QKV (T x 3h_p x h), the attention projection (T x h x h_p) and the
  MLP's two (T x 4h_p x h, T x h x 4h_p). Backward runs the data-gradient GEMM (T x k x n) and the
  weight-gradient GEMM (k x n over T) of each, and the recompute runs the forward once more. Thin
  tensor-parallel GEMMs therefore lose what their shapes lose. Under a program whose cuBLAS needs every
  dimension a multiple of 8 for tensor cores (``Stack.tensor_core_multiple``: CUDA 10), a GEMM with one that is
  not (a head dimension of 100, h / tp = 238) runs at the CUDA cores' half-precision peak.
- Attention, as the stack runs it. ``materialized`` charges the score GEMMs (a_p·b batches of
  s x s x d and s x d x s) and the stack's passes over the b·a_p·s² scores, backward's counted from each op's
  gradient where the stack states them. ``flash`` charges one
  kernel: forward 2·b·s²·h_p FLOPs (causal, half of 4·b·s²·h_p), backward 2.5 times that, together at the
  kernel's published forward+backward rate on the device class at the head dimension, where one is published
  (``Attention.rates``), else at its stated fractions of peak.
- Elementwise work runs at ``mem_eff`` of HBM bandwidth, with a floor of one kernel launch. It is counted
  as the stack's passes over T x h (LayerNorms, residuals, dropouts, replicated across TP ranks),
  T x h_p and T x 4h_p, with backward twice the forward's passes. Backward also sums each linear's output
  gradient over the T tokens for its bias gradient (one read of T x n per linear). A stack that moves q, k
  and v into its attention kernel's layout and back states those passes over T x h_p, forward and backward
  apart (``Stack.attention_io``). Bias additions a program runs as kernels of their own (``Stack.bias_adds``)
  cost their forward passes only, and joining q's, k's and v's gradients back into the projection's costs its
  backward passes only (``Stack.qkv_split_bwd``).
- The head is the LM-head GEMM (T x V/tp x h) and its two backward GEMMs, the final LayerNorm, and the
  stack's loss bytes per logit. The embedding is a gather, a position add and a dropout (7.5 passes over
  T x h); its backward writes the gradient of the (V/tp x h) table once.
- A training loop that evaluates metrics on every micro-batch's logits (``Stack.metric_bytes``: Composer's
  train metrics) pays them as a piece of their own, ``LOOP_METRICS``, after the backward.
- A program whose own optimizer step, in a run without ZeRO, walks the parameter tensors one at a time
  (``Stack.step_loop``: Megatron-LM 2019's fp16 optimizer) pays every tensor's kernels, each at least a kernel
  floor, and its host reads (``step_loop``). For each value the host reads back the device idles for two
  kernel floors: the copy to the host, then the host's next launch. Every TP rank holds a piece of every
  tensor, so those floors and reads do not shrink with TP. A block whose forward reads values back
  (``Stack.host_reads``) pays the same for each, after the block (``host_reads``). So does a program that copies
  the CUDA RNG state to and from the device around each block's dropouts (``Stack.rng``: Megatron-LM 2019 on
  PyTorch 1.1), each copy at the host bandwidth and a floor. Host reads are not scaled by ``compute_scale``, and
  the critical path names them ``host_sync``.

A data-parallel collective runs on ``nccl_channels`` thread blocks, one SM each, beside the compute it
overlaps: the compute is charged that share of the SMs for the collective's duration (``interference``, the
CPU profile's fitted factor, here stated), as a task on the compute stream when the collective is issued.
Where the compute then waits for the collective, the wait absorbs the charge, up to the wait's length.

Communication. A group of n ranks along ``dp`` (ranks ``tp`` apart) or ``tp`` (adjacent ranks) either fits
in one node (NVLink/NVSwitch: ``intra_busbw``) or spans nodes with k of its ranks on each. Every group
of a dimension communicates at once, so the ``gpus_per_node / k`` groups on a node share its network
cards: a bus bandwidth of ``node_net_bw x k / gpus_per_node`` (at most ``intra_busbw``). On a DGX-2 at
MP 16, 16 DP rings share 8 x 12 GB/s, which is 6 GB/s per GPU. NCCL's own cost model
(``zerobench.sim.nccl``) turns that bandwidth into a time. It picks the fastest ring or tree and LL, LL128
or Simple protocol; the ring's latency grows with its steps.
"""

from __future__ import annotations

import dataclasses

from zerobench.models.sizes import padded_vocab
from zerobench.sim import nccl
from zerobench.sim.gemm import for_ceiling
from zerobench.sim.profile import LOOP_METRICS, Profile
from zerobench.sim.software import STACKS, Stack, fsdp_postdivide_factor
from zerobench.sim.stated import StatedDevice

_ELEM = {"fp16": 2, "bf16": 2, "fp32": 4}


class StatedProfile(Profile):
    """The ``Profile`` of a ``StatedDevice`` running ``stack`` (costs computed, not looked up). ``grad_elem``:
    bytes per gradient element the data-parallel reductions move, where the program reduces in another
    type than its parameters (FSDP reducing bf16 gradients in fp32)."""

    def __init__(self, dev: StatedDevice, stack: Stack | str = "zerobench", grad_elem: int | None = None):
        stack = STACKS[stack] if isinstance(stack, str) else stack
        super().__init__(
            device=dev.name, cores=1, sources={**dev.sources, **{f"stack.{k}": v for k, v in stack.sources.items()}}
        )
        self.dev, self.stack, self.grad_elem = dev, stack, grad_elem
        self.gemm = for_ceiling(dev.sms, dev.gemm_eff, dev.peak_flops)
        self.device_class = dev.name.split("-")[0].lower()
        self._ops: dict[tuple, float] = {}
        # NCCL's thread blocks take their SMs from the compute a DP collective overlaps (a stated share, not fitted)
        self.interference = dev.nccl_channels / dev.sms if dev.nccl_channels else 0.0

    def has_op(self, name: str, **shape) -> bool:
        """The training loop's metrics are a piece only where the stack's loop computes them."""
        return bool(self.stack.metric_bytes) if name == LOOP_METRICS else super().has_op(name, **shape)

    @property
    def zero_machinery(self):
        return self.stack.zero

    @property
    def scale(self) -> float:
        """What device times are multiplied by: the fitted ``compute_scale`` over the node's measured speed relative
        to the node the class was fitted on (``StatedDevice.relative_speed``)."""
        return self.dev.compute_scale / self.dev.relative_speed

    def with_scale(self, compute_scale: float) -> StatedProfile:
        return StatedProfile(dataclasses.replace(self.dev, compute_scale=compute_scale), self.stack, self.grad_elem)

    # -- compute -------------------------------------------------------------------------------
    def _peak(self, dtype: str) -> float:
        return self.dev.peak_flops_fp32 if dtype == "fp32" else self.dev.peak_flops

    def _gemm(self, m: float, n: float, k: float, batch: float, elem: int, peak: float) -> float:
        multiple = self.stack.tensor_core_multiple
        if multiple and peak == self.dev.peak_flops and any(int(x) % multiple for x in (m, n, k)):
            peak = self.dev.peak_flops_fp16_simt  # off the tensor cores (``Stack.tensor_core_multiple``)
        nbytes = elem * (m * k + k * n + m * n) * batch
        arith = self.gemm.compute_seconds(int(m), int(n), int(k), int(batch), peak)
        if self.dev.gemm_max and peak == self.dev.peak_flops:  # no shape beats the best one measured
            arith = max(arith, 2 * m * n * k * batch / (peak * self.dev.gemm_max))
        return self.gemm.launch_s + max(arith, nbytes / (self.dev.hbm_bw * self.dev.mem_eff))

    def _linear(self, m: int, n: int, k: int, elem: int, peak: float, backward: bool) -> float:
        """A linear layer's GEMMs: forward (m x n x k); backward the data gradient (m x k x n) and the weight
        gradient (k x n over m)."""
        if not backward:
            return self._gemm(m, n, k, 1, elem, peak)
        return self._gemm(m, k, n, 1, elem, peak) + self._gemm(k, n, m, 1, elem, peak)

    def _stream(self, nbytes: float, kernels: int = 1) -> float:
        d = self.dev
        return max(nbytes / (d.hbm_bw * d.mem_eff), kernels * d.kernel_floor_s)

    def _attention(self, b: int, s: int, hp: int, ap: int, dh: int, elem: int, peak: float, backward: bool) -> float:
        att = self.stack.attention
        if att.kind == "flash":
            flops = 2 * b * s * s * hp * (2.5 if backward else 1.0)
            rate = att.rates(self.device_class, dh, peak, half=peak == self.dev.peak_flops)[1 if backward else 0]
            nbytes = (8 if backward else 4) * b * s * hp * elem
            return self.gemm.launch_s + max(flops / rate, nbytes / (self.dev.hbm_bw * self.dev.mem_eff))
        per = 2 if backward else 1
        scores = self._gemm(s, s, dh, ap * b, elem, peak) + self._gemm(s, dh, s, ap * b, elem, peak)
        passes = att.score_passes if not backward else att.score_passes_bwd
        passes = 2 * att.score_passes if passes is None else passes
        return per * scores + self._stream(ap * b * s * s * passes * elem, att.score_kernels[1 if backward else 0])

    def _block(self, b: int, s: int, h: int, heads: int, tp: int, elem: int, peak: float, backward: bool) -> float:
        T, hp, ap, dh = b * s, h // tp, heads // tp, h // heads
        st = self.stack
        t = sum(
            self._linear(T, n, k, elem, peak, backward) for n, k in ((3 * hp, h), (h, hp), (4 * hp, h), (h, 4 * hp))
        )
        t += self._attention(b, s, hp, ap, dh, elem, peak, backward)
        io = st.attention_io  # (forward passes, backward passes, forward kernels, backward kernels); none cost 0
        t += self._stream(T * hp * io[int(backward)] * elem, io[2 + int(backward)])
        per = 2 if backward else 1
        passes = ((T * h, st.passes_h, 6), (T * hp, st.passes_hp, 2), (T * 4 * hp, st.passes_ffn, 2))
        t += sum(self._stream(per * n * p * elem, per * kern) for n, p, kern in passes if p)
        if backward:  # each bias's gradient: its linear's output gradient summed over the T tokens, read once
            t += self._stream(T * (3 * hp + h + 4 * hp + h) * elem, 4)
            # q's, k's and v's gradients joined into the projection's (one kernel, where the stack has one)
            t += self._stream(T * hp * st.qkv_split_bwd * elem, int(st.qkv_split_bwd > 0))
        else:  # bias additions of their own; their backward is the identity
            t += self._stream(T * (h * st.bias_adds[0] + hp * st.bias_adds[1]) * elem, st.bias_adds[2])
        return t

    def op_time(
        self,
        name: str,
        *,
        b: int,
        s: int,
        h: int,
        heads: int,
        vocab: int,
        tp: int,
        dtype: str,
        kernels: str,
        checkpoint: bool,
        ranks: int,
        threads: int,
    ) -> float:
        key = (name, b, s, h, heads, vocab, tp, dtype, checkpoint)
        if key not in self._ops:
            self._ops[key] = self._op_time(name, b, s, h, heads, vocab, tp, dtype, checkpoint)
        return self._ops[key] * self.scale

    def _op_time(
        self, name: str, b: int, s: int, h: int, heads: int, vocab: int, tp: int, dtype: str, checkpoint: bool
    ) -> float:
        if self.stack.vocab_multiple:  # the program's own padding, at every TP degree
            vocab = padded_vocab(vocab, tp, self.stack.vocab_multiple)
        elem, peak, T, vp = _ELEM[dtype], self._peak(dtype), b * s, vocab // tp
        loss_fwd, loss_bwd = self.stack.loss_bytes
        if name == "block_fwd":
            return self._block(b, s, h, heads, tp, elem, peak, backward=False)
        if name == "block_bwd":
            t = self._block(b, s, h, heads, tp, elem, peak, backward=True)
            return t + (self._block(b, s, h, heads, tp, elem, peak, backward=False) if checkpoint else 0.0)
        if name == "head_fwd":
            return (
                self._linear(T, vp, h, elem, peak, False)
                + self._stream(T * h * 2 * elem, 2)
                + self._stream(T * vp * loss_fwd, 3)
            )
        if name == "head_bwd":
            return (
                self._linear(T, vp, h, elem, peak, True)
                + self._stream(T * h * 4 * elem, 4)
                + self._stream(T * vp * loss_bwd, 3)
            )
        if name == "embed_fwd":
            return self._stream(T * h * 7.5 * elem, 3)
        if name == "embed_bwd":
            return self._stream(T * h * 3 * elem + vp * h * elem, 2)
        if name == LOOP_METRICS and self.stack.metric_bytes:
            return self._stream(T * vp * self.stack.metric_bytes, self.stack.metric_kernels)
        raise KeyError(f"the stated profile of {self.device} has no op {name}")

    def cost(self, name: str, ranks: int, n: float) -> float:
        """The engine's per-element work on the device: Adam per element, copy/add/memset per byte."""
        passes = {"adamw": self.dev.adam_bytes_per_element, "copy": 2, "add": 3, "memset": 1}
        if name not in passes:
            raise KeyError(f"the stated profile of {self.device} has no cost {name}")
        return self._stream(n * passes[name]) * self.scale if n > 0 else 0.0

    def transfer(self, ranks: int, nbytes: float) -> float:
        return nbytes / self.dev.host_bw + self.dev.kernel_floor_s if nbytes > 0 else 0.0

    def _host_read(self) -> float:
        """The device's idle time for one value the host reads back: the copy to the host, then the host's next
        launch after it (a kernel floor each; the host's own work between them is not charged)."""
        return 2 * self.dev.kernel_floor_s

    def host_reads(self, name: str, **shape) -> float:
        """The device's idle time in a block's pass while the host reads values back (``Stack.host_reads``) and
        copies the CUDA RNG state to and from the device (``Stack.rng``): each copy, then the host's next launch."""
        if name not in ("block_fwd", "block_bwd"):
            return 0.0
        backward, recompute = name == "block_bwd", bool(shape["checkpoint"])
        reads = self.stack.host_reads if not backward or recompute else 0  # the recompute reads again
        rng = self.stack.rng
        copies = rng.copies(backward, recompute)
        return reads * self._host_read() + copies * (rng.state_bytes / self.dev.host_bw + self.dev.kernel_floor_s)

    def step_loop(self, param_sizes: tuple[int, ...], tp: int, ranks: int) -> tuple[float, float, float] | None:
        loop = self.stack.step_loop
        if loop is None:
            return None
        n = sum(param_sizes)
        device = sum(self._stream(n * b) for _, b in (*loop.passes, ("update", loop.adam_bytes_per_element)))
        device += sum(self._stream(k * op.bytes_per_element) for k in param_sizes for op in loop.per_param)
        reads = loop.round_trips + loop.tp_reads + len(param_sizes) * sum(op.read_back for op in loop.per_param)
        flags = loop.tp_reads * self.collective("all_reduce", tp, ranks, 4, dim="tp", tp=tp)
        return device * self.scale, reads * self._host_read(), flags

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
        t = nccl.seconds(op, group, nodes, nbytes, self.bus_bandwidth(group, dim, tp))
        return t

    def collective_copies(self, op: str, group: int, nbytes: float, dim: str = "dp", stage: int | None = None) -> float:
        z = self.stack.zero.at(stage)
        if group <= 1 or nbytes <= 0 or dim != "dp" or op == "all_reduce":
            return 0.0
        t = 0.0
        if op in z.list_copies:  # a copy kernel into or out of each of the list's tensors: the whole tensor moved
            t += self._stream(2 * nbytes, group)
        if z.zeroed_gathers and op == "all_gather":  # torch.zeros of the gathered size
            t += self._stream(nbytes)
        if z.predivided_grads and op == "reduce_scatter":  # div_ by (part of) the data-parallel size, in place
            t += self._stream(2 * nbytes)
        if z.postdivided_grads and op == "reduce_scatter" and fsdp_postdivide_factor(group) > 1:  # the shard's div_
            t += self._stream(2 * nbytes / group)
        return t * self.scale
