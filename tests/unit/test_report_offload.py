"""The report's one-card offload table from rows: systems named, OOM probes kept, medians over repeats."""

import pandas as pd
import pytest

from zerobench.report.offload import offload_table

GiB = 2**30


def row(
    run, metric, value, *, system="zerobench", stage=2, offload="none", layers=8, budget=8 * GiB, status="ok", rank=0
):
    return {
        "run_id": run,
        "metric": metric,
        "value": value,
        "status": status,
        "rank": rank,
        "config": {
            "system": system,
            "memory_budget_bytes": budget,
            "preset": "small",
            "model": {"layers": layers, "hidden": 64, "heads": 4, "vocab": 128, "seq": 32},
            "zero": {"stage": stage, "offload_optimizer": offload, "offload_param": "none"},
        },
        "config_hash": f"{system}-{stage}-{offload}-{layers}-{budget}",
        "provenance": {"hardware": {"class": "gpu-x"}},
    }


def frame(rows):
    return pd.json_normalize(rows, sep=".")


def test_fits_oom_and_medians():
    rows = [
        # zerobench stage 2 with optimizer offload, two repeats: medians of step time and peak
        *(
            row(r, m, v, offload="cpu", layers=16)
            for r, m, v in [
                ("a", "step_time_s", 1.0),
                ("b", "step_time_s", 3.0),
                ("a", "tflops_per_gpu", 40.0),
                ("b", "tflops_per_gpu", 20.0),
                ("a", "peak_memory_bytes", 7 * GiB),
                ("b", "peak_memory_bytes", 7 * GiB),
                ("a", "host_model_state_bytes", 48 * GiB),
                ("b", "host_model_state_bytes", 48 * GiB),
            ]
        ),
        row("a", "peak_memory_bytes", 99 * GiB, offload="cpu", layers=16, rank=1),  # rank 1 is not read
        # DeepSpeed ZeRO-Offload ran out of memory at the same size: a status row only
        row("c", "run_status", 0, system="deepspeed-2-offload", layers=16, status="oom", rank=None),
        # no offload, fits at 8 layers
        row("d", "step_time_s", 0.07, stage=0),
        row("d", "peak_memory_bytes", 6 * GiB, stage=0),
        # a run without budget or offload is not this table's
        row("e", "step_time_s", 0.5, budget=None, layers=4),
    ]
    t = offload_table(frame(rows)).set_index("system")
    assert list(t.index) == ["zerobench-0", "deepspeed-2-offload", "zerobench-2-offload"]  # by model size
    z = t.loc["zerobench-2-offload"]
    assert (z["fits"], z["runs"], z["step_ms"], z["tflops_per_gpu"]) == ("yes", 2, 2000, 30.0)
    assert z["device_peak_GiB"] == 7.0 and z["host_states_GiB"] == 48.0 and z["budget_GiB"] == 8.0
    d = t.loc["deepspeed-2-offload"]
    assert d["fits"] == "OOM" and pd.isna(d["step_ms"])
    assert (
        d["params_B"]
        == z["params_B"]
        == pytest.approx((128 * 64 + 32 * 64 + 16 * (12 * 64 * 64 + 13 * 64) + 128) / 1e9)
    )
    assert t.loc["zerobench-0", "step_ms"] == 70


def test_no_budget_or_offload_rows_give_an_empty_table():
    assert offload_table(frame([row("e", "step_time_s", 0.5, budget=None)])).empty


def _runs(rows_file, hardware="gpu-x", step=1.0, **kw):
    """One stage-2 offload run "a" of one configuration, as read from ``rows_file``."""
    out = []
    for metric, value in (("step_time_s", step), ("peak_memory_bytes", 7 * GiB)):
        r = row("a", metric, value, offload="cpu", **kw)
        r["rows_file"], r["provenance"]["hardware"]["class"] = rows_file, hardware
        out.append(r)
    return out


def test_one_run_id_in_two_directories_is_two_repeats():
    t = offload_table(frame(_runs("x/rows.jsonl", step=1.0) + _runs("y/rows.jsonl", step=3.0)))
    assert len(t) == 1
    assert (t.loc[0, "runs"], t.loc[0, "step_ms"]) == (2, 2000)  # the median of both, not the last one's 3000


def test_each_hardware_class_is_its_own_row():
    t = offload_table(frame(_runs("x/rows.jsonl", "cpu-2core", 1.0) + _runs("y/rows.jsonl", "gpu-x", 0.01)))
    got = dict(zip(t["hardware"], t["step_ms"]))
    assert got == {"cpu-2core": 1000, "gpu-x": 10}


def test_runs_under_a_measuring_tool_are_not_timings():
    slow = _runs("y/rows.jsonl", step=30.0)
    for r in slow:
        r["instrumented"] = "callgrind"
    t = offload_table(frame(_runs("x/rows.jsonl", step=1.0) + slow))
    assert (t.loc[0, "runs"], t.loc[0, "step_ms"]) == (1, 1000)
