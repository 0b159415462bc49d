"""Per-GPU memory of a training configuration, by the paper's analysis (§3, §5, §6) plus stated terms.

- Model states: the paper's formulas for mixed-precision Adam (2-byte params and grads, K = 12 bytes of
  fp32 master + moments) on Ψ_mp, this MP rank's parameters (exact count, see ``params_per_mp_rank``); in fp32
  4-byte params and grads and no separate master (the parameters are the master).
  8-bit moments make K = 4 + 2 + 8/2048; optimizer offload moves the master, the moments and (stages 2-3)
  the gradient partition to host memory, parameter offload (stage 3) the parameter partition too
  (``model_states_host``, not counted against the GPU).
- Activation checkpoints: L * b * s * h * e bytes (one block input per layer, e = 2 bytes in fp16/bf16, 4 in
  fp32), divided by MP with P_a, moved to host memory with P_a+cpu.
- Working memory of one block while it is recomputed (or every block without checkpointing): the
  per-layer activation bytes of Korthikanti et al., "Reducing Activation Recomputation in Large
  Transformer Models" (MLSys 2023), eq. 2 with tensor parallelism t and no sequence parallelism:
  s * b * h * (10 + 24/t + 5 * a * s / (h * t)) for 2-byte activations (twice it in fp32).
- The output layer: the logits and the loss over them, 12 bytes per logit of this MP rank (s * b * V / t):
  the logits, their fp32 copy for the cross-entropy and its fp32 gradient, as zerobench's engine was measured
  to hold them (its working peak grows by 12 bytes per logit with the micro-batch, in bf16 and fp32 alike).
  Korthikanti et al. count 4 bytes per logit for Megatron-LM's fused loss.
- Stage 3's gathered parameters: the root unit (embeddings, final LayerNorm) and one block, each whole beside
  its shard while it computes (as ``sim/memory.py`` counts them).
- Constant buffers: the fused communication bucket (C_B), ``cb_elements`` x e bytes, twice (one being
  filled while one is reduced), and never more than one copy of the gradients: the buckets partition them.
  Without C_B one buffer as large as the model's gradients (the paper's point).
- An explicit allocator/fragmentation allowance: ``frag`` x the sum above (default 10% with M_D, 30%
  without — assumptions, not measurements; calibrate from GPU rows where available).
"""

from __future__ import annotations

from dataclasses import dataclass

from zerobench.metrics.analytic import host_state_bytes_analytic, model_state_bytes_analytic
from zerobench.models.config import GPTConfig
from zerobench.models.sizes import params_per_mp_rank


@dataclass(frozen=True)
class PlanConfig:
    """A configuration to plan."""

    model: GPTConfig
    """Model shape (vocabulary already padded for MP)."""
    gpus: int = 400
    """Total GPUs."""
    gpus_per_node: int = 16
    """GPUs per node (16 for the paper's DGX-2)."""
    mp: int = 1
    """Model (tensor) parallel degree."""
    gpu_mem_bytes: float = 32e9
    """Memory per GPU in bytes (the paper's GB = 1e9 bytes)."""
    micro_batch: int = 1
    """Sequences per micro-batch per data-parallel replica."""
    stage: int = 2
    """ZeRO-DP stage 0-3."""
    checkpoint_activations: bool = True
    """Activation checkpointing (one checkpoint per block)."""
    pa: bool = False
    """P_a: partition checkpoints over MP ranks."""
    pa_cpu: bool = False
    """P_a+cpu: checkpoints in host memory."""
    cb_elements: int | None = 500_000_000
    """C_B: fused communication buffer size in elements (None: buffers as large as the model)."""
    md: bool = True
    """M_D: contiguous buffers (lowers the fragmentation allowance)."""
    frag: float | None = None
    """Allocator/fragmentation allowance as a fraction (default 0.10 with M_D, 0.30 without)."""
    optim_bits: int = 32
    """Adam moments in fp32 (K = 12) or blockwise 8-bit (K = 4 + 2 + 8/2048)."""
    offload_optimizer: bool = False
    """ZeRO-Offload: master, moments and (stages 2-3) the gradient partition in host memory."""
    offload_param: bool = False
    """Stage 3: the parameter partition in host memory too."""
    precision: str = "fp16"
    """fp16 or bf16 (2-byte parameters, gradients and activations, an fp32 master) or fp32 (4-byte, no master)."""

    @property
    def elem(self) -> int:
        """Bytes of a parameter, a gradient and an activation element."""
        return 4 if self.precision == "fp32" else 2

    @property
    def k(self) -> float:
        """Bytes of optimizer state per parameter (the paper's K)."""
        if self.optim_bits == 32:
            return 4 + 8
        from zerobench.zero.optim import quant8  # imports torch: only an 8-bit plan pays for it

        return 4 + quant8.state_bytes_per_element()

    @property
    def dp(self) -> int:
        return self.gpus // self.mp


def block_activation_bytes(cfg: GPTConfig, b: int, mp: int) -> float:
    s, h, a = cfg.seq, cfg.hidden, cfg.heads
    return s * b * h * (10 + 24 / mp + 5 * a * s / (h * mp))


LOGIT_BYTES = 12
"""Bytes per logit of the output layer and its loss (the logits, their fp32 copy for the cross-entropy and its
fp32 gradient), as zerobench's engine was measured to hold them: its working peak grows by 12 bytes per logit
with the micro-batch (``mini`` preset, vocabulary 32,768, bf16 and fp32 alike)."""


def gathered_param_bytes(cfg: GPTConfig, mp: int, elem: int) -> float:
    """Stage 3: the root unit (embeddings, final LayerNorm) and one block, gathered whole while they compute."""
    h = cfg.hidden
    root = cfg.vocab * h // mp + cfg.seq * h + 2 * h
    block = 12 * h * h // mp + 7 * h // mp + 6 * h
    return (root + block) * elem


def memory_per_gpu(p: PlanConfig) -> dict[str, float]:
    """Bytes per GPU by category (device), plus host checkpoint bytes and whether it fits."""
    m, e = p.model, p.elem
    psi = params_per_mp_rank(m, p.mp)
    optim, master = p.k - 4, (0 if p.precision == "fp32" else 4)
    states = sum(
        model_state_bytes_analytic(
            psi, p.dp, p.stage, e, e, master, optim, p.offload_optimizer, p.offload_param
        ).values()
    )
    host_states = (
        sum(host_state_bytes_analytic(psi, p.dp, p.stage, e, e, optim, p.offload_param).values())
        if p.offload_optimizer
        else 0.0
    )
    b, s, h, L = p.micro_batch, m.seq, m.hidden, m.layers
    ckpt = ckpt_host = 0.0
    if p.checkpoint_activations:
        ckpt = L * b * s * h * e / (p.mp if (p.pa or p.pa_cpu) else 1)
        if p.pa_cpu:
            ckpt, ckpt_host = 0.0, ckpt
        working = block_activation_bytes(m, b, p.mp) * e / 2
    else:
        working = L * block_activation_bytes(m, b, p.mp) * e / 2
    output = LOGIT_BYTES * s * b * m.vocab / p.mp
    gathered = gathered_param_bytes(m, p.mp, e) if p.stage == 3 else 0.0
    grads = psi * e  # one copy of this rank's gradients: no set of buckets holds more
    buffers = float(min(2 * e * p.cb_elements, grads) if p.cb_elements is not None else grads)
    subtotal = states + ckpt + working + output + gathered + buffers
    frag = p.frag if p.frag is not None else (0.10 if p.md else 0.30)
    total = subtotal * (1 + frag)
    return {
        "params_per_mp_rank": psi,
        "model_states": states,
        "model_states_host": host_states,
        "activation_checkpoints": ckpt,
        "activation_checkpoints_host": ckpt_host,
        "working_activations": working,
        "output_layer": output,
        "stage3_gathered": gathered,
        "buffers": buffers,
        "fragmentation_allowance": subtotal * frag,
        "total": total,
        "fits": total <= p.gpu_mem_bytes,
    }
