"""Peer comparison plumbing without processes: candidate validation, the bar per stage, configs."""

import importlib.util

import pytest

from zerobench.bench.peers import PeersConfig, bar, traced, train_config
from zerobench.config import ConfigError
from zerobench.peers.registry import SHARDING


def test_unknown_system_and_missing_baseline_are_one_line_errors():
    with pytest.raises(ConfigError, match="unknown system 'fsdp9'"):
        PeersConfig(systems=("torch-ddp", "fsdp9")).validate()
    PeersConfig(systems=("zerobench-3", "fsdp2")).validate()  # without torch-ddp: times, no ratio to it
    with pytest.raises(ConfigError, match="--steps > --warmup"):
        PeersConfig(systems=("torch-ddp",), steps=2, warmup=2).validate()


def test_profile_traces_the_round_runs_only_and_leaves_timed_steps():
    p = PeersConfig(systems=("torch-ddp", "zerobench-3"), steps=7, warmup=3, profile="traces")
    p.validate()
    cfg = traced(p, train_config(p, "zerobench-3"))
    assert cfg.profile is not None and (cfg.profile.dir, cfg.profile.steps, cfg.timed_steps) == ("traces", 2, 2)
    assert traced(PeersConfig(), train_config(p, "zerobench-3")).profile is None
    with pytest.raises(ConfigError, match=r"--profile traces the last 2 steps.*give --steps 6 or more with --warmup 3"):
        PeersConfig(systems=("torch-ddp",), steps=5, warmup=3, profile="traces").validate()


def test_peer_configs_match_zerobench_except_the_system():
    p = PeersConfig(systems=("torch-ddp", "zerobench-3"), preset="tiny", seq=32, micro_batch=3)
    zb, ddp = train_config(p, "zerobench-3"), train_config(p, "torch-ddp")
    assert (zb.system, zb.zero.stage, ddp.system) == ("zerobench", 3, "torch-ddp")
    assert zb.model == ddp.model and zb.model.seq == 32
    assert (zb.micro_batch, zb.seed, zb.zero.optimizer) == (ddp.micro_batch, ddp.seed, ddp.zero.optimizer)
    ref = train_config(p, "torch-ddp", dp=1, micro_batch=p.micro_batch * p.dp)
    assert ref.global_batch == ddp.global_batch


def test_the_no_overlap_candidates_are_zerobench_with_overlap_comm_off_and_judged_like_their_stage():
    p = PeersConfig(systems=("torch-ddp", "zerobench-3", "zerobench-3-no-overlap"))
    p.validate()
    on, off = train_config(p, "zerobench-3"), train_config(p, "zerobench-3-no-overlap")
    assert (on.system, off.system, on.zero.stage, off.zero.stage) == ("zerobench", "zerobench", 3, 3)
    assert on.zero.overlap_comm and not off.zero.overlap_comm
    assert "zerobench-3-no-overlap" not in PeersConfig().candidates()  # named in --systems only
    v = {
        x["candidate"]: x
        for x in bar(
            [_rec("zerobench-3", 0.9, 110), _rec("zerobench-3-no-overlap", 1.0, 95), _rec("fsdp1-full-shard", 1.2, 100)]
        )
    }
    assert v["zerobench-3-no-overlap"]["leanest_peer"] == "fsdp1-full-shard", "zerobench is never its own peer"
    assert v["zerobench-3-no-overlap"]["memory_ok"] and not v["zerobench-3"]["memory_ok"]


def test_peers_reject_what_they_are_not_wired_for():
    from zerobench.peers.deepspeed_peer import ds_config
    from zerobench.systems import validate_run
    from zerobench.train.config import TrainConfig
    from zerobench.zero.config import ZeroConfig

    with pytest.raises(ConfigError, match="drop --tp"):
        validate_run(TrainConfig(system="fsdp2", tp=2, dp=1))
    no_overlap = ZeroConfig(overlap_comm=False)
    for system in ("torch-ddp", "fsdp1-full-shard", "megatron"):
        with pytest.raises(ConfigError, match="drop --no-overlap-comm"):
            validate_run(TrainConfig(system=system, dp=1, zero=no_overlap))
    cfg = TrainConfig(system="deepspeed-3", dp=1, zero=no_overlap)
    validate_run(cfg)
    assert ds_config("deepspeed-3", cfg)["zero_optimization"]["overlap_comm"] is False


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_runs_the_overlap_its_rows_say(stage):
    """DeepSpeed's own default overlap_comm is off at stages 1-2, and the peer left it to that default while its rows
    said overlap_comm on: deepspeed-2 ran leaner and without overlap beside an overlapping zerobench-2. The config now
    says it at every stage, and DeepSpeed's own parser reads what the rows say."""
    from zerobench.peers.deepspeed_peer import ds_config
    from zerobench.peers.registry import deepspeed_available
    from zerobench.train.config import TrainConfig

    cfg = TrainConfig(system=f"deepspeed-{stage}", dp=1)
    zero = ds_config(f"deepspeed-{stage}", cfg)["zero_optimization"]
    assert zero["overlap_comm"] is cfg.zero.overlap_comm is True
    if deepspeed_available():
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

        assert DeepSpeedZeroConfig(**zero).overlap_comm is True


def test_every_peer_takes_bf16_and_only_deepspeed_peers_take_checkpointing():
    """The one-card offload comparison runs DeepSpeed in bf16 with activation checkpointing, as zerobench's
    GPU offload rows do; the single-card table runs every peer in bf16 with its own mixed precision. fp16 (loss
    scaling) is no peer's, checkpointing is DeepSpeed's alone among them, and P_a/M_D are zerobench's alone."""
    from zerobench.parallel.config import ActivationConfig
    from zerobench.peers.deepspeed_peer import ds_config
    from zerobench.systems import validate_run
    from zerobench.train.config import TrainConfig
    from zerobench.zero.config import Precision, ZeroConfig

    bf16, ckpt = ZeroConfig(precision=Precision.BF16), ActivationConfig(checkpoint=True)
    for system in ("torch-ddp", "torch-zero1", "fsdp1-full-shard", "fsdp2", "fsdp2-compiled", "megatron-core"):
        with pytest.raises(ConfigError, match="runs fp32 or bf16"):
            validate_run(TrainConfig(system=system, dp=1, zero=ZeroConfig(precision=Precision.FP16)))
        if system != "megatron-core" or importlib.util.find_spec("megatron") is not None:
            validate_run(TrainConfig(system=system, dp=1, zero=bf16))
    with pytest.raises(ConfigError, match="DeepSpeed peers only"):
        validate_run(TrainConfig(system="torch-ddp", dp=1, activation=ckpt))
    with pytest.raises(ConfigError, match="P_a, P_a\\+cpu and M_D are zerobench's"):
        validate_run(
            TrainConfig(system="deepspeed-2", dp=1, activation=ActivationConfig(checkpoint=True, contiguous=True))
        )
    with pytest.raises(ConfigError, match="runs fp32"):
        validate_run(TrainConfig(system="deepspeed-2", dp=1, zero=ZeroConfig(precision=Precision.FP16)))
    cfg = TrainConfig(system="deepspeed-2-offload", dp=1, zero=bf16, activation=ckpt)
    validate_run(cfg)
    ds = ds_config("deepspeed-2-offload", cfg)
    assert ds["bf16"] == {"enabled": True} and ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert ds_config("deepspeed-2", TrainConfig(system="deepspeed-2", dp=1))["bf16"] == {"enabled": False}


def _rec(c, t, mem):
    stage = int(c.split("-")[1]) if c.startswith("zerobench") else SHARDING[c]
    return {"candidate": c, "sharding_stage": stage, "status": "ok", "time_vs_torch_ddp": t, "peak_live_bytes": mem}


def test_bar_compares_each_stage_with_the_fastest_and_leanest_peer_of_the_same_sharding():
    recs = [
        _rec("zerobench-2", 0.9, 100),
        _rec("fsdp2-no-reshard", 1.2, 90),
        _rec("deepspeed-2", 1.0, 120),
        _rec("zerobench-0", 1.0, 200),
        _rec("torch-ddp", 1.0, 200),
        _rec("fsdp2", 0.5, 10),
    ]
    v = {x["stage"]: x for x in bar(recs)}
    assert v[2]["fastest_peer"] == "deepspeed-2" and v[2]["time_vs_fastest"] == pytest.approx(0.9)
    assert v[2]["speed_ok"] and v[2]["leanest_peer"] == "fsdp2-no-reshard" and not v[2]["memory_ok"]
    assert not v[0]["speed_ok"] and v[0]["memory_ok"]  # 1.0 > 0.95
    assert 3 not in v  # no zerobench-3 candidate: no verdict


def test_bar_takes_the_median_of_same_round_ratios_not_a_ratio_of_ratios():
    """Measured at tiny DP 2: through torch-ddp's noisy rounds zerobench-3 read 2.128 / 2.002 = 1.06x fsdp2,
    but in each round side by side it took 1.17x, 0.76x and 0.61x fsdp2's time: the verdict is 0.76x. The
    fastest peer is the one the ratio is highest against, round by round."""
    zb3 = {**_rec("zerobench-3", 2.128, 10), "round_step_time_s": [29.8, 18.6, 18.3]}
    fsdp2 = {**_rec("fsdp2", 2.002, 10), "round_step_time_s": [25.5, 24.4, 30.0]}
    full = {**_rec("fsdp1-full-shard", 2.792, 10), "round_step_time_s": [40.0, 34.0, None]}
    (v,) = bar([zb3, fsdp2, full])
    assert v["time_vs_fastest"] == pytest.approx(18.6 / 24.4) and v["fastest_peer"] == "fsdp2" and v["speed_ok"]
    # a round a peer has no time for is left out of that pair's median, not of the others'
    assert bar([zb3, full])[0]["time_vs_fastest"] == pytest.approx((29.8 / 40.0 + 18.6 / 34.0) / 2)


def test_a_used_output_directory_is_refused(tmp_path):
    from zerobench.bench.peers import PeersConfig, run_peers
    from zerobench.config import ConfigError

    (tmp_path / "reference").mkdir()
    with pytest.raises(ConfigError, match="already holds rows"):
        run_peers(PeersConfig(systems=("torch-ddp",)), tmp_path, say=lambda m: None)


def test_only_the_memory_runs_set_the_malloc_threshold(tmp_path, monkeypatch):
    """Timing rounds run under the allocator users get; ``MALLOC_MMAP_THRESHOLD_`` (freed memory back to
    the OS, so VmHWM follows live memory) would make every large allocation a fresh mmap that page-faults,
    taxing systems that allocate per step, so only the memory run sets it."""
    from zerobench.bench import peers
    from zerobench.launch.base import LaunchResult

    envs = {}

    def fake_launch(cfg, out, run_id, timeout_s, extra_env=None, log_path=None, cancel=None):
        envs[run_id] = extra_env or {}
        return LaunchResult(ok=True, reason="", status="ok", returncodes=[0], elapsed_s=0.0)

    monkeypatch.setattr(peers, "launch_local", fake_launch)
    p = PeersConfig(systems=("torch-ddp", "zerobench-3"), rounds=2)
    peers.run_peers(p, tmp_path, say=lambda m: None)
    assert {k for k, v in envs.items() if "MALLOC_MMAP_THRESHOLD_" in v} == {"mem-torch-ddp", "mem-zerobench-3"}
    assert {"r0-torch-ddp", "r1-zerobench-3", "reference"} <= set(envs)


def test_a_signal_stops_the_whole_comparison_not_only_the_run_in_progress(tmp_path, monkeypatch):
    """SIGTERM/SIGINT during one run used to cancel that run and go on with the next: the comparison now
    stops there (the CLI exits 143), keeping the rows written so far."""
    from zerobench.bench import peers
    from zerobench.launch.base import LaunchResult
    from zerobench.launch.cancel import Cancelled

    started = []

    def fake_launch(cfg, out, run_id, timeout_s, extra_env=None, log_path=None, cancel=None):
        started.append(run_id)
        cancel.requested = "SIGTERM"  # as the handler would, while the run's ranks are up
        return LaunchResult(
            ok=False, reason="cancelled (SIGTERM)", status="cancelled", returncodes=[143], elapsed_s=0.0
        )

    monkeypatch.setattr(peers, "launch_local", fake_launch)
    with pytest.raises(Cancelled, match="during r0-torch-ddp"):
        peers.run_peers(PeersConfig(systems=("torch-ddp", "zerobench-3"), rounds=2), tmp_path, say=lambda m: None)
    assert started == ["r0-torch-ddp"]


def test_bar_says_when_the_rounds_spread_too_much_to_place_the_ratio_against_it():
    """Two standard errors of the median per-round ratio (against the fastest peer): tiny DP 4's recorded rounds
    (0.946-1.136 against DDP) cannot place 0.988 against 0.95; tight rounds can; one round decides nothing."""
    import math

    from zerobench.bench.stats import median_standard_error

    ddp = [24.1, 18.8, 19.9, 20.4, 19.9, 19.1, 19.4, 17.7, 19.4]
    ratios = [0.946, 1.102, 0.983, 0.978, 1.072, 0.988, 0.948, 1.136, 0.994]
    zb0 = {**_rec("zerobench-0", 1.0, 10), "round_step_time_s": [d * r for d, r in zip(ddp, ratios)]}
    (v,) = bar([zb0, {**_rec("torch-ddp", 1.0, 10), "round_step_time_s": ddp}])
    assert v["time_vs_fastest"] == pytest.approx(0.988) and not v["speed_ok"]
    assert v["time_noise"] == pytest.approx(2 * median_standard_error(ratios)) and v["time_noise"] > 0.988 - 0.95
    assert not v["speed_decided"]
    tight = {**zb0, "round_step_time_s": [d * 0.90 * (1 + 0.002 * k) for k, d in enumerate(ddp)]}
    (v,) = bar([tight, {**_rec("torch-ddp", 1.0, 10), "round_step_time_s": ddp}])
    assert v["speed_ok"] and v["speed_decided"] and v["time_noise"] < 0.01
    one = {**zb0, "round_step_time_s": ddp[:1]}
    (v,) = bar([one, {**_rec("torch-ddp", 1.0, 10), "round_step_time_s": ddp[:1]}])
    assert math.isinf(v["time_noise"]) and not v["speed_decided"]


def test_a_system_named_twice_is_refused():
    """Both runs of a doubled candidate wrote into one directory and the summary listed it twice."""
    with pytest.raises(ConfigError, match="names torch-ddp twice"):
        PeersConfig(systems=("torch-ddp", "torch-ddp")).validate()


def test_nothing_measured_is_no_memory_verdict():
    """With --no-memory-run every stage's memory verdict read 'NO' though nothing was measured."""
    recs = [_rec("zerobench-2", 0.9, None), _rec("fsdp2-no-reshard", 1.2, None), _rec("torch-ddp", 1.0, None)]
    (v,) = [x for x in bar(recs) if x["candidate"] == "zerobench-2"]
    assert v["memory_vs_leanest"] is None and v["memory_ok"] is None


def test_peak_rss_comes_from_memory_runs_alone_when_the_comparison_has_them(tmp_path):
    """A candidate whose memory run was missing took its RSS from round 0, which runs under the default allocator
    settings: torch-ddp's 1044 MiB beside zerobench's 777 from its memory run (874 in its round), a stopped
    comparison's bias in zerobench's favour."""
    from zerobench.bench.peers import summarize
    from zerobench.results.rows import RowWriter

    MiB = 2**20
    for run_id, rss in (("r0-torch-ddp", 1044), ("r0-zerobench-2", 874), ("mem-zerobench-2", 777)):
        w = RowWriter(tmp_path / run_id, run_id, {"system": run_id})
        w.write("step_time_s", 1.0, "s")
        w.write("peak_rss_bytes", rss * MiB, "bytes")
    p = PeersConfig(systems=("torch-ddp", "zerobench-2"), rounds=1, memory_run=True, reference_run=False)
    got = {r["candidate"]: r for r in summarize(p, tmp_path, p.systems, {})}
    assert got["zerobench-2"]["peak_rss_bytes"] == 777 * MiB and "peak_rss_bytes" not in got["torch-ddp"]


def test_each_round_starts_one_candidate_later(tmp_path, monkeypatch):
    """Every round ran the candidates in the same order, so whatever a round's first run meets (a cold page cache,
    the previous round's last processes still exiting) always fell on the same candidate. Over as many rounds as
    candidates, each candidate now holds each place once."""
    from zerobench.bench import peers
    from zerobench.launch.base import LaunchResult

    started = []

    def fake_launch(cfg, out, run_id, timeout_s, extra_env=None, log_path=None, cancel=None):
        started.append(run_id)
        return LaunchResult(ok=True, reason="", status="ok", returncodes=[0], elapsed_s=0.0)

    monkeypatch.setattr(peers, "launch_local", fake_launch)
    cands = ("torch-ddp", "zerobench-1", "zerobench-3")
    p = PeersConfig(systems=cands, rounds=3, memory_run=False, reference_run=False)
    peers.run_peers(p, tmp_path, say=lambda m: None)
    rounds = [[rid.split("-", 1)[1] for rid in started if rid.startswith(f"r{r}-")] for r in range(3)]
    assert all(sorted(r) == sorted(cands) for r in rounds), rounds
    for place in range(3):
        assert sorted(r[place] for r in rounds) == sorted(cands), rounds


def test_deepspeed_peers_that_cannot_run_are_recorded_as_not_run(tmp_path, monkeypatch):
    """Without DeepSpeed the default set left its peers out without a word: the summary had no DeepSpeed rows and
    the offloaded zerobench stages no verdict, and nothing said why. They are now records of their own, failed
    with the reason, in the run's summary and in one summarised after a stop."""
    from zerobench.bench import peers, peers_stopped
    from zerobench.launch.base import LaunchResult
    from zerobench.peers.registry import DEEPSPEED_PEERS

    started, said = [], []

    def fake_launch(cfg, out, run_id, timeout_s, extra_env=None, log_path=None, cancel=None):
        started.append(run_id)
        return LaunchResult(ok=True, reason="", status="ok", returncodes=[0], elapsed_s=0.0)

    monkeypatch.setattr(peers, "launch_local", fake_launch)
    monkeypatch.setattr(peers, "deepspeed_available", lambda: False)
    p = PeersConfig(rounds=1, memory_run=False, reference_run=False)
    records = peers.run_peers(p, tmp_path / "run", say=said.append)
    absent = {r["candidate"]: r for r in records if r["candidate"] in DEEPSPEED_PEERS}
    assert set(absent) == set(DEEPSPEED_PEERS) and not any(c in rid for rid in started for c in DEEPSPEED_PEERS)
    assert all(r["status"] == "failed" and "DeepSpeed is not installed" in r["reason"] for r in absent.values())
    assert sum("DeepSpeed is not installed" in m for m in said) == len(DEEPSPEED_PEERS)
    (tmp_path / "run" / "summary").rename(tmp_path / "first-summary")
    again = {r["candidate"]: r for r in peers_stopped.summarize_stopped(tmp_path / "run")}
    assert all("DeepSpeed is not installed" in again[c]["reason"] for c in DEEPSPEED_PEERS)


def test_fsdp1_in_a_world_of_one_is_judged_as_the_data_parallel_peer_it_runs_as():
    """torch switches FSDP1's FULL_SHARD and SHARD_GRAD_OP to NO_SHARD at world size 1 (a warning in the log), and its
    records were still held against zerobench's stages 3 and 2 as a sharding peer. At DP 1 they shard like stage 0."""
    from zerobench.bench.peers import bar, sharding_stage

    one = [sharding_stage(c, 1) for c in ("fsdp1-full-shard", "fsdp1-shard-grad-op", "fsdp2", "zerobench-3")]
    assert one == [0, 0, 3, 3]
    assert [sharding_stage(c, 2) for c in ("fsdp1-full-shard", "fsdp1-shard-grad-op")] == [3, 2]
    recs = [
        _rec("zerobench-3", 1.2, 100),
        _rec("zerobench-0", 1.0, 200),
        _rec("fsdp2", 1.5, 150),
        {**_rec("fsdp1-full-shard", 1.0, 200), "sharding_stage": sharding_stage("fsdp1-full-shard", 1)},
    ]
    v = {x["stage"]: x for x in bar(recs)}
    assert v[3]["fastest_peer"] == "fsdp2" and v[0]["fastest_peer"] == "fsdp1-full-shard"


def test_the_compiled_candidates_are_zerobench_with_each_block_compiled_and_judged_like_their_stage():
    """``zerobench-N-compiled`` is the counterpart of ``fsdp2-compiled``: the same engine at stage N with the blocks
    through ``torch.compile`` (``--kernels compiled``), the optimizer's kernels left as zerobench's own."""
    from zerobench.bench.peers import PeersConfig, sharding_stage, train_config

    p = PeersConfig(
        systems=("zerobench-3-compiled", "zerobench-3", "fsdp2-compiled", "torch-ddp"), dp=1, memory_run=False
    )
    p.validate()
    assert "zerobench-3-compiled" not in PeersConfig().candidates()  # minutes of compiling on a CPU: asked for only
    for s in range(4):
        cfg = train_config(p, f"zerobench-{s}-compiled")
        assert (cfg.system, cfg.zero.stage, cfg.kernels, cfg.zero.kernels) == ("zerobench", s, "compiled", "auto")
        assert sharding_stage(f"zerobench-{s}-compiled", 1) == s
    assert train_config(p, "zerobench-3").kernels == "reference"


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"tp": 2, "dp": 1}, "TP's collectives run inside them: use --tp 1"),
        ({"activation": {"checkpoint": True}}, "does not take activation checkpointing"),
    ],
)
def test_compiled_kernels_refuse_what_runs_inside_a_block_in_one_line(kw, msg):
    from zerobench.parallel.config import ActivationConfig
    from zerobench.train.config import TrainConfig

    if "activation" in kw:
        kw = {**kw, "activation": ActivationConfig(**kw["activation"])}
    with pytest.raises(ConfigError, match=msg) as e:
        TrainConfig(kernels="compiled", **kw).validate()
    assert "\n" not in str(e.value)
    TrainConfig(kernels="compiled").validate()


def test_compiled_candidates_with_a_memory_run_on_a_cpu_are_refused_before_any_run(monkeypatch):
    """On a CPU the memory run trains under the live-tensor tracker, a dispatch mode compiled code refuses: the
    candidate failed after its timed rounds, its times thrown away with it. On a GPU the memory run reads the CUDA
    allocator and runs."""
    import torch

    from zerobench.bench.peers import PeersConfig

    p = PeersConfig(systems=("zerobench-3-compiled", "fsdp2-compiled", "torch-ddp"), dp=1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"zerobench-3-compiled, fsdp2-compiled on a CPU: .*pass --no-memory-run"):
        p.validate()
    PeersConfig(systems=p.systems, dp=1, memory_run=False).validate()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    p.validate()


def test_compiled_kernels_are_zerobench_s_and_refused_for_systems_that_build_their_own_model():
    from zerobench.systems import validate_run
    from zerobench.train.config import TrainConfig

    for system in ("torch-ddp", "fsdp2", "deepspeed-3", "megatron"):
        with pytest.raises(ConfigError, match=f"compiles zerobench's blocks; {system} builds its own model"):
            validate_run(TrainConfig(system=system, dp=1, kernels="compiled"))
    validate_run(TrainConfig(system="zerobench", dp=1, kernels="compiled"))


def test_a_profile_directory_holding_a_runs_traces_is_refused_before_any_run(tmp_path):
    from zerobench.bench.peers import run_peers

    held = tmp_path / "traces" / "r0-zerobench-3"
    held.mkdir(parents=True)
    (held / "rank0.trace.json").write_text("{}")
    p = PeersConfig(systems=("zerobench-3",), dp=1, steps=6, warmup=3, profile=str(tmp_path / "traces"))
    with pytest.raises(ConfigError, match="already holds the traces of a run 'r0-zerobench-3'"):
        run_peers(p, tmp_path / "out", say=lambda m: None)
    assert not (tmp_path / "out" / "comparison.json").exists()  # refused before the comparison began
    assert (held / "rank0.trace.json").read_text() == "{}"
