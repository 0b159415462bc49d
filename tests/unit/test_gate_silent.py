"""The gate never passes what it should refuse or fail (a helper's review, each case reproduced on copies of the
committed ``cpu-2core`` baseline, then changed): before, each of these exited 0.

- a 16-bit run's NaN final loss (the loss was skipped for any precision but fp32 before its finite check);
- a configuration that failed in the candidate where the baseline's run of it failed too;
- one rank's rows of a metric in another unit than the other ranks' (only the first row's unit was read);
- runs on gloo against runs on NCCL (``backend_ran``), as kernel paths are refused;
- a candidate step time too noisy to judge, judged ``ok`` once the baseline had a noise model for it;
- a baseline written from a stopped sweep one directory down (``DIR/timed/``), which left a configuration in the
  noise model only, never gated.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tests.unit.test_bad_inputs import run
from tests.unit.test_results_whole import _write

BASELINE = Path(__file__).resolve().parents[2] / "results" / "baselines" / "cpu-2core.jsonl"
ROWS = [json.loads(line) for line in BASELINE.read_text().splitlines() if line.strip()]
STAGE3 = next(r["config_hash"] for r in ROWS if r["run_id"] == "003-stage-3")


def _gate(capsys, base: Path, cand: Path, *extra: str) -> tuple[int, str]:
    code, err = run(
        ["regress", "--baseline", str(base), "--candidate", str(cand), "--timing", "report", *extra], capsys
    )
    return code, err


def _gate_out(capsys, base: Path, cand: Path) -> tuple[int, str]:
    from zerobench.cli import main

    code = main(["regress", "--baseline", str(base), "--candidate", str(cand), "--timing", "report"])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_nan_loss_of_a_bf16_run_fails(tmp_path, capsys):
    base = copy.deepcopy(ROWS)
    for r in base:
        r["config"]["zero"]["precision"] = "bf16"
    cand = copy.deepcopy(base)
    for r in cand:
        if r["config_hash"] == STAGE3 and r["metric"] == "loss" and r["step"] >= 5:
            r["value"] = float("nan")
    code, out = _gate_out(capsys, _write(tmp_path / "b", base) / "rows.jsonl", _write(tmp_path / "c", cand))
    assert code == 1 and "NOT FINITE" in out and "final_loss" in out, out


def test_a_configuration_that_failed_on_both_sides_fails(tmp_path, capsys):
    base = [r for r in copy.deepcopy(ROWS) if r["config_hash"] != STAGE3 or r["metric"] == "run_status"]
    for r in base:
        if r["config_hash"] == STAGE3:
            r["status"], r["reason"] = "failed", "RuntimeError: boom"
    code, out = _gate_out(capsys, _write(tmp_path / "b", base) / "rows.jsonl", _write(tmp_path / "c", base))
    assert code == 1 and "failed: stage=3 (failed; the baseline's run failed too)" in out, out


def test_one_rank_s_rows_in_another_unit_are_refused(tmp_path, capsys):
    cand = copy.deepcopy(ROWS)
    for r in cand:
        if r["config_hash"] == STAGE3 and r["metric"] == "peak_memory_bytes" and r.get("rank") == 1:
            r["unit"] = "MiB"
    code, err = _gate(capsys, BASELINE, _write(tmp_path / "c", cand))
    assert code == 2 and "peak_memory_bytes rank 1 is in MiB where other rows of it are in bytes" in err, err


def test_runs_on_two_backends_are_refused(tmp_path, capsys):
    base, cand = copy.deepcopy(ROWS), copy.deepcopy(ROWS)
    for rows, backend in ((base, "nccl"), (cand, "gloo")):
        for r in rows:
            if r["metric"] != "run_status":
                r["backend_ran"] = backend
    code, err = _gate(capsys, _write(tmp_path / "b", base) / "rows.jsonl", _write(tmp_path / "c", cand))
    assert code == 2 and "ran on gloo in the candidate and on nccl in the baseline" in err, err


def test_a_baseline_from_a_sweep_stopped_one_directory_down_is_refused(tmp_path, capsys):
    from zerobench.bench.sweep_state import PLAN_FILE

    runs = sorted({(r["label"], r["config_hash"]) for r in ROWS if r["metric"] == "run_status" and r.get("label")})
    stopped = _write(tmp_path / "1" / "timed", [r for r in ROWS if r["config_hash"] != STAGE3])
    plan = {"suite": "ci", "runs": [{"label": label, "config_hash": h} for label, h in runs]}
    (stopped / PLAN_FILE).write_text(json.dumps(plan))
    whole = _write(tmp_path / "2" / "timed", ROWS)
    (whole / PLAN_FILE).write_text(json.dumps(plan))
    argv = ["regress", "--write-baseline", str(tmp_path / "base.jsonl"), "--candidate", str(tmp_path / "1")]
    code, err = run([*argv, str(tmp_path / "2")], capsys)
    assert code == 2 and "the sweep stopped before 1 of its planned runs (timed/stage=3)" in err, err
    assert not (tmp_path / "base.jsonl").exists()


@pytest.mark.parametrize("noise_model", [False, True])
def test_a_step_time_its_own_spread_hides_stays_too_noisy_with_a_noise_model(noise_model, tmp_path, capsys):
    """A candidate 60% slower whose own per-step spread (``mad``) is 80% of its step: too noisy to judge, with or
    without the baseline's noise model (with it, before, a REGRESSION; with a wide one, ``ok``)."""
    from zerobench.bench.regress import noise_rows

    samples = [copy.deepcopy(ROWS) for _ in range(5)]
    for i, rows in enumerate(samples):
        for r in rows:
            if r["metric"] == "step_time_s" and r["config_hash"] == STAGE3:
                r["value"] *= 1 + 0.01 * i
    base = samples[0] + (noise_rows(samples)[0] if noise_model else [])
    cand = copy.deepcopy(ROWS)
    for r in cand:
        if r["metric"] == "step_time_s" and r["config_hash"] == STAGE3:
            r["value"] *= 1.6
            r["mad"] = 0.8 * r["value"]
    code, out = _gate_out(capsys, _write(tmp_path / "b", base) / "rows.jsonl", _write(tmp_path / "c", cand))
    line = next((ln for ln in out.splitlines() if "stage=3" in ln and "step_time_ratio" in ln), "")
    assert "TOO NOISY" in line and code == 0, out  # listed as not gated, neither ok nor a regression
