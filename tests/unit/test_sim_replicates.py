"""A profile that knows its own noise (issue 62): replicates, outliers, the stopping rule, the checks across
units and the intervals they give predictions, on synthetic samples (no processes, no clocks).

``profile_suite`` is driven here with its sessions replaced by a stand-in that answers each plan from a
function of (unit, replicate number): the passes, the re-measurements and the flags are the real code's.
"""

from __future__ import annotations

import dataclasses
import random
import re

import pytest

from tests.unit.test_sim_gpu import _cfg as _gpu_cfg
from tests.unit.test_sim_gpu import _gpu_profile
from zerobench.bench.spec import RunSpec, to_train_config
from zerobench.models.sizes import PRESETS
from zerobench.sim import profiler
from zerobench.sim.checks import CROSS_FACTOR, cross_world, non_monotone
from zerobench.sim.measure import HostJob, shape_key, shape_of
from zerobench.sim.measure_compute import Shape
from zerobench.sim.measure_units import rounds, units_of
from zerobench.sim.profile import LAUNCH, Curve, Linear, Profile, curve_key, point_key
from zerobench.sim.replicates import (
    FLOOR_S,
    MAX_REPLICATES,
    MAX_SPREAD,
    MIN_KEPT,
    Tally,
    estimate,
    outliers,
    stall_free_mean,
    stalls,
)
from zerobench.sim.simulate import interval, simulate
from zerobench.sim.validate import summarize, validate

MS = 1e-3


# -- one piece's replicates ------------------------------------------------------------------------------------
def test_a_replicate_far_from_the_others_is_rejected_and_close_ones_are_kept():
    assert outliers([10 * MS, 10.1 * MS, 30 * MS]) == [False, False, True]  # a stall in one replicate
    assert outliers([10 * MS, 9.2 * MS, 10.4 * MS, 10.2 * MS]) == [False] * 4  # within twice the threshold
    assert outliers([10 * MS, 10 * MS, 10 * MS, 3 * MS]) == [False, False, False, True]  # too fast is as suspect
    assert outliers([10 * MS, 30 * MS]) == [False, False]  # two that disagree: a third decides
    assert outliers([100e-6, 100e-6, 140e-6]) == [False] * 3  # 40 µs apart: under the floor


def test_a_piece_settles_on_three_kept_replicates_within_the_threshold():
    e = estimate([10 * MS, 10.4 * MS, 9.8 * MS])
    assert e.settled and e.kept == 3 and e.rejected == 0
    assert e.value == pytest.approx(10.0667 * MS, rel=1e-4) and e.spread == pytest.approx(0.3 / 10.0667, rel=1e-3)
    assert not estimate([10 * MS, 10.1 * MS]).settled  # two are not enough
    stalled = estimate([10 * MS, 10.2 * MS, 31 * MS])
    assert (stalled.kept, stalled.rejected, stalled.settled) == (2, 1, False)  # re-measured: one more is needed
    assert stalled.value == pytest.approx(10.1 * MS)
    assert not estimate([10 * MS, 11.5 * MS, 9 * MS]).settled  # ±12%: kept, but not settled
    assert estimate([10 * MS, 11.5 * MS, 9 * MS], threshold=0.15).settled
    assert estimate([60e-6, 100e-6, 80e-6]).settled  # ±25%, but 20 µs: below the floor


def test_a_stalled_step_leaves_its_replicate_but_a_slower_step_does_not():
    steps = [4 * MS] * 9 + [40 * MS]
    assert stalls(steps) == [False] * 9 + [True]
    assert stall_free_mean(steps) == pytest.approx(4 * MS)
    jitter = [4 * MS, 4.4 * MS, 5 * MS, 3.9 * MS, 4.1 * MS]  # 25% above the median: jitter the median step pays
    assert stalls(jitter) == [False] * 5 and stall_free_mean(jitter) == pytest.approx(sum(jitter) / 5)
    assert sum(stalls([4 * MS] * 3 + [40 * MS] * 3)) < 3  # never half the samples: the median step stays


# -- the plan over passes --------------------------------------------------------------------------------------
def test_the_plan_takes_two_then_one_of_every_unit_then_only_what_has_not_settled():
    t = Tally()
    units = [("a",), ("b",)]
    assert t.plan(units) == {("a",): 2, ("b",): 2}
    for u in units:
        for v in (10 * MS, 10.1 * MS):
            t.add(u, {"x": v})
    assert t.plan(units, every=True) == {("a",): 1, ("b",): 1}  # a second moment for every unit
    t.add(("a",), {"x": 10.2 * MS})
    t.add(("b",), {"x": 30 * MS})  # an outlier: two kept
    assert t.settled(("a",)) and not t.settled(("b",))
    assert t.plan(units) == {("b",): 1} and t.lacking(("b",)) and not t.lacking(("a",))
    for _ in range(MAX_REPLICATES):
        t.add(("c",), {"x": random.Random(len(t.samples)).uniform(5, 15) * MS})
    assert t.plan([("c",)]) == {}  # a unit that never settles stops at the cap


def test_a_flagged_unit_is_measured_afresh_once_then_keeps_its_flag():
    t = Tally()
    for v in (30 * MS, 30 * MS, 30 * MS):
        t.add(("u",), {"x": v})
    assert t.flag(("u",), "slow") and ("u",) not in t.samples and t.plan([("u",)]) == {("u",): 2}
    for v in (30 * MS, 30 * MS, 30 * MS):
        t.add(("u",), {"x": v})
    assert not t.flag(("u",), "slow again")  # what it measures is what the host does
    assert t.samples[("u",)]["x"] == [30 * MS] * 3 and t.flagged == {("u",): "slow again"}
    assert (("u",), "", None) in t.unsettled()


# -- checks across units ---------------------------------------------------------------------------------------
def _tiny_key(piece: str, ranks: int, threads: int) -> str:
    return shape_key(piece, Shape(PRESETS["tiny"], 2, 1, "fp32", "auto", False), ranks, threads)


def test_a_block_slower_in_a_smaller_world_is_flagged():
    values = {
        ("compute", 1, 0): {_tiny_key("block_fwd", 1, 2): 3 * MS, _tiny_key("head_fwd", 1, 2): 0.3 * MS},
        ("compute", 2, 0): {_tiny_key("block_fwd", 2, 1): 1 * MS, _tiny_key("head_fwd", 2, 1): 0.3 * MS},
        ("compute", 4, 0): {_tiny_key("block_fwd", 4, 1): 2.5 * MS, _tiny_key("head_fwd", 4, 1): 0.9 * MS},
    }
    flagged = cross_world(values)
    assert list(flagged) == [("compute", 1, 0)] and "3.0x" in flagged[("compute", 1, 0)]
    values[("compute", 1, 0)][_tiny_key("block_fwd", 1, 2)] = 0.99 * CROSS_FACTOR * MS  # within the allowance
    assert cross_world(values) == {}


def test_a_collective_slower_than_a_larger_size_is_flagged():
    key = curve_key("all_reduce", 2, 2)
    values = {
        ("coll", 2, 2, "all_reduce", n): {key: t}
        for n, t in ((1024, 0.9 * MS), (4096, 0.3 * MS), (16384, 0.35 * MS), (65536, 0.6 * MS))
    }
    assert list(non_monotone(values)) == [("coll", 2, 2, "all_reduce", 1024)]
    values[("coll", 2, 2, "all_reduce", 1024)][key] = 0.32 * MS  # a hair above: latency-bound sizes cross
    assert non_monotone(values) == {}
    values[("coll", 2, 2, "all_reduce", 1024)][key] = 0.3 * MS + 0.9 * FLOOR_S  # or under the floor
    assert non_monotone(values, threshold=0.0) == {}


# -- the passes, end to end on a stand-in for the processes -----------------------------------------------------
SHAPE = Shape(PRESETS["tiny"], 2, 1, "fp32", "auto", False)
PIECES = ("embed_fwd", "block_fwd", "head_fwd", "head_bwd", "block_bwd", "embed_bwd")


def _fake_sessions(monkeypatch, value):
    """Sessions that answer a plan with ``value(unit, k)`` for the k-th replicate (0-based) of each unit."""
    count: dict[tuple, int] = {}

    class Session:
        def __init__(self, job, timeout_s):
            self.job = job

        def run(self, plan):
            reps = {}
            for u in rounds(plan, ("compute", "elem", "engine", "coll", "sync", "insitu")):
                k = count[u] = count.get(u, -1) + 1
                reps.setdefault(u, []).append(value(self.job, u, k))
            return {"replicates": reps, "memory": {}, "composed": {}}

        def close(self):
            pass

    monkeypatch.setattr(profiler, "HostSession", Session)
    return count


def _steady(job, unit, k, scale=1.0):
    """Every unit's pieces at fixed costs, a ±1% wobble by replicate."""
    w = scale * (1 + 0.01 * ((k % 3) - 1))
    kind, r = unit[0], unit[1]
    if kind == "compute":
        return {shape_key(p, job.shapes[unit[2]], r, job.threads): (0.5 + PIECES.index(p)) * MS * r * w for p in PIECES}
    if kind == "elem":
        return {f"{n}|r{r}": unit[2] * 1e-9 * w for n in ("adamw", "copy", "add", "memset")}
    if kind == "engine":
        return {f"engine_s{unit[2]}|r{r}": (0.2 + 0.05 * unit[3]) * MS * w}
    if kind == "coll":
        return {curve_key(unit[3], unit[2], r): (0.1 * MS + unit[4] * 1e-9) * w}
    return {"compute_s": unit[3] * w, f"sync|g{unit[2]}|r{r}": 0.1 * MS + 0.01 * unit[3] * w}


def _job(ranks, threads, **kw):
    return HostJob(
        ranks=ranks, threads=threads, shapes=(SHAPE,), groups=(2,) if ranks > 1 else (), sizes=(1024, 4096, 16384), **kw
    )


def test_a_planted_slow_replicate_is_rejected_and_re_measured(monkeypatch):
    block = shape_key("block_fwd", SHAPE, 1, 2)

    def planted(job, unit, k):
        got = _steady(job, unit, k)
        if unit == ("compute", 1, 0) and k == 0:
            got[block] += 20 * MS  # one slow measurement of one piece
        return got

    count = _fake_sessions(monkeypatch, planted)
    done = profiler.profile_suite([_job(1, 2)], "cpu: test (2 cores)", 2, time_limit_s=0, say=lambda m: None)
    p = done.profile
    assert p.ops[block] == pytest.approx(1.5 * MS, rel=0.02)  # the planted replicate is not in it
    assert p.quality[block] == {"replicates": MIN_KEPT, "rejected": 1, "settled": True}
    assert count[("compute", 1, 0)] == MIN_KEPT  # 4 replicates: re-measured once, past the (zero) time limit
    assert done.noisy() is None and p.spread[block] < MAX_SPREAD


def test_a_piece_that_never_settles_is_named_in_one_line(monkeypatch):
    def noisy(job, unit, k):
        got = _steady(job, unit, k)
        if unit[0] == "compute":
            key = shape_key("head_bwd", SHAPE, 1, 2)
            got[key] *= (0.8, 1.0, 1.2)[k % 3]  # ±20% whenever measured
        return got

    count = _fake_sessions(monkeypatch, noisy)
    done = profiler.profile_suite([_job(1, 2)], "cpu: test (2 cores)", 2, time_limit_s=60, say=lambda m: None)
    assert count[("compute", 1, 0)] + 1 == MAX_REPLICATES  # measured until the cap
    line = done.noisy()
    assert line.count("\n") == 0 and "1 of 30 pieces did not settle" in line
    assert re.search(r"head_bwd \(h64 s64 b2, 1 process\(es\)\) ±2\d% from 12 kept", line), line
    assert done.profile.quality[shape_key("head_bwd", SHAPE, 1, 2)]["settled"] is False


def test_a_profile_taken_with_a_slow_small_world_re_measures_it(monkeypatch):
    def slow_first(job, unit, k):
        got = _steady(job, unit, k)
        if unit == ("compute", 1, 0) and k < 2:  # the whole first pass of one process, 3x slow
            got = {key: 3 * v for key, v in got.items()}
        return got

    count = _fake_sessions(monkeypatch, slow_first)
    done = profiler.profile_suite(
        [_job(1, 2), _job(2, 1)], "cpu: test (2 cores)", 2, time_limit_s=0, say=lambda m: None
    )
    assert count[("compute", 1, 0)] >= 4  # two discarded, then measured afresh
    assert done.profile.ops[shape_key("block_fwd", SHAPE, 1, 2)] == pytest.approx(1.5 * MS, rel=0.02)
    assert not done.tally.flagged and done.noisy() is None


def test_a_collective_point_taken_slow_is_re_measured_and_the_curve_is_monotone(monkeypatch):
    key = curve_key("all_gather", 2, 2)

    def slow_point(job, unit, k):
        got = _steady(job, unit, k)
        if unit == ("coll", 2, 2, "all_gather", 1024) and k < 3:
            got[key] = 1 * MS  # slower than 16 KiB's 0.12 ms
        return got

    count = _fake_sessions(monkeypatch, slow_point)
    done = profiler.profile_suite([_job(2, 1)], "cpu: test (2 cores)", 2, time_limit_s=0, say=lambda m: None)
    assert count[("coll", 2, 2, "all_gather", 1024)] >= 5
    pts = done.profile.curves[key].points
    assert [t for _, t in pts] == sorted(t for _, t in pts) and pts[0][1] < 0.12 * MS


# -- spreads in rows, and the prediction's interval ------------------------------------------------------------
def test_spreads_and_how_entries_were_measured_round_trip_through_rows():
    ar = curve_key("all_reduce", 2, 2)
    p = Profile(
        "cpu: test (2 cores)",
        cores=2,
        ops={"block_fwd|x": 1e-3},
        curves={ar: Curve(((1024.0, 1e-4), (4096.0, 2e-4)))},
        linear={"copy|r2": Linear(1e-6, 1e-10)},
        spread={"block_fwd|x": 0.04, point_key(ar, 1024.0): 0.2, "copy|r2": 0.1},
        quality={"block_fwd|x": {"replicates": 3, "rejected": 1, "settled": True}},
    )
    rows = [{**r, "status": "ok", "device": p.device, "cores": 2} for r in p.rows()]
    assert next(r for r in rows if r["key"] == "block_fwd|x")["rejected"] == 1
    q = Profile.from_rows(rows)
    assert q.spread == p.spread and (q.ops, q.curves, q.linear) == (p.ops, p.curves, p.linear)
    lo, hi = q.bound(-1), q.bound(+1)
    assert (lo.ops["block_fwd|x"], hi.ops["block_fwd|x"]) == (pytest.approx(0.96e-3), pytest.approx(1.04e-3))
    assert hi.curves[ar].points == ((1024.0, pytest.approx(1.2e-4)), (4096.0, 2e-4))
    assert hi.linear["copy|r2"] == Linear(pytest.approx(1.1e-6), pytest.approx(1.1e-10))


def test_profiles_read_as_rounds_carry_their_disagreement_as_spread():
    def one(t):
        p = Profile("cpu: test (2 cores)", cores=2, ops={"block_fwd|x": t}, spread={"block_fwd|x": 0.01})
        return [{**r, "status": "ok", "device": p.device, "cores": 2} for r in p.rows()]

    q = Profile.from_rows(one(1e-3) + one(1.2e-3) + one(1.1e-3))
    assert q.ops["block_fwd|x"] == 1.1e-3 and q.spread["block_fwd|x"] == pytest.approx(0.1e-3 / 1.1e-3)
    assert not Profile.from_rows(
        [{**r, "status": "ok", "device": "cpu: x", "cores": 2} for r in Profile("cpu: x", ops={"a": 1.0}).rows()]
    ).has_spread


def _cpu_profile(cfg, spread=0.0):
    s, r, t = shape_of(cfg), cfg.world_size, max(1, 2 // cfg.world_size)
    p = Profile("cpu: test (2 cores)", cores=2)
    for op in PIECES:
        p.ops[shape_key(op, s, r, t)] = 1e-3
        p.spread[shape_key(op, s, r, t)] = spread
    for name in ("adamw", "copy", "add", "memset"):
        p.linear[f"{name}|r{r}"] = Linear(0.0, 1e-10)
    return p


def test_the_interval_holds_the_point_and_widens_with_the_spreads():
    cfg = to_train_config(RunSpec(preset="tiny", precision="fp32"))
    point = simulate(cfg, _cpu_profile(cfg, 0.1))["step_time_s"]
    lo, hi = interval(cfg, _cpu_profile(cfg, 0.1))
    assert lo < point < hi and hi - lo > 0.15 * point
    assert interval(cfg, _cpu_profile(cfg)) == (pytest.approx(point), pytest.approx(point))


def test_validation_says_whether_each_run_is_inside_its_interval():
    cfg = to_train_config(RunSpec(preset="tiny", precision="fp32"))
    prof = _cpu_profile(cfg, 0.1)
    point = simulate(cfg, prof)["step_time_s"]
    rows = [
        {
            "metric": "step_time_s",
            "status": "ok",
            "value": v,
            "run_id": rid,
            "config": dataclasses.asdict(cfg),
            "config_hash": rid,
        }
        for rid, v in (("in", point * 1.05), ("out", point * 1.5))
    ]
    recs = validate(rows, prof)
    assert [r["inside"] for r in recs] == [True, False]
    assert recs[0]["predicted_low_s"] < point < recs[0]["predicted_high_s"]
    assert summarize(recs)["inside_interval"] == 1


def test_the_reports_validation_table_carries_the_interval(tmp_path):
    from zerobench.report.aggregate import sim_validation_table
    from zerobench.results import load
    from zerobench.sim.validate import write_rows

    cfg = to_train_config(RunSpec(preset="tiny", precision="fp32"))
    prof = _cpu_profile(cfg, 0.1)
    point = simulate(cfg, prof)["step_time_s"]
    rows = [
        {
            "metric": "step_time_s",
            "status": "ok",
            "value": point * 1.5,
            "run_id": "r",
            "config_hash": "h",
            "config": dataclasses.asdict(cfg),
        }
    ]
    write_rows(tmp_path, validate(rows, prof), prof, "measured")
    t = sim_validation_table(load(tmp_path)).set_index("run")
    assert t.loc["r", "predicted_low_ms"] < 1e3 * point < t.loc["r", "predicted_high_ms"]
    assert not t.loc["r", "inside"]


def test_a_host_bound_gpu_step_moves_with_the_launch_spreads_a_device_bound_one_does_not():
    """On a GPU the host's cost to issue each piece (``LAUNCH``) follows the host's speed: its spread reaches a
    host-bound step's interval whole, and a device-bound one's hardly."""
    c = _gpu_cfg(stage=0)

    def with_launch_spread(p):
        p.spread.update({k: 0.3 for k in p.ops if LAUNCH in k})
        return p

    host_bound = with_launch_spread(_gpu_profile([c], device_s=1e-4, launch_s=1e-3))
    lo, hi = interval(c, host_bound)
    point = simulate(c, host_bound)["step_time_s"]
    assert lo == pytest.approx(0.7 * point, rel=0.02) and hi == pytest.approx(1.3 * point, rel=0.02)
    device_bound = with_launch_spread(_gpu_profile([c], device_s=1e-3, launch_s=1e-4))
    lo, hi = interval(c, device_bound)
    assert hi - lo < 0.01 * simulate(c, device_bound)["step_time_s"]


def test_a_gpu_job_measures_no_skew_penalty_and_its_own_element_sizes():
    (job,) = profiler_jobs = [HostJob(ranks=2, threads=8, shapes=(SHAPE,), groups=(2,), device="cuda")]
    kinds = {u[0] for u in units_of(job)}
    assert kinds == {"compute", "elem", "engine", "coll"} and profiler_jobs
    assert max(u[2] for u in units_of(job) if u[0] == "elem") == 1 << 26
    cpu = units_of(dataclasses.replace(job, device="cpu"))
    assert {u[0] for u in cpu} == {"compute", "elem", "engine", "coll", "sync"}


def test_a_pass_takes_one_replicate_of_each_unit_before_the_next():
    plan = {("compute", 1, 0): 2, ("compute", 1, 1): 1, ("elem", 1, 5): 3}
    assert rounds(plan, ("compute",)) == [("compute", 1, 0), ("compute", 1, 1), ("compute", 1, 0)]
    assert rounds(plan, ("elem",)) == [("elem", 1, 5)] * 3


def test_one_stalled_step_does_not_set_a_compute_piece(monkeypatch):
    """The quick path's worst miss: one piece charged at several times what the run pays. A profile's compute
    piece was the mean over one window of steps, so a single stalled step (the host busy elsewhere for a moment)
    moved it by the stall over the window's length, where the run's median step never sees the stall. Here one
    step of fifteen stalls for half a second in block 0's forward; the pieces equal those of the same steps
    without the stall (the stall lands before block 0's own stamp: in ``embed_fwd``). The steps run for real, on
    a clock that advances a fixed tick per stamp, so the two measurements differ by the stall alone and not by
    whatever else the machine is doing."""
    import torch

    from zerobench.distributed.fake import init_fake_world
    from zerobench.sim import measure_compute as M

    now = {"t": 0.0}

    class TickClock:
        def stamp(self):
            now["t"] += MS
            return now["t"]

        def finish(self):
            pass

        def seconds(self, mark):
            return mark

    monkeypatch.setattr(M, "HostClock", TickClock)
    real = M.shape_model
    steps = {"n": 0}

    def stalled_model(shape, device):
        model, x, y = real(shape, device)

        def stall(_mod, _args):
            steps["n"] += 1
            if steps["n"] == 8:
                now["t"] += 0.5

        model.blocks[0].register_forward_pre_hook(stall)
        return model, x, y

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        init_fake_world(1, 0)
        clean = M.time_compute(SHAPE, reps=15)
        monkeypatch.setattr(M, "shape_model", stalled_model)
        got = M.time_compute(SHAPE, reps=15)
        steps["n"] = 0  # the same stall with nothing dropped: it lands in a timed step, and the mean carries it
        monkeypatch.setattr(M, "stalls", lambda samples: [False] * len(samples))
        kept = M.time_compute(SHAPE, reps=15)
    finally:
        torch.set_num_threads(threads)
        torch.distributed.destroy_process_group()
    assert kept["embed_fwd"] == pytest.approx(clean["embed_fwd"] + 0.5 / 15, rel=1e-9)
    assert clean["embed_fwd"] > 0 and set(got) == set(clean)
    assert got == pytest.approx(clean, rel=1e-9, abs=1e-12), (got, clean)
