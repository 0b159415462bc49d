"""``zerobench peers`` smoke run (CI): 2 processes, zerobench stages next to torch's peers (DeepSpeed too
when installed), one round; rows, the table, loss parity with one process, and the report section."""

import subprocess
import sys

import pytest

from zerobench.peers.registry import deepspeed_available
from zerobench.results.rows import read_rows

pytestmark = pytest.mark.dist


def test_peers_smoke_writes_summary_rows_and_reports_them(tmp_path):
    systems = ["zerobench-0", "zerobench-2", "zerobench-3", "torch-ddp", "torch-zero1", "fsdp1-shard-grad-op",
               "fsdp2"] + (["deepspeed-2"] if deepspeed_available() else [])
    out = tmp_path / "peers"
    proc = subprocess.run(
        [sys.executable, "-m", "zerobench", "peers", "--systems", *systems, "--dp", "2", "--rounds", "1",
         "--steps", "3", "--warmup", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = read_rows(out / "summary")
    by = {(r["candidate"], r["metric"]): r["value"] for r in rows}
    for s in systems:
        assert by[(s, "peer_step_time_s")] > 0
        assert by[(s, "peer_peak_live_bytes")] > 0
        # every system trains the same model on the same global batch as one process does
        assert by[(s, "peer_loss_max_abs_diff")] < 1e-4, s
    assert by[("torch-ddp", "peer_time_vs_torch_ddp")] == 1.0
    assert "zerobench-2 " in proc.stdout and "fastest peer" in proc.stdout
    rep = subprocess.run([sys.executable, "-m", "zerobench", "report", str(out), "--out", str(tmp_path / "rep")],
                         capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    md = (tmp_path / "rep" / "summary.md").read_text()
    assert "zerobench vs peers" in md and "fsdp1-shard-grad-op" in md
    assert (tmp_path / "rep" / "peers.png").stat().st_size > 10_000
