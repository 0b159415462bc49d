"""``zerobench profile`` on this host: every rank of a configuration measuring at once.

For each process count a set of configurations needs, ``profile_host`` starts that many processes (as
the local launcher would, with the same threads per process). Together they time

1. each configuration's compute pieces at its TP-sharded shape (``measure_compute.time_compute``, on a
   fake process group, all processes stepping in lockstep behind a barrier);
2. the engine's per-element costs (optimizer step, copy, add, memset) and its own host work per step and
   per block at each stage (``time_engine_overhead``, on a model too small to compute);
3. the collectives zerobench issues (``zerobench.distributed.collectives``, so gloo's composed
   reduce-scatter and all-gather are what is timed) from 1 KiB to 64 MiB (1 GiB on GPUs), on groups of
   each size the configurations use, every group of the host communicating at once, as TP groups and DP
   groups do (``measure_comm``);
4. the synchronisation penalty: what a blocking collective costs beyond its isolated time when the ranks
   arrive from computing apart (``sync|g|r``: α + β·T for T seconds of compute since the last one; CPU
   processes only);
5. each TP shape's pieces once more on the real groups (``{piece}+tp``): the pieces with their TP
   collectives, as the critical path pays them.

Rank 0's figures become the profile. A process that dies or hangs fails the profile in one line. On GPUs
(``HostJob.device``) each rank has a GPU of its own (rank r on ``cuda:r``, NCCL between them, as the runs
place them on a node); the pieces are timed on each card's stream and as the host's cost to issue them, and
each shape's step memory is added (``measure_memory.step_memory``). A world of one has no collectives.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import time
from dataclasses import dataclass

from zerobench.config import ConfigError, RunFailed
from zerobench.sim.measure_comm import GPU_SIZES, SIZES, groups_of, sync_penalty_points, time_collectives
from zerobench.sim.measure_compute import Shape, time_compute, time_engine_overhead, time_per_element
from zerobench.sim.measure_memory import step_memory
from zerobench.sim.profile import IN_SITU, Curve, Linear, Profile, op_key


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
    """Collective sizes in bytes."""
    device: str = "cpu"
    """Where the ranks compute: ``cpu``, or ``cuda`` (rank r on GPU r; the pieces on its stream and as the
    host's cost to issue them, and each shape's step memory)."""


def shape_key(op: str, s: Shape, ranks: int, threads: int) -> str:
    m = s.model
    return op_key(
        op,
        b=s.micro_batch,
        s=m.seq,
        h=m.hidden,
        heads=m.heads,
        vocab=m.vocab,
        tp=s.tp,
        dtype=s.precision,
        kernels=s.kernels,
        checkpoint=s.checkpoint,
        ranks=ranks,
        threads=threads,
    )


def _tp_in_situ(job: HostJob, barrier, device) -> dict[str, float]:
    """Each TP shape's pieces again, on the real gloo world: every TP group of the host running its forward
    and backward with its real collectives, placed as the run's mesh places them. A piece's time here less
    its time on the fake group is what its TP collectives cost on the critical path, waits on the partner
    and the compute they slow included (in a TP 2 mini run on the 2-core Xeon VM a 128 KiB all-reduce took
    0.91 ms of the caller's time on average where the isolated curve says 0.43)."""
    ops = {}
    for s in job.shapes:
        if s.tp > 1:
            for name, t in time_compute(s, barrier=barrier.wait, device=device).items():
                ops[shape_key(name + IN_SITU, s, job.ranks, job.threads)] = t
    return ops


def _worker(rank: int, job: HostJob, port: int, barrier, results) -> None:
    import torch
    import torch.distributed as dist

    from zerobench.distributed.env import choose_backend
    from zerobench.distributed.fake import init_fake_world

    try:
        torch.set_num_threads(job.threads)
        device = torch.device(job.device)
        if device.type == "cuda":  # a GPU of its own per rank, as the runs place them on a node
            device = torch.device("cuda", rank)
            torch.cuda.set_device(device)
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
        linear.update(
            {f"{k}|r{job.ranks}": v for k, v in time_engine_overhead(barrier.wait, job.kernels, device).items()}
        )
        dist.destroy_process_group()
        curves, composed = {}, {}
        if job.ranks > 1 and job.groups:
            gpus = torch.cuda.device_count() if device.type == "cuda" else 0  # jobs_for gave each rank a card
            gpu = {"device_id": device} if device.type == "cuda" else {}
            dist.init_process_group(
                choose_backend("auto", device, job.ranks, gpus),
                init_method=f"tcp://127.0.0.1:{port}",
                rank=rank,
                world_size=job.ranks,
                **gpu,
            )
            groups = groups_of(job.groups, job.ranks, rank)
            curves, composed = time_collectives(groups, job.ranks, job.sizes, device)
            if device.type == "cpu":
                linear.update({k: Linear.fit(v) for k, v in sync_penalty_points(groups, job.ranks).items()})
            ops.update(_tp_in_situ(job, barrier, device))
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
    prof = Profile(
        device=device,
        cores=cores,
        ops=ops,
        linear=linear,
        composed=collectives["composed"],
        memory=collectives["memory"],
    )
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
                    return (
                        "error",
                        f"profiling process {dead[0]} exited with code {procs[dead[0]].exitcode}",
                        None,
                        None,
                    )
    return ("error", f"profiling did not finish within {timeout_s:.0f} s", None, None)


def shape_of(cfg) -> Shape:
    """The compute shape of a ``TrainConfig``."""
    return Shape(cfg.model, cfg.micro_batch, cfg.tp, cfg.zero.precision.value, cfg.kernels, cfg.activation.checkpoint)


def jobs_for(
    configs, cores: int, sizes: tuple[int, ...] | None = None, device: str = "cpu", gpus: int = 0
) -> list[HostJob]:
    """One ``HostJob`` per process count the configurations need: their shapes and group sizes. On GPUs
    (``device="cuda"``, ``gpus`` on this host) a world of N needs N of them: one per rank, as on a node."""
    if device != "cpu":
        big = max(configs, key=lambda c: c.world_size, default=None)
        if big is not None and big.world_size > gpus:
            raise ConfigError(
                f"zerobench profile on {device}: the suite has a world of {big.world_size} (dp {big.dp} "
                f"x tp {big.tp}) and this host has {gpus} GPU(s); each rank profiles on a GPU of its "
                f"own, as the runs place them: profile on a node with {big.world_size} GPUs, or give "
                f"a suite of worlds up to {gpus}"
            )
    if sizes is None:
        sizes = SIZES if device == "cpu" else GPU_SIZES
    by_ranks: dict[int, tuple[dict, set]] = {}
    for cfg in configs:
        shapes, groups = by_ranks.setdefault(cfg.world_size, ({}, set()))
        shapes[shape_of(cfg)] = None
        groups.update(g for g in (cfg.dp, cfg.tp) if g > 1)
    return [
        HostJob(
            ranks=n,
            threads=max(1, cores // n),
            shapes=tuple(shapes),
            groups=tuple(sorted(groups)),
            kernels=next(iter(shapes)).kernels,
            sizes=sizes,
            device=device,
        )
        for n, (shapes, groups) in sorted(by_ranks.items())
    ]
