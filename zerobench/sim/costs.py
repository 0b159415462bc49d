"""The two shapes a measured cost takes in a profile: a curve of seconds against bytes, and a line α + β·n."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Curve:
    """Seconds of a collective against its size in bytes (``points`` sorted by bytes)."""

    points: tuple[tuple[float, float], ...]

    def seconds(self, nbytes: float) -> float:
        pts = self.points
        if nbytes <= pts[0][0]:
            return pts[0][1]
        if nbytes >= pts[-1][0]:
            (b0, t0), (b1, t1) = pts[-2], pts[-1]
            bw = (b1 - b0) / max(t1 - t0, 1e-12)
            return t1 + (nbytes - b1) / bw
        i = bisect.bisect_left([p[0] for p in pts], nbytes)
        (b0, t0), (b1, t1) = pts[i - 1], pts[i]
        f = (math.log(nbytes) - math.log(b0)) / (math.log(b1) - math.log(b0))
        return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))


@dataclass(frozen=True)
class Linear:
    """``alpha + beta * n`` seconds."""

    alpha: float
    beta: float

    def seconds(self, n: float) -> float:
        return self.alpha + self.beta * n if n > 0 else 0.0

    @classmethod
    def fit(cls, points: list[tuple[float, float]]) -> Linear:
        """Least squares through (n, seconds), weighted towards relative error; alpha and beta kept >= 0: every
        cost fitted so (per element, per block, the ranks' skew per second of compute) grows with ``n`` or stays,
        so a falling line is noise, read as the flat one (a negative slope would charge a long step negative time)."""
        w = [1.0 / max(t, 1e-9) for _, t in points]
        sw = sum(w)
        mx = sum(wi * n for wi, (n, _) in zip(w, points)) / sw
        my = sum(wi * t for wi, (_, t) in zip(w, points)) / sw
        sxx = sum(wi * (n - mx) ** 2 for wi, (n, _) in zip(w, points))
        sxy = sum(wi * (n - mx) * (t - my) for wi, (n, t) in zip(w, points))
        beta = max(sxy / sxx, 0.0) if sxx else 0.0
        alpha = my - beta * mx
        if alpha < 0:
            alpha, beta = 0.0, sum(t for _, t in points) / sum(n for n, _ in points)
        return cls(alpha, beta)
