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
