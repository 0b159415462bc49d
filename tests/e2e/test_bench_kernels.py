"""``zerobench bench-kernels``: runs end to end on a small partition and writes rows (no timing asserted:
the numbers are the benchmark's output, not a test's)."""

import subprocess
import sys

from zerobench.bench.kernels import summarize
from zerobench.results.rows import read_rows


def test_bench_kernels_writes_rows_for_every_candidate(tmp_path):
    out = tmp_path / "rows"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "zerobench",
            "bench-kernels",
            "--numel",
            "200000",
            "--rounds",
            "2",
            "--ops",
            "--rows",
            "64",
            "--hidden",
            "32",
            "--no-deepspeed",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    rows = read_rows(out)
    cands = {r["candidate"] for r in rows if r["metric"] == "adamw_fraction_of_bandwidth_limit"}
    assert cands == {"bandwidth_limit", "torch_adamw_foreach", "torch_adamw_fused", "zerobench_adamw"}
    assert all(r["value"] > 0 for r in rows)
    assert "bias_gelu_fused" in proc.stdout and "layer_norm_fused" in proc.stdout
    assert all(r["provenance"]["commit"] and r["config_hash"] for r in rows)


def test_summary_ratios_are_medians_of_per_round_ratios():
    times = {
        "bandwidth_limit": [1.0, 1.0, 4.0],
        "torch_adamw_fused": [2.0, 1.0, 4.0],
        "zerobench_adamw": [1.0, 2.0, 8.0],
    }
    recs = {r["candidate"]: r for r in summarize(times, 10)}
    assert recs["zerobench_adamw"]["fraction_of_limit"] == 0.5  # per round 1, 0.5, 0.5
    assert recs["zerobench_adamw"]["time_vs_torch_fused"] == 2.0  # per round 0.5, 2, 2
    assert recs["bandwidth_limit"]["fraction_of_limit"] == 1.0
