"""The profiler's collective timing (``zerobench/sim/measure_comm.py``) on a real gloo world: the code a GPU
node runs over NCCL (there with the device drained around each call), here on CPU processes."""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed

pytestmark = pytest.mark.dist

SIZES = (1 << 10, 1 << 14, 1 << 18)


def _curves(rank: int, world: int):
    import torch

    from zerobench.sim.measure_comm import groups_of, time_collectives

    groups = groups_of((2, world), world, rank)
    curves, composed = time_collectives(groups, world, SIZES, torch.device("cpu"))
    return curves, composed, [g is None for g in groups.values()]


def test_every_op_is_timed_on_every_group_size_over_every_size():
    curves, composed, whole = run_distributed(_curves, 4, timeout=120)[0]
    assert whole == [False, True]  # pairs of ranks, then the whole world
    for g in (2, 4):
        for op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"):
            pts = curves[f"{op}|g{g}|r4"]
            assert [b for b, _ in pts] == [4.0 * (-(-n // (4 * g)) * g) for n in SIZES]
            assert all(t > 0 for _, t in pts) and [t for _, t in pts] == sorted(t for _, t in pts)
        assert composed[f"reduce_scatter|g{g}|r4"] == f"all_reduce|g{g}|r4"  # gloo composes it
