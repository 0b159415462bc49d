"""MFU and the CUDA allocator's peaks in ``zerobench peers``' summary, from the H200's recorded runs
(``results/reference/gpu-h200-2026-11-27/peers-tiny-dp1``, fp32) and from rows of a CPU."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from zerobench.bench.peers import PeersConfig, bar, summarize
from zerobench.metrics.peak import DENSE_BF16_PEAK_FLOPS, dense_bf16_peak, mfu
from zerobench.models.config import GPTConfig
from zerobench.models.sizes import flops_per_token
from zerobench.results.rows import read_rows

REF = Path(__file__).resolve().parents[2] / "results" / "reference" / "gpu-h200-2026-11-27" / "peers-tiny-dp1"
TINY = ("zerobench-0", "zerobench-3", "torch-ddp", "fsdp1-full-shard", "fsdp2")
P = PeersConfig(systems=TINY, dp=1, preset="tiny", micro_batch=8, steps=30, warmup=10, rounds=2, memory_run=False)


def test_the_peak_is_stated_per_card_by_exact_name():
    assert dense_bf16_peak("NVIDIA H100 80GB HBM3") == dense_bf16_peak("NVIDIA H200") == 989e12
    assert dense_bf16_peak("NVIDIA H100 PCIe") is None and dense_bf16_peak("NVIDIA H200 NVL") is None
    assert dense_bf16_peak(None) is None and dense_bf16_peak("Intel(R) Xeon(R) CPU @ 2.20GHz") is None
    assert set(DENSE_BF16_PEAK_FLOPS) == {"NVIDIA H100 80GB HBM3", "NVIDIA H200"}
    assert mfu(4.945e14, 1.0, "NVIDIA H200", "bf16") == pytest.approx(0.5)
    assert mfu(4.945e14, 1.0, "NVIDIA H200", "fp32") is None  # a bf16 peak would mislead about an fp32 run
    assert mfu(4.945e14, 1.0, "cpu", "bf16") is None


def _summary(tmp_path: Path, p: PeersConfig) -> tuple[dict[str, dict], list[dict]]:
    shutil.copytree(REF, tmp_path / "runs", ignore=shutil.ignore_patterns("summary"))
    recs = {r["candidate"]: r for r in summarize(p, tmp_path / "runs", p.systems, {})}
    return recs, read_rows(tmp_path / "runs" / "summary")


def _round_rows(candidate: str, metric: str) -> list[int]:
    return [r["value"] for i in range(P.rounds) for r in read_rows(REF / f"r{i}-{candidate}") if r["metric"] == metric]


def test_device_memory_is_the_highest_of_the_timed_runs_and_fp32_has_no_mfu(tmp_path):
    recs, rows = _summary(tmp_path, P)
    model = GPTConfig(layers=2, hidden=64, heads=4, vocab=512, seq=64)
    for c in TINY:
        assert recs[c]["max_memory_allocated_bytes"] == max(_round_rows(c, "peak_memory_bytes")) > 0
        assert recs[c]["max_memory_reserved_bytes"] == max(_round_rows(c, "peak_reserved_bytes"))
        assert recs[c]["model_flops_per_step"] == flops_per_token(model) * 8 * 64
        assert "mfu" not in recs[c]
    assert not [r for r in rows if r["metric"] == "peer_mfu"]
    got = {(r["candidate"], r["metric"]) for r in rows}
    assert ("fsdp2", "peer_max_memory_allocated_bytes") in got and ("fsdp2", "peer_max_memory_reserved_bytes") in got


def test_mfu_divides_model_flops_per_step_by_step_time_and_the_cards_peak(tmp_path):
    """The same runs summarised as if bf16 (the rows' own precision is not read: the comparison's is)."""
    recs, rows = _summary(tmp_path, dataclasses.replace(P, precision="bf16"))
    mfus = {r["candidate"]: r for r in rows if r["metric"] == "peer_mfu"}
    assert set(mfus) == set(TINY)
    for c in TINY:
        want = recs[c]["model_flops_per_step"] / recs[c]["step_time_s"] / 989e12
        assert mfus[c]["value"] == pytest.approx(want, rel=1e-12) and recs[c]["mfu"] == mfus[c]["value"]
        assert (mfus[c]["device"], mfus[c]["peak_flops"]) == ("NVIDIA H200", 989e12)


def test_a_cpu_comparison_has_neither_mfu_nor_device_memory(tmp_path):
    """Rows of a CPU carry the live-tensor tracker's peak (or none), never the CUDA allocator's."""
    shutil.copytree(REF, tmp_path / "runs", ignore=shutil.ignore_patterns("summary"))
    for path in (tmp_path / "runs").glob("*/rows.jsonl"):
        out = []
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if r["metric"] == "peak_reserved_bytes":
                continue
            if r["metric"] == "peak_memory_bytes":
                r["source"] = "live-tensor tracker"
            r.setdefault("provenance", {})["hardware"] = {"kind": "cpu", "device": "some CPU"}
            out.append(json.dumps(r))
        path.write_text("\n".join(out) + "\n")
    p = dataclasses.replace(P, precision="bf16")
    recs = summarize(p, tmp_path / "runs", p.systems, {})
    assert all("mfu" not in r and "max_memory_allocated_bytes" not in r for r in recs)
    assert all("max_memory_reserved_bytes" not in r and r["model_flops_per_step"] > 0 for r in recs)


def test_without_torch_ddp_every_measured_time_and_mfu_stays_and_the_bar_compares_side_by_side(tmp_path):
    """A comparison whose torch-ddp run failed or was cut (as a lent card's time limit cut one) still tables each
    candidate's own median step time and MFU, and judges zerobench against its peers round by round; only the
    ratio to torch-ddp is missing."""
    shutil.copytree(REF, tmp_path / "runs", ignore=shutil.ignore_patterns("summary", "r*-torch-ddp"))
    p = dataclasses.replace(P, precision="bf16")
    recs = {r["candidate"]: r for r in summarize(p, tmp_path / "runs", p.systems, {"torch-ddp": "cut"})}
    rows = read_rows(tmp_path / "runs" / "summary")
    for c in (c for c in TINY if c != "torch-ddp"):
        own = sorted(_round_rows(c, "step_time_s"))
        assert recs[c]["step_time_s"] == pytest.approx(sum(own) / 2) and "time_vs_torch_ddp" not in recs[c]
        assert recs[c]["mfu"] == pytest.approx(recs[c]["model_flops_per_step"] / recs[c]["step_time_s"] / 989e12)
        assert {
            m for m in ("peer_step_time_s", "peer_mfu") if any(r["metric"] == m and r["candidate"] == c for r in rows)
        } == {"peer_step_time_s", "peer_mfu"}
    assert recs["torch-ddp"]["status"] == "failed" and "step_time_s" not in recs["torch-ddp"]
    (v3,) = [v for v in bar(list(recs.values())) if v["candidate"] == "zerobench-3"]
    side_by_side = [
        a / b for a, b in zip(_round_rows("zerobench-3", "step_time_s"), _round_rows("fsdp2", "step_time_s"))
    ]
    assert v3["fastest_peer"] == "fsdp2"  # FSDP1 in a world of one runs as NO_SHARD: stage 0's peer
    assert v3["time_vs_fastest"] == pytest.approx(sum(side_by_side) / 2)
