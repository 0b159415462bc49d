"""The regression gate's rules on the committed CPU baseline, without running anything: a candidate that is the
baseline passes; a NaN or infinite value on any rank (a diverged loss, a broken measurement), in the candidate
or the baseline, fails as NOT FINITE whatever the rows' order; a gated metric the candidate's run lacks fails as
missing. Before, all of these passed as "ok"."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from zerobench.bench.regress import compare, run_gate

BASELINE = Path(__file__).resolve().parents[2] / "results" / "baselines" / "cpu-2core.jsonl"


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return [json.loads(line) for line in BASELINE.read_text().splitlines()]


def _gate(tmp_path, baseline: list[dict], candidate: list[dict], capsys) -> tuple[int, str]:
    paths = []
    for name, rs in (("base.jsonl", baseline), ("cand.jsonl", candidate)):
        paths.append(tmp_path / name)
        paths[-1].write_text("".join(json.dumps(r) + "\n" for r in rs))
    code = run_gate(str(paths[0]), str(paths[1]), 0.05, str(tmp_path / "proposed.jsonl"), timing="report")
    return code, capsys.readouterr().out


def _where(rows: list[dict], metric: str, run: str) -> list[int]:
    return [i for i, r in enumerate(rows) if r["metric"] == metric and r["run_id"] == run]


def test_the_baseline_against_itself_passes(tmp_path, rows, capsys):
    code, out = _gate(tmp_path, rows, rows, capsys)
    assert code == 0 and "0 regressions" in out and "missing" not in out, out


@pytest.mark.parametrize("which", [0, -1])
def test_a_nan_on_one_rank_fails_whatever_the_order(tmp_path, rows, capsys, which):
    cand = copy.deepcopy(rows)
    hits = _where(cand, "peak_memory_bytes", "000-stage-0")
    assert len(hits) == 2, hits  # one row per rank
    cand[hits[which]]["value"] = math.nan
    code, out = _gate(tmp_path, rows, cand, capsys)
    line = next(x for x in out.splitlines() if "NOT FINITE" in x)
    assert code == 1 and "peak_memory_bytes" in line and "stage=0" in line, out


def test_a_diverged_final_loss_fails(tmp_path, rows, capsys):
    cand = copy.deepcopy(rows)
    losses = _where(cand, "loss", "002-stage-2")
    last = max(cand[i].get("step", 0) for i in losses)
    at_last = [i for i in losses if cand[i].get("step", 0) == last]
    cand[at_last[0]]["value"] = math.nan  # one rank's row of the last step
    comps, missing = compare(rows, cand)
    bad = [c for c in comps if c.verdict == "not finite"]
    assert [(c.label, c.metric) for c in bad] == [("stage=2", "final_loss")] and not missing, bad


def test_an_infinite_step_time_fails(tmp_path, rows, capsys):
    cand = copy.deepcopy(rows)
    for i in _where(cand, "step_time_s", "003-stage-3"):
        cand[i]["value"] = math.inf
    comps, _ = compare(rows, cand)
    assert [(c.label, c.metric) for c in comps if c.verdict == "not finite"] == [("stage=3", "step_time_ratio")]


def test_a_nan_in_the_baseline_fails(tmp_path, rows, capsys):
    base = copy.deepcopy(rows)
    base[_where(base, "model_state_bytes", "001-stage-1")[0]]["value"] = math.nan
    code, out = _gate(tmp_path, base, rows, capsys)
    assert code == 1 and "NOT FINITE" in out, out


def test_a_gated_metric_the_candidate_lacks_is_missing(tmp_path, rows, capsys):
    gone = set(_where(rows, "peak_memory_bytes", "003-stage-3"))
    assert gone
    code, out = _gate(tmp_path, rows, [r for i, r in enumerate(rows) if i not in gone], capsys)
    assert code == 1 and "missing: stage=3: peak_memory_bytes" in out, out


# -- rows the gate used to read wrongly without a word (an audit's mutations of the committed baselines) ----------

CAMPAIGN = BASELINE.parents[1] / "reference" / "gate-campaign-cpu-2core" / "part-1" / "baseline.jsonl"


@pytest.fixture(scope="module")
def host_rows() -> list[dict]:
    """A baseline with per-rank host-work counts (DP 2) and a noise model of unchanged runs."""
    return [json.loads(line) for line in CAMPAIGN.read_text().splitlines()]


def _refused(tmp_path, baseline, candidate, capsys, match: str) -> None:
    from zerobench.config import ConfigError

    with pytest.raises(ConfigError, match=match):
        _gate(tmp_path, baseline, candidate, capsys)


def test_two_rows_of_one_measurement_are_refused_not_last_one_wins(tmp_path, rows, capsys):
    """Rows of two rounds in one directory: the last row used to win (a +20% round hidden by a clean one)."""
    i = _where(rows, "step_time_s", "002-stage-2")[0]
    worse = dict(rows[i], value=rows[i]["value"] * 1.5)
    _refused(tmp_path, rows, [*rows[:i], worse, *rows[i:]], capsys, r"candidate: run 002-stage-2: step_time_s is meas")


def test_two_completed_runs_of_one_configuration_are_refused(tmp_path, rows, capsys):
    again = [dict(r, run_id="001-stage-1-r2") for r in rows if r["run_id"] == "001-stage-1"]
    _refused(
        tmp_path, [*rows, *again], rows, capsys, r"baseline: two completed runs of one configuration \(001-stage-1 and"
    )


def test_a_baseline_the_gate_would_refuse_is_not_written(tmp_path, rows):
    """``--write-baseline`` wrote a candidate of two completed runs of one configuration (a label renamed on
    resume), which every later gate run then refused as its baseline."""
    from zerobench.bench.regress import write_baseline
    from zerobench.config import ConfigError

    again = [dict(r, run_id="001-stage-1-r2") for r in rows if r["run_id"] == "001-stage-1"]
    with pytest.raises(ConfigError, match=r"two completed runs of one configuration \(001-stage-1 and"):
        write_baseline([*rows, *again], tmp_path / "b.jsonl", whole=True)
    assert not (tmp_path / "b.jsonl").exists()


@pytest.mark.parametrize(
    "metric,value,match",
    [
        ("step_time_s", 0.0, "is 0 s: a step takes time"),
        ("step_time_s", -0.02, "is -0.02: a size, count or time is never negative"),
        ("peak_memory_bytes", -1, "a size, count or time is never negative"),
        ("model_state_bytes", True, "has the value True, not a number"),
        ("comm_volume_elements_per_step", "12", "'value' must be a number or null, got '12'"),
    ],
)
def test_a_value_that_is_no_measurement_is_one_line(tmp_path, rows, capsys, metric, value, match):
    """A zero or negative step time used to raise ZeroDivisionError or pass as IMPROVED; a negative size or a
    bool passed as IMPROVED."""
    cand = copy.deepcopy(rows)
    cand[_where(cand, metric, "003-stage-3")[0]]["value"] = value
    _refused(tmp_path, rows, cand, capsys, match)


def test_a_null_step_time_is_missing_not_a_traceback(tmp_path, rows, capsys):
    cand = copy.deepcopy(rows)
    for i in _where(cand, "step_time_s", "003-stage-3"):
        cand[i]["value"] = None
    code, out = _gate(tmp_path, rows, cand, capsys)
    assert code == 1 and "missing: stage=3: step_time_ratio" in out, out


def test_a_step_time_rows_spread_that_is_no_number_is_one_line(tmp_path, rows, capsys):
    """A ``mad`` or ``n`` that is not a number used to be a TypeError traceback (exit 1, a regression's code)."""
    for field, value in (("mad", "0.001"), ("n", "5"), ("n", 0)):
        cand = copy.deepcopy(rows)
        cand[_where(cand, "step_time_s", "002-stage-2")[0]][field] = value
        _refused(tmp_path, rows, cand, capsys, f"has {field} {value!r}, not a number of at least")


def _slowed(rows: list[dict], run: str, factor: float) -> list[dict]:
    cand = copy.deepcopy(rows)
    for i in _where(cand, "step_time_s", run):
        cand[i]["value"] *= factor
    return cand


def test_a_slower_stage_0_regresses_against_torch_ddp(rows):
    """Stage 0's own time was never gated: it is the other stages' reference, so a 3x slower stage 0 passed and
    stages 1-3 read as improved. It is now timed against the torch-ddp run of the same workload."""
    assert _where(rows, "step_time_s", "008-torch-ddp")  # the committed baseline has the reference run
    comps, _ = compare(rows, _slowed(rows, "000-stage-0", 3.0))
    verdicts = {(c.label, c.metric): c.verdict for c in comps}
    assert verdicts[("stage=0", "step_time_ratio")] == "regression", verdicts


def test_an_infinite_reference_time_fails_every_ratio_taken_from_it(rows):
    """An infinite stage-0 time read as stages 1-3 IMPROVED by 100%."""
    comps, _ = compare(rows, _slowed(rows, "000-stage-0", math.inf))
    bad = sorted(c.label for c in comps if c.metric == "step_time_ratio" and c.verdict == "not finite")
    assert bad == ["stage=0", "stage=1", "stage=2", "stage=3"], bad


def test_the_timing_reference_is_a_run_of_the_same_workload(rows):
    """A stage-0 run of another micro-batch in the same results (2x slower) became every stage's reference, and
    stages 1-3 read as 50% faster; a real slowdown beside it passed as ok."""
    other = []
    for row in (r for r in rows if r["run_id"] == "000-stage-0"):
        r = copy.deepcopy(row)
        r["run_id"], r["config_hash"] = "009-stage-0-mb4", "f" * 16
        r["config"]["micro_batch"] = 4
        if r.get("label"):
            r["label"] = "stage=0,mb4"
        if r["metric"] == "step_time_s":
            r["value"] *= 2
        other.append(r)
    comps, _ = compare(rows, [*_slowed(rows, "001-stage-1", 1.6), *other])
    verdicts = {(c.label, c.metric): c.verdict for c in comps if c.metric == "step_time_ratio"}
    assert verdicts[("stage=1", "step_time_ratio")] == "regression", verdicts
    assert verdicts[("stage=2", "step_time_ratio")] == "ok", verdicts


def test_two_runs_that_could_be_the_timing_reference_are_refused(tmp_path, rows, capsys):
    again = []
    for row in (r for r in rows if r["run_id"] == "008-torch-ddp"):
        r = copy.deepcopy(row)
        r["run_id"], r["config_hash"] = "009-torch-ddp-again", "e" * 16
        r["config"]["collective_timeout_s"] = 60.0
        again.append(r)
    _refused(tmp_path, rows, [*rows, *again], capsys, "are both its timing reference")


def test_a_metric_in_another_unit_is_refused(tmp_path, rows, capsys):
    """Peak memory in MiB used to read as a 100% improvement, a step time in ms as a +99900% 'improvement'."""
    cand = copy.deepcopy(rows)
    for i in _where(cand, "peak_memory_bytes", "001-stage-1"):
        cand[i] = dict(cand[i], unit="MiB", value=cand[i]["value"] / 2**20)
    _refused(tmp_path, rows, cand, capsys, r"peak_memory_bytes is in MiB in the candidate and bytes in the baseline")


def test_a_candidate_without_hardware_provenance_is_refused(tmp_path, rows, capsys):
    cand = [{k: v for k, v in r.items() if k != "provenance"} for r in rows]
    _refused(tmp_path, rows, cand, capsys, "the candidate's rows carry no hardware provenance")


def test_a_baseline_without_hardware_provenance_is_refused(tmp_path, rows, capsys):
    """Refused one way only: a baseline without provenance was compared with a candidate of any machine."""
    base = [{k: v for k, v in r.items() if k != "provenance"} for r in rows]
    _refused(tmp_path, base, rows, capsys, "the baseline's rows carry no hardware provenance")


def test_a_second_gate_run_into_one_out_is_refused(tmp_path, rows, capsys):
    """Two gate runs' verdicts in one --out gave two gate_result rows: which verdict stood was not said."""
    from zerobench.cli import main

    base = tmp_path / "b.jsonl"
    base.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["regress", "--baseline", str(base), "--candidate", str(base), "--timing", "report"]
    assert main([*argv, "--out", str(tmp_path / "v"), "--propose", str(tmp_path / "p.jsonl")]) == 0
    assert main([*argv, "--out", str(tmp_path / "v"), "--propose", str(tmp_path / "p.jsonl")]) == 2
    assert "already holds result rows" in capsys.readouterr().err


def test_a_rank_whose_rows_are_lost_fails_as_missing(tmp_path, host_rows, capsys):
    """Rank 1's counts gone used to read as -50% IMPROVED (the sum over ranks halves); a rank's size gone, or
    null, was left out of the max over ranks."""
    measured = [r for r in host_rows if r["metric"] != "gate_noise"]  # a sweep's rows: no noise model
    cand = [r for r in measured if not (r["metric"] == "ops_dispatched" and r.get("rank") == 1)]
    code, out = _gate(tmp_path, host_rows, cand, capsys)
    assert code == 1 and "ops_dispatched (measured on ranks 0, the baseline on 0, 1)" in out, out
    assert "IMPROVED" not in out
    cand = copy.deepcopy(measured)
    timed = (r for r in cand if not r.get("instrumented"))  # a run under callgrind counts only its instructions
    next(r for r in timed if r["metric"] == "model_state_bytes" and r.get("rank") == 1)["value"] = None
    code, out = _gate(tmp_path, host_rows, cand, capsys)
    assert code == 1 and ": model_state_bytes" in out and "missing" in out, out


def test_a_damaged_baseline_fails(tmp_path, rows, capsys):
    """A baseline with a torn last row, or cut so that a run lost its status row, used to compare what was left
    and pass."""
    from zerobench.config import ConfigError

    torn = tmp_path / "torn.jsonl"
    torn.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"metric": "loss", "va')
    (tmp_path / "cand.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match="its last row is torn: a damaged baseline"):
        run_gate(str(torn), str(tmp_path / "cand.jsonl"), 0.05, str(tmp_path / "p.jsonl"), timing="report")
    cut = [r for r in rows if not (r["run_id"] == "002-stage-2" and r["metric"] == "run_status")]
    code, out = _gate(tmp_path, cut, rows, capsys)
    assert code == 1 and "damaged baseline: 002-stage-2 (the baseline's run is incomplete)" in out, out
    whole = tmp_path / "no-final-newline.jsonl"  # a whole file whose last row lacks only its newline is read
    whole.write_text("".join(json.dumps(r) + "\n" for r in rows).rstrip("\n"))
    assert run_gate(str(whole), str(tmp_path / "cand.jsonl"), 0.05, str(tmp_path / "p.jsonl"), timing="report") == 0


def test_a_new_configuration_that_failed_fails_the_gate(tmp_path, rows, capsys):
    """A run the pull request adds that runs out of memory used to be listed as not completed, with exit 0."""
    new = [
        dict(r, run_id="008-new", config_hash="f" * 16, value=0, status="oom", reason="rank 0 ran out of memory")
        for r in rows
        if r["run_id"] == "000-stage-0" and r["metric"] == "run_status"
    ]
    code, out = _gate(tmp_path, rows, [*rows, *new], capsys)
    assert code == 1 and "failed: stage=0 (oom; not in the baseline)" in out, out
    # a configuration the suite's checker refused (paper/fig2 holds ten) is listed, and fails nothing
    invalid = [dict(r, status="invalid", reason="tp 4 needs 4 processes") for r in new]
    code, out = _gate(tmp_path, rows, [*rows, *invalid], capsys)
    assert code == 0 and "not completed: stage=0 (run 008-new: invalid" in out and "failed:" not in out, out
    code, out = _gate(tmp_path, [*rows, *new], rows, capsys)  # a sweep given as the baseline, with a failed run
    assert code == 0 and "not compared: stage=0 (the baseline's run is oom)" in out, out


def test_a_slower_step_under_report_is_not_counted_as_an_improvement(tmp_path, rows, capsys):
    cand = copy.deepcopy(rows)
    for i in _where(cand, "step_time_s", "002-stage-2"):
        cand[i]["value"] *= 2
    code, out = _gate(tmp_path, rows, cand, capsys)
    assert code == 0 and "0 improvements, 1 slower (not gated: --timing report)" in out, out
    assert "update the baseline?" not in out


def test_a_candidate_whose_own_spread_hides_a_slowdown_is_too_noisy_not_ok(tmp_path, rows, capsys):
    """A step twice as slow with a per-step spread as large used to widen its own tolerance and pass as ok."""
    cand = copy.deepcopy(rows)
    for i in _where(cand, "step_time_s", "002-stage-2"):
        cand[i]["value"] *= 2
        cand[i]["mad"] = cand[i]["value"] * 3
    paths = []
    for name, rs in (("base.jsonl", rows), ("cand.jsonl", cand)):
        paths.append(tmp_path / name)
        paths[-1].write_text("".join(json.dumps(r) + "\n" for r in rs))
    code = run_gate(str(paths[0]), str(paths[1]), 0.05, str(tmp_path / "p.jsonl"), timing="gate")
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "step_time_ratio" in x)
    assert "TOO NOISY" in line and "1 comparisons too noisy to judge" in out, out
    assert code == 0


def test_a_noise_model_too_wide_to_catch_a_doubling_is_too_noisy_not_ok(host_rows):
    """A noise model of few runs gives tolerances over 100%: a +50% change used to pass as ok."""
    from zerobench.bench.gate_rules import MAX_TOLERANCE, gate

    base = copy.deepcopy(host_rows)
    for r in base:
        if r["metric"] == "gate_noise" and r["of"] == "host_cpu_s":
            r["value"], r["n"] = 0.5, 2  # sigma 50% from two runs
    cand = copy.deepcopy(host_rows)
    for r in cand:
        if r["metric"] == "host_cpu_s" and r.get("phase") == "step":
            r["value"] *= 1.5
    res = gate(base, cand, false_alarm=0.001)
    x = next(c for c in res.comparisons if c.metric == "host_cpu_s")
    assert x.tolerance > MAX_TOLERANCE and x.verdict == "too noisy", x


def test_a_callgrind_run_without_its_own_status_row_is_incomplete(tmp_path, host_rows, capsys):
    """A run under callgrind that stopped before its status row used to take its timed twin's ``ok`` and have its
    instruction counts compared. Only sweeps from before the runner tagged that row (which left both tools' status
    rows untagged) are read that way."""
    measured = [r for r in host_rows if r["metric"] != "gate_noise"]
    cand = [r for r in measured if not (r["metric"] == "run_status" and r.get("instrumented"))]
    code, out = _gate(tmp_path, host_rows, cand, capsys)
    assert code == 1 and "not completed: stage=2 (run 001-stage-2 under callgrind: incomplete" in out, out
    assert "missing: stage=2: instructions" in out, out
    legacy = [dict(r, instrumented=None) if r["metric"] == "run_status" else r for r in measured]  # both untagged
    code, out = _gate(tmp_path, host_rows, legacy, capsys)
    assert code == 0 and "not completed" not in out, out
    # an --instructions sweep of that time on its own: its only untagged row is its status row
    status_row = next(r for r in legacy if r["metric"] == "run_status")
    alone = [r for r in legacy if r.get("instrumented") and r["metric"] != "run_status"] + [status_row]
    from zerobench.bench.gate_rules import run_statuses

    assert set(run_statuses(alone).values()) == {("ok", None)}


def test_a_noise_model_from_a_resumed_sweep_keeps_every_tool(tmp_path, host_rows):
    """The first sweep of a noise model had its timed run fail and complete on retry (run id -r2): the model was
    copied from the failed attempt's identity, so its rows read as that attempt's (incomplete, or a second run)."""
    from zerobench.bench.gate_rules import summarize
    from zerobench.bench.regress import write_baseline

    measured = [r for r in host_rows if r["metric"] != "gate_noise"]
    failed = [dict(r, status="failed", value=0, reason="killed") for r in measured if r["metric"] == "run_status"]
    failed = [r for r in failed if not r.get("instrumented")]
    retried = [dict(r, run_id=r["run_id"] + "-r2") if not r.get("instrumented") else r for r in measured]
    samples = [[*failed, *retried]]
    for k in (1.01, 0.99):
        samples.append([dict(r, value=r["value"] * k) if r["metric"] == "host_cpu_s" else r for r in measured])
    path = tmp_path / "base.jsonl"
    write_baseline(samples[0], path, more=samples[1:])
    base = [json.loads(line) for line in path.read_text().splitlines()]
    (d,) = summarize(base).values()
    assert d["ok"] and {"instructions", "host_cpu_s", "ops_dispatched"} <= set(d["noise"]), sorted(d["noise"])
    assert any(r.get("instrumented") and r["metric"] == "instructions" for r in base)  # the callgrind run is kept


def test_a_loss_row_without_a_step_is_no_traceback(tmp_path, rows, capsys):
    """A hand-made loss row with ``"step": null`` stopped the gate with ``'>' not supported between NoneType and
    int``; it reads as step 0, and the last step's loss is still the one compared."""
    cand = copy.deepcopy(rows)
    first = next(
        i
        for i in _where(cand, "loss", "000-stage-0")
        if cand[i]["step"] == min(cand[j]["step"] for j in _where(cand, "loss", "000-stage-0"))
    )
    cand[first]["step"] = None
    code, out = _gate(tmp_path, rows, cand, capsys)
    assert code == 0, out
