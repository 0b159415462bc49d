"""Statistics of interleaved timing, shared by every side-by-side comparison: the A/B gate (``ab.py``), the
peers comparison (``peers.py``), the kernel benchmark (``kernels.py``) and the stored-baseline gate
(``regress.py``).

Timings taken side by side are compared as ratios per round (candidate / reference taken in the same
round), and a set of rounds by the median of those ratios, which one burst of machine noise cannot move
much. AB/BA round pairs combine by their geometric mean (a drift linear over the pair cancels).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

MEDIAN_SE_FACTOR = 1.2533
"""Standard error of a median / standard error of a mean, for normal noise (sqrt(pi / 2))."""
MAD_TO_SIGMA = 1.4826
"""A normal distribution's standard deviation / its median absolute deviation."""


def median_ratio(xs: Sequence[float], refs: Sequence[float]) -> float:
    """Median over rounds of ``x / ref`` (round k of each taken side by side)."""
    if len(xs) != len(refs) or not xs:
        raise ValueError(f"paired rounds needed: {len(xs)} vs {len(refs)} samples")
    return statistics.median(x / r for x, r in zip(xs, refs))


def abba_pairs(ratios: dict[int, float]) -> list[float]:
    """Geometric mean of each AB/BA round pair's two ratios (rounds 0+1, 2+3, ...; incomplete pairs dropped)."""
    last = max(ratios, default=-1)
    return [math.sqrt(ratios[k] * ratios[k + 1]) for k in range(0, last + 1, 2) if k in ratios and k + 1 in ratios]


def median_standard_error(xs: Sequence[float]) -> float:
    """Standard error of the median of ``xs`` (normal noise); infinite with fewer than two samples."""
    if len(xs) < 2:
        return math.inf
    return MEDIAN_SE_FACTOR * statistics.stdev(xs) / math.sqrt(len(xs))


def undecided(xs: Sequence[float], tolerance: float) -> bool:
    """True while a tolerance boundary (1 +- tolerance) lies within two standard errors of the median ratio."""
    if len(xs) < 2:
        return True
    med, se = statistics.median(xs), median_standard_error(xs)
    return any(abs(med - edge) < 2 * se for edge in (1 - tolerance, 1 + tolerance))


def relative_se_from_mad(mad: float, median: float, n: int) -> float:
    """Relative standard error of a median of ``n`` samples from their median absolute deviation."""
    return MAD_TO_SIGMA * mad / median / math.sqrt(max(n, 1))


def ratio_verdict(ratio: float, tolerance: float) -> str:
    """``REGRESSION`` above 1 + tolerance, ``improvement`` below 1 - tolerance, else ``ok``."""
    if ratio > 1 + tolerance:
        return "REGRESSION"
    return "improvement" if ratio < 1 - tolerance else "ok"


# --- the A/B decision rule: a sign test on AB/BA pairs, with a stated false-alarm rate -------------------------
#
# Under unchanged code the two sides of an A/B comparison are the same experiment with two labels, so each AB/BA
# pair's ratio is as likely to lie above 1 as below it, whatever the machine's noise does (bursts, drift, a
# neighbour): the AB and BA orders cancel any advantage of going first, and relabelling the sides inverts every
# ratio. The count of pairs above 1 is then Binomial(n, 1/2), and "at least c of n pairs above 1" has a
# probability that depends on nothing else: the false-alarm rate. Equivalently, the (n - c + 1)-th smallest pair
# is a lower confidence bound of the median pair ratio. A verdict needs both: the bound above 1 (the candidate is
# slower, beyond chance) and the median beyond the tolerance (by enough to matter).


def binomial_tail(n: int, k: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2)."""
    if k <= 0:
        return 1.0
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def min_pairs(alpha: float) -> int:
    """The fewest AB/BA pairs with which the sign test can reach a false-alarm rate of ``alpha`` (all n pairs
    above 1 has probability 2^-n)."""
    return max(1, math.ceil(math.log2(1 / alpha) - 1e-12))


def sign_boundaries(n_min: int, n_max: int, alpha: float) -> dict[int, int | None]:
    """Critical counts of a sequential sign test looked at after every pair from ``n_min`` to ``n_max``: at look n
    a slowdown is significant when at least ``c[n]`` pairs lie above 1 (None: no count is, at n). The false-alarm
    rate is spent linearly over the looks (look j of J may reach ``alpha * j / J`` in all), computed exactly
    (``false_alarm_rate``), so stopping at any look keeps it at most ``alpha``."""
    looks = list(range(n_min, max(n_min, n_max) + 1))
    bounds: dict[int, int | None] = {}
    for j, n in enumerate(looks, 1):
        budget = alpha * j / len(looks)
        bounds[n] = None
        for c in range(n // 2 + 1, n + 1):  # above half (else no evidence), the smallest within the budget
            if false_alarm_rate({**bounds, n: c}) <= budget + 1e-15:
                bounds[n] = c
                break
    return bounds


def false_alarm_rate(bounds: dict[int, int | None]) -> float:
    """The exact probability, for unchanged code (each pair above 1 with probability 1/2, independently), that
    the sequential sign test with these critical counts flags a slowdown at some look."""
    dist = {0: 1.0}  # count of pairs above 1 -> probability, over paths not yet flagged
    flagged, n = 0.0, 0
    for look in sorted(bounds):
        while n < look:
            nxt: dict[int, float] = {}
            for s, p in dist.items():
                nxt[s] = nxt.get(s, 0.0) + p / 2
                nxt[s + 1] = nxt.get(s + 1, 0.0) + p / 2
            dist, n = nxt, n + 1
        c = bounds[look]
        if c is not None:
            flagged += sum(p for s, p in dist.items() if s >= c)
            dist = {s: p for s, p in dist.items() if s < c}
    return flagged


def median_bounds(pairs: Sequence[float], c: int | None) -> tuple[float, float]:
    """The confidence bounds of the median pair ratio that go with the critical count ``c``: the
    (n - c + 1)-th smallest and the c-th smallest pair (0 and infinity where ``c`` is None)."""
    xs = sorted(pairs)
    if c is None or c > len(xs):
        return 0.0, math.inf
    return xs[len(xs) - c], xs[c - 1]


def ab_verdict(pairs: Sequence[float], tolerance: float, c: int | None) -> str:
    """``REGRESSION`` when the lower bound of the median pair ratio lies above 1 and the median above
    1 + tolerance; ``improvement`` when the upper bound lies below 1 and the median below 1 - tolerance;
    ``undecided`` when there are too few pairs for any count to reach the false-alarm rate (``c`` None: a run
    that lost rounds), which is not a pass; else ``ok`` (at critical count ``c``, ``sign_boundaries``)."""
    if c is None or c > len(pairs):
        return "undecided"
    lo, hi = median_bounds(pairs, c)
    med = statistics.median(pairs)
    if lo > 1 and med > 1 + tolerance:
        return "REGRESSION"
    if hi < 1 and med < 1 - tolerance:
        return "improvement"
    return "ok"


def ab_undecided(pairs: Sequence[float], tolerance: float, c: int | None) -> bool:
    """True while the median lies beyond a tolerance edge but the sign test does not yet say so beyond chance:
    more pairs may decide it."""
    if not pairs:
        return True
    med = statistics.median(pairs)
    beyond = med > 1 + tolerance or med < 1 - tolerance
    verdict = ab_verdict(pairs, tolerance, c)
    return verdict == "undecided" or (beyond and verdict == "ok")


def critical_count(bounds: dict[int, int | None], n: int, alpha: float) -> int | None:
    """The critical count at ``n`` pairs: the design's (``sign_boundaries``), or a single look's where ``n`` is not
    one of its looks (a run that missed a pair)."""
    return bounds[n] if n in bounds else sign_boundaries(n, n, alpha)[n]


def sign_test(pairs: Sequence[float], bounds: dict[int, int | None], alpha: float, tolerance: float) -> dict:
    """The A/B verdict on ``pairs`` and what it rests on: the median's confidence bounds, the pairs above 1, the
    critical count and the design's exact false-alarm rate."""
    c = critical_count(bounds, len(pairs), alpha)
    lo, hi = median_bounds(pairs, c)
    design = bounds if len(pairs) in bounds else {len(pairs): c}
    return {
        "verdict": ab_verdict(pairs, tolerance, c),
        "lower": lo,
        "upper": hi,
        "pairs_above": sum(p > 1 for p in pairs),
        "critical": c,
        "false_alarm": false_alarm_rate(design),
    }
