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
