"""A shard's signature: which parts of a device tensor changed since it was last signed, computed on the device
and read back as a few integers, so that only a changed shard crosses to the host.

The tensor's elements, read as integers of their own width (16-bit for bf16/fp16, 32-bit for fp32), are summed in
spans of ``SPAN`` elements, twice, each element weighted by its position in the span: two weights in [1, 32768] per
position, taken from a bijection of 30-bit integers, so that no two positions of a span have the same pair. A plain
sum of the bits cannot see a change that keeps it: a permutation in place (a transpose, a flip, rows swapped) or
negating as many positive as negative values. Weighted so, a swap of two unequal elements, or a pair of sign flips,
moves the sums by (a - b) x (w_i - w_j), which is zero for both sets only where both weights match, which they never
do; a value moved to another span changes both spans' sums. A change goes unseen only where it keeps both weighted
sums of every span, which takes changed values in exact integer proportion to the weights. Every product and sum
is exact in int32 or int64 (no wrap-around, which C++ leaves undefined for signed integers).
"""

from __future__ import annotations

import torch

SPAN = 1 << 16
"""Elements summed under one set of position weights."""
GROUP = 8
"""Spans signed per kernel: the temporaries of one group are about 12.5 MiB at their peak (measured on the CPU with
torch's profiler, bf16 and fp32 alike: the products, and their int64 copy for the sum)."""
_MASK = (1 << 30) - 1
_WEIGHTS: dict[torch.device, torch.Tensor] = {}


def _mix(x: int) -> int:
    """A bijection of 30-bit integers (xor-shifts and odd multipliers, each invertible modulo 2**30)."""
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & _MASK
    x ^= x >> 12
    x = (x * 0x297A2D39) & _MASK
    x ^= x >> 15
    return x


def position_weights(device: torch.device) -> torch.Tensor:
    """``int64 [2, SPAN]``: the two weight sets, each in [1, 32768], cached per device. Position i's pair is the
    high and low 15 bits of ``_mix(i)``, so no two positions share both."""
    if device not in _WEIGHTS:
        mixed = [_mix(i) for i in range(SPAN)]
        rows = [[(m >> 15) + 1 for m in mixed], [(m & 0x7FFF) + 1 for m in mixed]]
        _WEIGHTS[device] = torch.tensor(rows, dtype=torch.int64).to(device)
    return _WEIGHTS[device]


def signature(t: torch.Tensor) -> torch.Tensor:
    """``int64 [2 * spans]``: the two position-weighted sums of each span of ``t``'s elements read as integers
    (``t`` contiguous, of a 2- or 4-byte dtype). Equal signatures of one tensor taken at two times mean equal
    contents, but for the changes the module docstring names."""
    wide = t.element_size() == 4
    ints = t.reshape(-1).view(torch.int32 if wide else torch.int16)
    w64 = position_weights(t.device)
    w = w64 if wide else w64.to(torch.int32)  # 16-bit: int32 products below 2**30; 32-bit: int64 below 2**46
    n, step, sums = ints.numel(), SPAN * GROUP, []
    for start in range(0, n, step):
        part = ints[start : start + step]
        part = part.to(torch.int64) if wide else part
        spans, tail = divmod(part.numel(), SPAN)
        if spans:  # sums of 2**16 products: below 2**46 (16-bit) or 2**62 (32-bit)
            whole = part[: spans * SPAN].view(spans, 1, SPAN) * w
            sums.append(whole.sum(-1, dtype=torch.int64).reshape(-1))
        if tail:
            sums.append((part[spans * SPAN :].view(1, tail) * w[:, :tail]).sum(-1, dtype=torch.int64))
    return torch.cat(sums) if sums else torch.zeros(0, dtype=torch.int64, device=t.device)


def changed(before: list[torch.Tensor] | None, now: list[torch.Tensor]) -> list[bool]:
    """Per tensor, whether its signature differs from ``before`` (every one where ``before`` is None), with one
    read back from the device."""
    if before is None:
        return [True] * len(now)
    if not now:
        return []
    return torch.stack([(a != b).any() for a, b in zip(before, now)]).tolist()
