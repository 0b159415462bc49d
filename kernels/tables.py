"""Work tables the kernels consume, as pure data (unit-tested without kernels or processes).

``adamw_blocks`` splits a flat partition into blocks that each lie wholly inside or outside the
weight-decay ranges, so that a kernel program (a Triton program, or an OpenMP iteration on CPU) handles one
block with one decay flag: the multi-tensor-apply idea over a single flat buffer. Given ``spans``, the table
covers only those ranges (one param group's parameters: the step runs once per group, with its
hyperparameters, and leaves the rest of the partition alone). ``copy_pieces`` splits a
multi-tensor flatten/unflatten into byte pieces of bounded size so that the work balances over threads.
"""

from __future__ import annotations

import torch


def adamw_blocks(
    numel: int, decay_ranges: list[tuple[int, int]], block: int, spans: list[tuple[int, int]] | None = None
) -> torch.Tensor:
    """``[n, 3]`` int64 rows ``(start, end, decay)`` covering ``[0, numel)`` in order, each at most ``block`` long.

    ``decay_ranges`` are half-open ``(lo, hi)`` ranges inside the partition (sorted or not; they must not
    overlap). Elements outside every range get no weight decay. With ``spans`` (ranges of the same kind),
    the rows cover only the spans' elements, in order.
    """
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    segments = [(lo, hi, 1) for lo, hi in _checked(decay_ranges, numel, "decay")]
    pos, filled = 0, []
    for lo, hi, d in segments:
        if lo > pos:
            filled.append((pos, lo, 0))
        filled.append((lo, hi, d))
        pos = hi
    if pos < numel:
        filled.append((pos, numel, 0))
    if spans is not None:
        filled = _restrict(filled, _checked(spans, numel, "span"))
    rows = [(s, min(s + block, e), d) for s0, e, d in filled for s in range(s0, e, block)]
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, 3)


def _checked(ranges: list[tuple[int, int]], numel: int, what: str) -> list[tuple[int, int]]:
    """The non-empty ranges, sorted; a range that overlaps another or leaves ``[0, numel)`` is refused."""
    out = sorted((lo, hi) for lo, hi in ranges if hi > lo)
    pos = 0
    for lo, hi in out:
        if lo < pos or hi > numel or lo < 0:
            raise ValueError(f"{what} range ({lo}, {hi}) overlaps another or lies outside [0, {numel})")
        pos = hi
    return out


def _restrict(segments: list[tuple[int, int, int]], spans: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """The parts of ``segments`` (sorted, contiguous) inside ``spans`` (sorted, disjoint)."""
    out, i = [], 0
    for lo, hi in spans:
        while i < len(segments) and segments[i][1] <= lo:
            i += 1
        j = i
        while j < len(segments) and segments[j][0] < hi:
            s, e, d = segments[j]
            out.append((max(s, lo), min(e, hi), d))
            j += 1
    return out


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
