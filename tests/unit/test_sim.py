"""The performance simulator's pure parts: the event replay, profile curves and rows, the engine's real
layout as the replay sees it, and what the replayed schedule must show per stage (issue 22)."""

from __future__ import annotations

import math

import pytest

from zerobench.bench.spec import RunSpec, to_train_config
from zerobench.sim.layout import HEAD, engine_buckets
from zerobench.sim.measure_compute import skew_mean
from zerobench.sim.profile import Curve, Linear, Profile, curve_key
from zerobench.sim.replay import Timeline
from zerobench.sim.simulate import simulate


def test_replay_overlaps_streams_and_the_critical_path_sums_to_the_step():
    tl = Timeline()
    a = tl.add("bwd 1", "compute", 3.0, "compute")
    c = tl.add("reduce 1", "dp", 2.0, "dp_comm", (a,))  # starts when its gradients exist
    tl.add("bwd 2", "compute", 1.0, "compute")  # overlaps the reduce
    c2 = tl.add("reduce 2", "dp", 2.0, "dp_comm", (tl.now("compute"),))  # waits for the dp stream (ends 5)
    tl.wait("compute", (c, c2))
    tl.add("step", "compute", 0.5, "optimizer")
    assert tl.tasks[c2].start == 5.0 and tl.tasks[c2].end == 7.0
    assert tl.makespan == 7.5
    bd = tl.breakdown()
    assert bd == {"compute": 3.0, "dp_comm": 4.0, "optimizer": 0.5}
    assert math.isclose(sum(bd.values()), tl.makespan)


def test_curve_interpolates_in_log_log_and_extrapolates_at_the_last_bandwidth():
    c = Curve(((1e3, 1e-4), (1e6, 1e-3), (1e7, 1e-2)))
    assert c.seconds(1e6) == pytest.approx(1e-3)
    assert c.seconds(10) == pytest.approx(1e-4)  # the latency floor
    assert 1e-4 < c.seconds(3e4) < 1e-3
    assert c.seconds(1e8) == pytest.approx(1e-2 + 9e7 / (9e6 / 9e-3))


def test_linear_fit_recovers_alpha_and_beta():
    pts = [(n, 2e-5 + 3e-10 * n) for n in (1e3, 1e5, 1e6, 4e6)]
    fit = Linear.fit(pts)
    assert fit.alpha == pytest.approx(2e-5, rel=1e-6) and fit.beta == pytest.approx(3e-10, rel=1e-6)


def test_a_falling_line_is_fitted_flat():
    """A fresh profile's skew line once came out at -0.0097 s per s of compute on CI's VM (noise between its four
    points); a negative slope would charge a long step negative time."""
    pts = [(1e-3, 3e-4), (4e-3, 2.9e-4), (16e-3, 2.6e-4), (64e-3, 2.0e-4)]
    fit = Linear.fit(pts)
    assert fit.beta == 0.0 and 2.0e-4 < fit.alpha < 3e-4 and fit.seconds(10.0) == fit.alpha


def test_the_skew_penalty_drops_a_rare_stall_and_keeps_a_skew_most_samples_show():
    ms = 1e-3
    stall = [1 * ms] * 15 + [800 * ms]  # one host stall in 16 samples: the median step never sees it
    assert skew_mean(stall) == pytest.approx(1 * ms)
    # Each point of the line is such a mean: the stall alone made the slope ~0.8 s per s of compute.
    pts = [(t, skew_mean([0.5 * ms + 0.05 * t] * 15 + [0.8])) for t in (1 * ms, 4 * ms, 16 * ms, 64 * ms)]
    assert Linear.fit(pts).beta == pytest.approx(0.05, rel=1e-6)
    skewed = [2 * ms] * 12 + [9 * ms] * 4  # a quarter of the samples: a cost the median step pays in part
    assert skew_mean(skewed) == pytest.approx((12 * 2 + 2 * 9) * ms / 14)
    assert skew_mean([3 * ms] * 7) == pytest.approx(3 * ms)  # fewer than eight samples: nothing dropped


def test_profile_round_trips_through_rows():
    p = Profile(
        "cpu: test (2 cores)",
        cores=2,
        ops={"block_fwd|x": 1e-3},
        curves={curve_key("all_reduce", 2, 2): Curve(((1024.0, 1e-4), (4096.0, 2e-4)))},
        linear={"copy|r2": Linear(0.0, 1e-10)},
    )
    rows = [{**r, "status": "ok", "device": p.device, "cores": 2} for r in p.rows()]
    q = Profile.from_rows(rows)
    assert (q.ops, q.curves, q.linear, q.cores) == (p.ops, p.curves, p.linear, 2)
    with pytest.raises(ValueError, match="zerobench profile"):
        Profile.from_rows([])


def test_a_profile_measured_several_times_is_the_median_of_its_measurements():
    def prof(t_op, t_curve, beta):
        p = Profile(
            "cpu: test (2 cores)",
            cores=2,
            ops={"block_fwd|x": t_op},
            curves={curve_key("all_reduce", 2, 2): Curve(((1024.0, t_curve), (4096.0, 2 * t_curve)))},
            linear={"copy|r2": Linear(0.0, beta)},
        )
        return [{**r, "status": "ok", "device": p.device, "cores": 2} for r in p.rows()]

    q = Profile.from_rows(prof(2e-3, 3e-4, 4e-10) + prof(1e-3, 2e-4, 2e-10) + prof(9e-3, 1e-4, 1e-10))
    assert q.ops == {"block_fwd|x": 2e-3}  # the median, not the last profile read
    assert q.curves[curve_key("all_reduce", 2, 2)].points == ((1024.0, 2e-4), (4096.0, 4e-4))
    assert q.linear["copy|r2"].beta == 2e-10


def _gloo_profile(device: str, composed: bool) -> list[dict]:
    ar, rs = curve_key("all_reduce", 2, 2), curve_key("reduce_scatter", 2, 2)
    p = Profile(
        device,
        cores=2,
        curves={ar: Curve(((1024.0, 4e-4), (4096.0, 8e-4))), rs: Curve(((1024.0, 2e-4), (4096.0, 6e-4)))},
        composed={rs: ar} if composed else {},
    )
    return [{**r, "status": "ok", "device": p.device, "cores": 2} for r in p.rows()]


def test_a_collective_built_from_another_is_read_with_it_as_one_measurement():
    """On gloo zerobench's reduce-scatter is an all-reduce: the profile times that one operation twice, and
    both lookups read the mean of the two curves; a native reduce-scatter keeps its own."""
    q = Profile.from_rows(_gloo_profile("cpu: test (2 cores)", composed=True))
    assert q.composed == {curve_key("reduce_scatter", 2, 2): curve_key("all_reduce", 2, 2)}
    for op in ("all_reduce", "reduce_scatter"):
        assert q.collective(op, 2, 2, 1024) == pytest.approx(3e-4)
        assert q.collective(op, 2, 2, 4096) == pytest.approx(7e-4)
    assert q.curves[curve_key("all_reduce", 2, 2)].seconds(1024) == 4e-4  # the rows' own curves are kept
    native = Profile.from_rows(_gloo_profile("gpu: test", composed=False))
    assert not native.composed
    assert native.collective("reduce_scatter", 2, 2, 1024) == pytest.approx(2e-4)
    assert native.collective("all_reduce", 2, 2, 1024) == pytest.approx(4e-4)


def test_cpu_profiles_from_before_curves_named_their_composition_are_read_as_gloo():
    old = [{k: v for k, v in r.items() if k != "composed_of"} for r in _gloo_profile("cpu: x (2 cores)", True)]
    assert Profile.from_rows(old).composed == {curve_key("reduce_scatter", 2, 2): curve_key("all_reduce", 2, 2)}
    assert not Profile.from_rows(_gloo_profile("cpu: x (2 cores)", composed=False)).composed  # said: none


def _cfg(**kw):
    return to_train_config(RunSpec(preset="tiny", precision="fp32", **kw))


def test_layout_buckets_are_the_engines_and_say_where_they_complete():
    cfg = _cfg(stage=3, dp=2, bucket_size=8192)
    bs = engine_buckets(cfg)
    assert sum(b.param_numel for b in bs) == 2 * (12 * 64 * 64 + 13 * 64) + 512 * 64 + 64 * 64 + 2 * 64
    assert all(b.numel == 2 * b.shard_numel for b in bs)
    # stage 3: the last block's unit first, the root (unit 0) last; every unit's buckets consecutive
    assert [b.unit for b in bs] == sorted((b.unit for b in bs), key=lambda u: (u == 0, -u))
    assert {b.lands for b in bs if b.unit == 2} == {1} and {b.lands for b in bs if b.unit == 0} == {2}
    # stages 0-2: ln_f (head) and the last block fill bucket 0 first
    assert engine_buckets(_cfg(stage=2, dp=2, bucket_size=8192))[0].lands in (HEAD, 1)


def _profile(cfgs, block=1e-3, head=2e-3, coll=(1e-4, 1e-9)) -> Profile:
    """A stated profile: every piece ``block`` s (head pieces ``head``), collectives alpha + bytes * beta."""
    from zerobench.sim.measure import shape_key, shape_of

    p = Profile("stated test device", cores=64)
    for c in cfgs:
        for op in ("embed_fwd", "block_fwd", "head_fwd", "head_bwd", "block_bwd", "embed_bwd"):
            t = head if op.startswith("head") else (2 * block if op == "block_bwd" else block)
            p.ops[shape_key(op, shape_of(c), c.world_size, max(1, 64 // c.world_size))] = t
        for name in ("adamw", "copy", "add", "memset"):
            p.linear[f"{name}|r{c.world_size}"] = Linear(0.0, 1e-12)
        for g in {c.dp, c.tp}:
            for op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"):
                a, b = coll
                p.curves[curve_key(op, g, c.world_size)] = Curve(((1.0, a + b), (1e9, a + 1e9 * b)))
    return p


def test_one_rank_is_its_compute_and_stage_3_gathers_every_unit_twice():
    one = _cfg(stage=0, dp=1)
    p = _profile([one])
    r = simulate(one, p)
    L = one.model.layers
    assert r["breakdown_s"]["compute"] == pytest.approx(2 * 1e-3 + L * 3e-3 + 2 * 2e-3)
    s3 = _cfg(stage=3, dp=2)
    sim3 = simulate(s3, _profile([s3]))
    units = len({b.unit for b in engine_buckets(s3)})
    gathers = [t for t in sim3["timeline"].tasks if t.name.startswith("gather")]
    assert len({t.name for t in gathers}) == units and len(gathers) == 2 * len(engine_buckets(s3))


def test_slow_links_are_exposed_at_stage_3_and_prefetch_hides_them():
    fast, slow = (1e-6, 1e-12), (1e-4, 4e-9)
    s2, s3 = _cfg(stage=2, dp=2), _cfg(stage=3, dp=2)
    for c in (s2, s3):
        assert (
            simulate(c, _profile([c], coll=fast))["step_time_s"] < simulate(c, _profile([c], coll=slow))["step_time_s"]
        )
    slow3 = simulate(s3, _profile([s3], coll=slow))
    assert slow3["breakdown_s"]["dp_comm"] > simulate(s2, _profile([s2], coll=slow))["breakdown_s"]["dp_comm"]
    import dataclasses

    no_pre = dataclasses.replace(s3, zero=dataclasses.replace(s3.zero, prefetch=False))
    assert simulate(no_pre, _profile([no_pre], coll=slow))["step_time_s"] > slow3["step_time_s"]


def test_without_overlap_comm_backward_waits_for_every_bucket():
    import dataclasses

    for stage in (0, 2, 3):
        c = _cfg(stage=stage, dp=2, bucket_size=8192)
        off = dataclasses.replace(c, zero=dataclasses.replace(c.zero, overlap_comm=False))
        prof = _profile([c], coll=(1e-4, 4e-9))
        on_s, off_s = simulate(c, prof)["step_time_s"], simulate(off, prof)["step_time_s"]
        assert off_s > on_s, (stage, on_s, off_s)


def test_tp_collectives_sit_on_the_critical_path_four_per_block_six_with_recompute():
    for ckpt, per_block in ((False, 4), (True, 6)):
        c = _cfg(stage=0, dp=1, tp=2, checkpoint_activations=ckpt)
        tasks = simulate(c, _profile([c]))["timeline"].tasks
        n = sum(t.name == "tp all_reduce" for t in tasks)
        assert n == c.model.layers * per_block + 1 + 3 + 1  # + embedding, cross-entropy (3), head backward


def test_a_profile_entry_keeps_its_pieces_tail():
    """One call in eight stalls for 40 ms: a step that sums such pieces pays the stall on average, so the
    profile's entry is the mean (at least 5 ms here), where the median (well under 1 ms) would drop it."""
    import time

    from zerobench.sim.measure_compute import STATISTIC, mean_time

    calls = iter(range(100))

    def piece():
        if next(calls) % 8 == 0:
            time.sleep(0.04)

    assert STATISTIC == "mean"
    assert mean_time(piece, 16) >= 2 * 0.04 / 16


def test_tp_pieces_measured_in_situ_charge_their_collectives_as_measured():
    """Where the profile has a TP piece measured with its collectives on the real groups (``+tp``), the
    replay charges that piece's TP collectives as the difference from the piece alone (never negative),
    in place of the isolated collectives and the rank-skew penalty; other profiles keep the old path."""
    from zerobench.sim.measure import shape_key, shape_of
    from zerobench.sim.profile import IN_SITU

    c = _cfg(stage=0, dp=1, tp=2)
    p = _profile([c])
    plain = simulate(c, p)
    assert any(t.name == "tp all_reduce" for t in plain["timeline"].tasks)
    extra = {"embed_fwd": 1e-4, "block_fwd": 3e-4, "head_fwd": 5e-4, "head_bwd": 2e-4, "block_bwd": -4e-4}
    for op, e in extra.items():
        p.ops[shape_key(op + IN_SITU, shape_of(c), 2, 32)] = p.ops[shape_key(op, shape_of(c), 2, 32)] + e
    r = simulate(c, p)
    L = c.model.layers
    assert r["breakdown_s"]["mp_comm"] == pytest.approx(1e-4 + 5e-4 + 2e-4 + L * 3e-4)  # block_bwd: 0, not < 0
    assert r["breakdown_s"]["compute"] == pytest.approx(plain["breakdown_s"]["compute"])
    assert "sync" not in r["breakdown_s"]
    assert not any(t.name == "tp all_reduce" for t in r["timeline"].tasks)


def test_the_unused_check_is_its_own_collective_but_at_stage_0_and_in_runs_recorded_before_it_rode():
    """The engine's unused-parameter agreement: an all-reduce behind the last bucket at stages 1-3; at stage 0 its
    flags ride in the last bucket's all-reduce (none of its own), except in runs recorded before that change,
    which ``validate`` replays as they ran (by their rows' timestamps)."""
    from zerobench.sim.validate import FLAGS_RIDE_SINCE, recorded_before_flags_rode

    def checks(cfg, **kw):
        return [t for t in simulate(cfg, _profile([cfg]), **kw)["timeline"].tasks if t.name == "unused check"]

    s0, s1 = _cfg(stage=0, dp=2), _cfg(stage=1, dp=2)
    assert checks(s0) == [] and len(checks(s0, own_check_at_stage0=True)) == 1 and len(checks(s1)) == 1
    assert checks(_cfg(stage=1, dp=1)) == []
    stamp = FLAGS_RIDE_SINCE.isoformat()
    rows = [
        {"metric": "step_time_s", "run_id": "old", "provenance": {"timestamp": "2026-11-25T21:38:03+00:00"}},
        {"metric": "step_time_s", "run_id": "new", "provenance": {"timestamp": stamp}},
        {"metric": "loss", "run_id": "loss-only", "provenance": {"timestamp": "2026-11-25T21:38:03+00:00"}},
    ]
    assert recorded_before_flags_rode(rows) == {"old"}


def test_at_stages_2_3_a_large_buckets_copy_waits_for_the_reduce_scatter_in_flight():
    """``overlap_comm`` on: a large bucket's gradients that land while another bucket's reduce-scatter runs
    wait as autograd made them (``StagingBuckets.hold``): on a network slower than a block's backward, each
    large bucket's staging copy starts once the previous bucket's reduce-scatter has ended. The step is still
    faster than with ``overlap_comm`` off, which waits for each as it starts."""
    import dataclasses

    from zerobench.sim.schedule import StepReplay

    for stage in (2, 3):
        c = _cfg(stage=stage, dp=2, bucket_size=8192)
        prof = _profile([c], coll=(1e-4, 4e-8))
        tasks = simulate(c, prof)["timeline"].tasks
        buckets = StepReplay(c, prof).buckets
        reduces = {t.name: t for t in tasks if t.name.startswith("reduce bucket")}
        copies = [t for t in tasks if t.name == "staging copy"]  # one per bucket, in bucket order
        assert len(copies) == len(buckets) == len(reduces)
        assert max(r.seconds for r in reduces.values()) > 2e-3, "a reduce-scatter outlasts a block's backward"
        large = [b.index for b in buckets[1:] if b.held_back]
        assert large
        for i in large:
            assert copies[i].start >= reduces[f"reduce bucket {i - 1}"].end, (stage, i)
        off = dataclasses.replace(c, zero=dataclasses.replace(c.zero, overlap_comm=False))
        assert simulate(c, prof)["step_time_s"] < simulate(off, prof)["step_time_s"]


def test_at_stages_2_3_the_embeddings_backward_waits_for_the_reduce_scatters_in_flight():
    """The tied word embedding (its own held-back bucket) gets its second gradient in the embedding's backward,
    which starts once every reduce-scatter issued before it has ended (``zero/grads/staging.py``); at stages 0-1
    (no staging) and with ``overlap_comm`` off there is no such wait."""
    import dataclasses

    for stage in (0, 1, 2, 3):
        c = _cfg(stage=stage, dp=2, bucket_size=8192)
        assert [b.tied for b in engine_buckets(c)].count(True) == 1
        for overlap in (True, False):
            cfg = dataclasses.replace(c, zero=dataclasses.replace(c.zero, overlap_comm=overlap))
            tasks = simulate(cfg, _profile([cfg], coll=(1e-4, 4e-8)))["timeline"].tasks
            embed = next(t for t in tasks if t.name == "embed_bwd")
            before = [t for t in tasks if t.name.startswith("reduce bucket") and t.start <= embed.start]
            assert before, (stage, overlap)
            waited = all(t.end <= embed.start for t in before)
            assert waited is (stage >= 2 or not overlap), (stage, overlap, embed.start, [t.end for t in before])


def test_more_ranks_than_cores_share_them_a_piece_at_one_rank_per_core_times_the_share():
    """On a 2-core CPU host, a piece at 4 single-threaded ranks is the 2-rank piece times 2 (the share a step pays
    on average), whatever the bimodal 4-rank measurement says; where the host is not oversubscribed, or the profile
    lacks the one-rank-per-core piece, or the device is not a CPU, the measured entry stands."""
    from zerobench.sim.profile import op_key

    shape = dict(b=2, s=64, h=64, heads=4, vocab=512, tp=1, dtype="fp32", kernels="auto", checkpoint=False)
    prof = Profile("cpu: test (2 cores)", cores=2)
    prof.ops[op_key("block_fwd", **shape, ranks=1, threads=2)] = 1.5e-3
    prof.ops[op_key("block_fwd", **shape, ranks=2, threads=1)] = 1.8e-3
    prof.ops[op_key("block_fwd", **shape, ranks=4, threads=1)] = 2.5e-3  # a median on the untouched mode
    prof.ops[op_key("head_fwd", **shape, ranks=4, threads=1)] = 4.0e-3  # no 2-rank piece
    assert prof.op_time("block_fwd", **shape, ranks=4, threads=1) == pytest.approx(3.6e-3)
    assert prof.op_time("block_fwd", **shape, ranks=2, threads=1) == pytest.approx(1.8e-3)
    assert prof.op_time("block_fwd", **shape, ranks=1, threads=2) == pytest.approx(1.5e-3)
    assert prof.op_time("head_fwd", **shape, ranks=4, threads=1) == pytest.approx(4.0e-3)
    gpu = Profile("cuda: test", cores=2, ops=dict(prof.ops))
    assert gpu.op_time("block_fwd", **shape, ranks=4, threads=1) == pytest.approx(2.5e-3)
    low = prof.bound(-1)  # the interval follows the piece it is read from
    prof.spread[op_key("block_fwd", **shape, ranks=2, threads=1)] = 0.1
    assert prof.bound(-1).op_time("block_fwd", **shape, ranks=4, threads=1) == pytest.approx(3.24e-3)
    assert low.op_time("block_fwd", **shape, ranks=4, threads=1) == pytest.approx(3.6e-3)


def test_compiled_kernels_are_refused_by_the_profile_and_left_undescribed_by_the_replay():
    """The profile times the blocks' eager kernels: a compiled run would be profiled, or predicted, as an eager one
    under its own name."""
    from zerobench.config import ConfigError
    from zerobench.sim.measure import shape_of
    from zerobench.sim.simulate import undescribed
    from zerobench.train.config import TrainConfig

    cfg = TrainConfig(kernels="compiled")
    with pytest.raises(ConfigError, match="does not model --kernels compiled") as e:
        shape_of(cfg)
    assert "\n" not in str(e.value)
    assert undescribed(cfg) == ["compiled blocks (--kernels compiled: the profile times eager ones)"]
    with pytest.raises(ValueError, match="does not describe compiled blocks"):
        simulate(cfg, Profile("stated test device", cores=64))
    assert shape_of(TrainConfig(kernels="auto")).kernels == "auto" and undescribed(TrainConfig()) == []
