"""The simulator's GPU path without a GPU (issue 22, items 3b and 4): the replay of a device the host runs
ahead of, a world of one's copies, the memory planner from measured terms, the profiler's one-card rule,
the recorded H200 rounds (``results/reference/gpu-h200-2026-11-26``) and H100 rounds
(``results/reference/gpu-h100-2026-11-26``) reproduced from their rows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from zerobench.bench.spec import RunSpec, to_train_config
from zerobench.config import ConfigError
from zerobench.sim.layout import engine_buckets
from zerobench.sim.measure import jobs_for, shape_key, shape_of
from zerobench.sim.memory import max_layers, predict_memory
from zerobench.sim.profile import LAUNCH, Linear, Profile
from zerobench.sim.simulate import simulate

GPU_REF = Path(__file__).resolve().parents[2] / "results" / "reference" / "gpu-h200-2026-11-26"
H100_REF = GPU_REF.parent / "gpu-h100-2026-11-26"
PIECES = ("embed_fwd", "block_fwd", "head_fwd", "head_bwd", "block_bwd", "embed_bwd")


def _cfg(**kw):
    return to_train_config(RunSpec(preset="tiny", precision="bf16", **kw))


def _gpu_profile(cfgs, device_s=1e-3, launch_s=1e-4, engine=(0.0, 0.0), block_bytes=1000.0, fixed_bytes=5000.0):
    """A GPU profile: every piece ``device_s`` on the stream and ``launch_s`` to issue; copies and the step free."""
    p = Profile("cuda: test card", cores=16)
    for c in cfgs:
        s, r, t = shape_of(c), c.world_size, max(1, 16 // c.world_size)
        for op in PIECES:
            p.ops[shape_key(op, s, r, t)] = device_s
            p.ops[shape_key(op + LAUNCH, s, r, t)] = launch_s
        p.memory[shape_key("step_peak_fixed", s, r, t)] = fixed_bytes
        p.memory[shape_key("step_peak_block", s, r, t)] = block_bytes
        for name in ("adamw", "copy", "add", "memset"):
            p.linear[f"{name}|r{r}"] = Linear(0.0, 0.0)
        for stage in range(4):
            p.linear[f"engine_s{stage}|r{r}"] = Linear(*engine)
    return p


def test_a_gpu_step_is_device_bound_or_host_bound_whichever_its_pieces_make_it():
    c = _cfg(stage=0)
    n = 2 * c.model.layers + 4  # pieces issued in one step
    fast_host = simulate(c, _gpu_profile([c], device_s=1e-3, launch_s=1e-4))
    assert fast_host["step_time_s"] == pytest.approx(1e-4 + n * 1e-3)  # one launch, then the device's work
    assert fast_host["breakdown_s"]["compute"] == pytest.approx(n * 1e-3)
    slow_host = simulate(c, _gpu_profile([c], device_s=1e-4, launch_s=1e-3))
    assert slow_host["step_time_s"] == pytest.approx(n * 1e-3 + 1e-4)  # every launch, then the last piece
    assert slow_host["breakdown_s"]["host"] == pytest.approx(n * 1e-3)


def test_the_engines_host_work_hides_behind_the_device_until_step_reads_a_result_back():
    c = _cfg(stage=3)
    base = simulate(c, _gpu_profile([c]))["step_time_s"]
    per_block = simulate(c, _gpu_profile([c], engine=(0.0, 2e-4)))["step_time_s"]  # host work beside backward
    assert per_block == pytest.approx(base)
    per_step = simulate(c, _gpu_profile([c], engine=(5e-3, 0.0)))  # after the sync: the device waits for it
    assert per_step["step_time_s"] == pytest.approx(base + 5e-3)
    assert per_step["breakdown_s"]["engine"] == pytest.approx(5e-3)


def test_a_group_of_one_copies_where_the_engine_has_two_buffers():
    """At DP 1 stage 2 reduce-scatters each bucket into its own gradient shard, stage 3 also gathers every unit
    into a full buffer before forward and before backward; stages 0-1 move nothing (``collectives.py``)."""

    def copies(stage):
        c = _cfg(stage=stage)
        tasks = simulate(c, _gpu_profile([c]))["timeline"].tasks
        return [t.name for t in tasks if "a group of one" in t.name]

    assert copies(0) == [] and copies(1) == []
    n = len(engine_buckets(_cfg(stage=2)))
    assert len(copies(2)) == n
    assert len(copies(3)) == 3 * len(engine_buckets(_cfg(stage=3)))  # two gathers and a reduce per bucket


def test_memory_is_the_engines_states_plus_the_measured_step():
    c0 = _cfg(stage=0)
    p = _gpu_profile([c0, _cfg(stage=2), _cfg(stage=3)])
    numel = sum(b.numel for b in engine_buckets(c0))
    m0 = predict_memory(c0, p)
    assert m0["states_params"] == m0["states_grads"] == 2 * numel
    assert m0["states_master"] == 4 * numel and m0["states_optimizer_states"] == 8 * numel
    assert m0["activations"] == 5000 + c0.model.layers * 1000
    assert m0["total"] == pytest.approx(16 * numel + m0["activations"])
    m2 = predict_memory(_cfg(stage=2), p)
    assert m2["states_grads"] == 0 and m2["total"] == pytest.approx(m0["total"] - 2 * numel)
    accum = _cfg(stage=2, grad_accum=2)
    assert predict_memory(accum, _gpu_profile([accum]))["states_grads"] == 2 * numel  # held between micro-batches
    c3 = _cfg(stage=3)
    units: dict[int, int] = {}
    for b in engine_buckets(c3):
        units[b.unit] = units.get(b.unit, 0) + b.numel
    m3 = predict_memory(c3, p)
    assert m3["stage3_gathered"] == 2 * (units[0] + max(v for u, v in units.items() if u))


def test_memory_entries_serve_every_world_size_and_the_planner_solves_layers():
    one, four = _cfg(stage=2), _cfg(stage=2, dp=4)
    p = _gpu_profile([one])  # measured with one process
    assert predict_memory(four, p)["states_master"] == pytest.approx(predict_memory(one, p)["states_master"] / 4)
    budget = predict_memory(dataclasses.replace(one, model=dataclasses.replace(one.model, layers=7)), p)["total"]
    assert max_layers(one, p, budget) == 7 and max_layers(one, p, budget - 1) == 6
    assert max_layers(four, p, budget) > 7


def test_a_gpu_profile_refuses_offload_rather_than_costing_it_as_a_device_copy():
    c = _cfg(stage=2, offload_optimizer="cpu")
    with pytest.raises(KeyError, match="does not predict offload"):
        simulate(c, _gpu_profile([c]))


def test_profile_rows_keep_the_memory_entries():
    c = _cfg(stage=0)
    p = _gpu_profile([c])
    rows = [dict(r, status="ok", device=p.device, cores=p.cores) for r in p.rows()]
    back = Profile.from_rows(rows)
    assert back.memory == p.memory and back.asynchronous


def test_a_gpu_profile_puts_each_rank_on_a_gpu_of_its_own():
    """On GPUs rank r profiles on card r and the collectives are timed over NCCL up to 1 GiB: a world needs as
    many cards as ranks, and a host with fewer says so in one line (on CPU processes, up to 64 MiB)."""
    from zerobench.sim.measure_comm import GPU_SIZES, SIZES

    (one,) = jobs_for([_cfg(stage=3)], 16, device="cuda", gpus=1)
    assert one.ranks == 1 and one.groups == () and one.sizes == GPU_SIZES and GPU_SIZES[-1] == 1 << 30
    with pytest.raises(ConfigError, match=r"world of 2 \(dp 2 x tp 1\) and this host has 1 GPU\(s\)") as e:
        jobs_for([_cfg(stage=3), _cfg(stage=3, dp=2)], 16, device="cuda", gpus=1)
    assert "\n" not in str(e.value)
    jobs = jobs_for([_cfg(stage=3), _cfg(stage=2, dp=2, tp=2)], 16, device="cuda", gpus=8)
    assert [(j.ranks, j.groups, j.threads) for j in jobs] == [(1, (), 16), (4, (2,), 4)]
    assert all(j.device == "cuda" and j.sizes == GPU_SIZES for j in jobs)
    (cpu,) = jobs_for([_cfg(stage=2, dp=2)], 2)
    assert cpu.device == "cpu" and cpu.sizes == SIZES and SIZES[-1] == 64 << 20


def test_a_gpu_node_profile_replays_dp_collectives_beside_the_cards_compute():
    """A profile of a node's GPUs (NCCL curves, no skew line) predicts DP runs: each bucket's reduce-scatter on
    the DP stream once its gradients land, hidden behind the backward that follows it, exposed after the last."""
    from zerobench.sim.profile import Curve, curve_key

    c = _cfg(stage=2, dp=2, bucket_size=20_000)
    p = _gpu_profile([c], device_s=1e-3, launch_s=1e-5)
    for op in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"):
        p.curves[curve_key(op, 2, 2)] = Curve(((1024.0, 2e-5), (1 << 30, 0.1)))
    out = simulate(c, p)
    n = len(engine_buckets(c))
    dp = [t for t in out["timeline"].tasks if t.stream == "dp"]
    assert n > 2 and [t.name.split(" ")[0] for t in dp] == ["reduce"] * n + ["unused"] + ["publish"] * n
    backward_end = max(t.end for t in out["timeline"].tasks if t.category == "compute")
    assert dp[0].end < backward_end  # the first buckets' reduce-scatters run beside the backward
    assert "sync" not in out["breakdown_s"] and out["breakdown_s"]["dp_comm"] > 0
    alone = simulate(dataclasses.replace(c, dp=1), _gpu_profile([dataclasses.replace(c, dp=1)], 1e-3, 1e-5))
    assert alone["step_time_s"] < out["step_time_s"] < alone["step_time_s"] + sum(t.seconds for t in dp)


def test_search_from_a_guess_brackets_then_bisects():
    from zerobench.bench.search import largest_fitting

    for limit in (1, 2, 5, 17):
        for answer in range(limit + 1):
            for start in range(1, limit + 2):
                seen: list[int] = []
                got = largest_fitting(lambda n, a=answer, s=seen: s.append(n) or n <= a, limit, start)
                assert got == answer and len(seen) == len(set(seen)) and all(1 <= n <= limit for n in seen)
    seen = []
    assert largest_fitting(lambda n: seen.append(n) or n <= 15, 256, 15) == 15 and seen == [15, 16]


# -- the recorded H200 rounds ---------------------------------------------------------------------
def _round(i, ref=GPU_REF):
    from zerobench.results.rows import read_rows
    from zerobench.sim import validate as V

    prof = Profile.from_rows(read_rows(ref / f"profile-{i}"))
    return {r["run_id"]: r for r in V.validate(read_rows(ref / "sim-validation" / f"round-{i}"), prof)}


@pytest.mark.parametrize("i", [2, 3])
def test_recorded_h200_memory_is_predicted_within_one_percent(i):
    recs = _round(i)
    assert len(recs) >= 8 and all(abs(r["memory_ratio"] - 1) < 0.01 for r in recs.values())


@pytest.mark.parametrize("i", [2, 3])
def test_recorded_h200_device_bound_runs_meet_the_step_time_bar(i):
    """Every stage of the 1.3B GPT (device-bound) within 10% in every round; the 125M one is host-bound at
    micro-batch 8 on these hosts, and docs/simulator.md and the dataset's README report its misses (the host's
    speed drifted between runs)."""
    big = {k: r for k, r in _round(i).items() if "1.3b" in k}
    assert {r["stage"] for r in big.values()} == {0, 1, 2, 3}
    assert all(abs(r["ratio"] - 1) <= 0.10 for r in big.values()), {k: round(r["ratio"], 3) for k, r in big.items()}
    small = [r for k, r in _round(i).items() if "125m" in k]
    assert small and any(r["breakdown_s"].get("host", 0) > 0 for r in small)


def test_the_first_round_was_profiled_before_warm_up_and_stream_timed_copies():
    """Round 1's profile predates the card's warm-up before timing and the per-element costs timed on the stream
    (each copy then paid a synchronisation): the 1.3B runs read 1.04-1.10, the checkpointed one just over the bar,
    as the dataset's README table says."""
    big = {k: round(r["ratio"], 2) for k, r in _round(1).items() if "1.3b" in k}
    assert max(big.values()) == 1.10 and big["008-1.3b-s3-ckpt"] == 1.10 and min(big.values()) == 1.04


def test_the_planner_solves_max_size_from_a_recorded_profile(capsys):
    from zerobench.cli import main

    args = [
        "plan",
        "--max-size",
        "--profile",
        str(GPU_REF / "profile-3"),
        "--hidden",
        "2048",
        "--heads",
        "16",
        "--vocab",
        "50304",
        "--seq",
        "1024",
        "--micro-batch",
        "8",
        "--precision",
        "bf16",
        "--stage",
        "2",
        "--gpu-mem",
        "24GiB",
        "--bucket-size",
        "6250000",
    ]
    assert main([*args, "--gpus", "1"]) == 0
    assert "max size: 15 layers" in capsys.readouterr().out
    assert main([*args, "--gpus", "4"]) == 0
    assert "max size: 25 layers" in capsys.readouterr().out
    assert main([a for a in args if a != "--max-size"]) == 2
    err = capsys.readouterr().err
    assert "add --max-size" in err and "Traceback" not in err


def test_the_reports_validation_table_carries_the_memory_columns(tmp_path):
    from zerobench.report.aggregate import sim_validation_table
    from zerobench.results import load
    from zerobench.results.rows import read_rows
    from zerobench.sim import validate as V

    prof = Profile.from_rows(read_rows(GPU_REF / "profile-3"))
    recs = V.validate(read_rows(GPU_REF / "sim-validation" / "round-3"), prof)
    V.write_rows(tmp_path, recs, prof, "round-3")
    t = sim_validation_table(load(tmp_path)).set_index("run")
    assert len(t) == 10 and t.loc["004-1.3b-s0", "measured_peak_MiB"] == 37226
    assert t["memory_ratio"].between(0.99, 1.0).all() and t.loc["004-1.3b-s0", "ratio"] == pytest.approx(
        1.023, abs=1e-3
    )


# -- the recorded H100 rounds: both sizes device-bound (suites/gpu/sim_device_bound.yaml) --------------------
@pytest.mark.parametrize("i", [1, 2])
def test_recorded_h100_rounds_meet_the_step_time_bar_at_two_sizes(i):
    """Issue 22's GPU bar: every stage within 10% at two model sizes (125M at micro-batch 32, 1.3B at 8), from a
    profile of the same card taken before the runs; round 2 adds checkpointing and accumulation."""
    recs = _round(i, H100_REF)
    for size in ("125m", "1.3b"):
        assert {r["stage"] for k, r in recs.items() if size in k} == {0, 1, 2, 3}, size
    assert all(abs(r["ratio"] - 1) <= 0.10 for r in recs.values()), {k: round(r["ratio"], 3) for k, r in recs.items()}
    assert all(r["breakdown_s"].get("host", 0) < 0.02 * r["predicted_s"] for r in recs.values())  # device-bound
    assert all(abs(r["memory_ratio"] - 1) < 0.01 for r in recs.values())
    assert len(recs) == {1: 8, 2: 10}[i]


@pytest.mark.parametrize("i", [1, 2])
def test_the_recorded_h100_validation_tables_are_what_the_rows_give(i):
    import json

    from zerobench.sim import validate as V

    stated = json.loads((H100_REF / "sim-validation" / f"validation-round-{i}.json").read_text())
    s = V.summarize(list(_round(i, H100_REF).values()))
    assert s["median_abs_error"] == pytest.approx(stated["summary"]["median_abs_error"], abs=1e-9)
    assert s["worst_abs_error"] == pytest.approx(stated["summary"]["worst_abs_error"], abs=1e-9)


def test_maxsize_on_the_h100_agrees_with_the_planner_from_its_profile():
    """Item 4: `zerobench maxsize --dp 1` on the card (24 GiB emulated) and `plan --max-size --profile` from the
    same card's profile give the same largest model; the last size that fit peaked where the planner said."""
    from zerobench.results.rows import read_rows

    rows = {r["metric"]: r for r in read_rows(H100_REF / "maxsize")}
    probe = {r["metric"]: r["value"] for r in read_rows(H100_REF / "maxsize" / "probes" / "probe-15")}
    layers = rows["max_layers"]["value"]
    cfg = to_train_config(
        RunSpec(
            preset="small",
            hidden=2048,
            heads=16,
            vocab=50304,
            seq=1024,
            micro_batch=8,
            precision="bf16",
            stage=2,
            bucket_size=6_250_000,
            layers=layers,
        )
    )
    prof = Profile.from_rows(read_rows(H100_REF / "profile-1"))
    assert max_layers(cfg, prof, 24 * 2**30) == layers == 15
    assert rows["max_params"]["value"] == probe["num_params"] == 860_497_920
    assert predict_memory(cfg, prof)["total"] / probe["peak_memory_bytes"] == pytest.approx(1, abs=0.01)
    assert not list((H100_REF / "maxsize" / "probes" / "probe-16").glob("rows.jsonl"))  # 16 layers: out of memory
    assert "out of memory" in (H100_REF / "maxsize" / "probes" / "probe-16" / "run.log").read_text()


def test_two_validations_in_one_results_directory_stay_apart():
    """Each ``simulate --validate --out`` is one config hash; the H100 directory holds two (before, their rows were
    matched by run id alone and the report's figure failed on the duplicates)."""
    from zerobench.report.aggregate import sim_validation_table
    from zerobench.results import load

    t = sim_validation_table(load(H100_REF / "sim-validation"))
    assert len(t) == 18 and t["predicted_ms"].notna().all() and t["memory_ratio"].between(0.99, 1.0).all()
    assert sorted(t["run"]).count("007-1.3b-s3") == 2


def test_a_profile_plan_whose_limit_fits_says_at_least(capsys, monkeypatch):
    """`plan --max-size --profile` printed the search's limit (4096 layers) as the answer when the limit itself fit."""
    from zerobench.cli import main
    from zerobench.sim import command

    monkeypatch.setattr(command, "PROFILE_MAX_LAYERS", 12)  # 4096 layers' layouts take minutes to build

    shape = ["--hidden", "2048", "--heads", "16", "--vocab", "50304", "--seq", "1024", "--micro-batch", "8"]
    shape += ["--precision", "bf16", "--stage", "2", "--gpus", "1", "--bucket-size", "6250000"]
    args = ["plan", "--max-size", "--profile", str(H100_REF / "profile-1"), *shape]
    assert main([*args, "--gpu-mem", "100TiB"]) == 0
    assert "max size: at least 12 layers" in capsys.readouterr().out
    assert main([*args, "--gpu-mem", "12GiB"]) == 0
    got = capsys.readouterr().out
    assert "max size: " in got and "at least" not in got
