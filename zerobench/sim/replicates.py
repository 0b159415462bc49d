"""How ``zerobench profile`` decides that a piece is measured: replicates, outliers and a stopping rule.

A *unit* is one thing the profiler times in one go (a compute shape's forward and backward, a collective at
one size, a per-element cost at one size, ...); one timing of it is a *replicate*, which gives a value for
each of its *pieces* (a shape's step gives its embedding, block and head pieces). The profiler takes a few
replicates of every unit in each *pass*, round-robin over the units (``measure.profile_suite``), and passes
follow one another over the whole profiling time, so the replicates of one piece are spread over that time
rather than taken back to back: a noisy moment of the host touches one replicate of many pieces, not every
replicate of one.

After each pass, per piece (``estimate``):

- a replicate far from the others (``outliers``: beyond ``OUTLIER_MADS`` robust deviations of the median,
  and beyond twice the threshold) is rejected, and a unit left with fewer than ``MIN_KEPT`` replicates is
  measured again;
- the piece's value is the mean of its kept replicates (each replicate is itself a mean over samples: see
  ``measure_compute.STATISTIC``), its *spread* their half-range relative to it;
- it has *settled* when at least ``MIN_KEPT`` replicates are kept and their half-range is at most the
  threshold (``MAX_SPREAD`` of the value by default) or ``FLOOR_S``, whichever is larger.

``Tally.plan`` asks for more replicates of the units with a piece not settled until the time limit; a unit
flagged by a check across units (``flag``: a shape slower in a smaller world, a collective slower at a
smaller size) has its replicates discarded and is measured afresh, once. Nothing here touches a process
or a clock: it is arithmetic on samples, unit-tested on synthetic ones.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

MAX_SPREAD = 0.05
"""Default threshold: a piece has settled when its kept replicates lie within ±5% of their mean."""
FLOOR_S = 50e-6
"""Below 50 µs a spread is settled whatever its relative size: a collective of 1 KiB on gloo varies by tens of
µs from call to call, which no step of the suites' sizes can resolve."""
MIN_KEPT = 3
"""Replicates a piece needs (after rejections) before it can settle."""
MAX_REPLICATES = 12
"""Replicates a unit is given at most (kept and rejected together); past them it stays unsettled."""
OUTLIER_MADS = 3.0
"""A replicate further than this many robust standard deviations (1.4826 x the median absolute deviation)
from the median is an outlier, provided it is also further than twice the threshold."""
STALL_FACTOR = 1.5
"""Within one replicate, a sample (a step) longer than 1.5x the median sample and an outlier by
``OUTLIER_MADS`` is a stall: a run's median step never pays one that fewer than half its steps meet."""


def _mad(xs: list[float], m: float) -> float:
    return 1.4826 * statistics.median(abs(x - m) for x in xs)


def outliers(values: list[float], threshold: float = MAX_SPREAD) -> list[bool]:
    """Which of ``values`` (one piece's replicates) lie too far from the rest: further from their median than
    ``OUTLIER_MADS`` robust deviations, than ``2 * threshold`` of the median and than ``FLOOR_S``. With fewer
    than three values nothing is judged (two that disagree are settled by a third)."""
    if len(values) < 3:
        return [False] * len(values)
    m = statistics.median(values)
    limit = max(OUTLIER_MADS * _mad(values, m), 2 * threshold * abs(m), FLOOR_S)
    return [abs(v - m) > limit for v in values]


def stalls(samples: list[float]) -> list[bool]:
    """Which samples of one replicate are stalls (only ever slow ones): longer than ``STALL_FACTOR`` x the
    median and than the median plus ``OUTLIER_MADS`` robust deviations and ``FLOOR_S``. Fewer than half
    the samples can be, so the replicate keeps its median sample."""
    if len(samples) < 3:
        return [False] * len(samples)
    m = statistics.median(samples)
    limit = max(STALL_FACTOR * m, m + OUTLIER_MADS * _mad(samples, m), m + FLOOR_S)
    return [s > limit for s in samples]


def stall_free_mean(samples: list[float]) -> float:
    """The mean of ``samples`` less their stalls (``stalls``)."""
    drop = stalls(samples)
    return statistics.fmean(s for s, d in zip(samples, drop) if not d)


@dataclass(frozen=True)
class Estimate:
    """One piece's value from its replicates."""

    value: float
    """Mean of the kept replicates (seconds)."""
    spread: float
    """Half-range of the kept replicates relative to ``value`` (0.05: they lie within ±5%)."""
    kept: int
    rejected: int
    settled: bool


def estimate(replicates: list[float], threshold: float = MAX_SPREAD) -> Estimate:
    """The value, spread and settledness of one piece from all its replicates so far (see the module)."""
    out = outliers(replicates, threshold)
    kept = [v for v, o in zip(replicates, out) if not o]
    value = statistics.fmean(kept)
    half = (max(kept) - min(kept)) / 2
    spread = half / abs(value) if value else 0.0
    settled = len(kept) >= MIN_KEPT and half <= max(threshold * abs(value), FLOOR_S)
    return Estimate(value, spread, len(kept), len(replicates) - len(kept), settled)


@dataclass
class Tally:
    """Every piece's replicates over the passes, and what the next pass should measure."""

    threshold: float = MAX_SPREAD
    samples: dict[tuple, dict[str, list[float]]] = field(default_factory=dict)
    """unit -> piece -> replicate values, in the order taken."""
    taken: dict[tuple, int] = field(default_factory=dict)
    """unit -> replicates taken (discarded ones included: the cap counts the work done)."""
    flagged: dict[tuple, str] = field(default_factory=dict)
    """unit -> why a check across units flagged it (kept once it has been measured afresh: it stayed so)."""
    refreshed: set = field(default_factory=set)
    """Units whose replicates were discarded after a flag (a unit is measured afresh once)."""

    def add(self, unit: tuple, values: dict[str, float]) -> None:
        """One replicate of ``unit``: a value per piece."""
        pieces = self.samples.setdefault(unit, {})
        for piece, v in values.items():
            pieces.setdefault(piece, []).append(float(v))
        self.taken[unit] = self.taken.get(unit, 0) + 1

    def estimates(self, unit: tuple) -> dict[str, Estimate]:
        return {piece: estimate(vs, self.threshold) for piece, vs in self.samples.get(unit, {}).items() if vs}

    def settled(self, unit: tuple) -> bool:
        est = self.estimates(unit)
        return bool(est) and all(e.settled for e in est.values())

    def flag(self, unit: tuple, why: str) -> bool:
        """A check across units found ``unit`` implausible. The first time, its replicates are discarded so that the
        next passes measure it afresh (True); a unit measured afresh that fails the check again keeps the flag,
        with ``why`` (False): what it measured is what the host does."""
        self.flagged[unit] = why
        if unit in self.refreshed:
            return False
        self.refreshed.add(unit)
        self.samples.pop(unit, None)
        self.taken[unit] = 0
        return True

    def clear_flag(self, unit: tuple) -> None:
        self.flagged.pop(unit, None)

    def lacking(self, unit: tuple) -> bool:
        """Whether ``unit`` has a piece with fewer than ``MIN_KEPT`` kept replicates (or none at all): it is
        measured again even past the time limit, within ``MAX_REPLICATES``."""
        est = self.estimates(unit)
        return not est or min(e.kept for e in est.values()) < MIN_KEPT

    def plan(self, units: list[tuple], first: int = MIN_KEPT - 1, every: bool = False) -> dict[tuple, int]:
        """Replicates to take of each of ``units`` in the next pass: ``first`` of a unit with none; with ``every``,
        at least one more of each (so that every piece has replicates from two moments); else only of the units
        not settled, as many as they lack (at least one); never past ``MAX_REPLICATES`` a unit."""
        out = {}
        for u in units:
            if not self.estimates(u):
                want = first
            elif self.settled(u) and not every:
                continue
            else:
                want = max(1, MIN_KEPT - min(e.kept for e in self.estimates(u).values()))
            want = min(want, MAX_REPLICATES - self.taken.get(u, 0))
            if want > 0:
                out[u] = want
        return out

    def unsettled(self) -> list[tuple[tuple, str, Estimate | None]]:
        """(unit, piece, its estimate) of every piece not settled, and every flagged unit (piece ``""``)."""
        out = []
        for u in self.samples:
            for piece, e in self.estimates(u).items():
                if not e.settled:
                    out.append((u, piece, e))
        return out + [(u, "", None) for u in self.flagged]
