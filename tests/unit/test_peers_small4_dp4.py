"""Issue 24's grid cell 4-layer small at DP 4 (``results/reference/peers-engine-cpu-2core/small4-dp4*``): the
README's bar figures recomputed from the committed summary rows with ``zerobench peers``' own ``bar``."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerobench.bench.peers import bar
from zerobench.results.rows import read_rows

REF = Path(__file__).resolve().parents[2] / "results" / "reference" / "peers-engine-cpu-2core"
MiB = 2**20


def _records(name: str) -> dict[str, dict]:
    """The summary rows of one comparison as ``summarize``'s records (per-round times in round order)."""
    recs: dict[str, dict] = {}
    for r in read_rows(REF / name / "summary"):
        rec = recs.setdefault(r["candidate"], {"candidate": r["candidate"], "status": r.get("status", "ok")})
        if r["metric"] == "peer_round_step_time_s":
            rec.setdefault("rounds", {})[r["round"]] = r["value"]
        elif r["metric"] in ("peer_time_vs_torch_ddp", "peer_peak_live_bytes", "peer_peak_rss_bytes"):
            rec[r["metric"].removeprefix("peer_")] = r["value"]
    for rec in recs.values():
        rounds = rec.pop("rounds", {})
        rec["round_step_time_s"] = [rounds.get(i) for i in range(max(rounds, default=-1) + 1)]
    return recs


@pytest.fixture(scope="module")
def verdicts() -> dict[str, dict]:
    return {v["candidate"]: v for v in bar(list(_records("small4-dp4").values()))}


def test_time_against_the_fastest_peer_of_the_same_sharding(verdicts):
    got = {c: (v["fastest_peer"], round(v["time_vs_fastest"], 3)) for c, v in verdicts.items()}
    assert got == {"zerobench-0": ("torch-ddp", 0.903), "zerobench-1": ("torch-zero1", 0.944),
                   "zerobench-2": ("fsdp1-shard-grad-op", 0.828), "zerobench-3": ("fsdp1-full-shard", 0.893),
                   "zerobench-2-offload": ("deepspeed-2-offload", 0.761),
                   "zerobench-3-offload": ("deepspeed-3-offload", 0.754)}
    assert all(v["speed_ok"] for v in verdicts.values())
    assert not verdicts["zerobench-1"]["speed_decided"]  # the README says "within noise" for stage 1


def test_peak_memory_against_the_leanest_peer(verdicts):
    got = {c: (v["leanest_peer"], round(v["memory_vs_leanest"], 3)) for c, v in verdicts.items()}
    assert got["zerobench-0"] == ("deepspeed-0", 0.984) and got["zerobench-1"] == ("deepspeed-1", 0.973)
    assert got["zerobench-2"] == ("fsdp1-shard-grad-op", 1.029)  # the misses the README explains
    assert got["zerobench-3"] == ("fsdp1-full-shard", 1.007)


def test_stage3_and_ddp_and_overlap_off():
    recs = _records("small4-dp4")
    assert round(recs["zerobench-3"]["time_vs_torch_ddp"], 3) == 1.045  # the bar: <= 1.2
    off = _records("small4-dp4-overlap-off")
    live = {c: round(r["peak_live_bytes"] / MiB, 1) for c, r in off.items() if "peak_live_bytes" in r}
    assert live["zerobench-3-no-overlap"] == 336.8 and live["fsdp1-full-shard"] == 341.8  # 0.985: the bar met
    assert live["zerobench-2-no-overlap"] == 405.9 == round(recs["zerobench-2"]["peak_live_bytes"] / MiB, 1)
