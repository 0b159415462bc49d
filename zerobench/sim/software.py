"""What a run's program does on the GPU: the kernels of a transformer block, the loss and the ZeRO-3 machinery.

The roofline of a block is set by the kernels the program launches, and the hardware alone does not decide
them. The 2019 Megatron-LM runs the attention softmax in eager PyTorch over the b·a·s² scores. Megatron-LM
2021 fuses it. FlashAttention never writes the scores to memory. A ``Stack`` describes one such program, and
every figure in it names where it comes from: the framework's code at the version that ran, or a
published kernel benchmark.

Elementwise work is counted in passes. One pass reads or writes a tensor once, and the count covers the
forward; the backward costs twice the passes, except where a stack counts them from each op's gradient (the
scores' passes, bias additions, the copies around an attention kernel), and a recompute runs the forward once
more (``gpu_costs``):

- over T x h, the per-token activations. These passes are replicated across TP ranks: LayerNorms,
  residual adds, dropouts and their masks.
- over T x h/tp: head split and merge copies.
- over b·(a/tp)·s², the score tensor, where the attention writes it to memory.
- over T x 4h/tp: bias and GeLU.

The loss is counted in bytes per logit element, forward and backward apart.

ZeRO machinery. How a program's ZeRO gathers and reduces is its own cost, and not zerobench's engine: DeepSpeed's
ZeRO-3 in 2021 gathers and reduces each parameter through list collectives and synchronises the device before every
gather; its ZeRO-2 in 2020, the paper's, reduces in the compute stream's order, so backward waits for every bucket. A
stack that has such machinery says so here (``ZeroMachinery``). The replay charges it (``schedule``).

The optimizer step. Without ZeRO, a program steps with its own optimizer. The other programs here are charged
one pass over all of a rank's elements (the device's ``adam_bytes_per_element``). Megatron-LM 2019's walks the
parameter tensors in Python (``StepLoop``): kernels for every tensor and two values of each read back on the host,
whose floors and round trips cost the same at every TP degree.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Attention:
    """The attention core's kernels."""

    kind: str
    """``materialized``: score GEMMs and elementwise passes over the s² tensor. ``flash``: one tiled kernel
    (causal: half the score FLOPs), whose achieved fraction of peak is ``fwd_eff`` and ``bwd_eff``."""
    score_passes: float = 0.0
    """Forward passes over b·(a/tp)·s² (``materialized`` only)."""
    score_passes_bwd: float | None = None
    """Backward passes over the scores, counted from each op's gradient (``materialized`` only; None: twice the
    forward's). A softmax's gradient reads its output and the incoming gradient and writes one (3) where its
    forward read and wrote (2); a mask's subtraction of a constant has no backward kernel."""
    score_kernels: tuple[int, int] = (4, 8)
    """Kernels over the scores, forward and backward (``materialized`` only): each costs at least a launch."""
    fwd_eff: dict[str, float] = field(default_factory=dict)
    """Device class -> achieved fraction of peak, forward (``flash`` only). Where ``fwd_bwd`` states the class, only
    the ratio of ``bwd_eff`` to this is read: how the kernel's time splits between forward and backward."""
    bwd_eff: dict[str, float] = field(default_factory=dict)
    fwd_bwd: dict[str, dict[int, float]] = field(default_factory=dict)
    """Device class -> head dimension -> published forward+backward TFLOP/s of the kernel (causal, sequence 2k,
    FLOPs counted as the FlashAttention papers count them: 3.5 times the causal forward's). Between two stated head
    dimensions the rate is interpolated linearly; outside them, the nearest is taken (``rates``)."""
    source: str = ""

    def rates(self, device_class: str, head_dim: int, peak: float, half: bool = True) -> tuple[float, float]:
        """(forward, backward) FLOP/s of the ``flash`` kernel on ``device_class`` at ``head_dim``. From the published
        forward+backward rate R where ``fwd_bwd`` states the class and the run is in half precision (``half``: the
        figures are fp16/bf16): the forward's F FLOPs and the backward's 2.5 F take 3.5 F / R together, split so
        that the backward runs ``bwd_eff / fwd_eff`` times the forward's rate. Else the stated fractions of
        ``peak`` (the peak of the run's precision)."""
        fwd, bwd = self.fwd_eff[device_class], self.bwd_eff[device_class]
        table = self.fwd_bwd.get(device_class) if half else None
        if not table:
            return fwd * peak, bwd * peak
        dims = sorted(table)
        d = min(max(head_dim, dims[0]), dims[-1])
        hi = next(x for x in dims if x >= d)
        lo = max(x for x in dims if x <= d)
        both = table[lo] if hi == lo else table[lo] + (table[hi] - table[lo]) * (d - lo) / (hi - lo)
        k = bwd / fwd
        rf = (1 + 2.5 / k) * both * 1e12 / 3.5
        return rf, k * rf


@dataclass(frozen=True)
class ZeroMachinery:
    """How a ZeRO implementation gathers and reduces, where it differs from zerobench's engine (one collective per
    bucket, issued on a stream of its own while backward goes on; at stage 3 prefetched, with no device
    synchronisation)."""

    per_parameter: bool = False
    """One all-gather and one reduce-scatter per parameter tensor, never coalesced."""
    list_copies: tuple[str, ...] = ()
    """The collectives (``all_gather``, ``reduce_scatter``) given a list of ``world`` tensors: torch's
    ProcessGroupNCCL copies each of them into (or out of) a flat buffer, so one collective launches ``world`` copy
    kernels that read and write the whole tensor."""
    blocking_reduce: bool = False
    """The gradient reduction runs in the compute stream's order: backward waits for each bucket's before it goes
    on, so no reduction overlaps compute (DeepSpeed's ``overlap_comm`` false)."""
    zeroed_gathers: bool = False
    """Each gather's output is allocated with ``torch.zeros``: a memset of the gathered size first."""
    predivided_grads: bool = False
    """Each gradient is divided in place before its reduce-scatter (read and write): by the data-parallel size, or
    by part of it where ``postdivided_grads`` divides by the rest."""
    postdivided_grads: bool = False
    """After its reduce-scatter, each rank's gradient shard is divided in place by what the division before it left
    (``fsdp_postdivide_factor``), where that is above 1: read and write of the shard."""
    sync_per_module: bool = False
    """Before every gather the host waits for the device (``torch.cuda.synchronize``), so no gather is issued
    while compute runs and none is prefetched behind it: each gather and each module's compute run back to back."""
    regather_for_recompute: bool = False
    """With activation checkpointing, the recompute's forward gathers a block's parameters and releases them,
    and its backward gathers them again: three gathers per step, not two."""
    stage1: ZeroMachinery | None = None
    """The machinery of the program's stage 1 where that is other code (None: the same)."""
    source: str = ""

    def at(self, stage: int | None) -> ZeroMachinery:
        """The machinery a run at ZeRO ``stage`` meets."""
        return self.stage1 if stage == 1 and self.stage1 is not None else self


@dataclass(frozen=True)
class ParamOp:
    """One kernel a program's optimizer step launches for every parameter tensor, one tensor at a time."""

    name: str
    bytes_per_element: float
    """Bytes it moves per element of the tensor (reads and writes)."""
    read_back: bool = False
    """The host reads its result (``float(t)``, ``.item()``) before it goes on: the device idles for the round trip."""


@dataclass(frozen=True)
class StepLoop:
    """A program's own mixed-precision optimizer step, where it walks the parameter tensors one at a time in Python
    instead of over flat buffers (runs without ZeRO: with ZeRO the engine's optimizer steps). Its per-tensor kernels
    and round trips do not shrink with tensor parallelism: every TP rank holds a piece of every tensor, so a TP rank
    pays them all whatever the TP degree. The update itself is one fused pass (``adam_bytes_per_element``, in place of
    the device's)."""

    passes: tuple[tuple[str, float], ...]
    """Kernels over all of this rank's gradients at once: (name, bytes per element)."""
    round_trips: int
    """Times per step, outside the per-tensor loop, that the host waits for the device to drain
    (``torch.cuda.synchronize()``): the device idles for the round trip, as for a read."""
    per_param: tuple[ParamOp, ...]
    """The kernels launched for every parameter tensor, in order."""
    tp_reads: int
    """One-element all-reduces over the TP group whose result the host reads (an overflow flag, a norm)."""
    adam_bytes_per_element: float
    """Bytes the update itself moves per element, where the loop's own copies convert the gradient and the
    parameter (in place of the device's ``adam_bytes_per_element``)."""
    source: str = ""


@dataclass(frozen=True)
class RngState:
    """The CUDA RNG state a program saves and restores around each block: Megatron-LM's model-parallel RNG tracker
    forks it around the attention dropout (``fork``: get, set, and after the dropout get and set again), and its
    activation checkpoint saves it before the forward (a get) and around the recompute (a get, a set, and a set
    after). Where the state lives on the device, each get and set is a blocking copy of ``state_bytes`` between
    the device and the host's pageable memory, ordered after the queued kernels: the device idles for the copy and
    the host's next launch."""

    forks: int = 0
    """Tracker forks per block forward (4 copies each)."""
    checkpoint: bool = False
    """The program's activation checkpoint saves and restores the state: 1 copy in the forward, 3 around the
    recompute in the backward (only where the run recomputes)."""
    state_bytes: int = 0
    """Bytes of each copy; 0 where the state is a seed and an offset on the host, and a get or set costs the device
    nothing."""
    source: str = ""

    def copies(self, backward: bool, recompute: bool) -> int:
        """Device-host copies of the state in one block's forward (``backward`` False) or backward."""
        if not self.state_bytes:
            return 0
        if backward:  # the recompute runs the forward's forks again
            return 4 * self.forks + 3 if recompute and self.checkpoint else 0
        return 4 * self.forks + (1 if recompute and self.checkpoint else 0)


@dataclass(frozen=True)
class Stack:
    name: str
    attention: Attention
    passes_h: float
    """Forward passes over T x h (replicated across TP ranks)."""
    passes_hp: float
    """Forward passes over T x h/tp."""
    passes_ffn: float
    """Forward passes over T x 4h/tp."""
    loss_bytes: tuple[float, float]
    """Bytes moved per logit element by the loss: (forward, backward)."""
    bias_adds: tuple[float, float, int] = (0.0, 0.0, 0)
    """Forward passes of bias additions the program runs as kernels of their own after a GEMM, over T x h
    (replicated across TP ranks) and T x h/tp, and their kernels. Their backward is the identity (no kernel); the
    bias gradient is counted with every linear's. Zero where the bias rides in the GEMM's epilogue or a fused
    kernel."""
    qkv_split_bwd: float = 0.0
    """Backward passes over T x h/tp that join q's, k's and v's gradients into the QKV projection's output
    gradient: the backward of the split (``torch.split``, ``chunk``: a concatenation) or ``unbind`` (a stack) of
    one fused projection, read 3 and written 3 (6), and a copy more where a reshape of the joined gradient is not a
    view (6). Counted apart because their forward is a view."""
    attention_io: tuple[float, float, int, int] = (0.0, 0.0, 0, 0)
    """Passes over T x h/tp that move q, k and v into the attention kernel's layout and its output back, and
    their kernels: (forward passes, backward passes, forward kernels, backward kernels). Counted apart from
    ``passes_hp`` because their backward is not twice their forward."""
    metric_bytes: float = 0.0
    """Bytes per logit element that the training loop's own metrics move after every micro-batch's backward,
    outside the model (a trainer that evaluates train metrics on each micro-batch's logits), counted for the
    logits' dtype the program runs in and over this rank's V/tp columns. Zero where the loop computes none."""
    metric_kernels: int = 0
    """Kernels those metrics launch per micro-batch (each costs at least a launch)."""
    host_reads: int = 0
    """Values a block's forward reads back on the host (``.item()``, ``nonzero``): the device idles for each round
    trip, as for a ``StepLoop``'s reads."""
    rng: RngState = field(default_factory=RngState)
    """What saving and restoring the CUDA RNG state around a block's dropouts costs the device."""
    zero: ZeroMachinery = ZeroMachinery()
    step_loop: StepLoop | None = None
    """The program's own optimizer step for runs without ZeRO, where it loops over the parameters (None: one pass
    over flat buffers, as the device's ``adam_bytes_per_element`` charges)."""
    vocab_multiple: int | None = None
    """The program pads its vocabulary to a multiple of this times the TP degree (Megatron-LM's
    ``--make-vocab-size-divisible-by``, 128), at every TP degree: the head's GEMMs run at the padded width. None: the
    vocabulary as the run states it."""
    tensor_core_multiple: int | None = None
    """Where the program's cuBLAS runs a half-precision GEMM on tensor cores only when every dimension (m, n, k) is a
    multiple of this (cuBLAS before 11.0: 8), else on the CUDA cores at the device's ``peak_flops_fp16_simt``. None:
    tensor cores whatever the shape (cuBLAS 11 and later)."""
    sources: dict[str, str] = field(default_factory=dict)


CUBLAS_10_TENSOR_CORES = (
    "NVIDIA Deep Learning Performance Guide, 'Matrix Multiplication Background User's Guide', 'Tensor Core "
    "Requirements' (https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/): with "
    "cuBLAS before 11.0, an FP16 GEMM uses Tensor Cores only when M, N and K are multiples of 8; the program's PyTorch "
    "1.1/1.2 builds link CUDA 10's cuBLAS. Baidu DeepBench's V100 benchmark (code/nvidia/gemm_bench.cu at da81ba7) "
    "pads a half-precision GEMM's dimensions to multiples of 8 before timing it, citing cuBLAS's tensor-op "
    "restrictions (m and k for its NN and TN layouts, m and n for NT, all three for TT), so its 512 x 24000 x 1530 "
    "row (93.5 TFLOP/s, CUDA 10.1) ran at k = 1536. For these programs' GEMMs the per-layout rule and the "
    "any-dimension rule charged here pick the same shapes: every layout needs both feature dimensions (or the head "
    "dimension) aligned, and the token count b x s is a multiple of 8"
)

FA2 = "Dao 2023, FlashAttention-2 (arXiv 2307.08691)"
_FA2_TEXT = (
    f"{FA2}: abstract (forward 50-73% of peak on A100); §1 (FlashAttention: forward 30-50%, backward 25-35%; "
    "FlashAttention-2 about 2x faster); §4.1 (1.3-1.5x faster than FlashAttention in Triton forward, about "
    "2x backward; up to 335 TFLOP/s forward+backward on H100 with no Hopper-specific instructions)"
)

_A100_TYPICAL = 0.615 / 0.73
"""The A100's typical forward (the midpoint of the stated 50-73%) against its stated best (73%)."""
_FA2_FIG = (
    "Dao 2023 (arXiv 2307.08691) Fig. 4(c),(d) (A100 80GB SXM4) and Fig. 7(c),(d) (H100 80GB SXM5), the "
    "flash-attention README's Performance section: forward+backward TFLOP/s, causal, sequence 2k, hidden 2048, "
    "16k tokens per batch, read from the bars' labels"
)
SDPA_FLASH2 = Attention(
    "flash",
    fwd_eff={"a100": 0.615, "h100": 335 / 989 * _A100_TYPICAL, "v100": 0.40},
    bwd_eff={"a100": 0.60, "h100": 335 / 989 * _A100_TYPICAL, "v100": 0.30},
    fwd_bwd={"a100": {64: 140.0, 128: 155.0}, "h100": {64: 232.0, 128: 265.0}},
    source=(
        f"{_FA2_TEXT}. A100 and H100: FlashAttention-2's forward+backward, {_FA2_FIG}: A100 140 (head dim 64) and "
        "155 (128), H100 232 and 265; split between forward and backward as the stated fractions below split it. "
        "Those fractions: A100, the forward's stated range, midpoint; the backward 2x FlashAttention's 25-35%. "
        "H100: its stated best, 335 of 989 TFLOP/s, taken down as far as the A100's midpoint is below its best "
        "(0.615 / 0.73). V100 has no flash kernel and no figure: PyTorch's SDPA runs its memory-efficient kernel, "
        "taken at FlashAttention's A100 fractions [assumed]"
    ),
)
"""FlashAttention-2 (CUDA): PyTorch's SDPA flash backend, and flash-attn 2.x."""

_FA3_FIG = (
    "Shah et al. 2024, FlashAttention-3 (arXiv 2407.08608), its BF16 benchmarks on H100 80GB SXM5 at head dim 128 "
    "and sequence 2k, read from the bars' labels: forward with the causal mask, cuDNN 484 TFLOP/s and "
    "FlashAttention-2 298; backward (without the mask), cuDNN 465 and FlashAttention-2 291"
)


def fwd_bwd_rate(fwd: float, bwd: float) -> float:
    """Forward+backward TFLOP/s of a kernel from its forward and backward rates: the forward's F FLOPs and the
    backward's 2.5 F, 3.5 F in all (the FlashAttention papers' count)."""
    return 3.5 / (1 / fwd + 2.5 / bwd)


_CUDNN_OVER_FA2 = fwd_bwd_rate(484.0, 465.0) / fwd_bwd_rate(298.0, 291.0)
"""cuDNN's attention against FlashAttention-2 in one benchmark of one paper (``_FA3_FIG``): 1.61."""
SDPA_2026 = replace(
    SDPA_FLASH2,
    fwd_eff={**SDPA_FLASH2.fwd_eff, "h100": 484.0 / 989},
    bwd_eff={**SDPA_FLASH2.bwd_eff, "h100": 465.0 / 989},
    fwd_bwd={**SDPA_FLASH2.fwd_bwd, "h100": {d: r * _CUDNN_OVER_FA2 for d, r in SDPA_FLASH2.fwd_bwd["h100"].items()}},
    source=(
        "PyTorch's SDPA as torch 2.11 dispatches it. On sm90 it puts cuDNN's attention first when the cuDNN it "
        "runs with is 9.15.1 or newer (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, "
        "check_prefer_cudnn_attention), which torch 2.11's bundled one is (huggingface/transformers#48163, the "
        "thread's last comment: the check is in 2.10, and 2.11's bundled cuDNN crosses the threshold); zerobench's "
        "call (bf16, is_causal, no mask, no dropout, head dim 128) is one cuDNN takes. [assumed, inferred: the H100 run "
        "recorded neither its cuDNN version nor the kernel; a system cuDNN ahead of the wheel's on the library path "
        "would change it.] cuDNN is charged FlashAttention-2's published forward+backward rate on H100 times "
        f"cuDNN's advantage over FlashAttention-2 in one benchmark, {_FA3_FIG}: 1.61, and split between forward "
        "and backward as that benchmark's cuDNN bars split it [assumed: the advantage holds with the causal mask "
        "in the backward, and at other head dimensions and sequence lengths]. On A100 (sm80) SDPA keeps "
        f"FlashAttention-2: {SDPA_FLASH2.source}"
    ),
)
"""PyTorch's SDPA as zerobench's recorded runs dispatch it (torch 2.11): cuDNN's attention on H100, FlashAttention-2
on A100."""
TRITON_FLASH = Attention(
    "flash",
    fwd_eff={k: v / 1.4 for k, v in SDPA_FLASH2.fwd_eff.items()},
    bwd_eff={k: v / 2.0 for k, v in SDPA_FLASH2.bwd_eff.items()},
    fwd_bwd={"a100": {64: 77.0, 128: 69.0}, "h100": {64: 136.0, 128: 108.0}},
    source=(
        "FlashAttention in Triton as flash-attn's flash_attn_triton.py (which llm-foundry copies) runs it. Its "
        "docstring: 'Overall Triton forward + backward is slightly slower than CUDA forward + backward' (CUDA: "
        f"FlashAttention 1). So it is charged FlashAttention 1 (CUDA)'s forward+backward, {_FA2_FIG}: A100 77 "
        "(head dim 64) and 69 (128), H100 136 and 108 (an upper bound: 'slightly slower'). The split between "
        f"forward and backward: {_FA2_TEXT}: FlashAttention-2 over FlashAttention in Triton, 1.4x (1.3-1.5x) forward "
        "and 2x backward"
    ),
)
"""FlashAttention (1) in Triton, as llm-foundry's ``attn_impl: triton`` runs it."""
UNFUSED = Attention(
    "materialized",
    score_passes=10.5,
    score_passes_bwd=9.5,
    score_kernels=(5, 4),
    source=(
        "PyTorch 1.x eager attention as Megatron-LM 2019 runs it (mpu/transformer.py, GPT2ParallelSelfAttention): "
        "scale (2); the causal mask as torch.mul(scores, mask) - 10000.0 * (1.0 - mask), a product and a "
        "subtraction (4); softmax (2); dropout with its 1-byte mask (2.5): 10.5 forward. Backward: dropout "
        "(read the gradient and the mask, write: 2.5), softmax (read its output and the gradient, write: 3), the "
        "mask's product (2; the subtraction of a constant has no kernel), the scale (2): 9.5"
    ),
)
FUSED_SOFTMAX = Attention(
    "materialized",
    score_passes=4.5,
    score_passes_bwd=5.5,
    score_kernels=(2, 2),
    source=(
        "Narayanan et al. 2021 §4.2: one fused scale+mask+softmax kernel (read and write, 2), then the attention "
        "dropout with its mask (2.5): 4.5 forward. Backward: the dropout's (2.5), then the fused softmax's, which "
        "reads its output and the gradient and writes one (3): 5.5"
    ),
)

_EAGER_LOSS = (
    "logits cast to fp32 (read 2 + write 4), log-softmax (read 4 twice, write 4), and in backward its "
    "gradient (read 8, write 4) and the cast back (read 4, write 2): 36 bytes per logit"
)


def fsdp_predivide_factor(world: int) -> int:
    """What PyTorch FSDP divides a gradient by before its reduction: the smallest power of two ``f`` (doubling from 1
    while ``f`` divides ``world``) with ``world / f`` at most ``f``, about the square root of the world size, so
    neither division under- or overflows a half-precision gradient (``_get_gradient_predivide_factor``)."""
    f = 1
    while world % f == 0 and world / f > f:
        f *= 2
    return f


def fsdp_postdivide_factor(world: int) -> float:
    """What PyTorch FSDP divides a gradient shard by after its reduction: the rest of the world size."""
    return world / fsdp_predivide_factor(world)


FSDP_TORCH = ZeroMachinery(
    predivided_grads=True,
    postdivided_grads=True,
    source=(
        "PyTorch FSDP's gradient reduction with no communication hook (composer 0.16.4 registers none). torch 2.1.0 "
        "torch/distributed/fsdp/_runtime_utils.py: _post_backward_hook casts the unsharded gradient to "
        "reduce_dtype on the post-backward stream (charged where the reduction's type is wider), then _reduce_grad "
        "divides the whole gradient in place by gradient_predivide_factor (_div_if_needed), reduce-scatters it, and "
        "divides the shard by gradient_postdivide_factor where that is above 1; the factors are "
        "torch/distributed/algorithms/_comm_hooks/default_hooks.py DefaultState._get_gradient_predivide_factor "
        "and the world size over it. torch 1.13.1 (the older rows) does the same in its default reduce_scatter_hook. "
        "Not charged: torch 1.13.1 also passes the gradient through F.pad before the hook, a copy [a lower bound]"
    ),
)
"""PyTorch FSDP's reduction (torch 1.13-2.1), as llm-foundry's Composer runs it."""

_FOUNDRY = Stack(
    "llm-foundry",
    TRITON_FLASH,
    passes_h=10,
    passes_hp=0,
    passes_ffn=2,
    loss_bytes=(2, 4),
    qkv_split_bwd=6,
    sources={
        "attention": (
            "llm-foundry scripts/train/benchmarking/submit_benchmarks.py: attn_impl defaults to "
            f"'triton' (FlashAttention in Triton). {TRITON_FLASH.source}"
        ),
        "passes": (
            "llm-foundry v0.4.0 MPTBlock with resid_pdrop 0: two LayerNorms (2 each), two residual "
            "adds (3 each); q, k, v are views into the kernel; GeLU (2). Backward joins q's, k's and v's "
            "gradients (qkv.split's concatenation, 6)"
        ),
        "loss": (
            "MPT's default loss_fn 'fused_crossentropy' (flash-attn's kernel): the logits read once "
            "forward (2), read and the gradient written once backward (4)"
        ),
        "metrics": (
            "Composer's Trainer._train_microbatch updates the model's train metrics after every micro-batch's "
            "backward (_eval_train_metrics, under the run's autocast; composer v0.13.3 to v0.17.x, the versions "
            "the rows ran: mosaicml/examples 9fa3ceb9 examples/llm/requirements.txt, llm-foundry v0.3.0 and "
            "5e85bd62d setup.py). MPT's train metrics are LanguageCrossEntropy and LanguagePerplexity (mosaicml/"
            "examples 9fa3ceb9 mosaic_gpt.py; llm-foundry modeling_mpt.py, use_train_metrics defaults to true and "
            "the benchmark scripts do not set it). Each runs torch.nn.CrossEntropyLoss(reduction='sum') on the "
            "bf16 logits, which autocast runs in fp32 (PyTorch's amp reference lists cross_entropy among the CUDA ops "
            "that autocast to float32): the cast (read 2, write 4) and log-softmax (read 4 twice, "
            "write 4), 18 bytes per logit, twice: 36. 14 kernels (each metric's cast, log-softmax, nll, its "
            "count of the targets and its two state additions, 7)"
        ),
        "zero": FSDP_TORCH.source,
    },
    metric_bytes=36,
    metric_kernels=14,
    zero=FSDP_TORCH,
)
"""MPT as llm-foundry runs it with ``attn_impl: triton``."""

_MEGATRON_2019_CODE = "NVIDIA/Megatron-LM 93ab4bea59 (2019-09-12, the code of arXiv 1909.08053)"
MEGATRON_2019_STEP = StepLoop(
    passes=(("divide by the data-parallel size", 4.0),),
    round_trips=1,
    per_param=(
        ParamOp("zero the fp32 master gradient", 4.0),
        ParamOp("zero the fp16 gradient", 2.0),
        ParamOp("autograd adds the new gradient into the zeroed .grad", 6.0),
        ParamOp("copy the reduced gradient back", 4.0),
        ParamOp("cast the gradient to fp32 for the overflow check", 6.0),
        ParamOp("sum it, read on the host", 4.0, read_back=True),
        ParamOp("copy the gradient to the fp32 master's", 6.0),
        ParamOp("unscale the master gradient", 8.0),
        ParamOp("its norm, read on the host", 4.0, read_back=True),
        ParamOp("copy the updated master to the fp16 parameter", 6.0),
    ),
    tp_reads=2,
    adam_bytes_per_element=28.0,
    source=(
        f"{_MEGATRON_2019_CODE}, pretrain_gpt2.py backward_step and train_step with --fp16 (dynamic loss scaling, "
        "clip_grad 1.0 by default; arguments.py). backward_step first calls FP16_Optimizer.zero_grad(), which "
        "zeroes every fp32 master gradient and every fp16 gradient tensor by tensor (zero_(), 4 and 2), so autograd "
        "adds each new gradient into its zeroed .grad in place (read 2 + 2, write 2, a kernel per tensor). Then "
        "model/distributed.py allreduce_params flattens every gradient (_flatten_dense_tensors: the replay's copy "
        "into the bucket), divides it in place (2 + 2), all-reduces it over the data-parallel group, calls "
        "torch.cuda.synchronize() and copies each tensor's piece back (2 + 2, a kernel per tensor). "
        "fp16/fp16.py FP16_Optimizer.update_master_grads then runs, per tensor: the overflow check of "
        "fp16/loss_scaler.py (_has_inf_or_nan: float(x.float().sum()), a cast 2 + 4, a sum 4 and a host read), "
        "then an all-reduce of the flag over the model-parallel group and .item(); fp16util.model_grads_to_master_grads "
        "with flat_master False (a copy per tensor, 2 + 4); _downscale_master (mul_ per tensor, 4 + 4). "
        "clip_master_grads is mpu/grads.py clip_grad_norm: param.grad.data.norm(2) and .item() per tensor (TP rank 0 "
        "norms every tensor, the others their model-parallel ones, and the model-parallel all-reduce of the sum, "
        "read with .item(), waits for rank 0), so a rank pays one read per tensor; the clip's own mul_ runs only "
        "when the norm exceeds 1, and is not charged [assumed: the norm stays at or below 1]. The update is apex "
        "FusedAdam as of apex ad98cc5f (2019-09-11): multi_tensor_applier over the fp32 masters, parameter, gradient "
        "and two moments read, three written, 28 bytes [assumed: the runs' apex had the multi-tensor FusedAdam, "
        "which arrived in August 2019; before it, a kernel per tensor]; then master_params_to_model_params copies "
        "each master into its fp16 parameter (4 + 2). A host read is a device-to-host copy and the host's next "
        "launch after it, each a kernel floor [assumed]. Not charged: the flag's and the norm's host-to-device "
        "copies (torch.cuda.ByteTensor, FloatTensor) and the loss's all-reduce over the world, a few latencies "
        "per step"
    ),
)
"""Megatron-LM 2019's fp16 optimizer step and its own data-parallel reduction, tensor by tensor."""

MEGATRON_2019_RNG = RngState(
    forks=1,
    checkpoint=True,
    state_bytes=200 * 4120,
    source=(
        f"{_MEGATRON_2019_CODE}: mpu/transformer.py forks the model-parallel RNG tracker around the attention dropout "
        "of every layer (mpu/random.py CudaRNGStatesTracker.fork: torch.cuda.get_rng_state, _set_cuda_rng_state, "
        "and both again after it), and mpu/random.py CheckpointFunction, with --checkpoint-num-layers 1 by default, "
        "gets the state in its forward and gets, sets and sets it again around the recompute: 5 copies a layer "
        "forward and 7 backward. The repository's docker/Dockerfile builds on nvcr.io/nvidia/pytorch:19.05-py3, "
        "PyTorch 1.1 [assumed: the paper's runs used it], whose CUDA generator keeps 200 MTGP32 states on the device "
        "(torch 1.1.0 wheel, include/THC/THCGenerator.hpp: THCGeneratorState.gen_states): THCRandom_getRNGState "
        "and setRNGState (aten/src/THC/THCTensorRandom.cu) run a blocking cudaMemcpy of MAX_NUM_BLOCKS (200) x "
        "sizeof(curandStateMtgp32) (4120) bytes to or from pageable host memory on the legacy default stream, "
        "which PyTorch 1.1 computes on: it waits for the queued kernels, and the device then idles until the host "
        "launches again. Charged at the node's pinned host bandwidth and one kernel floor, a lower bound: a pageable "
        "copy is slower, the set's own kernel and the host's Python between the copies are not charged, and a "
        "node's 16 GPUs share its PCIe links"
    ),
)
"""Megatron-LM 2019's RNG state handling on its PyTorch 1.1: a synchronous 824 KB copy for every get and set."""

STACKS: dict[str, Stack] = {
    "zerobench": Stack(
        "zerobench",
        SDPA_2026,
        passes_h=10,
        passes_hp=2,
        passes_ffn=2,
        loss_bytes=(18, 18),
        sources={
            "attention": SDPA_2026.source,
            "passes": (
                "zerobench/models/gpt.py at dropout 0: two LayerNorms (read + write, 2 each), two "
                "residual adds (3 each); the merged heads' transpose copy (2); GeLU (2; the bias adds "
                "ride in the GEMM's epilogue). Backward joins q's, k's and v's gradients: unbind's stack (6), then "
                "the view of the permuted projection copies it (6; both seen in torch's profiler)"
            ),
            "loss": f"LMLoss: {_EAGER_LOSS}",
        },
        qkv_split_bwd=12,
    ),
    "megatron-2019": Stack(
        "megatron-2019",
        UNFUSED,
        passes_h=15,
        passes_hp=8,
        passes_ffn=2,
        loss_bytes=(18, 18),
        sources={
            "attention": UNFUSED.source,
            "passes": (
                "Megatron-LM 2019 in eager PyTorch 1.x: two LayerNorms, two dropouts with masks, two "
                "residual adds over T x h (15); splitting and merging heads (8; their backward, the views' copies "
                "and the split's join, is in its doubling); GeLU, a scripted fused kernel (2)"
            ),
            "loss": f"vocab-parallel cross-entropy in fp32: {_EAGER_LOSS}",
            "tensor_cores": CUBLAS_10_TENSOR_CORES,
            "vocab": (
                "Megatron-LM 2019 arguments.py, --make-vocab-size-divisible-by (default 128): the GPT-2 tokenizer's "
                "50,257 tokens padded to a multiple of 128 x the model-parallel size, at every size (50,304 at MP 1)"
            ),
            "step": MEGATRON_2019_STEP.source,
            "rng": MEGATRON_2019_RNG.source,
            "bias": (
                "Megatron-LM 2019 mpu/layers.py on PyTorch 1.x: ColumnParallelLinear calls F.linear, which for a 3-D "
                "input runs a matmul and then adds the bias in place: the QKV projection's is 2 passes over "
                "T x 3h/tp and the MLP's first 2 over T x 4h/tp (14 over T x h/tp). RowParallelLinear adds its bias "
                "after the all-reduce, output_ + self.bias, 2 passes over T x h, twice a layer (4). 4 kernels"
            ),
        },
        bias_adds=(4, 14, 4),
        step_loop=MEGATRON_2019_STEP,
        rng=MEGATRON_2019_RNG,
        vocab_multiple=128,
        tensor_core_multiple=8,
    ),
    "megatron-2021": Stack(
        "megatron-2021",
        FUSED_SOFTMAX,
        passes_h=11,
        passes_hp=2,
        passes_ffn=2,
        loss_bytes=(18, 18),
        sources={
            "attention": FUSED_SOFTMAX.source,
            "passes": (
                "Narayanan et al. 2021 §4.2: two LayerNorms (2 each), two fused bias+dropout+add "
                "kernels (read 2, write 1, 1-byte mask: 3.5 each); fused bias+GeLU (2). Over T x h/tp: the "
                "[s,b,a,h] layout splits q, k and v as views, and the context's permute(2, 0, 1, 3).contiguous() "
                "copies it once (2; megatron/model/transformer.py at aed2f75e20). Backward joins q's, k's and v's "
                "gradients (split_tensor_along_last_dim's concatenation, 6)"
            ),
            "loss": f"vocab-parallel cross-entropy in fp32: {_EAGER_LOSS}",
            "bias": (
                "Megatron-LM 2021 (PyTorch 1.8, its README) megatron/model/transformer.py: the QKV projection is a "
                "ColumnParallelLinear without skip_bias_add, so F.linear adds its bias in a pass of its own (on 1.8 "
                "either in place after the matmul, or as addmm's copy of the broadcast bias into the output that "
                "the GEMM then reads): 2 passes over T x 3h/tp, 6 over T x h/tp. The other biases ride in the fused "
                "bias+GeLU and bias+dropout+add kernels. 1 kernel"
            ),
        },
        bias_adds=(0, 6, 1),
        qkv_split_bwd=6,
    ),
    "llm-foundry": _FOUNDRY,
    "llm-foundry-flash2": replace(
        _FOUNDRY,
        name="llm-foundry-flash2",
        attention=SDPA_FLASH2,
        attention_io=(9, 11, 20, 7),
        host_reads=6,
        sources={
            **_FOUNDRY.sources,
            "attention": f"attn_impl flash (flash-attn 2.4.2). {SDPA_FLASH2.source}",
            "passes": (
                f"{_FOUNDRY.sources['passes']}. And llm-foundry 5e85bd62d attention.py flash_attn_fn runs the kernel "
                "on unpadded tokens: flash-attn 2.4.2 bert_padding.unpad_input on q, k and v (a gather each: read, "
                "write) and pad_input on the output (zeros, then an indexed write: 3), 9 passes forward; backward "
                "each gather's gradient is zeros and a scatter (3 each) and the pad's a gather (2), 11. Kernels: "
                "each unpad_input also sums, finds nonzeros, takes a max, a cumsum and a pad of the mask (20 "
                "forward in all, 7 backward). Its nonzero and .item() make the host wait for the device 6 times a "
                "layer (host_reads); the host's own time between them is not charged"
            ),
        },
    ),
}
"""Programs by name: zerobench's own GPT, and the published runs' frameworks."""

DEEPSPEED_2021 = ZeroMachinery(
    per_parameter=True,
    list_copies=("all_gather", "reduce_scatter"),
    zeroed_gathers=True,
    predivided_grads=True,
    sync_per_module=True,
    regather_for_recompute=True,
    source=(
        "DeepSpeed v0.3.15 (April 2021) deepspeed/runtime/zero/partition_parameters.py: _allgather_param issues one "
        "torch.distributed.all_gather per parameter into a list of world_size views, after torch.zeros of the "
        "gathered size and a torch.cuda.synchronize(); _reduce_scatter_gradient reduces each parameter with "
        "torch.distributed.reduce_scatter over a list of world_size inputs, after stage3.py average_tensor divides "
        "it in place by the data-parallel size (tensor.div_; charged over the gradient's own bytes, a lower bound: "
        "the code divides the whole bucket buffer at each flush) [assumed: contiguous_gradients true, as DeepSpeed's "
        "ZeRO-3 configurations set it; v0.3.15's default, false, reduces a flattened bucket with an all-reduce "
        "instead]. With lists, torch 1.8's ProcessGroupNCCL copies every "
        "input into a flat buffer before the reduce-scatter, and every piece of the all-gather's flat output out to "
        "its list tensor after it (copy_ per tensor). stage3.py fetch_sub_module ends in "
        "_synchronize_communication (comm_stream.synchronize(); torch.cuda.synchronize()) before every submodule; its "
        "post-forward hook releases a submodule's parameters once no active submodule holds them, the recompute's "
        "forward included"
    ),
)

STACKS["megatron-2021+deepspeed-0.3"] = replace(
    STACKS["megatron-2021"],
    name="megatron-2021+deepspeed-0.3",
    zero=DEEPSPEED_2021,
    sources={**STACKS["megatron-2021"].sources, "zero": DEEPSPEED_2021.source},
)
"""Megatron-LM 2021's GPT with DeepSpeed 0.3's ZeRO-3, as Narayanan et al. 2021 compared against it."""

_DEEPSPEED_020 = "DeepSpeed v0.2.0 (May 2020, the ZeRO-2 release behind the paper's ZeRO-100B figures)"
_OVERLAP_DEFAULT = (
    "overlap_comm is false by default (deepspeed_zero_config.py ZERO_OPTIMIZATION_OVERLAP_COMM_DEFAULT; documented as "
    "'Attempts to overlap the reduction of the gradients with backward computation', default false) [assumed: the "
    "runs left it at its default, as DeepSpeedExamples 5426d18a (2020-05-14) Megatron-LM/scripts/ds_zero2_config.json "
    "does, which sets only stage 2, and the paper names no overlap among its settings]"
)
DEEPSPEED_2020 = ZeroMachinery(
    list_copies=("all_gather",),
    predivided_grads=True,
    blocking_reduce=True,
    stage1=ZeroMachinery(
        list_copies=("all_gather", "reduce_scatter"),
        predivided_grads=True,
        blocking_reduce=True,
        source=(
            f"{_DEEPSPEED_020} deepspeed/pt/zero_optimizer_stage1.py, the paper's P_os (C1, C2): once backward has "
            "ended, the engine's allreduce_gradients calls reduce_scatter_gradients, which flattens every gradient "
            "into sub-partitions and runs torch.distributed.reduce_scatter over a list of world_size inputs (torch's "
            "ProcessGroupNCCL copies each into a flat buffer), then scales every partition with mul_ (read and write; "
            "charged as the divide before it, the same bytes); no reduction overlaps backward. step() all-gathers "
            "the updated sub-partitions over a list (copies out)"
        ),
    ),
    source=(
        f"{_DEEPSPEED_020} deepspeed/pt/deepspeed_zero_optimizer.py, stage 2 with the paper's C_B (reduce_bucket_size "
        "5e8) and M_D, read as contiguous_gradients true [assumed: the paper's M_D keeps gradients in contiguous "
        "buffers (§6.3); the flag defaults to false, and the released example leaves it so, which would all-reduce "
        "each flattened bucket instead, about twice the traffic, and copy it back]: each gradient is copied into the "
        "reduce bucket (ipg_buffer) as it lands; a full bucket goes to average_tensor, which divides it in place by "
        "the data-parallel size (tensor.div_, read and write) and reduces each rank's slice to that rank with "
        f"torch.distributed.reduce, then waits on every handle. {_OVERLAP_DEFAULT}; the waits are then issued on "
        "torch.cuda.current_stream(), so the compute stream waits for each bucket's reduces before backward goes on. "
        "After the step, step() all-gathers the updated fp16 partitions with torch.distributed.all_gather over a list "
        "of world_size narrow views, in allgather_bucket_size shards: torch's ProcessGroupNCCL copies each piece of "
        "its flat output into its list tensor. The reduce takes no list, so its only copies are the bucket's own"
    ),
)
"""DeepSpeed 2020's ZeRO-2 (P_os+g), as the paper's ZeRO-100B ran it, and its ZeRO-1 (P_os) for C1 and C2."""

PYTORCH_12_RNG = RngState(
    forks=1,
    checkpoint=True,
    source=(
        "The paper's artifact description lists PyTorch 1.2, which DeepSpeed v0.2.0's Dockerfile installs "
        "(torch==1.2.0): its CUDA generator is a seed and a Philox offset on the host (torch 1.2.0 wheel, "
        "include/ATen/CUDAGenerator.h), so getting and setting the state around Megatron-LM's forks and DeepSpeed's "
        "activation checkpoint (deepspeed/pt/deepspeed_checkpointing.py, synchronize_checkpoint_boundary off by "
        "default) costs the device nothing"
    ),
)
"""The paper's runs' RNG state handling on PyTorch 1.2: host-side, free for the device."""

STACKS["megatron-2019+deepspeed-0.2"] = replace(
    STACKS["megatron-2019"],
    name="megatron-2019+deepspeed-0.2",
    zero=DEEPSPEED_2020,
    rng=PYTORCH_12_RNG,
    sources={**STACKS["megatron-2019"].sources, "zero": DEEPSPEED_2020.source, "rng": PYTORCH_12_RNG.source},
)
"""The paper's program: Megatron-LM 2019's GPT with DeepSpeed 0.2's ZeRO (runs without ZeRO step as Megatron-LM's
own, its ``step_loop``)."""
