"""Search for the largest integer that fits, when fitting is monotone (memory grows with layers)."""

from __future__ import annotations

from collections.abc import Callable


def largest_fitting(fits: Callable[[int], bool], limit: int, start: int = 1) -> int:
    """The largest n in [1, limit] with ``fits(n)`` (0 if none). From ``start`` (a guess, e.g. the memory
    planner's answer): step away from it by doubling strides until the answer is bracketed, then bisect; a
    right guess costs two probes (``start`` fits, ``start + 1`` does not)."""
    start = min(max(start, 1), limit)
    if fits(start):
        lo, step = start, 1
        while lo + step <= limit and fits(lo + step):
            lo, step = lo + step, step * 2
        hi = min(lo + step, limit + 1)
    else:
        hi, step = start, 1
        while True:
            if hi - step < 1:
                if hi == 1 or not fits(1):
                    return 0
                lo = 1
                break
            if fits(hi - step):
                lo = hi - step
                break
            hi, step = hi - step, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
