"""``zerobench results show`` (and the demo's closing table): a completed run's reason is blank (``-``), not
``NaN``; a metric a run has no row for is ``-``; a NaN held by a row (a diverged loss) still reads ``nan``."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

from zerobench.results.show import show

BASELINE = Path(__file__).resolve().parents[2] / "results" / "baselines" / "cpu-2core.jsonl"


def test_blank_missing_and_nan_cells(tmp_path):
    rows = [json.loads(line) for line in BASELINE.read_text().splitlines()]
    runs = sorted({r["run_id"] for r in rows})
    failed = copy.deepcopy(next(r for r in rows if r["run_id"] == runs[1] and r["metric"] == "run_status"))
    failed.update(status="failed", reason="rank 1 exited with code 17", run_id="zz-failed")
    for r in rows:
        if r["run_id"] == runs[2] and r["metric"] == "loss":
            r["value"] = math.nan
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*rows, failed]))
    lines = {line.split()[0]: line for line in show(tmp_path).splitlines()[1:]}
    ok = lines[runs[0]].split()
    assert ok[-1] == "-" and ok[8] == "-", lines[runs[0]]  # no reason; no tflops row in the baseline
    assert "NaN" not in show(tmp_path).replace("nan", "")
    assert lines[runs[2]].split()[-2] == "nan", lines[runs[2]]  # the diverged loss is shown as it is
    assert lines["zz-failed"].rstrip().endswith("rank 1 exited with code 17"), lines["zz-failed"]


def test_a_run_under_callgrind_says_so(tmp_path):
    """A run counted under callgrind trains only to its counted step: its line says so instead of reading as an
    ordinary run with a higher final loss."""
    rows = [json.loads(line) for line in BASELINE.read_text().splitlines()]
    runs = sorted({r["run_id"] for r in rows})
    for r in rows:
        if r["run_id"] == runs[0] and r["metric"] != "run_status":
            r["instrumented"] = "callgrind"
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = {line.split()[0]: line for line in show(tmp_path).splitlines()[1:]}
    assert lines[runs[0]].rstrip().endswith("instrumented (callgrind): counts only, trained to its counted step")
    assert lines[runs[1]].split()[-1] == "-"
