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
import weakref

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


_CHECKED_TABLES: dict[int, tuple] = {}
"""id -> (a weak reference to a block table already checked, the version and sizes it was checked at): the engine
passes the same table every step, so a CUDA table's rows are read back to the host once, not every step."""


def _check_blocks(blocks: torch.Tensor, numel: int, device: torch.device) -> None:
    """A table the kernels can run: ``[n, 3]`` int64 rows on ``device``, each inside ``[0, numel)`` and at most the
    device's block long (the C++ kernel would write past the partition, the Triton kernel would leave the rest of a
    longer row unstepped)."""
    if blocks.dtype != torch.int64 or blocks.dim() != 2 or blocks.shape[1] != 3 or blocks.device != device:
        raise ValueError(
            f"blocks must be an [n, 3] int64 table on {device} (kernels.adamw_blocks), got {tuple(blocks.shape)} "
            f"{blocks.dtype} on {blocks.device}"
        )
    if torch.compiler.is_compiling():  # traced: the rows are data, checked where the table was made
        return
    limit = {"cuda": TRITON_ADAMW_BLOCK, "cpu": CPU_ADAMW_BLOCK}.get(device.type)
    key = (blocks._version, numel, limit)
    seen = _CHECKED_TABLES.get(id(blocks))
    if seen is not None and seen[0]() is blocks and seen[1] == key:
        return
    rows = blocks.cpu()
    start, end = rows[:, 0], rows[:, 1]
    bad = (start < 0) | (end < start) | (end > numel)
    if limit is not None:
        bad |= end - start > limit
    if bool(bad.any()):
        s, e, _ = rows[bad.nonzero()[0, 0]].tolist()
        raise ValueError(
            f"blocks row ({s}, {e}) is not a range of at most {limit or numel} elements inside the partition's "
            f"{numel}: build the table with kernels.adamw_blocks for this partition and device"
        )
    ident = id(blocks)
    _CHECKED_TABLES[ident] = (weakref.ref(blocks, lambda _: _CHECKED_TABLES.pop(ident, None)), key)


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
    _check_blocks(blocks, n, dev)
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


def _check_last_dim(x: torch.Tensor, **params: torch.Tensor) -> None:
    """The fused bodies index each parameter by ``x``'s last dimension: anything but a 1-D tensor of that size on
    ``x``'s device would be read past its end or broadcast differently from torch's op, so it is refused."""
    for name, t in params.items():
        if t is None or t.dim() != 1 or t.numel() != x.shape[-1] or t.device != x.device:
            got = "None" if t is None else f"{tuple(t.shape)} on {t.device}"
            raise ValueError(f"{name} must be 1-D of x's last dimension ({x.shape[-1]}) on {x.device}, got {got}")


FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""What the fused bodies compute in: the C++ ones in fp32 (storing in the input's dtype), Triton's in these three."""

TRITON_MAX_ROW = 1 << 20
"""Triton's largest block (``TRITON_MAX_TENSOR_NUMEL``): its LayerNorm and softmax hold one whole row per block."""


def _path(mode: str, x: torch.Tensor, row: int | None = None) -> str:
    """``resolve``'s path for ``x``, where the fused bodies can compute it: a dtype they do not compute in (fp64,
    which the C++ bodies would round through fp32 and Triton refuses) or, on CUDA, a row longer than one Triton block
    takes the reference path under ``auto`` and is a one-line ``ValueError`` under ``fused``."""
    path = resolve(mode, x.device)
    if path == "reference" or x.numel() == 0:
        return "reference"
    why = None
    if x.dtype not in FUSED_DTYPES:
        why = f"the fused kernels compute in fp32, bf16 or fp16, got {x.dtype}"
    elif row is not None and x.device.type == "cuda" and row > TRITON_MAX_ROW:
        why = f"a row of {row} elements exceeds the Triton kernels' one-block rows ({TRITON_MAX_ROW})"
    if why is None:
        return "fused"
    if mode == "fused":
        raise ValueError(f"{why}: use kernels='reference' (or 'auto') for this tensor")
    return "reference"


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none", mode: str = "auto") -> torch.Tensor:
    """``gelu(x + bias)`` fused (erf form, or ``approximate="tanh"``); differentiable."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    _check_last_dim(x, bias=bias)
    if _path(mode, x) == "reference":
        return reference.bias_gelu(x, bias, approximate)
    return ops.bias_gelu_op(x.contiguous(), bias, approximate)


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5, mode: str = "auto"
) -> torch.Tensor:
    """LayerNorm over the last dimension with affine ``weight``/``bias``; differentiable."""
    _check_last_dim(x, weight=weight, bias=bias)
    if _path(mode, x, x.shape[-1]) == "reference":
        return reference.layer_norm(x, weight, bias, eps)
    return ops.layer_norm_op(x.contiguous(), weight, bias, eps)[0]


def causal_softmax(x: torch.Tensor, scale: float, mode: str = "auto") -> torch.Tensor:
    """softmax(scale * x) over ``[..., s, s]`` attention scores with the causal mask; differentiable."""
    if x.shape[-1] != x.shape[-2]:
        raise ValueError(f"causal softmax takes square [..., s, s] scores, got {tuple(x.shape)}")
    if _path(mode, x, x.shape[-1]) == "reference":
        return reference.causal_softmax(x, scale)
    return ops.causal_softmax_op(x.contiguous(), scale)


def _check_copy(flat: torch.Tensor, tensors: list[torch.Tensor], offsets: list[int]) -> None:
    if flat.dim() != 1 or not flat.is_contiguous():
        raise ValueError(
            f"the flat buffer must be 1-D and contiguous, got shape {tuple(flat.shape)} with strides {flat.stride()}"
        )
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
