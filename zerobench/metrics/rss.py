"""Resident memory by category, from ``/proc/self/smaps`` (Linux): what a process's RSS is made of at its
highest point, so that host memory beyond the tensors a system holds is accounted for.

``rss_breakdown`` splits the resident set into:

- ``tensors``: resident pages under live tensor storages (the live-tensor tracker's);
- ``libraries``: file-backed mappings (torch's and Python's shared objects, the modules' code);
- ``heap``: the rest of malloc's main heap: the interpreter's objects, small allocations, and the freed
  blocks malloc keeps;
- ``native``: anonymous mappings that hold no live tensor: C++ buffers (gloo's, OpenMP's), thread
  stacks and arenas, tensors made where the tracker does not see them;
- ``other``: the main stack, vdso and the like.

``RssPeak`` samples the RSS (``/proc/self/statm``, one read) after every operator the tracker sees and
keeps the breakdown at the highest sample. A sample is taken between operators, so a buffer that lives
only inside one (a collective's scratch) can push ``VmHWM`` above the highest sample.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

CATEGORIES = ("tensors", "libraries", "heap", "native", "other")
ENV = "ZEROBENCH_RSS_BREAKDOWN"
"""Set to 1 by a launcher (``zerobench peers``' memory runs) to have a rank break its peak RSS down."""
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class Mapping:
    """One mapping of the address space: ``[start, end)``, its name (a path, ``[heap]``, or empty) and
    resident bytes."""

    start: int
    end: int
    name: str
    rss: int


def current_rss() -> int | None:
    """Resident bytes of this process now, or None where /proc is unavailable."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return None


def parse_smaps(text: str) -> list[Mapping]:
    """The mappings of an smaps listing, with their ``Rss``."""
    out: list[Mapping] = []
    head: tuple[int, int, str] | None = None
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0].endswith(":") and head is not None:
            if parts[0] == "Rss:":
                out.append(Mapping(*head, int(parts[1]) * 1024))
                head = None
            continue
        lo, _, hi = parts[0].partition("-")
        if hi:
            head = (int(lo, 16), int(hi, 16), " ".join(parts[5:]))
    return out


def read_mappings() -> list[Mapping] | None:
    try:
        with open("/proc/self/smaps") as f:
            return parse_smaps(f.read())
    except OSError:
        return None


def rss_breakdown(mappings: Iterable[Mapping], live: Iterable[tuple[int, int]]) -> dict[str, int]:
    """Resident bytes by category (``CATEGORIES``) given the live tensor storages as (address, bytes).

    A storage's bytes count as ``tensors`` up to the resident bytes of the mapping they lie in (untouched
    pages of a storage are not resident); the rest of an anonymous mapping's resident bytes is ``heap``
    for ``[heap]`` and ``native`` otherwise."""
    maps = sorted((m for m in mappings if m.rss), key=lambda m: m.start)
    starts = [m.start for m in maps]
    covered = [0] * len(maps)
    for ptr, n in live:
        i = max(bisect.bisect_right(starts, ptr) - 1, 0)
        while i < len(maps) and maps[i].start < ptr + n:
            covered[i] += max(0, min(maps[i].end, ptr + n) - max(maps[i].start, ptr))
            i += 1
    out = dict.fromkeys(CATEGORIES, 0)
    for m, cov in zip(maps, covered):
        if m.name.startswith("/"):
            out["libraries"] += m.rss
        elif m.name in ("", "[heap]"):
            tensors = min(cov, m.rss)
            out["tensors"] += tensors
            out["heap" if m.name == "[heap]" else "native"] += m.rss - tensors
        else:
            out["other"] += m.rss
    return out


class RssPeak:
    """The highest RSS sampled between operators, and its breakdown then (see the module docstring)."""

    def __init__(self, live: Callable[[], list[tuple[int, int]]], step: int = 1 << 20):
        self.live, self.step = live, step
        self.peak = 0
        self.breakdown: dict[str, int] | None = None

    def reset(self) -> None:
        self.peak, self.breakdown = 0, None

    def sample(self) -> None:
        """Read the RSS; past the highest sample by ``step`` bytes or more, take the breakdown (one smaps read)."""
        rss = current_rss()
        if rss is None or rss < self.peak + self.step:
            return
        maps = read_mappings()
        if maps is None:
            return
        self.breakdown = rss_breakdown(maps, self.live())
        self.peak = sum(self.breakdown.values())
