"""What one record of the report is, on the committed ``quick-cpu-2core`` sweep (copied and changed): a run's
figures are read with the provenance of the rows that hold them, not of its ``run_status`` row (written by whoever
recorded the run's end: under Slurm the submit host); and repeats on another processor or torch version are records
of their own, named so, never a median across machines or builds."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from zerobench.report import aggregate, render
from zerobench.report.comparison import comparison_table
from zerobench.report.offload import offload_table
from zerobench.results import load

REF = Path(__file__).resolve().parents[2] / "results" / "reference"
QUICK = REF / "quick-cpu-2core"
LOGIN = {"class": "login-node", "count": 1, "device": "Intel Xeon (submit host)", "kind": "cpu"}


def _copy(dst: Path, change=None, src: Path = QUICK) -> Path:
    """``src``'s rows files under ``dst``, each row passed through ``change`` (which edits it in place)."""
    for f in sorted(src.rglob("rows.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        for r in rows:
            if change is not None:
                change(r)
        out = dst / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dst


def _submit_host(r: dict) -> None:
    if r["metric"] == "run_status":
        r["provenance"].update(hardware=dict(LOGIN), torch_version="2.9.0+cpu")


def test_a_status_row_stamped_by_the_submit_host_is_no_hardware_of_the_run(tmp_path):
    df = load(_copy(tmp_path / "slurm", _submit_host))
    runs = aggregate.runs_table(df)
    assert set(runs["hardware"]) == {"cpu-2core"} and set(runs["device"]) == {"AMD EPYC"}
    assert len(runs) == len(aggregate.runs_table(load(QUICK)))  # no record of status rows alone
    prov = render._provenance(df)
    assert (prov["hardware"], prov["hardware_classes"], prov["torch"]) == (["AMD EPYC"], ["cpu-2core"], ["2.13.0+cpu"])


def test_the_offload_table_puts_a_status_row_in_its_run_s_class():
    def row(metric, value, hardware, status="ok"):
        return {
            "run_id": "a",
            "metric": metric,
            "value": value,
            "status": status,
            "rank": 0 if metric != "run_status" else None,
            "config": {
                "system": "zerobench",
                "memory_budget_bytes": 2**33,
                "model": {"layers": 8, "hidden": 64, "heads": 4, "vocab": 128, "seq": 32},
                "zero": {"stage": 2, "offload_optimizer": "cpu", "offload_param": "none"},
            },
            "config_hash": "h",
            "provenance": {"hardware": dict(hardware)},
        }

    rows = [row("step_time_s", 1.0, {"class": "gpu-x"}), row("run_status", 1, LOGIN)]
    t = offload_table(pd.json_normalize(rows, sep="."))
    assert list(t["hardware"]) == ["gpu-x"] and list(t["fits"]) == ["yes"]


@pytest.mark.parametrize(
    "field, value, tag",
    [("device", "Intel Xeon", "device=Intel Xeon"), ("torch_version", "2.14.0+cpu", "torch=2.14.0+cpu")],
)
def test_another_processor_or_torch_is_a_record_of_its_own(tmp_path, field, value, tag):
    """Before, the two copies were two repeats of one record: the median of both machines' step times, labelled
    with the first row's device."""

    def other(r):
        if field == "device":
            r["provenance"]["hardware"]["device"] = value
        else:
            r["provenance"]["torch_version"] = value
        if r["metric"] in ("step_time_s", "tflops_per_gpu"):
            r["value"] *= 3.0 if r["metric"] == "step_time_s" else 1 / 3.0

    one = aggregate.runs_table(load(QUICK))
    df = pd.concat([load(_copy(tmp_path / "a")), load(_copy(tmp_path / "b", other))], ignore_index=True)
    runs = aggregate.runs_table(df)
    assert len(runs) == 2 * len(one) and (runs["repeats"] == 1).all()
    mine = runs["variant"] == tag
    assert mine.sum() == len(one) and runs.loc[~mine, "variant"].str.startswith(("device=", "torch=")).all()
    key = ["stage", "dp"]
    theirs = runs[mine].set_index(key)["step_time_s"].sort_index()
    assert theirs.to_list() == pytest.approx((3.0 * one.set_index(key)["step_time_s"].sort_index()).to_list())
    table = comparison_table(runs)
    assert (table[table["stage"] == 0]["vs_DP_throughput"] == 1.0).all()  # each machine's own baseline
    ratios = table.groupby("variant")["vs_DP_throughput"].apply(lambda s: s.round(9).tolist())
    assert ratios.iloc[0] == ratios.iloc[1]  # a ratio within one machine, not across two


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_run_whose_loss_diverged_is_named_non_finite_not_counted(tmp_path, bad):
    """A NaN or infinite loss at step 4 left the run's step time and memory in the tables as a data point."""
    diverged = "004-stage-1-dp-2"

    def change(r):
        if r["run_id"] == diverged and r["metric"] == "loss" and r["step"] == 4:
            r["value"] = bad

    df = load(_copy(tmp_path / "x", change))
    assert aggregate.run_statuses(df) == {aggregate.NON_FINITE: [diverged]}
    runs = aggregate.runs_table(df)
    assert len(runs) == len(aggregate.runs_table(load(QUICK))) - 1
    assert runs[(runs["stage"] == 1) & (runs["dp"] == 2)].empty


@pytest.mark.parametrize(
    "field, value",
    [("layers", None), ("layers", "2"), ("layers", [2]), ("hidden", 64.5), ("hidden", 1e400), ("hidden", "missing")],
)
def test_rows_without_an_integer_model_shape_are_one_line(tmp_path, capsys, field, value):
    """The figures label a record by its layers and hidden size: a missing or non-integer one ended ``zerobench
    report`` in a traceback from ``int()``, where a bad stage, DP or TP was already one line."""
    from tests.unit.test_bad_inputs import assert_one_line, run

    def change(r):
        if value == "missing":
            r["config"]["model"].pop(field)
        else:
            r["config"]["model"][field] = value

    d = _copy(tmp_path / "x", change)
    code, err = run(["report", str(d), "--out", str(tmp_path / "r")], capsys)
    shown = None if value == "missing" else float("inf") if value == 1e400 else value
    assert_one_line(code, err, f"their config's model.{field} is {shown!r}, not an integer")
