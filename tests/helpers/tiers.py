"""Which cases of a parametrized test the fast tier runs.

README's test command (and CI's) runs both tiers: the fast one (``python -m pytest -n 2 --dist loadfile``), then
the full grid (``-m 'slow and not timing'``). A case left to the full grid is still run on every change; the fast
tier keeps the cases that cover each behaviour's code paths, so that it stays a quick check on a 2-core machine.
For the ZeRO stages those are the two ends: stage 0 (data parallelism's full buffers and all-reduce) and stage 3
(everything partitioned: reduce-scatter, gather and free); stages 1 and 2 share their code with one or the other
and run in the full grid.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest


def tiered(values: Iterable, fast: Iterable) -> list:
    """``values`` as parameters, each one not in ``fast`` marked ``slow`` (the full grid runs it)."""
    keep = set(fast)
    return [v if v in keep else pytest.param(v, marks=pytest.mark.slow) for v in values]


STAGES = tiered((0, 1, 2, 3), fast=(0, 3))
"""The four ZeRO stages: 0 and 3 in the fast tier, 1 and 2 in the full grid."""
