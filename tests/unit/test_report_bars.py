"""One record is one bar, on the committed ``quick-cpu-2core`` and ``c1-c5-cpu-2core`` sweeps: a bar seaborn draws
is the mean of the records under one (x, legend entry), so every figure gives each record an entry of its own. The
figures are drawn and their bars counted (the PNG itself is not written)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from zerobench.report import aggregate, figures, paper_figures
from zerobench.results import load

REF = Path(__file__).resolve().parents[2] / "results" / "reference"


def _bars(monkeypatch, module, draw) -> dict[str, list[float]]:
    """The heights of the bars ``draw()`` puts on each axis (by title), as ``module._save`` is handed them (seaborn's
    legend handles are patches of height 0; every bar here is above 0)."""
    got: dict[str, list[float]] = {}

    def spy(fig, out, name):
        for ax in fig.axes:
            got[ax.get_title()] = [h for p in ax.patches if math.isfinite(h := p.get_height()) and h > 0]
        plt.close(fig)
        return out / f"{name}.png"

    monkeypatch.setattr(module, "_save", spy)
    draw()
    return got


def test_every_record_is_a_bar_of_the_communication_figure(monkeypatch, tmp_path):
    """quick and C1-C5 hold five records at DP 2 TP 2 and stages 1-2: their bars were 'dp2 tp2' twice, each the mean
    of two or three records (13 records drawn as 10 bars)."""
    runs = aggregate.runs_table(pd.concat([load(REF / "quick-cpu-2core"), load(REF / "c1-c5-cpu-2core")]))
    drawn = runs[runs["comm_volume_elements_per_step"].notna() & (runs["dp"] > 1)]
    bars = _bars(monkeypatch, figures, lambda: figures.comm_volume(runs, tmp_path))
    (heights,) = bars.values()
    assert len(heights) == len(drawn) == 13
    assert sorted(heights) == [2.0] * 11 + [3.0] * 2


def test_every_record_is_a_bar_of_figs_7_and_8(monkeypatch, tmp_path):
    """C1-C5 measured at DP 2 and again at DP 4: the two records of each configuration were one bar, their mean (the
    variant names differences only between records of one layout, so both read 'tiny [cpu-2core]')."""
    src = REF / "c1-c5-cpu-2core"
    for f in sorted(src.rglob("rows.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        for r in rows:
            r["config"]["dp"], r["config_hash"] = 4, r["config_hash"][::-1]
        out = tmp_path / "dp4" / f.relative_to(src)
        out.parent.mkdir(parents=True)
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = aggregate.runs_table(pd.concat([load(src), load(tmp_path / "dp4")], ignore_index=True))
    assert len(runs) == 10
    series = paper_figures.fig678_series(runs)
    assert len(set(zip(runs["paper_config"], series))) == 10
    bars = _bars(monkeypatch, paper_figures, lambda: paper_figures.fig678_measured(runs, None, tmp_path))
    memory = [t for t in bars if t.startswith("Fig 7")]
    throughput = [t for t in bars if t.startswith("Fig 8")]
    assert len(bars[memory[0]]) == len(bars[throughput[0]]) == 10


def test_a_run_of_accumulated_micro_batches_is_not_drawn_against_one_micro_batchs_lines(monkeypatch, tmp_path):
    """Stages 2-3 reduce every micro-batch, so a step of A = 2 micro-batches moves 3Ψ at stage 2 and 6Ψ at stage 3:
    drawn beside the 2Ψ/3Ψ lines it read as a regression of the engine (a reviewer's run). Such records stay out."""
    runs = aggregate.runs_table(load(REF / "quick-cpu-2core"))
    assert (runs["grad_accum"] == 1).all()
    drawn = runs[runs["comm_volume_elements_per_step"].notna() & (runs["dp"] > 1)]
    runs.loc[drawn.index[0], "grad_accum"] = 2
    bars = _bars(monkeypatch, figures, lambda: figures.comm_volume(runs, tmp_path))
    (heights,) = bars.values()
    assert len(heights) == len(drawn) - 1
