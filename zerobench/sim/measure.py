"""``zerobench profile`` on this host: every rank of a configuration measuring at once.

For each process count a set of configurations needs, ``profile_host`` starts that many processes (as
the local launcher would, with the same threads per process). Together they time

1. each configuration's compute pieces at its TP-sharded shape (``measure_compute.time_compute``, on a
   fake process group, all processes stepping in lockstep behind a barrier);
2. the engine's per-element costs (optimizer step, copy, add, memset) and its own host work per step and
   per block at each stage (``time_engine_overhead``, on a model too small to compute);
3. the collectives zerobench issues (``zerobench.distributed.collectives``, so gloo's composed
   reduce-scatter and all-gather are what is timed) from 1 KiB to 64 MiB, on groups of each size the
   configurations use, every group of the host communicating at once, as TP groups and DP groups do;
4. the synchronisation penalty: what a blocking collective costs beyond its isolated time when the ranks
   arrive from computing apart (``sync|g|r``: α + β·T for T seconds of compute since the last one);
5. each TP shape's pieces once more on the real groups (``{piece}+tp``): the pieces with their TP
   collectives, as the critical path pays them.

Rank 0's figures become the profile. A process that dies or hangs fails the profile in one line. On a GPU
(``HostJob.device``, one-card configurations) the one process times 1-2 on the card and adds each shape's
step memory (``measure_memory.step_memory``); there are no collectives to time.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import time
from dataclasses import dataclass

from zerobench.config import ConfigError, RunFailed
from zerobench.sim.measure_compute import (
    Shape,
    expected,
    mean_time,
    skew_mean,
    time_compute,
    time_engine_overhead,
    time_per_element,
)
from zerobench.sim.measure_memory import step_memory
from zerobench.sim.profile import IN_SITU, Curve, Linear, Profile, curve_key, op_key

SIZES = tuple(1 << k for k in range(10, 27, 2))
"""Collective sizes in bytes: 1 KiB, 4 KiB, ..., 64 MiB."""
OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")


@dataclass(frozen=True)
class HostJob:
    """What one set of concurrent processes measures."""

    ranks: int
    threads: int
    shapes: tuple[Shape, ...]
    groups: tuple[int, ...]
    """Collective group sizes (each dividing ``ranks``)."""
    kernels: str = "auto"
    sizes: tuple[int, ...] = SIZES
    device: str = "cpu"
    """Where the ranks compute: ``cpu``, or ``cuda`` (one rank on the first GPU; the pieces on its stream and
    as the host's cost to issue them, and each shape's step memory)."""


def shape_key(op: str, s: Shape, ranks: int, threads: int) -> str:
    m = s.model
    return op_key(op, b=s.micro_batch, s=m.seq, h=m.hidden, heads=m.heads, vocab=m.vocab, tp=s.tp,
                  dtype=s.precision, kernels=s.kernels, checkpoint=s.checkpoint, ranks=ranks, threads=threads)


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


def _groups(job: HostJob, rank: int) -> dict:
    """This rank's group of each size in ``job.groups``: consecutive ranks, every rank in one (``new_group`` is
    collective, so every rank creates all of them, in the same order); None is the whole world."""
    import torch.distributed as dist

    out = {}
    for g in job.groups:
        pgs = [dist.new_group(list(range(lo, lo + g))) for lo in range(0, job.ranks, g)] if g < job.ranks else [None]
        out[g] = pgs[rank // g] if g < job.ranks else None
    return out


def _collectives(job: HostJob, groups: dict) -> tuple[dict[str, list[tuple[float, float]]], dict[str, str]]:
    """Each op's curve per group size, and which curves time another op over the same bytes
    (``Profile.composed``)."""
    import torch
    import torch.distributed as dist

    from zerobench.distributed import collectives as C

    out: dict[str, list[tuple[float, float]]] = {}
    composed: dict[str, str] = {}
    for g, pg in groups.items():
        grp = C.Group.of(pg, "profile")
        if C.composes(grp):
            composed[curve_key("reduce_scatter", g, job.ranks)] = curve_key("all_reduce", g, job.ranks)
        src = dist.get_global_rank(pg or dist.group.WORLD, 0)
        for op in OPS:
            pts = []
            for nbytes in job.sizes:
                n = -(-nbytes // (4 * g)) * g
                fn = _collective(op, torch.ones(n), torch.ones(n // g), grp, src)
                for _ in range(3):
                    fn()
                ts = []
                for _ in range(24 if nbytes <= 1 << 20 else 5):
                    dist.barrier()
                    t0 = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t0)
                pts.append((4.0 * n, expected(ts)))
            out[curve_key(op, g, job.ranks)] = _monotone(pts)
    return out, composed


def _sync_penalty(job: HostJob, groups: dict) -> dict[str, list[tuple[float, float]]]:
    """Extra seconds a small blocking all-reduce costs right after T seconds of compute on every rank,
    over the same all-reduce issued in step (behind a barrier): the ranks' skew after computing apart
    (their jitter, time-sharing), which every synchronisation of a step pays. T from 1 to 64 ms.

    Each point is ``skew_mean`` of its samples, not their plain mean: the line is extrapolated to a whole
    step's compute, so one host stall among a point's samples would be charged to every step, though the
    median step the runs are judged by never sees it (on the 2-core EPYC VM one profile's line came out at
    1.17 s of skew per second of compute, where the profile an hour before it measured 0.018)."""
    import torch
    import torch.distributed as dist

    a, t = torch.randn(256, 256), torch.ones(1024)
    one = mean_time(lambda: a @ a, 20)
    out: dict[str, list[tuple[float, float]]] = {}
    for g, pg in groups.items():
        iso, pts = [], []
        for _ in range(20):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t, group=pg)
            iso.append(time.perf_counter() - t0)
        base = skew_mean(iso)
        for target in (1e-3, 4e-3, 16e-3, 64e-3):
            k = max(1, round(target / one))
            comp, after = [], []
            for _ in range(24 if target < 0.05 else 16):
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(k):
                    a @ a
                t1 = time.perf_counter()
                dist.all_reduce(t, group=pg)
                comp.append(t1 - t0)
                after.append(time.perf_counter() - t1)
            pts.append((expected(comp), max(skew_mean(after) - base, 1e-7)))
        out[f"sync|g{g}|r{job.ranks}"] = pts
    return out


def _tp_in_situ(job: HostJob, barrier) -> dict[str, float]:
    """Each TP shape's pieces again, on the real gloo world: every TP group of the host running its forward
    and backward with its real collectives, placed as the run's mesh places them. A piece's time here less
    its time on the fake group is what its TP collectives cost on the critical path, waits on the partner
    and the compute they slow included (in a TP 2 mini run on the 2-core Xeon VM a 128 KiB all-reduce took
    0.91 ms of the caller's time on average where the isolated curve says 0.43)."""
    ops = {}
    for s in job.shapes:
        if s.tp > 1:
            for name, t in time_compute(s, barrier=barrier.wait).items():
                ops[shape_key(name + IN_SITU, s, job.ranks, job.threads)] = t
    return ops


def _monotone(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """No size may cost more than a larger one (small messages' timings carry scheduling noise)."""
    out, best = [], float("inf")
    for b, t in reversed(pts):
        best = min(best, t)
        out.append((b, best))
    return out[::-1]


def _worker(rank: int, job: HostJob, port: int, barrier, results) -> None:
    import torch
    import torch.distributed as dist

    from zerobench.distributed.fake import init_fake_world

    try:
        torch.set_num_threads(job.threads)
        device = torch.device(job.device)
        if device.type == "cuda":
            torch.cuda.set_device(0)
        ops: dict[str, float] = {}
        memory: dict[str, float] = {}
        for s in job.shapes:
            init_fake_world(s.tp, 0)
            for name, t in time_compute(s, barrier=barrier.wait, device=device).items():
                ops[shape_key(name, s, job.ranks, job.threads)] = t
            if device.type == "cuda":
                memory.update({shape_key(k, s, job.ranks, job.threads): b for k, b in step_memory(s, device).items()})
            dist.destroy_process_group()
        linear = {f"{k}|r{job.ranks}": v for k, v in time_per_element(barrier.wait, job.kernels, device).items()}
        init_fake_world(1, 0)
        linear.update({f"{k}|r{job.ranks}": v
                       for k, v in time_engine_overhead(barrier.wait, job.kernels, device).items()})
        dist.destroy_process_group()
        curves, composed = {}, {}
        if job.ranks > 1 and job.groups:
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=job.ranks)
            groups = _groups(job, rank)
            curves, composed = _collectives(job, groups)
            linear.update({k: Linear.fit(v) for k, v in _sync_penalty(job, groups).items()})
            ops.update(_tp_in_situ(job, barrier))
            dist.destroy_process_group()
        if rank == 0:
            results.put(("ok", ops, {"curves": curves, "composed": composed, "memory": memory}, linear))
    except BaseException as e:
        results.put(("error", f"profiling process {rank}: {type(e).__name__}: {e}", None, None))
        raise


def profile_host(job: HostJob, device: str, cores: int, timeout_s: float = 900.0) -> Profile:
    """Run ``job`` on ``job.ranks`` local processes; rank 0's measurements as a ``Profile``."""
    from zerobench.launch.local import free_port

    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(job.ranks, timeout=timeout_s), ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, job, port, barrier, results), daemon=True) for r in range(job.ranks)]
    for p in procs:
        p.start()
    try:
        status, ops, collectives, linear = _wait(procs, results, timeout_s)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(5)
    if status != "ok":
        raise RunFailed(ops)
    prof = Profile(device=device, cores=cores, ops=ops, linear=linear, composed=collectives["composed"],
                   memory=collectives["memory"])
    prof.curves = {k: Curve(tuple(v)) for k, v in collectives["curves"].items()}
    return prof


def _wait(procs, results, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return results.get(timeout=1.0)
        except queue_mod.Empty:
            dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                try:
                    return results.get(timeout=2.0)
                except queue_mod.Empty:
                    return ("error", f"profiling process {dead[0]} exited with code {procs[dead[0]].exitcode}", None, None)
    return ("error", f"profiling did not finish within {timeout_s:.0f} s", None, None)


def shape_of(cfg) -> Shape:
    """The compute shape of a ``TrainConfig``."""
    return Shape(cfg.model, cfg.micro_batch, cfg.tp, cfg.zero.precision.value, cfg.kernels, cfg.activation.checkpoint)


def jobs_for(configs, cores: int, sizes: tuple[int, ...] = SIZES, device: str = "cpu") -> list[HostJob]:
    """One ``HostJob`` per process count the configurations need: their shapes and group sizes. On a GPU
    (``device="cuda"``) one-card configurations only: world 1, every stage."""
    if device != "cpu":
        many = [c for c in configs if c.world_size > 1]
        if many:
            raise ConfigError(f"zerobench profile on {device} measures one-card configurations (world 1); the "
                              f"suite has a world of {many[0].world_size} (dp {many[0].dp} x tp {many[0].tp}): "
                              f"profile it on CPU processes, or give a suite of dp 1, tp 1 runs")
    by_ranks: dict[int, tuple[dict, set]] = {}
    for cfg in configs:
        shapes, groups = by_ranks.setdefault(cfg.world_size, ({}, set()))
        shapes[shape_of(cfg)] = None
        groups.update(g for g in (cfg.dp, cfg.tp) if g > 1)
    return [HostJob(ranks=n, threads=max(1, cores // n), shapes=tuple(shapes), groups=tuple(sorted(groups)),
                    kernels=next(iter(shapes)).kernels, sizes=sizes, device=device)
            for n, (shapes, groups) in sorted(by_ranks.items())]
