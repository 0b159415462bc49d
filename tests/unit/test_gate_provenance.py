"""What the gate reads of the rows' provenance, and what it does with it: a configuration's machine is that of its
measurements (a status row is written by whoever recorded the run: under Slurm the submit host), and it is
compared per configuration, on copies of the committed ``cpu-2core`` baseline, changed."""

from __future__ import annotations

import copy

from tests.unit.test_gate_silent import BASELINE, ROWS, STAGE3, _gate_out
from tests.unit.test_results_whole import _write


def _on(r: dict, cls: str) -> None:
    r["provenance"]["hardware"] = {**r["provenance"]["hardware"], "class": cls}


def test_a_failed_run_s_status_row_written_on_the_submit_host_is_not_its_machine(tmp_path, capsys):
    """A run that failed before measuring anything leaves its status row only, stamped (under Slurm) with the
    submit host's hardware and torch: the gate fails it as missing, neither refusing the whole candidate as of
    two machine classes nor noting another torch version."""
    cand = [r for r in copy.deepcopy(ROWS) if r["config_hash"] != STAGE3 or r["metric"] == "run_status"]
    for r in cand:
        if r["config_hash"] == STAGE3:
            r["status"], r["reason"] = "failed", "RuntimeError: boom"
            _on(r, "cpu-64core")
            r["provenance"]["torch_version"] = "2.99.0+cpu"
    code, out = _gate_out(capsys, BASELINE, _write(tmp_path / "c", cand))
    assert code == 1, out
    assert "missing: stage=3 (in the baseline, not completed in the candidate)" in out, out
    assert "not completed: stage=3 (run 003-stage-3: failed: RuntimeError: boom)" in out, out
    assert "cpu-64core" not in out and "2.99.0" not in out, out
