"""Checks across a profile's units: measurements that contradict each other are flagged for a fresh measurement.

Two relations hold on any host, whatever its speed:

- **a shape in a smaller world is not slower than in a larger one.** With more processes on the host each
  has fewer threads and shares the cores with more others; a piece of the same shape that costs more with
  fewer processes (by ``CROSS_FACTOR``) was taken in a slow moment (``cross_world``);
- **a collective does not get faster as it grows.** A size that costs more than a larger size of the same
  curve by more than twice the threshold was taken in a slow moment (``non_monotone``).

A flagged unit has its replicates discarded and is measured afresh (``replicates.Tally.flag``); if it
contradicts the others again, what it measured is what the host does, and the flag stays in the profile's
rows and its one-line report. Pure functions of the units' values: unit-tested without processes.
"""

from __future__ import annotations

from zerobench.sim.profile import moved_bytes
from zerobench.sim.replicates import FLOOR_S, MAX_SPREAD

CROSS_FACTOR = 1.5
"""A piece 1.5x slower in a smaller world than in a larger one on the same host is flagged. Fewer threads per
process and more processes per core only ever slow a piece down; 1.5 leaves room for the threading overhead a
tiny shape pays with two threads where a larger world gives it one (on the 2-core Xeon VMs the tiny shape's
pieces with one process and two threads were 0.7-1.1x their time with two processes of one thread)."""


def _parts(key: str) -> tuple[str, str, int]:
    """(piece, the shape less its processes and threads, processes) of an ``op_key``."""
    fields = key.split("|")
    return fields[0], "|".join(fields[1:-2]), int(fields[-2][1:])


def cross_world(values: dict[tuple, dict[str, float]]) -> dict[tuple, str]:
    """Compute units (``("compute", ranks, i)`` -> piece key -> seconds) whose piece is ``CROSS_FACTOR`` slower
    than the same shape's with more processes on the host, each with the reason."""
    by: dict[tuple[str, str], list[tuple[int, float, tuple]]] = {}
    for unit, pieces in values.items():
        if unit[0] != "compute":
            continue
        for key, v in pieces.items():
            piece, shape, ranks = _parts(key)
            by.setdefault((piece, shape), []).append((ranks, v, unit))
    out: dict[tuple, str] = {}
    for (piece, _), seen in sorted(by.items()):
        for r, v, unit in seen:
            for r2, v2, _ in seen:
                if r < r2 and v > CROSS_FACTOR * v2 and v - v2 > FLOOR_S and unit not in out:
                    out[unit] = (
                        f"{piece} with {r} process(es) took {v * 1e3:.3f} ms, {v / v2:.1f}x its "
                        f"{v2 * 1e3:.3f} ms with {r2} sharing the host"
                    )
    return out


def non_monotone(values: dict[tuple, dict[str, float]], threshold: float = MAX_SPREAD) -> dict[tuple, str]:
    """Collective units (``("coll", ranks, g, op, nbytes)`` -> curve key -> seconds) that cost more than a
    larger size of the same curve by more than ``2 * threshold`` (and ``FLOOR_S``), each with the reason."""
    curves: dict[str, list[tuple[float, float, tuple]]] = {}
    for unit, pieces in values.items():
        if unit[0] != "coll":
            continue
        for key, v in pieces.items():
            curves.setdefault(key, []).append((moved_bytes(unit[4], unit[2]), v, unit))
    out: dict[tuple, str] = {}
    for key, pts in sorted(curves.items()):
        pts.sort()
        for i, (b, v, unit) in enumerate(pts[:-1]):
            v2, b2 = min((t, b2) for b2, t, _ in pts[i + 1 :])
            if v > v2 * (1 + 2 * threshold) and v - v2 > FLOOR_S:
                out[unit] = f"{key} took {v * 1e3:.3f} ms at {b:.0f} B, more than its {v2 * 1e3:.3f} ms at {b2:.0f} B"
    return out
