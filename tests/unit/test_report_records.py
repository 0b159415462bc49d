"""What one record of the report is, on the committed ``quick-cpu-2core`` sweep (copied and changed): a run's
figures are read with the provenance of the rows that hold them, not of its ``run_status`` row (written by whoever
recorded the run's end: under Slurm the submit host)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from zerobench.report import aggregate, render
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
