"""Which stage-0 run the baseline-DP-vs-ZeRO table divides by, on the committed ``quick-cpu-2core`` sweep (copied and
changed): where a workload has stage-0 runs of two lengths (steps, warm-up, seed) they are named apart, a ZeRO run is
divided by the one of its own length, and where none has its length it gets no ratio and a note saying why; a ZeRO
run whose stage-0 run failed or measured a non-finite figure is listed, with blank ratios and a note naming it."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from tests.unit.test_report_records import _copy
from zerobench.report import aggregate
from zerobench.report.comparison import comparison_table
from zerobench.results import load

BASE = "001-stage-0-dp-2"


def _steps(n: int, only: str | None = None, scale: float = 1.0):
    def change(r):
        if only is not None and r["run_id"] != only:
            return
        if r["run_id"] == BASE:
            r["config"]["steps"], r["config_hash"] = n, f"{r['config_hash']}-{n}"
            if r["metric"] == "tflops_per_gpu":
                r["value"] *= scale

    return change


def _dp2(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["dp"] == 2]


def test_stage_0_runs_of_two_lengths_are_named_and_each_run_has_its_own(tmp_path):
    """Before, the second stage-0 run of DP 2 (12 steps, twice the throughput) read 'vs DP 2.0' against the first and
    the ZeRO stages were divided by whichever came first, with no variant to tell the two apart."""
    df = pd.concat(
        [load(_copy(tmp_path / "a")), load(_copy(tmp_path / "b", _steps(12, BASE, scale=2.0)))], ignore_index=True
    )
    table = _dp2(comparison_table(aggregate.runs_table(df)))
    base = table[table["stage"] == 0].set_index("variant")
    assert sorted(base.index) == ["steps=12", "steps=6"] and (base["vs_DP_throughput"] == 1.0).all()
    six = base.loc["steps=6", "tflops_per_gpu"]
    assert base.loc["steps=12", "tflops_per_gpu"] == 2.0 * six
    zero = table[table["stage"] > 0]
    assert list(zero["vs_DP_throughput"]) == list(zero["tflops_per_gpu"] / six)  # the 6-step baseline's, as they
    assert "note" not in table or not table["note"].any()


def test_a_run_none_of_whose_baselines_has_its_length_gets_no_ratio_and_a_note(tmp_path):
    """Stage 0 of DP 2 at 12 and 20 steps, the ZeRO stages at 6: either would be a choice the table does not show."""
    df = pd.concat(
        [load(_copy(tmp_path / "a", _steps(12))), load(_copy(tmp_path / "b", _steps(20, BASE)))], ignore_index=True
    )
    table = _dp2(comparison_table(aggregate.runs_table(df)))
    zero = table[table["stage"] > 0]
    assert len(zero) == 3 and zero["vs_DP_throughput"].map(math.isnan).all() and zero["vs_DP_memory"].isna().all()
    assert zero["tflops_per_gpu"].notna().all()  # the run is listed, its own figures shown
    note = zero["note"].iloc[0]
    assert "2 stage-0 runs of this workload (steps=12; steps=20)" in note and "none of this run's length" in note


def _failed(r):
    if r["run_id"] == BASE and r["metric"] == "run_status":
        r["status"], r["reason"] = "failed", "rank 1 exited with code 1 (RuntimeError: boom)"


def _infinite(r):
    if r["run_id"] == BASE and r["metric"] == "tflops_per_gpu":
        r["value"] = math.inf


@pytest.mark.parametrize("change, status", [(_failed, "failed"), (_infinite, "non-finite")])
def test_zero_runs_whose_baseline_did_not_count_are_listed_with_a_note(tmp_path, change, status):
    """Before, stages 1-3 of DP 2 vanished from the table without a word when their stage-0 run failed or measured
    an infinite figure."""
    from zerobench.report.render import render

    note = f"no ratio: the stage-0 run of this workload is not counted ({BASE}: {status})"
    render([str(_copy(tmp_path / "a", change))], str(tmp_path / "report"))
    assert (tmp_path / "report" / "summary.md").read_text().count(note) == 3

    from zerobench.report.comparison import missed_baselines

    df = load(tmp_path / "a")
    table = _dp2(comparison_table(aggregate.runs_table(df), None, missed_baselines(df)))
    assert list(table["stage"]) == [1, 2, 3]
    assert table["vs_DP_throughput"].isna().all() and table["vs_DP_memory"].isna().all()
    assert table["tflops_per_gpu"].notna().all() and table["model_states_MiB"].notna().all()
    assert set(table["note"]) == {note}
    assert not comparison_table(aggregate.runs_table(df), None, missed_baselines(df))["note"].iloc[0]  # DP 1's
