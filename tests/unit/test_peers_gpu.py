"""Issue 24 on a lent H200 (``results/reference/gpu-h200-2026-11-27``): the engines side by side at a world of 1,
recomputed from the recorded rows. The figures of docs/peers.md and of the dataset's README are these numbers;
the summary rows committed beside the runs are what ``zerobench peers`` (or, for the small comparison the call's
time limit cut before its last run, the same ``summarize``) wrote from them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from zerobench.bench.peers import PeersConfig, bar, summarize
from zerobench.results.rows import read_rows

REF = Path(__file__).resolve().parents[2] / "results" / "reference" / "gpu-h200-2026-11-27"
SMALL = (
    "zerobench-0",
    "zerobench-1",
    "zerobench-2",
    "zerobench-3",
    "torch-ddp",
    "torch-zero1",
    "fsdp1-shard-grad-op",
    "fsdp2-no-reshard",
    "fsdp1-full-shard",
    "fsdp2",
)
TINY = ("zerobench-0", "zerobench-3", "torch-ddp", "fsdp1-full-shard", "fsdp2")


def _recompute(runs: Path, name: str, p: PeersConfig) -> dict[str, dict]:
    """The recorded runs of ``name`` copied to ``runs`` without their summary, and summarised again there."""
    shutil.copytree(REF / name, runs, ignore=shutil.ignore_patterns("summary"))
    return {r["candidate"]: r for r in summarize(p, runs, p.systems, {})}


@pytest.fixture(scope="module")
def small_runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("small") / "peers-small-dp1"


@pytest.fixture(scope="module")
def small(small_runs):
    p = PeersConfig(systems=SMALL, dp=1, preset="small", micro_batch=8, steps=10, warmup=3, rounds=2)
    return _recompute(small_runs, "peers-small-dp1", p)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    p = PeersConfig(systems=TINY, dp=1, preset="tiny", micro_batch=8, steps=30, warmup=10, rounds=2, memory_run=False)
    return _recompute(tmp_path_factory.mktemp("tiny") / "peers-tiny-dp1", "peers-tiny-dp1", p)


def _rounded(x):
    return None if x is None else round(x, 3)


def _verdicts(recs: dict[str, dict]) -> dict[str, dict]:
    return {v["candidate"]: v for v in bar(list(recs.values()))}


def test_the_committed_summaries_are_the_rows_recomputed(small, tiny):
    for name, recs in (("peers-small-dp1", small), ("peers-tiny-dp1", tiny)):
        got = {
            (r["candidate"], r["metric"]): r["value"]
            for r in read_rows(REF / name / "summary")
            if r["metric"] == "peer_time_vs_torch_ddp"
        }
        assert got == {(c, "peer_time_vs_torch_ddp"): r["time_vs_torch_ddp"] for c, r in recs.items()}


def test_a_summary_made_elsewhere_names_the_card_the_runs_ran_on(small, small_runs):
    """The small comparison's summary was computed on a CPU VM from the H200's rows, and is again here."""
    for summary in (REF / "peers-small-dp1" / "summary", REF / "peers-tiny-dp1" / "summary", small_runs / "summary"):
        assert {r["provenance"]["hardware"]["device"] for r in read_rows(summary)} == {"NVIDIA H200"}


def test_small_device_bound_every_engine_within_three_percent_of_ddp(small):
    """98M parameters, fp32, micro-batch 8 x 512: a 68 ms step of matrix work, where no engine's own cost shows."""
    assert {c: round(r["time_vs_torch_ddp"], 3) for c, r in small.items()} == {
        "zerobench-0": 1.018,
        "zerobench-1": 1.011,
        "zerobench-2": 1.003,
        "zerobench-3": 1.017,
        "torch-ddp": 1.0,
        "torch-zero1": 1.001,
        "fsdp1-shard-grad-op": 1.025,
        "fsdp2-no-reshard": 1.016,
        "fsdp1-full-shard": 1.011,
        "fsdp2": 1.025,
    }
    v = _verdicts(small)
    assert {s: (v[s]["fastest_peer"], round(v[s]["time_vs_fastest"], 3)) for s in v} == {
        "zerobench-0": ("torch-ddp", 1.018),
        "zerobench-1": ("torch-zero1", 1.01),
        "zerobench-2": ("fsdp2-no-reshard", 0.987),
        "zerobench-3": ("fsdp2", 0.992),  # FSDP1 ran unsharded in a world of one: stage 0's peer, not stage 3's
    }
    assert small["zerobench-3"]["time_vs_torch_ddp"] <= 1.2  # the stage-3 bar at the small preset


def test_small_peak_memory_next_to_the_leanest_peer(small):
    """FSDP1 in a world of one runs NO_SHARD, so it is judged as stage 0's peer: there it is leaner than DDP and than
    zerobench's stage 0. Stage 3 has no peer measured for memory (FSDP2's memory run was cut)."""
    v = _verdicts(small)
    assert {s: (v[s]["leanest_peer"], _rounded(v[s]["memory_vs_leanest"])) for s in v} == {
        "zerobench-0": ("fsdp1-shard-grad-op", 1.081),
        "zerobench-1": ("torch-zero1", 0.997),
        "zerobench-2": ("fsdp2-no-reshard", 0.915),
        "zerobench-3": (None, None),
    }
    assert round(small["zerobench-0"]["peak_live_bytes"] / small["torch-ddp"]["peak_live_bytes"], 3) == 0.996
    # FSDP1 switches both sharding strategies to NO_SHARD at a world of 1 (its warning in the runs' logs): the same
    # peak, with no gathered copy of a unit, where stage 3 still gathers its units into buffers of their own
    assert small["fsdp1-full-shard"]["peak_live_bytes"] == small["fsdp1-shard-grad-op"]["peak_live_bytes"]
    over = small["zerobench-3"]["peak_live_bytes"] - small["fsdp1-full-shard"]["peak_live_bytes"]
    assert round(over / 2**20, 1) == 51.7
    assert "fsdp2" not in {c for c, r in small.items() if "peak_live_bytes" in r}  # its memory run was cut


def test_tiny_launch_bound_stage3_ahead_of_fsdp_and_within_the_bar_of_ddp(tiny):
    """The tiny GPT on a GPU: a 4-5 ms step of kernel launches and Python, where each engine's own work shows."""
    assert {c: round(r["time_vs_torch_ddp"], 3) for c, r in tiny.items()} == {
        "zerobench-0": 1.062,
        "zerobench-3": 1.14,
        "torch-ddp": 1.0,
        "fsdp1-full-shard": 1.875,
        "fsdp2": 2.116,
    }
    v = _verdicts(tiny)
    assert round(v["zerobench-0"]["time_vs_fastest"], 3) == 1.062 and not v["zerobench-0"]["speed_ok"]
    assert v["zerobench-3"]["fastest_peer"] == "fsdp2" and round(v["zerobench-3"]["time_vs_fastest"], 3) == 0.543
    assert round(tiny["zerobench-3"]["time_vs_torch_ddp"] / tiny["fsdp1-full-shard"]["time_vs_torch_ddp"], 2) == 0.61
    assert all(r["loss_max_abs_diff"] < 1e-6 for r in tiny.values())  # the same training as one process
