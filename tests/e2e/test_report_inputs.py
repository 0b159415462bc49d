"""Every committed results directory renders, and so do sweeps that trained nothing successfully."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from tests.e2e.test_cli_train import zb
from zerobench.report.render import render

REPO = Path(__file__).resolve().parents[2]
COMMITTED = sorted(p for p in (REPO / "results" / "reference").iterdir() if p.is_dir())
SAME_FORMAT = "sim-validation-cpu-2core"
"""The simulator's validation recordings share one format: the fast tier renders the latest, the full tier every
one (5 s each)."""


def _tiered(p: Path):
    slow = p.name.startswith(SAME_FORMAT) and p.name != f"{SAME_FORMAT}-xeon-5"
    return pytest.param(p, marks=pytest.mark.slow, id=p.name) if slow else pytest.param(p, id=p.name)


def test_there_are_committed_results():
    assert len(COMMITTED) >= 7


@pytest.mark.parametrize(
    "results", [_tiered(p) for p in COMMITTED + sorted((REPO / "results" / "baselines").glob("*.jsonl"))]
)
def test_every_committed_results_directory_renders(results, tmp_path):
    with warnings.catch_warnings():  # nothing printed at the user: a baseline file (no ledger rows) drew an empty
        warnings.simplefilter("error", UserWarning)  # memory chart and matplotlib warned of its legend
        html = render([str(results)], tmp_path / "report")
    assert html.exists() and html.stat().st_size > 1000
    assert (tmp_path / "report" / "summary.md").read_text().strip()


@pytest.mark.slow
def test_a_sweep_where_every_run_ran_out_of_memory_renders(tmp_path):
    suite = tmp_path / "oom.yaml"
    suite.write_text(
        "name: oom\nbase: {preset: tiny, steps: 2, warmup: 0, dp: 1}\naxes: {memory_budget: [64KiB, 96KiB]}\n"
    )
    out = tmp_path / "runs"
    r = zb("sweep", str(suite), "--out", str(out), "--no-progress", "--allow-failures", timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(" oom ") == 2, r.stdout
    r = zb("report", str(out), "--out", str(tmp_path / "report"), timeout=300)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "report" / "summary.md").read_text()
    assert "OOM" in md, md
