"""What ``zerobench sweep`` exits with, which is what ``sbatch slurm/scale_400gpu.sh`` ends as: the script passed
``--allow-failures``, so a job whose every run crashed ended ``COMPLETED`` with exit 0 (a helper's review). It now
passes ``--allow-oom``: a run that does not fit (``oom``, ``invalid``) is a measurement, a crash or a timeout fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_bad_inputs import run
from zerobench.bench.sweep_state import SweepSummary

REPO = Path(__file__).resolve().parents[2]


def _summary(statuses: dict[str, str]) -> SweepSummary:
    s = SweepSummary(ran=list(statuses))
    for label, status in statuses.items():
        if status != "ok":
            s.failed[label], s.failed_status[label] = f"{status}: why", status
    return s


@pytest.mark.parametrize(
    ("statuses", "flag", "code"),
    [
        ({"a": "ok", "b": "oom", "c": "invalid"}, "--allow-oom", 0),
        ({"a": "oom", "b": "oom"}, "--allow-oom", 0),
        ({"a": "ok", "b": "failed"}, "--allow-oom", 1),
        ({"a": "ok", "b": "timeout"}, "--allow-oom", 1),
        ({"a": "ok", "b": "failed"}, "--allow-failures", 0),
        ({"a": "ok", "b": "oom"}, None, 1),
        ({"a": "ok"}, None, 0),
    ],
)
def test_the_exit_code_says_whether_a_run_crashed(statuses, flag, code, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("zerobench.bench.runner.run_sweep", lambda *a, **k: _summary(statuses))
    argv = ["sweep", "cpu/quick", "--out", str(tmp_path / "out"), "--no-progress", *([flag] if flag else [])]
    got, err = run(argv, capsys)
    assert got == code, err
    if flag == "--allow-oom" and code:
        assert "failed other than by not fitting" in err and "b: " in err, err


def test_the_scale_script_lets_only_runs_that_do_not_fit_pass():
    script = (REPO / "slurm" / "scale_400gpu.sh").read_text()
    assert "--allow-oom" in script and "--allow-failures" not in script
