"""The harness under the faults real clusters produce: stuck and dead ranks, SIGTERM, a full disk, host
OOM, reused output directories and resumed sweeps. Every case ends in one line, a status row, and no
rank left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_cli_train import zb

pytestmark = pytest.mark.dist
TINY = ["--preset", "tiny", "--warmup", "0"]


def status_rows(out: Path) -> list[dict]:
    rows = []
    for f in sorted(out.rglob("rows.jsonl")):
        rows += [json.loads(line) for line in f.read_text().splitlines() if '"run_status"' in line]
    return rows


def ranks_running(marker: str) -> list[str]:
    r = subprocess.run(["pgrep", "-f", f"zerobench.launch.worker.*{marker}"], capture_output=True, text=True)
    return r.stdout.split()


def one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if not ln.startswith("zerobench: warning")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.slow
def test_a_stopped_rank_fails_the_run_naming_it(tmp_path):
    out = tmp_path / "run"
    r = zb(
        "train",
        *TINY,
        "--dp",
        "2",
        "--steps",
        "50",
        "--collective-timeout",
        "3",
        "--out",
        str(out),
        env={"ZEROBENCH_FAULT": "1:2:stop"},
        timeout=120,
    )
    line = one_line(r.stderr)
    assert r.returncode == 1, r.stderr
    assert "rank 1 (stopped) stuck" in line and "rank 0 timed out" in line, line
    assert not ranks_running(str(out))
    assert status_rows(out)[-1]["status"] == "failed"


def test_a_dead_rank_prints_one_line_and_keeps_the_tracebacks_in_the_log(tmp_path):
    out = tmp_path / "run"
    r = zb("train", *TINY, "--dp", "2", "--steps", "20", "--out", str(out), env={"ZEROBENCH_FAULT": "1:2:raise"})
    line = one_line(r.stderr)
    assert r.returncode == 1 and "rank 1 exited with code 1" in line and str(out / "run.log") in line, line
    log = (out / "run.log").read_text()
    assert "Traceback" in log and "planted fault on rank 1 at step 2" in log
    assert "step    1/20" in r.stdout  # rank 0's progress is still shown


def test_host_out_of_memory_is_recorded_as_oom(tmp_path):
    out = tmp_path / "run"
    r = zb("train", *TINY, "--dp", "2", "--steps", "20", "--out", str(out), env={"ZEROBENCH_FAULT": "1:1:oom"})
    line = one_line(r.stderr)
    assert r.returncode == 75 and "rank 1 ran out of memory" in line, line
    assert status_rows(out)[-1]["status"] == "oom"


def test_reusing_an_out_directory_is_refused_before_training(tmp_path):
    out = tmp_path / "run"
    assert zb("train", *TINY, "--steps", "2", "--out", str(out)).returncode == 0
    t0 = time.monotonic()
    r = zb("train", *TINY, "--steps", "2", "--out", str(out))
    assert r.returncode == 2 and "already holds result rows" in one_line(r.stderr)
    assert time.monotonic() - t0 < 30 and (out / "rows.jsonl").read_text().count('"run_id"') > 0


SUITE = """name: faults
base: {preset: tiny, steps: %d, warmup: 0, dp: 1}
runs:
%s"""


def write_suite(tmp_path: Path, steps: int, runs: str) -> Path:
    p = tmp_path / "suite.yaml"
    p.write_text(SUITE % (steps, runs))
    return p


@pytest.mark.slow
def test_resume_identifies_runs_by_label_and_keeps_every_attempt(tmp_path):
    # b has a's configuration (fault, timeout and label are not in the config hash) but never finished.
    suite = write_suite(tmp_path, 2, '  - {label: a}\n  - {label: b, fault: "0:1"}\n')
    out = tmp_path / "out"
    r = zb("sweep", str(suite), "--out", str(out), "--no-progress", timeout=300)
    assert r.returncode == 1 and "1 failed" in r.stdout
    r = zb("sweep", str(suite), "--out", str(out), "--no-progress", timeout=300)
    assert r.returncode == 2 and "pass --resume" in one_line(r.stderr)
    r = zb("sweep", str(suite), "--out", str(out), "--no-progress", "--resume", timeout=300)
    assert "1 ran, 1 skipped" in r.stdout, r.stdout
    attempts = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert attempts == ["000-a", "001-b", "001-b-r2"]
    assert sorted(p.name for p in out.iterdir() if not p.is_dir()) == ["sweep-plan.json"]  # beside them, the plan
    ids = {row["run_id"] for row in status_rows(out)}
    assert ids == set(attempts)  # no attempt's rows merged into another's


def _sweep_in_training(tmp_path, runs: str, out, **popen):
    """A sweep of ``runs`` (long ones) started in the background, returned once its first run's ranks train."""
    suite = write_suite(tmp_path, 100000, runs)
    p = subprocess.Popen(
        [sys.executable, "-m", "zerobench", "sweep", str(suite), "--out", str(out), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )
    log = out / "000-long" / "run.log"
    deadline = time.monotonic() + 120
    while not (log.exists() and "step" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(ranks_running(str(out))) == 2, "the run never started"
    return p


@pytest.mark.slow
def test_sigterm_stops_the_ranks_and_records_cancelled(tmp_path):
    out = tmp_path / "out"
    p = _sweep_in_training(tmp_path, "  - {label: long, dp: 2}\n  - {label: next}\n", out)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    assert "cancelled (SIGTERM)" in err
    assert not ranks_running(str(out)), "ranks left running after SIGTERM"
    rows = status_rows(out)
    assert [r["status"] for r in rows] == ["cancelled"] and not (out / "001-next").exists()


@pytest.mark.slow
def test_sigterm_to_the_whole_job_records_cancelled(tmp_path):
    """scancel, a time limit or preemption signal every process of the job, the ranks with the launcher: a rank
    killed by that SIGTERM was seen first and the run read 'failed: rank 0 was killed by signal 15'."""
    out = tmp_path / "out"
    p = _sweep_in_training(tmp_path, "  - {label: long, dp: 2}\n", out, start_new_session=True)  # a job step's group
    os.killpg(p.pid, signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, err
    assert [r["status"] for r in status_rows(out)] == ["cancelled"], status_rows(out)


@pytest.mark.slow
def test_a_full_disk_stops_the_sweep_cleanly(tmp_path):
    suite = write_suite(tmp_path, 3, '  - {label: a, fault: "0:1:enospc"}\n  - {label: b}\n')
    out = tmp_path / "out"
    r = zb("sweep", str(suite), "--out", str(out), "--no-progress", timeout=300)
    assert r.returncode == 1
    assert "results could not be written, the sweep stopped" in r.stderr and "Traceback" not in r.stderr
    rows = status_rows(out)
    assert [(x["label"], x["status"]) for x in rows] == [("a", "failed")]
    assert "could not write its results" in rows[0]["reason"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_rows_are_written_whole_or_not_at_all(tmp_path):
    from zerobench.results.rows import RowWriteError, RowWriter

    (tmp_path / "rows.jsonl").symlink_to("/dev/full")  # every write: ENOSPC, from the kernel
    with pytest.raises(RowWriteError, match="No space left on device"):
        RowWriter(tmp_path, "r", {"a": 1}).write("loss", 1.0, "nats")


def test_sigterm_to_train_stops_its_ranks_and_records_cancelled(tmp_path):
    out = tmp_path / "run"
    p = subprocess.Popen(
        [sys.executable, "-m", "zerobench", "train", *TINY, "--dp", "2", "--steps", "100000", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not ((out / "run.log").exists() and len(ranks_running(str(out))) == 2) and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(3)  # into training
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143 and "cancelled (SIGTERM)" in one_line(err), err
    assert not ranks_running(str(out))
    assert [r["status"] for r in status_rows(out)] == ["cancelled"]
