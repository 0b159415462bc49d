"""The A/B gate gives every run of the suite a verdict (``bench/ab.py``), with the rounds planted: no process runs.

Before, a run the candidate measured no time for in any round dropped out of the table (the gate exited 0), and a
NaN time gave a NaN ratio whose verdict read ``ok``."""

from __future__ import annotations

import random

import pytest

from zerobench.bench import ab
from zerobench.cli.gate import _print_verdicts

RUNS = ("000-stage-0", "001-stage-1", "002-stage-2")


def _plant(monkeypatch, candidate_time):
    """Rounds whose runs all end (a status row each); ``candidate_time(run)`` is the candidate's time of a run
    (None: no time row), the baseline's is 1 with 1% noise."""
    rng = random.Random(1)
    monkeypatch.setattr(ab, "_round", lambda cfg, r, order, sides, out, say: {name: name for name in order})
    monkeypatch.setattr(ab, "_runs", lambda side: set(RUNS))

    def times(side, metric):
        rows = {}
        for run in RUNS:
            v = 1.0 + 0.01 * rng.gauss(0, 1)
            if side == "candidate":
                v = candidate_time(run, v)
            if v is not None:
                rows[run] = {"run_id": run, "value": v}
        return rows

    monkeypatch.setattr(ab, "_times", times)
    monkeypatch.setattr(ab, "_write", lambda *a, **k: None)


def _verdicts(tmp_path):
    cfg = ab.ABConfig(suite="cpu/ci", baseline_tree=".", candidate_tree=".")
    verdicts = ab.run_ab(cfg, tmp_path / "out", say=lambda m: None)
    return {v["run"]: v["verdict"] for v in verdicts}, _print_verdicts(verdicts, cfg.tolerance, tmp_path, 0.001)


@pytest.mark.parametrize(
    "planted,verdict",
    [
        (lambda run, v: None if run == "002-stage-2" else v, "missing"),
        (lambda run, v: float("nan") if run == "002-stage-2" else v, "NOT FINITE"),
        (lambda run, v: float("inf") if run == "002-stage-2" else v, "NOT FINITE"),
    ],
)
def test_a_run_no_pair_could_judge_fails(tmp_path, monkeypatch, capsys, planted, verdict):
    _plant(monkeypatch, planted)
    verdicts, code = _verdicts(tmp_path)
    assert verdicts == {"000-stage-0": "ok", "001-stage-1": "ok", "002-stage-2": verdict}, verdicts
    assert code == 1 and f"not compared: 002-stage-2 ({verdict})" in capsys.readouterr().err


def test_unchanged_runs_pass(tmp_path, monkeypatch):
    _plant(monkeypatch, lambda run, v: v)
    verdicts, code = _verdicts(tmp_path)
    assert set(verdicts.values()) == {"ok"} and code == 0, verdicts


def test_a_run_the_suites_checker_refused_is_not_a_run_to_judge(tmp_path, monkeypatch):
    """A suite may hold an entry its checker refuses by design (an ``invalid`` status row on both sides): it was
    given a 'missing' verdict and failed the gate."""
    rows = [
        {"run_id": "000-ok", "metric": "run_status", "status": "ok"},
        {"run_id": "001-refused", "metric": "run_status", "status": "invalid"},
        {"run_id": "000-ok", "metric": "step_time_s", "status": "ok", "value": 1.0},
    ]
    monkeypatch.setattr(ab, "read_rows", lambda out: rows)
    assert ab._runs(tmp_path) == {"000-ok"}
