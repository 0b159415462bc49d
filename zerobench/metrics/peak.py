"""The cards' dense bf16 peak, in one place, for model FLOPs utilisation (MFU).

MFU = model FLOPs per step (``models/sizes.py:flops_per_token``, Megatron's count, no recompute) / step time / the
card's dense bf16 peak. The peak is the vendor's datasheet figure for dense (not 2:4 sparse) bf16 tensor-core
math, keyed by the exact name torch reports (``torch.cuda.get_device_name``), so a card of the same family with
another peak (H100 PCIe, H200 NVL) is not taken for the SXM part:

- NVIDIA H100 SXM5 80GB: 989 TFLOP/s bf16 dense (NVIDIA H100 Tensor Core GPU datasheet: 1,979 with sparsity).
- NVIDIA H200 SXM 141GB: 989 TFLOP/s bf16 dense (NVIDIA H200 Tensor Core GPU datasheet: 1,979 with sparsity; the
  H100's compute with more and faster memory).

A CPU, or a card not listed here, has no stated peak: its MFU is left empty rather than divided by a guess; so
is an fp32 run's, whose dense bf16 peak would mislead.
"""

from __future__ import annotations

DENSE_BF16_PEAK_FLOPS: dict[str, float] = {
    "NVIDIA H100 80GB HBM3": 989e12,
    "NVIDIA H200": 989e12,
}


def dense_bf16_peak(device: str | None) -> float | None:
    """FLOP/s of ``device`` (as torch names it) in dense bf16; None for a CPU or a card not listed."""
    return DENSE_BF16_PEAK_FLOPS.get(device or "")


def mfu(model_flops_per_step: float, step_time_s: float | None, device: str | None, precision: str) -> float | None:
    """Model FLOPs utilisation of one device, or None where no peak applies (CPU, unlisted card, not bf16)."""
    peak = dense_bf16_peak(device)
    if peak is None or not step_time_s or precision != "bf16":
        return None
    return model_flops_per_step / step_time_s / peak
