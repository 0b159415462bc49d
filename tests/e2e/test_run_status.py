"""``zerobench train``'s status as a user meets it: an fp16 run that diverges (every step after the first skipped
on overflow, the loss NaN) exits 1 with one line naming why, and its rows say ``failed`` with that reason and
count the skipped steps, in one process and through the launcher; a run that trains records ``ok``. Before, the
diverged run exited 0 and read ``ok``."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_cli_train import zb

REPRO = ("train", "--preset", "tiny", "--precision", "fp16", "--lr", "50", "--micro-batch", "1")


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in (path / "rows.jsonl").read_text().splitlines()]


def _check_diverged(r, out, steps: int) -> None:
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("zerobench: error: ") and "training diverged: the loss is nan" in line, line
    rows = _rows(out)
    (status,) = [x for x in rows if x["metric"] == "run_status"]
    assert (status["status"], status["value"]) == ("failed", 0) and "training diverged" in status["reason"], status
    (skipped,) = [x for x in rows if x["metric"] == "skipped_steps"]
    assert (skipped["value"], skipped["steps"]) == (steps - 1, list(range(2, steps + 1))), skipped
    assert len([x for x in rows if x["metric"] == "loss"]) == steps  # the diverging losses are kept
    show = zb("results", "show", str(out))
    line = show.stdout.splitlines()[1].split()
    assert show.returncode == 0 and line[1] == "failed" and str(steps - 1) in line, show.stdout


@pytest.mark.slow
def test_the_fp16_repro_fails_in_one_process(tmp_path):
    out = tmp_path / "one"
    _check_diverged(zb(*REPRO, "--steps", "20", "--out", str(out), timeout=300), out, 20)


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
