"""zerobench kernels: fused AdamW over flat partitions, bias+GeLU, LayerNorm, causal scaled softmax, and the
multi-tensor flatten/unflatten copy.

Each op has a pure-PyTorch reference (``kernels.reference``, fp64-capable), a Triton implementation for CUDA
(``kernels.triton_kernels``, tested on CPU under ``TRITON_INTERPRET=1``) and a C++ implementation for CPU
(``kernels.cpu``), registered as ``torch.ops.zerobench.*`` custom ops that dispatch by device
(``kernels.ops``). Callers choose with a mode: ``"auto"`` uses the fused kernels where the device has them
and the reference otherwise, ``"fused"`` requires them, ``"reference"`` forces the pure-PyTorch path.
"""

from __future__ import annotations

import logging

import torch

from kernels import cpu, ops, reference, tables
from kernels.cpu import KernelUnavailable

MODES = ("auto", "fused", "reference")
CPU_ADAMW_BLOCK = 16384
TRITON_ADAMW_BLOCK = 1024
_log = logging.getLogger(__name__)
_warned: set[str] = set()

__all__ = [
    "MODES",
    "KernelUnavailable",
    "adamw_blocks",
    "available",
    "bias_gelu",
    "causal_softmax",
    "flatten_into_",
    "fused_adamw_",
    "layer_norm",
    "nonfinite_",
    "reference",
    "resolve",
    "tables",
    "unflatten_from_",
]


def available(device: torch.device | str) -> tuple[bool, str]:
    """Whether the fused kernels run on ``device``, and if not, why (one line)."""
    kind = torch.device(device).type
    if kind == "cpu":
        try:
            cpu.library()
            return True, ""
        except KernelUnavailable as e:
            return False, str(e)
    if kind == "cuda":
        try:
            import triton  # noqa: F401

            return True, ""
        except ImportError:
            return False, "triton is not installed (pip install triton)"
    return False, f"no fused kernels for device type {kind!r}"


def resolve(mode: str, device: torch.device | str) -> str:
    """``"fused"`` or ``"reference"`` for ``mode`` on ``device``; ``"fused"`` mode raises if unavailable."""
    if mode not in MODES:
        from zerobench.config import ConfigError

        raise ConfigError(f"unknown kernel mode {mode!r}: choose one of {', '.join(MODES)}")
    if mode == "reference":
        return "reference"
    ok, why = available(device)
    if ok:
        return "fused"
    if mode == "fused":
        raise KernelUnavailable(why)
    if why not in _warned:
        _warned.add(why)
        _log.warning("fused kernels unavailable, using the reference path: %s", why)
    return "reference"


def adamw_blocks(
    numel: int,
    decay_ranges: list[tuple[int, int]],
    device: torch.device | str,
    spans: list[tuple[int, int]] | None = None,
) -> torch.Tensor:
    """The block table for ``fused_adamw_`` on ``device`` (block size matched to the implementation); with
    ``spans``, over those ranges only (the kernel then updates nothing else)."""
    dev = torch.device(device)
    block = TRITON_ADAMW_BLOCK if dev.type == "cuda" else CPU_ADAMW_BLOCK
    return tables.adamw_blocks(numel, decay_ranges, block, spans).to(dev)


def _check_flat(name: str, t: torch.Tensor, numel: int, device: torch.device) -> None:
    if t.device != device or not t.is_contiguous() or t.numel() != numel:
        raise ValueError(
            f"{name} must be a contiguous tensor of {numel} elements on {device}, "
            f"got {tuple(t.shape)} on {t.device} (contiguous={t.is_contiguous()})"
        )


def fused_adamw_(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    *,
    blocks: torch.Tensor,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    step: int,
    grad_scale: float = 1.0,
    out: torch.Tensor | None = None,
    found_inf: torch.Tensor | None = None,
    adopt: bool = False,
) -> None:
    """One AdamW step over the flat fp32 partition ``param`` in place, in a single pass.

    ``grad`` is fp32, bf16 or fp16 and is multiplied by ``grad_scale`` first (in the ZeRO engine: 1 / loss scale
    times the clip coefficient). ``blocks`` comes from ``adamw_blocks`` and says where weight decay applies.
    ``out`` (bf16/fp16/fp32, optional) receives the updated partition rounded to nearest even — the
    low-precision parameter copy — in the same pass. A nonzero ``found_inf`` skips the step entirely.

    ``adopt`` (a bf16/fp16 ``out`` that this kernel wrote last step): an element of ``out`` whose bits are no longer
    ``param``'s rounding was changed in place since (by the user, between steps), and the step starts from that
    value instead of ``param``'s, as ``torch.optim`` steps whatever a parameter holds. It costs one more read of
    ``out`` in the same pass.
    """
    n, dev = param.numel(), param.device
    if param.dtype != torch.float32:
        raise ValueError(f"param (the master partition) must be fp32, got {param.dtype}")
    for name, t in (("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq), ("param", param)):
        _check_flat(name, t, n, dev)
    if exp_avg.dtype != torch.float32 or exp_avg_sq.dtype != torch.float32:
        raise ValueError("exp_avg and exp_avg_sq must be fp32")
    if out is not None:
        _check_flat("out", out, n, dev)
    if step < 1:
        raise ValueError(f"step is 1-based, got {step}")
    eager = None if torch.compiler.is_compiling() else ops.EAGER_ADAMW.get(dev.type)
    (eager or ops.adamw_)(
        param,
        grad,
        exp_avg,
        exp_avg_sq,
        out,
        blocks,
        found_inf,
        lr,
        betas[0],
        betas[1],
        eps,
        weight_decay,
        step,
        grad_scale,
        adopt,
    )


def nonfinite_(x: torch.Tensor, flag: torch.Tensor) -> None:
    """Set ``flag`` (one fp32 element) to 1 when ``x`` holds inf or NaN (no host sync on CUDA)."""
    ops.nonfinite_(x.contiguous(), flag)


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none", mode: str = "auto") -> torch.Tensor:
    """``gelu(x + bias)`` fused (erf form, or ``approximate="tanh"``); differentiable."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    if resolve(mode, x.device) == "reference":
        return reference.bias_gelu(x, bias, approximate)
    return ops.bias_gelu_op(x, bias, approximate)


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5, mode: str = "auto"
) -> torch.Tensor:
    """LayerNorm over the last dimension with affine ``weight``/``bias``; differentiable."""
    if resolve(mode, x.device) == "reference":
        return reference.layer_norm(x, weight, bias, eps)
    return ops.layer_norm_op(x.contiguous(), weight, bias, eps)[0]


def causal_softmax(x: torch.Tensor, scale: float, mode: str = "auto") -> torch.Tensor:
    """softmax(scale * x) over ``[..., s, s]`` attention scores with the causal mask; differentiable."""
    if x.shape[-1] != x.shape[-2]:
        raise ValueError(f"causal softmax takes square [..., s, s] scores, got {tuple(x.shape)}")
    if resolve(mode, x.device) == "reference":
        return reference.causal_softmax(x, scale)
    return ops.causal_softmax_op(x.contiguous(), scale)


def _check_copy(flat: torch.Tensor, tensors: list[torch.Tensor], offsets: list[int]) -> None:
    if len(tensors) != len(offsets):
        raise ValueError(f"{len(tensors)} tensors but {len(offsets)} offsets")
    for i, (t, off) in enumerate(zip(tensors, offsets)):
        if t.dtype != flat.dtype or t.device != flat.device or not t.is_contiguous():
            raise ValueError(f"tensor {i} must be contiguous {flat.dtype} on {flat.device} like the flat buffer")
        if off < 0 or off + t.numel() > flat.numel():
            raise ValueError(
                f"tensor {i} ({t.numel()} elements at offset {off}) overruns the flat buffer of {flat.numel()}"
            )


def flatten_into_(flat: torch.Tensor, tensors: list[torch.Tensor], offsets: list[int]) -> None:
    """``flat[off : off + t.numel()] = t`` for every tensor, in one multi-tensor kernel."""
    _check_copy(flat, tensors, offsets)
    ops.flat_copy_(flat, tensors, list(offsets), False)


def unflatten_from_(flat: torch.Tensor, tensors: list[torch.Tensor], offsets: list[int]) -> None:
    """``t = flat[off : off + t.numel()]`` for every tensor, in one multi-tensor kernel."""
    _check_copy(flat, tensors, offsets)
    ops.flat_copy_(flat, tensors, list(offsets), True)
