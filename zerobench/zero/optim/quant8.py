"""Blockwise dynamic 8-bit quantization of optimizer states (Dettmers et al., "8-bit Optimizers via
Block-wise Quantization", ICLR 2022).

A tensor is cut into blocks of ``BLOCK`` elements; each block is normalised by its absolute maximum (kept
in fp32) and every normalised value is stored as the index (uint8) of the nearest entry of a 256-entry
*dynamic* code book. The code book spends most of its entries on large magnitudes and covers eight decades
below the block maximum with progressively fewer entries per decade (the "dynamic tree" idea: relative
precision where the values are, range where they are not). Adam's first moment is signed, the second is
not, so each has its own book: the unsigned one spends the sign bit on twice the entries per decade.

Pure functions over tensors; the optimizer's state codec (``zerobench.zero.optim.states``) calls them.
"""

from __future__ import annotations

import functools
import itertools

import torch

BLOCK = 2048
"""Elements per quantization block (one fp32 absmax each: 0.2% overhead)."""


def _decades(counts: list[int]) -> list[float]:
    """Positive code values: decade k (values in (10^-(k+1), 10^-k]) gets ``counts[k]`` evenly spaced
    entries, the top one exactly 10^-k (so a block's maximum is represented exactly)."""
    out = []
    for k, n in enumerate(counts):
        top, bottom = 10.0**-k, 10.0 ** -(k + 1)
        out += [bottom + (top - bottom) * (i + 1) / n for i in range(n)]
    return out


@functools.cache
def _book(signed: bool) -> torch.Tensor:
    if signed:  # 128 positive, 127 negative, zero
        pos = _decades([64, 32, 16, 8, 4, 2, 1, 1])
        values = pos + [-x for x in _decades([63, 32, 16, 8, 4, 2, 1, 1])] + [0.0]
    else:  # 255 positive, zero
        values = [*_decades([128, 64, 32, 16, 8, 4, 2, 1]), 0.0]
    book = torch.tensor(sorted(values), dtype=torch.float32)
    assert book.numel() == 256 and torch.unique(book).numel() == 256
    return book


def code_book(signed: bool, device: torch.device | str = "cpu") -> torch.Tensor:
    """The 256 sorted code values (in [-1, 1] or [0, 1])."""
    return _book(signed).to(device)


@functools.cache
def _mids(signed: bool) -> torch.Tensor:
    b = _book(signed)
    return (b[1:] + b[:-1]) / 2


def num_blocks(numel: int) -> int:
    return -(-numel // BLOCK)


def quantize_(x: torch.Tensor, codes: torch.Tensor, absmax: torch.Tensor, signed: bool) -> None:
    """Quantize fp32 ``x`` (1-D) into ``codes`` (uint8, same numel) and ``absmax`` (fp32, one per block)."""
    n = x.numel()
    if n == 0:
        return
    nb = num_blocks(n)
    pad = nb * BLOCK - n
    xb = torch.nn.functional.pad(x, (0, pad)).view(nb, BLOCK) if pad else x.view(nb, BLOCK)
    torch.amax(xb.abs(), dim=1, out=absmax)
    scale = torch.where(absmax > 0, absmax, torch.ones_like(absmax)).unsqueeze(1)
    idx = torch.bucketize(xb / scale, _mids(signed).to(x.device))
    codes.copy_(idx.view(-1)[:n])


def dequantize(codes: torch.Tensor, absmax: torch.Tensor, signed: bool) -> torch.Tensor:
    """fp32 values of ``codes`` (1-D uint8) scaled by their blocks' ``absmax``."""
    n = codes.numel()
    if n == 0:
        return torch.empty(0, dtype=torch.float32, device=codes.device)
    vals = code_book(signed, codes.device)[codes.long()]
    nb = num_blocks(n)
    pad = nb * BLOCK - n
    if pad:
        vals = torch.nn.functional.pad(vals, (0, pad))
    return (vals.view(nb, BLOCK) * absmax.unsqueeze(1)).view(-1)[:n]


def runs(numel: int, breaks=()) -> list[tuple[int, int, int]]:
    """``(start, end, first block)`` of each run of a tensor of ``numel`` elements cut at ``breaks`` (sorted offsets
    inside it): a run is quantized in blocks of its own, so no block's absmax mixes two runs."""
    cuts = [0, *(b for b in breaks if 0 < b < numel), numel]
    out, block = [], 0
    for a, b in itertools.pairwise(cuts):
        if b > a:
            out.append((a, b, block))
            block += num_blocks(b - a)
    return out


def run_blocks(numel: int, breaks=()) -> int:
    """Blocks (absmax entries) of a tensor of ``numel`` elements cut at ``breaks``."""
    return sum(num_blocks(b - a) for a, b, _ in runs(numel, breaks))


def state_bytes_per_element() -> float:
    """Bytes per parameter of the two 8-bit moments, absmax included (2 + 8/BLOCK)."""
    return 2.0 + 8.0 / BLOCK
