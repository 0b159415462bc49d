"""Work tables the kernels consume, as pure data (unit-tested without kernels or processes).

``adamw_blocks`` splits a flat partition into blocks that each lie wholly inside or outside the
weight-decay ranges, so that a kernel program (a Triton program, or an OpenMP iteration on CPU) handles one
block with one decay flag: the multi-tensor-apply idea over a single flat buffer. ``copy_pieces`` splits a
multi-tensor flatten/unflatten into byte pieces of bounded size so that the work balances over threads.
"""

from __future__ import annotations

import torch


def adamw_blocks(numel: int, decay_ranges: list[tuple[int, int]], block: int) -> torch.Tensor:
    """``[n, 3]`` int64 rows ``(start, end, decay)`` covering ``[0, numel)`` in order, each at most ``block`` long.

    ``decay_ranges`` are half-open ``(lo, hi)`` ranges inside the partition (sorted or not; they must not
    overlap). Elements outside every range get no weight decay.
    """
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    ranges = sorted((lo, hi) for lo, hi in decay_ranges if hi > lo)
    segments: list[tuple[int, int, int]] = []
    pos = 0
    for lo, hi in ranges:
        if lo < pos or hi > numel or lo < 0:
            raise ValueError(f"decay range ({lo}, {hi}) overlaps another or lies outside [0, {numel})")
        if lo > pos:
            segments.append((pos, lo, 0))
        segments.append((lo, hi, 1))
        pos = hi
    if pos < numel:
        segments.append((pos, numel, 0))
    rows = [(s, min(s + block, e), d) for s0, e, d in segments for s in range(s0, e, block)]
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, 3)


def copy_pieces(nbytes: list[int], flat_offsets: list[int], piece_bytes: int) -> torch.Tensor:
    """``[n, 4]`` int64 rows ``(tensor index, byte offset in tensor, byte offset in flat, bytes)``."""
    if piece_bytes < 1:
        raise ValueError(f"piece_bytes must be >= 1, got {piece_bytes}")
    rows = [
        (t, off, flat + off, min(piece_bytes, size - off))
        for t, (size, flat) in enumerate(zip(nbytes, flat_offsets))
        for off in range(0, size, piece_bytes)
    ]
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, 4)
