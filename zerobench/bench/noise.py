"""The regression gate's noise model: how far a metric moves between unchanged runs, and the tolerance that gives.

A baseline recorded from K unchanged runs (``zerobench regress --write-baseline FILE --candidate DIR1 ... DIRK``)
holds, per configuration and gated metric, a ``gate_noise`` row with the K values: their mean is the baseline
value (``center``), their relative standard deviation the noise (``value``: sigma of x / center). The mean, not
the median, because the bound below is a prediction bound around the mean: centred on the median it would
false-alarm about 10-15% more often than stated at K = 3-5. A candidate's
value x regresses when x / center - 1 exceeds

    tolerance = max(floor, k * sigma),  k = t(1 - alpha / M; K - 1) * sqrt(1 + 1 / K)

the one-sided Student-t prediction bound for one more run of unchanged code (K runs give the mean and sigma it is
measured against), at a false-alarm rate alpha / M per comparison: M is the number of noise-modelled comparisons
in the gate run, so the whole gate run false-alarms with probability at most alpha (Bonferroni). This assumes
normal noise: instruction counts move by address and hash-seed effects, close to it; CPU time on a busy machine
moves in bursts, heavier-tailed, which the floors and the recorded campaign (``scripts/gate_campaign.sh``) check.
A metric whose K values are all equal (sigma 0: a deterministic count) is compared exactly.

The floors are the smallest tolerances the gate applies, per family: changes below them are not called. Each
family has a relative floor and an absolute one (``ABS_FLOORS``, in the metric's unit): a phase that does little
work (a few dozen Python calls, a few hundred thousand instructions) moves by a garbage collection or a dict
resize, a whole-percent change of almost nothing, even when K unchanged runs happened to agree exactly.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

NOISE_METRIC = "gate_noise"
FLOORS = {"instructions": 0.01, "py_calls": 0.01, "host_cpu_s": 0.05}
"""Smallest tolerance per metric family (a metric ``name.phase`` belongs to family ``name``)."""
DEFAULT_FLOOR = 0.01
ABS_FLOORS = {"instructions": 2e5, "py_calls": 50.0, "host_cpu_s": 1e-3}
"""Smallest change called per metric family, in its unit: about 50 us of host work (2e5 instructions, 1 ms of CPU
time, whose accounting moves by a scheduler tick) and 50 Python calls; a relative tolerance below it is raised
to it for a metric of that size."""


def family(metric: str) -> str:
    """``host_cpu_s.optimizer`` -> ``host_cpu_s``."""
    return metric.split(".", 1)[0]


def floor(metric: str, center: float | None = None) -> float:
    """The relative floor of ``metric`` for a baseline value ``center``: the family's relative floor, or its
    absolute floor divided by ``center``, whichever is larger (the relative one alone without a centre)."""
    rel = FLOORS.get(family(metric), DEFAULT_FLOOR)
    absolute = ABS_FLOORS.get(family(metric))
    if absolute is not None and center:
        rel = max(rel, absolute / abs(center))
    return rel


def t_cdf(t: float, dof: int) -> float:
    """P(T <= t) for Student's t with an integer number of degrees of freedom (the finite series of Abramowitz
    and Stegun 26.7.3-4: exact, no special functions needed)."""
    if dof < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {dof}")
    theta = math.atan(abs(t) / math.sqrt(dof))
    s, c = math.sin(theta), math.cos(theta)
    if dof % 2:  # odd: (2/pi) (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
        series, term = 0.0, c
        for j in range((dof - 1) // 2):
            series += term
            term *= c * c * (2 * j + 2) / (2 * j + 3)
        inside = 2 / math.pi * (theta + s * series)
    else:  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
        series, term = 0.0, 1.0
        for j in range(dof // 2):
            series += term
            term *= c * c * (2 * j + 1) / (2 * j + 2)
        inside = s * series
    return 0.5 + 0.5 * inside if t >= 0 else 0.5 - 0.5 * inside


def t_quantile(p: float, dof: int) -> float:
    """The t with P(T <= t) = p (bisection on ``t_cdf``)."""
    if not 0 < p < 1:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1 - p, dof)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, dof) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, dof) < p else (lo, mid)
    return (lo + hi) / 2


def spread(values: Sequence[float]) -> tuple[float, float]:
    """(center, sigma) of unchanged runs' values: the mean, and the standard deviation of value / mean (0 when
    all are equal; infinite when the mean is 0 and they are not, which the non-negative metrics gated cannot
    reach)."""
    center = statistics.fmean(values)
    if all(v == values[0] for v in values):
        return center, 0.0
    if center == 0:
        return center, math.inf
    return center, statistics.stdev(v / center for v in values)


def factor(n: int, alpha: float) -> float:
    """How many sigmas a value of one more unchanged run stays within with probability 1 - alpha (one-sided),
    when sigma was measured from ``n`` runs."""
    if n < 2:
        return math.inf
    return t_quantile(1 - alpha, n - 1) * math.sqrt(1 + 1 / n)


def tolerance(
    metric: str, sigma: float, n: int, alpha: float, exact_when_still: bool = True, center: float | None = None
) -> float:
    """The tolerance of ``metric`` with noise ``sigma`` measured from ``n`` runs, at false-alarm rate ``alpha``
    for this comparison: max(floor, factor * sigma); 0 (exact) for a metric that did not move, when
    ``exact_when_still`` (a count that is deterministic by construction; a metric known to move, such as CPU time,
    keeps its floor even when a few runs happened to agree). ``center``, the baseline value, sets the absolute
    floor's share."""
    if sigma == 0:
        return 0.0 if exact_when_still else floor(metric, center)
    return max(floor(metric, center), factor(n, alpha) * sigma)
