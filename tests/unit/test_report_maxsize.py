"""The report's max-model-size figures (Fig 4, Fig 6) and the baseline-DP-vs-ZeRO table's max-model column draw each
search configuration apart and pair a training run only with searches of its own workload and code.

Before, a bar or a cell took searches by stage, DP, TP, preset, precision and budget alone: searches of two
micro-batches (or 8-bit moments, or two commits) drawn under one label were averaged by the bar plot or reduced by
``.max()``, the table paired runs of micro-batch 2 with searches of micro-batch 1 (the committed reference did), a
capped search's "at least" was dropped from the table and Fig 6, and a search repeated into one ``--out`` took the
first search's bound for the second's answer."""

from __future__ import annotations

import argparse
import json
import math

import pandas as pd
import pytest

from zerobench.bench.maxsize import MaxSizeResult
from zerobench.bench.spec import RunSpec, to_train_config
from zerobench.cli.training import _write_maxsize_rows
from zerobench.report import aggregate
from zerobench.report.comparison import comparison_table
from zerobench.report.maxsize import maxsize_table
from zerobench.results import load
from zerobench.results.rows import RowWriter

SHAPE = {"preset": "tiny", "dp": 2, "precision": "bf16"}


def _search(out, stage, found, *, limit=64, budget="4MiB", **spec):
    """One stage's answer rows, as ``zerobench maxsize --out`` writes them."""
    args = argparse.Namespace(
        out=str(out), offload_optimizer="none", offload_param="none", optim_bits=32, budget=budget, max_layers=limit
    )
    run = RunSpec(**{**SHAPE, "micro_batch": 2, **spec, "stage": stage})
    params = to_train_config(RunSpec(**{**SHAPE, **spec, "layers": found})).model
    _write_maxsize_rows(args, run, MaxSizeResult(found, 1000 * found + params.hidden, {found: "ok"}))


def _run(out, stage, **spec):
    """A training run's rows, as a sweep's worker writes them: its resolved config, two figures, its status."""
    cfg = to_train_config(RunSpec(**{**SHAPE, "micro_batch": 2, "layers": 2, **spec, "stage": stage}))
    w = RowWriter(out / "runs" / f"stage{stage}", f"stage-{stage}", cfg, suite="t")
    w.write("model_state_bytes", 6000.0 / (1 + stage), "bytes")
    w.write("tflops_per_gpu", 1.0, "TFLOP/s")
    w.write("run_status", None, "", status="ok")


def _recommit(path, commit):
    """The rows of ``path`` as if another commit had written them."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for r in rows:
        r["provenance"] = {**r["provenance"], "commit": commit, "dirty": False, "dirty_diff": None}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _tables(*dirs):
    df = pd.concat([load(d) for d in dirs], ignore_index=True)
    sizes = maxsize_table(df)
    return sizes, comparison_table(aggregate.runs_table(df), sizes)


def _stage3(table):
    return table[table["stage"] == 3].iloc[0]


def test_a_run_is_paired_with_the_searches_of_its_own_workload(tmp_path):
    _run(tmp_path, 0)
    _run(tmp_path, 3)
    _search(tmp_path / "mb2", 0, 3)
    _search(tmp_path / "mb2", 3, 6)
    _search(tmp_path / "mb1", 0, 5, micro_batch=1)
    _search(tmp_path / "mb1", 3, 12, micro_batch=1)
    sizes, table = _tables(tmp_path)
    s3 = _stage3(table)
    assert s3["max_model_M_params"] * 1e6 == 6064 and s3["vs_DP_max_model"] == pytest.approx(6064 / 3064)
    assert s3["max_model_bound"] == "" and s3["vs_DP_max_model_bound"] == ""
    # Fig 4 draws the two micro-batches as two settings, each named by what sets it apart
    labels = set(sizes["label"])
    assert len(labels) == 2 and all("micro_batch=" in x for x in labels), labels


def test_searches_of_another_micro_batch_or_commit_give_no_max_model(tmp_path):
    _run(tmp_path, 0)
    _run(tmp_path, 3)
    _search(tmp_path / "mb1", 0, 5, micro_batch=1)
    _search(tmp_path / "mb1", 3, 12, micro_batch=1)
    _search(tmp_path / "old", 0, 3)
    _search(tmp_path / "old", 3, 6)
    _recommit(tmp_path / "old" / "rows.jsonl", "0" * 40)
    sizes, table = _tables(tmp_path)
    s3 = _stage3(table)
    assert math.isnan(s3["max_model_M_params"]) and math.isnan(s3["vs_DP_max_model"]), s3
    assert len(set(sizes["label"])) == 2  # the old commit's bars are drawn apart, named by their commit
    assert any("@0000000" in x for x in sizes["label"]), set(sizes["label"])


def test_a_capped_search_stays_at_least_in_the_table_and_figures(tmp_path):
    _run(tmp_path, 0)
    _run(tmp_path, 3)
    _search(tmp_path, 0, 3)
    _search(tmp_path, 3, 8, limit=8)  # the limit itself fit: the largest model is beyond it
    sizes, table = _tables(tmp_path)
    s3 = _stage3(table)
    assert s3["max_model_bound"] == "at least" and s3["vs_DP_max_model_bound"] == "at least"
    assert sizes.set_index("stage").loc[3, "at_least"]
    base = table[table["stage"] == 0].iloc[0]
    assert base["max_model_bound"] == ""


def test_a_capped_baseline_bounds_the_ratio_from_above(tmp_path):
    _run(tmp_path, 0)
    _run(tmp_path, 3)
    _search(tmp_path, 0, 3, limit=3)
    _search(tmp_path, 3, 6)
    _, table = _tables(tmp_path)
    assert _stage3(table)["vs_DP_max_model_bound"] == "at most"


def test_a_search_repeated_into_one_out_keeps_its_own_bound(tmp_path):
    """The first search's limit fit (at least 4 layers); the second, with a higher limit, found 6: the answer is 6,
    and exact."""
    _search(tmp_path, 3, 4, limit=4)
    _search(tmp_path, 3, 6, limit=64)
    sizes, _ = _tables(tmp_path)
    assert len(sizes) == 1, sizes
    row = sizes.iloc[0]
    assert row["max_layers"] == 6 and not row["at_least"] and row["repeats"] == 2


def test_a_repeated_search_that_never_found_the_edge_keeps_its_best_lower_bound(tmp_path):
    _search(tmp_path, 3, 4, limit=4)
    _search(tmp_path, 3, 8, limit=8)
    sizes, _ = _tables(tmp_path)
    row = sizes.iloc[0]
    assert row["max_layers"] == 8 and row["at_least"]


def test_fig6_and_its_runs_draw_variants_apart(tmp_path):
    """C1 runs of two micro-batches were one bar, their mean."""
    from zerobench.report.paper_figures import fig678_series

    flags = {"checkpoint_activations": True, "md": True}
    _run(tmp_path / "a", 1, **flags)
    _run(tmp_path / "b", 1, micro_batch=4, **flags)
    runs = aggregate.runs_table(pd.concat([load(tmp_path / "a"), load(tmp_path / "b")], ignore_index=True))
    runs = runs[runs["paper_config"].notna()]
    assert len(runs) == 2 and len(set(fig678_series(runs))) == 2


def test_the_max_model_column_compares_one_budget(tmp_path):
    """A stage-0 search at another budget beside the stage-3 one gave 'vs DP max model 0.812': 4 MiB against
    8 MiB."""
    _run(tmp_path, 0)
    _run(tmp_path, 3)
    _search(tmp_path / "a", 0, 3)
    _search(tmp_path / "b", 0, 9, budget="8MiB")
    _search(tmp_path / "a", 3, 6)
    s3 = _stage3(_tables(tmp_path)[1])
    assert (s3["max_model_budget"], s3["vs_DP_max_model"]) == ("4MiB", pytest.approx(6064 / 3064))
    _search(tmp_path / "b", 3, 12, budget="8MiB")  # which budget the row means is not said
    s3 = _stage3(_tables(tmp_path)[1])
    assert s3["max_model_budget"] is None and math.isnan(s3["vs_DP_max_model"])
