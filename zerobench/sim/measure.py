"""``zerobench profile`` on this host: every rank of a configuration measuring at once, in passes.

For each process count a set of configurations needs there is a ``HostJob``, and for each job a
``HostSession``: that many processes (as the local launcher would start them, with the same threads per
process and ``OMP_NUM_THREADS``), started once and parked between passes. A pass sends every session a plan
(``measure_units``: which units, how many replicates each), one session after another, so a piece's
replicates are taken at moments spread over the whole profile (``profiler.profile_suite`` decides the plans).
Together a job's processes time

1. each configuration's compute pieces at its TP-sharded shape (``measure_compute.ComputeBench``, on a
   fake process group, all processes stepping in lockstep behind a barrier);
2. the engine's per-element costs (optimizer step, copy, add, memset) and its own host work per step and
   per block at each stage (``measure_engine``, on a model too small to compute);
3. the collectives zerobench issues (``zerobench.distributed.collectives``, so gloo's composed
   reduce-scatter and all-gather are what is timed) from 1 KiB to 64 MiB (1 GiB on GPUs), on groups of
   each size the configurations use, every group of the host communicating at once, as TP groups and DP
   groups do (``measure_comm``);
4. the synchronisation penalty: what a blocking collective costs beyond its isolated time when the ranks
   arrive from computing apart (``sync|g|r``: α + β·T for T seconds of compute since the last one; CPU
   processes only);
5. each TP shape's pieces once more on the real groups (``{piece}+tp``): the pieces with their TP
   collectives, as the critical path pays them. A piece's time there less its time on the fake group is what
   its TP collectives cost on the critical path, waits on the partner and the compute they slow included (in a
   TP 2 mini run on the 2-core Xeon VM a 128 KiB all-reduce took 0.91 ms of the caller's time on average where
   the isolated curve says 0.43).

Rank 0's figures are the profile's. A process that dies or hangs fails the profile in one line. On GPUs
(``HostJob.device``) each rank has a GPU of its own (rank r on ``cuda:r``, NCCL between them, as the runs
place them on a node); the pieces are timed on each card's stream and as the host's cost to issue them, and
each shape's step memory is added (``measure_memory.step_memory``). A world of one has no collectives.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue as queue_mod
import time
from dataclasses import dataclass

from zerobench.config import ConfigError, RunFailed
from zerobench.parallel.config import COMPILED
from zerobench.sim.measure_comm import GPU_SIZES, SIZES
from zerobench.sim.measure_compute import Shape
from zerobench.sim.measure_compute import shape_key as shape_key  # where the profile's callers look for it


@dataclass
class Plant:
    """Test-only (``train.faults.PROFILE_PLANT_ENV``): ``seconds`` of busy waiting in block 0's forward at every
    step of the first ``replicates`` compute replicates each profiling process takes: one piece made slow in one
    measurement, which the profile must catch."""

    seconds: float
    replicates: int = 1

    def spend(self) -> None:
        self.replicates -= 1


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
    plant: Plant | None = None
    """Test-only: a slow piece planted in the first compute replicates (``Plant``)."""


def _worker(rank: int, job: HostJob, barrier, commands, results) -> None:
    import torch

    from zerobench.sim.measure_units import run_pass

    try:
        torch.set_num_threads(job.threads)
        device = torch.device(job.device)
        if device.type == "cuda":  # a GPU of its own per rank, as the runs place them on a node
            device = torch.device("cuda", rank)
            torch.cuda.set_device(device)
        state = {"plant": job.plant}
        for plan, port in iter(commands.get, None):
            out = run_pass(job, plan, rank, port, barrier, device, state)
            if rank == 0:
                results.put(("ok", out))
    except BaseException as e:
        results.put(("error", f"profiling process {rank}: {type(e).__name__}: {e}"))
        raise


@contextlib.contextmanager
def _threads_env(threads: int):
    """``OMP_NUM_THREADS`` as the local launcher sets it for a run's ranks, for the processes started inside."""
    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = old


class HostSession:
    """``job.ranks`` local processes that take passes of ``job``'s units (``run``) until ``close``."""

    def __init__(self, job: HostJob, timeout_s: float = 900.0):
        self.job, self.timeout_s = job, timeout_s
        ctx = mp.get_context("spawn")
        self.barrier, self.results = ctx.Barrier(job.ranks, timeout=timeout_s), ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(job.ranks)]
        self.procs = [
            ctx.Process(target=_worker, args=(r, job, self.barrier, self.commands[r], self.results), daemon=True)
            for r in range(job.ranks)
        ]
        with _threads_env(job.threads):
            for p in self.procs:
                p.start()

    def run(self, plan: dict[tuple, int]) -> dict:
        """Rank 0's replicates of ``plan`` (``measure_units.run_pass``); a failed or hung process is
        ``RunFailed`` in one line."""
        from zerobench.launch.local import free_port

        port = free_port()
        for q in self.commands:
            q.put((plan, port))
        status, out = _wait(self.procs, self.results, self.timeout_s)
        if status != "ok":
            raise RunFailed(out)
        return out

    def close(self) -> None:
        for q in self.commands:
            with contextlib.suppress(Exception):
                q.put(None)
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
                p.join(5)


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
                    return ("error", f"profiling process {dead[0]} exited with code {procs[dead[0]].exitcode}")
    return ("error", f"profiling did not finish a pass within {timeout_s:.0f} s")


def shape_of(cfg) -> Shape:
    """The compute shape of a ``TrainConfig``; refused in one line for ``--kernels compiled`` (Inductor's fused
    blocks), where profiling would time the blocks' eager kernels under the compiled run's name."""
    if cfg.kernels == COMPILED:
        raise ConfigError(
            "the simulator does not model --kernels compiled (its profile times the blocks' eager kernels): "
            "profile and predict the run with --kernels auto"
        )
    return Shape(cfg.model, cfg.micro_batch, cfg.tp, cfg.zero.precision.value, cfg.kernels, cfg.activation.checkpoint)


def jobs_for(
    configs, cores: int, sizes: tuple[int, ...] | None = None, device: str = "cpu", gpus: int = 0
) -> list[HostJob]:
    """One ``HostJob`` per process count the configurations need: their shapes and group sizes. On GPUs
    (``device="cuda"``, ``gpus`` on this host) a world of N needs N of them: one per rank, as on a node. Either
    way each world runs on this host, so one past the local launcher's limit is refused (``check_local_world``)."""
    from zerobench.launch.local import check_local_world

    if device != "cpu":
        big = max(configs, key=lambda c: c.world_size, default=None)
        if big is not None and big.world_size > gpus:
            raise ConfigError(
                f"zerobench profile on {device}: the suite has a world of {big.world_size} (dp {big.dp} "
                f"x tp {big.tp}) and this host has {gpus} GPU(s); each rank profiles on a GPU of its "
                f"own, as the runs place them: profile on a node with {big.world_size} GPUs, or give "
                f"a suite of worlds up to {gpus}"
            )
    for cfg in configs:
        check_local_world(
            cfg.world_size,
            f"zerobench profile: the suite's world of dp {cfg.dp} x tp {cfg.tp}",
            "its processes all run on this host: profile a suite of smaller worlds (the simulator predicts larger "
            "ones from it)",
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
