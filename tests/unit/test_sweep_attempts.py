"""Where a sweep's next attempt of a run goes (``bench.sweep_state.attempt_id``)."""

from __future__ import annotations

from types import SimpleNamespace

from zerobench.bench.sweep_state import attempt_id
from zerobench.results.rows import RowWriter


def test_an_attempt_without_rows_is_never_reused(tmp_path):
    """An interrupted sbatch sweep leaves its jobs queued or running: their directories have no rows yet, and
    the jobs write there later. ``--resume`` must give the retry a directory of its own, or the two jobs' rows
    land in one file under one status."""
    run = SimpleNamespace(run_id="000-a")
    assert attempt_id(tmp_path, run) == "000-a"
    (tmp_path / "000-a").mkdir()  # submitted, nothing written yet
    assert attempt_id(tmp_path, run) == "000-a-r2"
    RowWriter(tmp_path / "000-a-r2", "000-a-r2", {}).write("run_status", None, "", status="failed")
    assert attempt_id(tmp_path, run) == "000-a-r3"
