"""A report is whole or refused, as users reach it (a helper's review of the harness, each case reproduced first):

- ``zerobench report`` into a directory holding an earlier report wrote its figures over the old ones one by one,
  then the pages: a report stopped partway left the old ``index.html`` showing some new figures.
- A ``zerobench peers`` summary row without a timestamp was dropped from the report's table (its step time read
  as missing), and with every row so, the report ended in a pandas ``KeyError`` traceback.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.unit.test_bad_inputs import run
from tests.unit.test_results_whole import BASELINE, _write
from zerobench.report import figures, render
from zerobench.report.peers import peers_table
from zerobench.results import load
from zerobench.results.rows import read_rows

REPO = Path(__file__).resolve().parents[2]
QUICK = REPO / "results" / "reference" / "quick-cpu-2core"  # a sweep's whole rows: every figure of a run is drawn
PEERS = REPO / "results" / "reference" / "peers-offload-cpu-2core" / "summary" / "rows.jsonl"


def _shown(out: Path) -> list[str]:
    return re.findall(r'<img class="fig" src="([^"]+)"', (out / "index.html").read_text())


@pytest.fixture(scope="module")
def rows_dir(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("rows") / "sweep", read_rows(BASELINE))


def test_a_report_stopped_partway_leaves_the_earlier_one_whole(tmp_path, monkeypatch):
    out = tmp_path / "report"
    render.render([str(QUICK)], str(out))
    page, summary, shown = (out / "index.html").read_bytes(), (out / "summary.md").read_bytes(), _shown(out)
    assert len(shown) >= 4 and all((out / f).stat().st_size > 10_000 for f in shown)
    drawn = []

    def fail(*args):  # the loss curves come after three other figures were drawn
        drawn.extend(p.name for p in out.glob(".figures-*.partial/*.png"))
        raise RuntimeError("stopped while drawing")

    monkeypatch.setattr(figures, "loss_curves", fail)
    with pytest.raises(RuntimeError, match="stopped while drawing"):
        render.render([str(QUICK)], str(out))
    assert len(drawn) >= 3  # new figures existed when it stopped, beside the old ones
    assert (out / "index.html").read_bytes() == page and (out / "summary.md").read_bytes() == summary
    assert _shown(out) == shown and all((out / f).is_file() for f in shown)
    assert sorted(p.name for p in out.iterdir()) == sorted(["index.html", "summary.md", shown[0].split("/")[0]])


def test_a_new_report_replaces_the_earlier_one_s_figures_and_keeps_what_is_not_its(rows_dir, tmp_path):
    out = tmp_path / "report"
    render.render([str(rows_dir)], str(out))
    first = _shown(out)[0].split("/")[0]
    mine = [out / "figures-notes", out / "figures-0123abcd"]  # the user's, whatever their names
    for d in mine:
        d.mkdir()
        (d / "keep.txt").write_text("mine")
    render.render([str(rows_dir)], str(out))
    second = {f.split("/")[0] for f in _shown(out)}
    assert len(second) == 1 and first not in second and not (out / first).exists()
    assert all((out / f).stat().st_size > 10_000 for f in _shown(out))
    assert all((d / "keep.txt").read_text() == "mine" for d in mine)


def test_two_reports_into_one_directory_at_once_are_one_too_many(rows_dir, tmp_path, capsys):
    from zerobench.results.lock import claim

    out = tmp_path / "report"
    with claim(out):
        code, err = run(["report", str(rows_dir), "--out", str(out)], capsys)
    assert code == 2 and "is in use by another zerobench" in err, err
    assert not (out / "index.html").exists()


def test_a_peers_row_without_a_timestamp_stays_in_the_table(tmp_path):
    rows = read_rows(PEERS)
    full = peers_table(load(PEERS))
    one = json.loads(json.dumps(rows))
    del one[0]["provenance"]["timestamp"]
    t = peers_table(load(_write(tmp_path / "one", one)))
    cand, metric = rows[0]["candidate"], rows[0]["metric"]
    assert metric == "peer_step_time_s"
    values = t[t["candidate"] == cand]["step_time_s"].dropna().tolist()
    assert values == full[full["candidate"] == cand]["step_time_s"].tolist()  # shown, on a line of its own
    none = json.loads(json.dumps(rows))
    for r in none:
        del r["provenance"]["timestamp"]
    t = peers_table(load(_write(tmp_path / "none", none)))
    cols = ["candidate", "step_time_s", "peak_live_MiB"]
    assert t[cols].reset_index(drop=True).equals(full[cols].reset_index(drop=True))
