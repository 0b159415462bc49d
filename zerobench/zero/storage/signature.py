"""A shard's signature: which parts of a device tensor changed since it was last signed, computed on the device
and read back as a few integers, so that only a changed shard crosses to the host.

The tensor's bits, read as 16-bit integers, are summed in spans of ``SPAN`` elements, twice, each element weighted
by its position in the span (two fixed pseudo-random weights in [1, 65535]). A plain sum of the bits cannot see a
change that keeps it: a permutation in place (a transpose, a flip, rows swapped) or negating as many positive as
negative values. Weighted by position, a swap of two unequal values, or a pair of sign flips, changes the sums unless
the two positions have equal weights in both sets, which no two positions of a span have; a value moved to another
span changes both spans' sums. A change goes unseen only where it keeps both weighted sums of every span, which
takes changed values in exact integer proportion to their weights. Every product fits in int32 and every sum in int64, so the arithmetic is exact: no wrap-around,
which C++ leaves undefined for signed integers.
"""

from __future__ import annotations

import torch

SPAN = 1 << 16
"""16-bit elements summed under one set of position weights."""
GROUP = 64
"""Spans signed per kernel: the temporary is 8 bytes per 16-bit element of a group (32 MiB)."""
_MULTIPLIERS = (2654435761, 2246822519)
"""Two odd 32-bit multipliers (Knuth's multiplicative hash) that make the two weight sets."""
_WEIGHTS: dict[torch.device, torch.Tensor] = {}


def position_weights(device: torch.device) -> torch.Tensor:
    """``int32 [2, SPAN]``: the two weight sets, each in [1, 65535], cached per device."""
    if device not in _WEIGHTS:
        i = torch.arange(SPAN, dtype=torch.int64)
        rows = []
        for mult in _MULTIPLIERS:  # i < 2**16 and mult < 2**32: the product is exact in int64
            h = (i * mult) % (1 << 32)
            h = h ^ (h >> 15)
            rows.append(h % 65535 + 1)
        _WEIGHTS[device] = torch.stack(rows).to(torch.int32).to(device)
    return _WEIGHTS[device]


def signature(t: torch.Tensor) -> torch.Tensor:
    """``int64 [2 * spans]``: the two position-weighted sums of each span of ``t``'s bits (``t`` contiguous, of a
    2- or 4-byte dtype). Equal signatures of one tensor taken at two times mean equal contents, but for the changes
    the module docstring names."""
    bits = t.reshape(-1).view(torch.int16)
    w = position_weights(t.device)
    n, step, sums = bits.numel(), SPAN * GROUP, []
    for start in range(0, n, step):
        part = bits[start : start + step]
        spans, tail = divmod(part.numel(), SPAN)
        if spans:  # int16 x int32 -> int32 products below 2**31; their sums below 2**47
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
