"""The simulator against recorded runs (issue 22, CPU validation): the profile and the runs of
``suites/cpu/sim_validation.yaml`` recorded on two 2-core VMs, an AMD EPYC
(``results/reference/sim-validation-cpu-2core``) and an Intel Xeon (``...-cpu-2core-xeon``), whose
profiles hold each piece's median, and on the Xeon again with profiles of each piece's mean
(``...-cpu-2core-xeon-mean``, ``measure_compute.STATISTIC``); then on a third Xeon VM with the TP pieces
measured in situ, the samples made before the step clock and 20 steps a run (``...-cpu-2core-xeon-insitu``);
and the same profiler and loop once more on a fourth and a fifth Xeon VM (``...-cpu-2core-xeon-4``, ``-5``).

What is asserted is what docs/simulator.md's validation table and each recording's README state, recomputed
from the rows: the profile alone predicts every run (no run's step time is an input), the one fitted factor is
fitted on non-ZeRO runs only, and the errors are the ones the table reports (tests/unit/test_docs.py holds the
table to each recording's validation.json). The issue's bar (median ≤ 10 %, worst ≤ 25 %)
holds on the third and fifth Xeon recordings and is a strict expected failure on the others.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerobench.results.rows import read_rows
from zerobench.sim import validate as V
from zerobench.sim.profile import Profile

REFS = Path(__file__).resolve().parents[2] / "results" / "reference"
REF = REFS / "sim-validation-cpu-2core"
STATISTIC = {
    "sim-validation-cpu-2core": "median",
    "sim-validation-cpu-2core-xeon": "median",
    "sim-validation-cpu-2core-xeon-mean": "mean",
    "sim-validation-cpu-2core-xeon-insitu": "mean",
    "sim-validation-cpu-2core-xeon-4": "mean",
    "sim-validation-cpu-2core-xeon-5": "mean",
}
"""Each recording and what its profile's entries are of their samples."""
HOSTS = tuple(STATISTIC)


@pytest.fixture(scope="module", params=HOSTS)
def recorded(request):
    ref = REFS / request.param
    rows = read_rows(ref / "runs")
    prof = Profile.from_rows(read_rows(ref / "profile"))
    prof.interference = V.fit_interference(rows, prof)
    return rows, prof, V.validate(rows, prof), ref


def test_every_kind_of_run_is_predicted(recorded):
    rows, _, recs, _ = recorded
    assert len(recs) >= 24
    assert {r["stage"] for r in recs} == {0, 1, 2, 3} and {r["dp"] for r in recs} == {1, 2, 4}
    assert len({r["hidden"] for r in recs}) == 3 and any(r["tp"] == 2 for r in recs)
    assert any(c.zero.offload_optimizer != "none" for _, c, _ in V.measured_runs(rows))


def test_the_fit_never_sees_a_zero_run(recorded, monkeypatch):
    rows, prof, _, _ = recorded
    seen = []
    real = V.simulate
    monkeypatch.setattr(V, "simulate", lambda cfg, p, **kw: seen.append(cfg) or real(cfg, p, **kw))
    V.fit_interference(rows, prof)
    assert seen and all(c.zero.stage == 0 and c.world_size > 1 for c in seen)


def test_profiles_say_which_statistic_they_hold():
    for host in HOSTS:
        stats = {r["config"].get("statistic", "median") for r in read_rows(REFS / host / "profile")}
        assert stats == {STATISTIC[host]}, (host, stats)


def test_the_errors_are_the_ones_the_table_states(recorded):
    _, prof, recs, ref = recorded
    table = json.loads((ref / "validation.json").read_text())
    stated = table["summary"]
    assert prof.interference == pytest.approx(table["interference"])
    s = V.summarize(recs)
    assert s["runs"] == stated["runs"]
    assert s["median_abs_error"] == pytest.approx(stated["median_abs_error"], abs=1e-6)
    assert s["worst_abs_error"] == pytest.approx(stated["worst_abs_error"], abs=1e-6)


MEETS_BAR = ("sim-validation-cpu-2core-xeon-insitu", "sim-validation-cpu-2core-xeon-5")
"""The recordings on which issue 22's whole CPU bar holds."""
CURRENT = ("sim-validation-cpu-2core-xeon-insitu", "sim-validation-cpu-2core-xeon-4", "sim-validation-cpu-2core-xeon-5")
"""The recordings of the current profiler and loop (TP pieces in situ, 20 steps a run)."""
_MISSED = pytest.mark.xfail(strict=True, reason="issue 22's CPU bar is missed on this recording: see docs/simulator.md")


@pytest.mark.parametrize(
    "recorded", [h if h in MEETS_BAR else pytest.param(h, marks=_MISSED) for h in HOSTS], indirect=True
)
def test_issue_22_cpu_bar(recorded):
    s = V.summarize(recorded[2])
    assert s["runs"] >= 24 and s["median_abs_error"] <= 0.10 and s["worst_abs_error"] <= 0.25


@pytest.mark.parametrize("recorded", CURRENT, indirect=True)
def test_issue_22_median_bar_is_met_on_every_recording_of_the_current_profiler(recorded):
    """The median half of the bar holds on all three recordings of the current profiler and loop; the worst
    run keeps the whole bar missed on one of them (the fourth Xeon's mini DP 2 stage 3 with offload: 25.3 %)."""
    s = V.summarize(recorded[2])
    assert s["runs"] == 34 and s["median_abs_error"] <= 0.10


def _step_row(run_id: str, value: float, config: dict, config_hash: str) -> dict:
    return {
        "metric": "step_time_s",
        "status": "ok",
        "value": value,
        "run_id": run_id,
        "config": config,
        "config_hash": config_hash,
    }


def test_a_run_measured_in_several_rounds_is_its_median():
    rows = read_rows(REF / "runs")
    one = next(r for r in rows if r["metric"] == "step_time_s" and r["status"] == "ok")
    cfg, h = one["config"], one["config_hash"]
    rounds = [_step_row("000-x", t, cfg, h) for t in (0.3, 0.1, 0.2)] + [_step_row("001-y", 0.5, cfg, h)]
    got = [(rid, t) for rid, _, t in V.measured_runs(rounds)]
    assert got == [("000-x", 0.2), ("001-y", 0.5)]
    with pytest.raises(ValueError, match="two different configurations"):
        V.measured_runs([*rounds, _step_row("000-x", 0.2, {**cfg, "seed": cfg.get("seed", 0) + 1}, "other")])


def test_a_run_whose_status_does_not_count_is_not_a_measurement():
    """A run killed or timed out after writing its step time (its launcher's ``run_status`` row says so, or it has
    none) is no measurement: in a directory of rounds, only the rounds whose run counts are taken."""
    rows = read_rows(REF / "runs")
    one = next(r for r in rows if r["metric"] == "step_time_s" and r["status"] == "ok")
    cfg, h = one["config"], one["config_hash"]

    def attempt(run_id: str, t: float, status: str | None) -> list[dict]:
        step = {**_step_row(run_id, t, cfg, h), "suite": "cpu/x", "schema": 2}
        return [step] + ([{**step, "metric": "run_status", "value": None, "status": status}] if status else [])

    rounds = [*attempt("000-x", 0.1, "ok"), *attempt("000-x", 9.0, "timeout"), *attempt("000-x", 0.3, "ok")]
    rounds += [*attempt("001-y", 0.5, "failed"), *attempt("002-z", 0.7, None)]  # 002-z: incomplete (killed)
    assert [(rid, t) for rid, _, t in V.measured_runs(rounds)] == [("000-x", 0.2)]
