"""Which path the kernels took is part of what a run measured: ``kernels="auto"`` takes the reference path where the
fused kernels do not load (no C++ compiler, no Triton, a change that broke their build), and the config says
``auto`` either way. Runs record the path (``kernels_ran``); the report keeps runs and max-size searches of two paths
apart, and the gate refuses to compare them. Before, nothing in the rows told the two apart."""

from __future__ import annotations

import pandas as pd
import pytest

from zerobench.bench.gate_inputs import check_same_kernels
from zerobench.bench.spec import RunSpec, to_train_config
from zerobench.config import ConfigError
from zerobench.report import aggregate
from zerobench.report.comparison import comparison_table
from zerobench.report.maxsize import maxsize_table
from zerobench.results import load
from zerobench.results.rows import RowWriter

FUSED = {"model": "fused", "optimizer": "fused"}
REFERENCE = {"model": "reference", "optimizer": "reference"}


def _row(run, path, config_hash="abc"):
    return {"run_id": run, "config_hash": config_hash, "metric": "step_time_s", "value": 1.0, "kernels_ran": path}


def test_the_gate_refuses_runs_whose_kernels_took_two_paths():
    with pytest.raises(ConfigError, match=r"run s0's kernels took model=reference, optimizer=reference in the cand"):
        check_same_kernels([[_row("s0", FUSED)], [_row("s0", REFERENCE)]], ["the baseline", "the candidate"])


def test_the_gate_takes_one_path_and_rows_that_record_none():
    check_same_kernels([[_row("s0", FUSED)], [_row("s0", FUSED)]], ["a", "b"])
    check_same_kernels([[_row("s0", None)], [_row("s0", REFERENCE)]], ["a", "b"])  # a baseline of before
    check_same_kernels([[_row("s0", FUSED)], [_row("s1", REFERENCE, "def")]], ["a", "b"])  # other configurations


def _run(out, stage, path, **spec):
    cfg = to_train_config(RunSpec(preset="tiny", dp=2, precision="bf16", layers=2, stage=stage, **spec))
    w = RowWriter(out / f"stage{stage}", f"stage-{stage}", cfg, suite="t", tags={"kernels_ran": path})
    w.write("model_state_bytes", 6000.0 / (1 + stage), "bytes")
    w.write("tflops_per_gpu", 1.0 if path == FUSED else 0.5, "TFLOP/s")
    RowWriter(out / f"stage{stage}", f"stage-{stage}", cfg, suite="t").write("run_status", None, "", status="ok")


def test_the_report_keeps_runs_of_two_kernel_paths_apart(tmp_path):
    """The same config run where the fused kernels loaded and where they did not: two records, named apart, each
    paired with its own path's baseline."""
    for path, d in ((FUSED, "a"), (REFERENCE, "b")):
        _run(tmp_path / d, 0, path)
        _run(tmp_path / d, 3, path)
    runs = aggregate.runs_table(load(tmp_path))
    assert len(runs) == 4
    assert set(runs["variant"]) == {
        "kernels_ran=model=fused, optimizer=fused",
        "kernels_ran=model=reference, optimizer=reference",
    }
    table = comparison_table(runs)
    assert (table["vs_DP_throughput"] == 1.0).all()  # each stage 3 against its own path's stage 0


@pytest.mark.parametrize("probes", ["fused", "reference"])
def test_a_search_sizes_only_runs_of_its_own_kernel_path(tmp_path, probes):
    import argparse

    from zerobench.bench.maxsize import MaxSizeResult
    from zerobench.cli.training import _write_maxsize_rows

    _run(tmp_path / "runs", 0, FUSED, micro_batch=2)
    _run(tmp_path / "runs", 3, FUSED, micro_batch=2)
    args = argparse.Namespace(
        out=str(tmp_path / "ms"), offload_optimizer="none", offload_param="none", optim_bits=32, budget="4MiB",
        max_layers=64,
    )  # fmt: skip
    for stage, found in ((0, 3), (3, 6)):
        spec = RunSpec(preset="tiny", dp=2, precision="bf16", micro_batch=2, stage=stage)
        path = FUSED if probes == "fused" else REFERENCE
        _write_maxsize_rows(args, spec, MaxSizeResult(found, 1000 * found, {found: "ok"}, path))
    df = pd.concat([load(tmp_path / "runs"), load(tmp_path / "ms")], ignore_index=True)
    sizes = maxsize_table(df)
    assert sizes["sized"].str.contains(f"model={probes}").all()
    s3 = comparison_table(aggregate.runs_table(df), sizes).set_index("stage").loc[3]
    if probes == "fused":
        assert s3["vs_DP_max_model"] == 2.0, s3
    else:  # the fused runs are not sized by reference-path probes
        assert pd.isna(s3["max_model_M_params"]), s3
