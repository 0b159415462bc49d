"""The profiler's communication measurements: the collectives zerobench issues, timed over sizes on groups
of each size a suite uses, and the rank-skew penalty a blocking collective pays after compute.

Both run inside ``measure._worker`` on a real process group: gloo between CPU processes, NCCL between
the GPUs of one node (one rank per GPU, as the runs place them). On a GPU a collective is timed from a
drained device to a drained device (``synchronize`` on both sides), so its time is the stream's, launch
included, as nccl-tests' bus-bandwidth figures are read.
"""

from __future__ import annotations

import time

from zerobench.sim.measure_compute import expected, mean_time, skew_mean
from zerobench.sim.profile import curve_key, moved_bytes

SIZES = tuple(1 << k for k in range(10, 27, 2))
"""Collective sizes in bytes on CPU processes: 1 KiB, 4 KiB, ..., 64 MiB."""
GPU_SIZES = tuple(1 << k for k in range(10, 31, 2))
"""On GPUs: 1 KiB, 4 KiB, ..., 1 GiB (a 1.3B model's bf16 gradients are 2.6 GB, its buckets 12.5 MB)."""
OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")


def _collective(op: str, full, part, grp, src: int):
    """The call ``zerobench`` makes for ``op``: ``full`` the whole tensor, ``part`` this rank's piece."""
    import torch.distributed as dist

    from zerobench.distributed import collectives as C

    return {
        "all_reduce": lambda: C.all_reduce(full, grp),
        "reduce_scatter": lambda: C.reduce_scatter(part, full, grp, inp_is_scratch=True),
        "all_gather": lambda: C.all_gather(full, part, grp),
        "broadcast": lambda: dist.broadcast(full, src=src, group=grp.pg),
    }[op]


def groups_of(sizes: tuple[int, ...], ranks: int, rank: int) -> dict:
    """This rank's group of each size in ``sizes``: consecutive ranks, every rank in one (``new_group`` is
    collective, so every rank creates all of them, in the same order); None is the whole world."""
    import torch.distributed as dist

    out = {}
    for g in sizes:
        pgs = [dist.new_group(list(range(lo, lo + g))) for lo in range(0, ranks, g)] if g < ranks else [None]
        out[g] = pgs[rank // g] if g < ranks else None
    return out


def _drain(device) -> None:
    """Wait for the device's queued work (nothing to wait for on a CPU: gloo's calls return when done)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def collective_replicate(op: str, g: int, pg, nbytes: int, device, calls: int) -> tuple[float, float]:
    """(bytes moved, mean seconds) of ``op`` over this rank's group ``pg`` of ``g`` ranks at about ``nbytes``
    (rounded up to a whole fp32 element per rank), over ``calls`` calls after one warm-up, each from a barrier
    and a drained device to a drained device. Every rank of the world calls it with the same arguments."""
    import torch
    import torch.distributed as dist

    from zerobench.distributed import collectives as C

    grp = C.Group.of(pg, "profile")
    src = dist.get_global_rank(pg or dist.group.WORLD, 0)
    n = int(moved_bytes(nbytes, g)) // 4
    full, part = torch.ones(n, device=device), torch.ones(n // g, device=device)
    fn = _collective(op, full, part, grp, src)
    fn()
    ts = []
    for _ in range(calls):
        dist.barrier()
        _drain(device)
        t0 = time.perf_counter()
        fn()
        _drain(device)
        ts.append(time.perf_counter() - t0)
    return 4.0 * n, expected(ts)


def calls_at(nbytes: int) -> int:
    """Calls a replicate of a collective averages: many at small sizes (scheduling noise), few at large ones."""
    return 8 if nbytes <= 1 << 20 else 2


def composed_curves(groups: dict, ranks: int) -> dict[str, str]:
    """Which curves time another op over the same bytes (``Profile.composed``: gloo's reduce-scatter is an
    all-reduce)."""
    from zerobench.distributed import collectives as C

    return {
        curve_key("reduce_scatter", g, ranks): curve_key("all_reduce", g, ranks)
        for g, pg in groups.items()
        if C.composes(C.Group.of(pg, "profile"))
    }


def time_collectives(
    groups: dict, ranks: int, sizes: tuple[int, ...], device
) -> tuple[dict[str, list[tuple[float, float]]], dict[str, str]]:
    """Each op's curve per group size (bytes, seconds), each point one replicate of three times ``calls_at`` calls,
    and which curves time another op over the same bytes (``composed_curves``)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for g, pg in groups.items():
        for op in OPS:
            pts = [collective_replicate(op, g, pg, nbytes, device, 3 * calls_at(nbytes)) for nbytes in sizes]
            out[curve_key(op, g, ranks)] = monotone(pts)
    return out, composed_curves(groups, ranks)


SYNC_TARGETS = (1e-3, 4e-3, 16e-3, 64e-3)
"""Seconds of compute before the blocking all-reduce whose extra cost the skew penalty is."""


def matmul_seconds() -> float:
    """Seconds of the 256x256 matmul the skew penalty computes with (``sync_replicate``'s unit of compute)."""
    import torch

    a = torch.randn(256, 256)
    return mean_time(lambda: a @ a, 20)


def sync_replicate(pg, target: float, one: float, iterations: int = 8) -> tuple[float, float]:
    """(seconds of compute, extra seconds of the all-reduce after it) for about ``target`` seconds of compute
    (``one``: a matmul's seconds): a small blocking all-reduce right after compute on every rank, over the same
    all-reduce issued in step behind a barrier; the ranks' skew after computing apart (their jitter,
    time-sharing), which every synchronisation of a step pays.

    The extra time is ``skew_mean`` of its samples, not their plain mean: the line through it is extrapolated to a
    whole step's compute, so one host stall among a point's samples would be charged to every step, though the
    median step the runs are judged by never sees it (on the 2-core EPYC VM one profile's line came out at
    1.17 s of skew per second of compute, where the profile an hour before it measured 0.018)."""
    import torch
    import torch.distributed as dist

    a, t = torch.randn(256, 256), torch.ones(1024)
    iso = []
    for _ in range(iterations):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t, group=pg)
        iso.append(time.perf_counter() - t0)
    k = max(1, round(target / one))
    comp, after = [], []
    for _ in range(iterations):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(k):
            a @ a
        t1 = time.perf_counter()
        dist.all_reduce(t, group=pg)
        comp.append(t1 - t0)
        after.append(time.perf_counter() - t1)
    return expected(comp), max(skew_mean(after) - skew_mean(iso), 1e-7)


def sync_penalty_points(groups: dict, ranks: int) -> dict[str, list[tuple[float, float]]]:
    """Extra seconds a small blocking all-reduce costs right after T seconds of compute on every rank, T from 1 to
    64 ms (``sync_replicate``), one replicate of 24 iterations a point. CPU processes only: a GPU's host runs
    ahead of its device, and the ranks' devices do not time-share."""
    one = matmul_seconds()
    return {
        f"sync|g{g}|r{ranks}": [sync_replicate(pg, target, one, 24) for target in SYNC_TARGETS]
        for g, pg in groups.items()
    }


def monotone(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """No size may cost more than a larger one (small messages' timings carry scheduling noise)."""
    out, best = [], float("inf")
    for b, t in reversed(pts):
        best = min(best, t)
        out.append((b, best))
    return out[::-1]
