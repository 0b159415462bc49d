"""What one profiling job measures, as units (``replicates``), and one pass over them in each of its processes.

A unit is a tuple naming its kind, the job's process count and what it times:

- ``("compute", ranks, i)``: shape ``i``'s forward and backward pieces (``ComputeBench``, on a fake TP group);
- ``("elem", ranks, n)``: the engine's per-element costs at ``n`` elements (``ElementBench``);
- ``("engine", ranks, stage, layers)``: the engine's host work at one stage and depth (``EngineBench``);
- ``("coll", ranks, g, op, nbytes)``: a collective over groups of ``g`` at one size (``collective_replicate``);
- ``("sync", ranks, g, target)``: the skew penalty after ``target`` seconds of compute (``sync_replicate``);
- ``("insitu", ranks, i)``: a TP shape's pieces with their collectives on the real groups.

``run_pass`` takes the replicates a plan asks for, round-robin over the units of each phase (a phase is the
units that need one kind of process group: the fake TP world, none, a fake world of one, the real one), so
that one unit's replicates are apart in time even within a pass. Every process of the job runs the same plan
in the same order (the compute steps and the collectives keep them in step); rank 0's values are the
profile's.
"""

from __future__ import annotations

from zerobench.sim.measure_comm import OPS, SYNC_TARGETS
from zerobench.sim.profile import IN_SITU, curve_key

STEPS = 5
"""Timed steps in one replicate of a compute unit (after one warm-up step)."""
ENGINE_PAIRS = 20
"""Interleaved pairs in one replicate of the engine's host work."""


def element_sizes(device: str) -> tuple[int, ...]:
    from zerobench.sim.measure_engine import ELEMENT_SIZES

    return ELEMENT_SIZES["cpu" if device == "cpu" else "cuda"]


def units_of(job) -> list[tuple]:
    """Every unit ``job`` (a ``measure.HostJob``) measures, in the order a pass takes them."""
    from zerobench.sim.measure_engine import ENGINE_LAYERS

    r = job.ranks
    out = [("compute", r, i) for i in range(len(job.shapes))]
    out += [("elem", r, n) for n in element_sizes(job.device)]
    out += [("engine", r, stage, layers) for stage in range(4) for layers in ENGINE_LAYERS]
    if r > 1 and job.groups:
        out += [("coll", r, g, op, nbytes) for g in job.groups for op in OPS for nbytes in job.sizes]
        if job.device == "cpu":
            out += [("sync", r, g, target) for g in job.groups for target in SYNC_TARGETS]
        out += [("insitu", r, i) for i, s in enumerate(job.shapes) if s.tp > 1]
    return out


PHASES = (("compute",), ("elem",), ("engine",), ("coll", "sync", "insitu"))
"""Units measured together, round-robin: each phase needs its own kind of process group."""


def rounds(plan: dict[tuple, int], kinds: tuple[str, ...]) -> list[tuple]:
    """The order a pass takes ``plan``'s units of ``kinds``: one replicate of each, then again, ..."""
    units = [u for u in plan if u[0] in kinds]
    most = max((plan[u] for u in units), default=0)
    return [u for k in range(most) for u in units if plan[u] > k]


def sync_key(g: int, ranks: int) -> str:
    return f"sync|g{g}|r{ranks}"


def run_pass(job, plan: dict[tuple, int], rank: int, port: int, barrier, device, state: dict) -> dict:
    """Take ``plan``'s replicates on this process: ``{"replicates": {unit: [values, ...]}, "memory": {...},
    "composed": {...}}`` (values: a dict per replicate, piece -> seconds). ``state`` persists across passes (the
    test-only plant's replicates left). Memory is measured in the first pass only (GPU profiles)."""
    import torch.distributed as dist

    from zerobench.distributed.fake import init_fake_world

    out: dict = {"replicates": {}, "memory": {}, "composed": {}}

    def record(unit, values):
        out["replicates"].setdefault(unit, []).append(values)

    order = rounds(plan, PHASES[0])
    if order:
        init_fake_world(max(job.shapes[u[2]].tp for u in order), 0)
        _compute_phase(job, order, barrier, device, state, record, out["memory"])
        dist.destroy_process_group()
    _element_phase(job, rounds(plan, PHASES[1]), barrier, device, record)
    order = rounds(plan, PHASES[2])
    if order:
        init_fake_world(1, 0)
        _engine_phase(job, order, barrier, device, record)
        dist.destroy_process_group()
    order = rounds(plan, PHASES[3])
    if order:
        _real_world_phase(job, order, rank, port, barrier, device, record, out["composed"])
    return out


def _compute_phase(job, order, barrier, device, state, record, memory) -> None:
    from zerobench.sim.measure_compute import ComputeBench, shape_key
    from zerobench.sim.measure_memory import step_memory

    benches = {}
    for unit in dict.fromkeys(order):
        s = job.shapes[unit[2]]
        if device.type == "cuda" and unit not in state.setdefault("memory_done", set()):
            memory.update({shape_key(k, s, job.ranks, job.threads): b for k, b in step_memory(s, device).items()})
            state["memory_done"].add(unit)
        benches[unit] = ComputeBench(s, device, plant=state.get("plant"))
    for unit in order:
        s = job.shapes[unit[2]]
        got = benches[unit].replicate(STEPS, barrier.wait)
        if state.get("plant"):
            state["plant"].spend()
        record(unit, {shape_key(k, s, job.ranks, job.threads): v for k, v in got.items()})


def _element_phase(job, order, barrier, device, record) -> None:
    from zerobench.sim.measure_engine import ElementBench

    benches = {u: ElementBench(u[2], job.kernels, device) for u in dict.fromkeys(order)}
    for unit in order:
        record(unit, {f"{k}|r{job.ranks}": v for k, v in benches[unit].replicate(barrier.wait).items()})


def _engine_phase(job, order, barrier, device, record) -> None:
    from zerobench.sim.measure_engine import EngineBench

    benches = {u: EngineBench(u[2], u[3], job.kernels, device) for u in dict.fromkeys(order)}
    for unit in order:
        record(unit, {f"engine_s{unit[2]}|r{job.ranks}": benches[unit].replicate(ENGINE_PAIRS, barrier.wait)})


def _real_world_phase(job, order, rank, port, barrier, device, record, composed) -> None:
    import torch
    import torch.distributed as dist

    from zerobench.distributed.env import choose_backend
    from zerobench.sim.measure_comm import (
        calls_at,
        collective_replicate,
        composed_curves,
        groups_of,
        matmul_seconds,
        sync_replicate,
    )
    from zerobench.sim.measure_compute import ComputeBench, shape_key

    gpus = torch.cuda.device_count() if device.type == "cuda" else 0  # jobs_for gave each rank a card
    gpu = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(
        choose_backend("auto", device, job.ranks, gpus),
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=job.ranks,
        **gpu,
    )
    try:
        groups = groups_of(job.groups, job.ranks, rank)
        composed.update(composed_curves(groups, job.ranks))
        one = matmul_seconds() if any(u[0] == "sync" for u in order) else 0.0
        in_situ = {u: ComputeBench(job.shapes[u[2]], device) for u in dict.fromkeys(order) if u[0] == "insitu"}
        for unit in order:
            kind = unit[0]
            if kind == "coll":
                _, r, g, op, nbytes = unit
                _, t = collective_replicate(op, g, groups[g], nbytes, device, calls_at(nbytes))
                record(unit, {curve_key(op, g, r): t})
            elif kind == "sync":
                _, r, g, target = unit
                comp, pen = sync_replicate(groups[g], target, one)
                record(unit, {"compute_s": comp, sync_key(g, r): pen})
            else:
                s = job.shapes[unit[2]]
                got = in_situ[unit].replicate(STEPS, barrier.wait)
                record(unit, {shape_key(k + IN_SITU, s, job.ranks, job.threads): v for k, v in got.items()})
    finally:
        dist.destroy_process_group()
