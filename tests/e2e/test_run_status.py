"""``zerobench train``'s status as a user meets it: an fp16 run that diverges (every step after the first skipped
on overflow, the loss NaN) exits 1 with one line naming why, and its rows say ``failed`` with that reason, count
the skipped steps and keep every step's loss, in one process and through the launcher; a run that trains records
``ok``. Run long enough, the loss scale reaches its minimum and the next overflow halts training (as DeepSpeed
does): the halting step's rows are written too. Before, the diverged run exited 0 and read ``ok``."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_cli_train import zb

REPRO = ("train", "--preset", "tiny", "--precision", "fp16", "--lr", "50", "--micro-batch", "1")


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in (path / "rows.jsonl").read_text().splitlines()]


DIVERGED = "training diverged: the loss is nan"
# 65536 halves at each overflow of steps 2-17, to 1 at step 17; step 18 overflows at the minimum
AT_MINIMUM = "fp16 gradients overflowed with the loss scale already at its minimum 1 (min_loss_scale 1; 16 earlier"


def _check_diverged(r, out, steps: int, reason: str = DIVERGED) -> None:
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("zerobench: error: ") and reason in line, line
    rows = _rows(out)
    (status,) = [x for x in rows if x["metric"] == "run_status"]
    assert (status["status"], status["value"]) == ("failed", 0) and reason in status["reason"], status
    (skipped,) = [x for x in rows if x["metric"] == "skipped_steps"]
    assert (skipped["value"], skipped["steps"]) == (steps - 1, list(range(2, steps + 1))), skipped
    assert len([x for x in rows if x["metric"] == "loss"]) == steps  # the diverging losses are kept
    show = zb("results", "show", str(out))
    line = show.stdout.splitlines()[1].split()
    assert show.returncode == 0 and line[1] == "failed" and str(steps - 1) in line, show.stdout


@pytest.mark.slow
def test_the_fp16_repro_fails_in_one_process(tmp_path):
    out = tmp_path / "one"
    _check_diverged(zb(*REPRO, "--steps", "8", "--out", str(out), timeout=300), out, 8)


@pytest.mark.slow
def test_an_overflow_at_the_minimum_loss_scale_halts_with_its_rows_written(tmp_path):
    """Issue 57's repro as it was filed (20 steps): the scale stops at its minimum, and the run says so."""
    out = tmp_path / "halt"
    r = zb(*REPRO, "--steps", "20", "--out", str(out), timeout=300)
    _check_diverged(r, out, 18, AT_MINIMUM)  # steps 19 and 20 never ran
    assert "step   18/20" in r.stdout and "step   19/20" not in r.stdout, r.stdout[-2000:]


@pytest.mark.dist
@pytest.mark.slow
def test_a_diverged_run_fails_through_the_launcher_and_a_trained_one_is_ok(tmp_path):
    out = tmp_path / "two"
    r = zb(*REPRO, "--steps", "4", "--dp", "2", "--out", str(out), timeout=300)
    _check_diverged(r, out, 4)
    assert "run failed: rank" in r.stderr
    ok = tmp_path / "ok"
    r = zb("train", "--preset", "tiny", "--steps", "2", "--dp", "2", "--out", str(ok), timeout=300)
    assert r.returncode == 0, r.stderr
    (status,) = [x for x in _rows(ok) if x["metric"] == "run_status"]
    assert (status["status"], status["value"], status["reason"]) == ("ok", 1, None)
