"""Results are whole or refused, as users reach them (a helper's review of the harness, each case reproduced first):

- ``train`` / ``profile`` ``--out`` a sweep's directory, and ``maxsize --out`` a directory holding any rows, were
  accepted: the new rows read as one more of the sweep's runs. (Repeats of a search may share an ``--out``.)
- A run's figure held twice in one rows file (files concatenated) was shown by the report and ``results show`` as
  whichever row came last, without a word; the gate refuses such rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_bad_inputs import run
from zerobench.config import ConfigError
from zerobench.results import load
from zerobench.results.outdir import check_fresh_run_dir
from zerobench.results.rows import read_rows

REPO = Path(__file__).resolve().parents[2]
BASELINE = REPO / "results" / "baselines" / "cpu-2core.jsonl"


def _write(d: Path, rows: list[dict]) -> Path:
    """``rows`` as ``d/rows.jsonl`` (shared by the report's and the gate's tests of edited rows)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


@pytest.fixture(scope="module")
def rows_dir(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("rows") / "sweep", read_rows(BASELINE))


def test_a_figure_held_twice_is_refused_by_report_and_show_in_one_line(rows_dir, tmp_path, capsys):
    rows = read_rows(BASELINE)
    doubled = _write(tmp_path / "doubled", rows + [r for r in rows if r["run_id"] == "002-stage-2"])
    with pytest.raises(ValueError, match=r"run 002-stage-2 holds \w+ .*twice.*give each run its own directory"):
        load(doubled)
    for argv in (["results", "show", str(doubled)], ["report", str(doubled), "--out", str(tmp_path / "rep")]):
        code, err = run(argv, capsys)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and "holds" in lines[0] and "twice" in lines[0], err
    assert not (tmp_path / "rep" / "index.html").exists()
    # the same run swept into two directories is two repeats, not a figure held twice
    both = tmp_path / "two"
    _write(both / "a", rows)
    _write(both / "b", rows)
    assert len(load(both)) == 2 * len(rows)


def test_a_timed_and_a_counted_run_under_one_id_are_two_runs(tmp_path):
    """``sweep --instructions`` tags every row of the counted run, its status row included (``instrumented``)."""
    rows = [r for r in read_rows(BASELINE) if r["run_id"] == "002-stage-2"]
    counted = [{**r, "instrumented": "callgrind"} for r in rows]
    assert len(load(_write(tmp_path / "d", rows + counted))) == 2 * len(rows)
    untagged = [{**r, "instrumented": "callgrind"} if r["metric"] != "run_status" else r for r in rows]
    with pytest.raises(ValueError, match="holds run_status twice"):
        load(_write(tmp_path / "e", rows + untagged))


def test_a_run_is_refused_an_out_holding_rows_below_it_or_inside_a_sweep(rows_dir, tmp_path):
    sweep = tmp_path / "sweep"
    _write(sweep / "runs" / "000-a", read_rows(BASELINE)[:3])
    with pytest.raises(ConfigError, match=r"--out .*sweep already holds result rows \(.*000-a/rows.jsonl\)"):
        check_fresh_run_dir(sweep)
    (tmp_path / "planned").mkdir()
    (tmp_path / "planned" / "sweep-plan.json").write_text("[]")
    for inside in (tmp_path / "planned", tmp_path / "planned" / "runs" / "new"):
        with pytest.raises(ConfigError, match=r"is in the sweep .*planned \(it holds sweep-plan.json\)"):
            check_fresh_run_dir(inside)
    empty = tmp_path / "fresh"
    _write(empty / "x", [])  # an empty rows file holds no run
    check_fresh_run_dir(empty)


@pytest.mark.parametrize("cmd", ["train", "maxsize", "profile", "ab"])
def test_train_maxsize_profile_and_ab_refuse_a_sweep_s_directory_before_any_work(cmd, rows_dir, tmp_path, capsys):
    argv = {
        "train": ["train", "--dp", "1", "--steps", "2", "--warmup", "0"],
        "maxsize": ["maxsize", "--budget", "8MiB"],
        "profile": ["profile", "--suite", "cpu/quick"],
        "ab": ["regress", "--ab", "cpu/quick", "--baseline-tree", str(tmp_path)],
    }[cmd]
    before = sorted(p.name for p in rows_dir.iterdir())
    code, err = run([*argv, "--out", str(rows_dir.parent)], capsys)
    said = "holds rows other than max-size searches'" if cmd == "maxsize" else "already holds result rows"
    assert code == 2 and said in err and "Traceback" not in err, err
    assert sorted(p.name for p in rows_dir.iterdir()) == before


def test_maxsize_repeats_may_share_an_out_that_holds_only_searches(tmp_path):
    """Repeats of a search into one ``--out`` are one bar in the report (their median): a directory of searches' rows
    is accepted, one with any other row is not, nor one in a sweep."""
    from zerobench.cli.training import _check_search_dir

    row = {**read_rows(BASELINE)[0], "run_id": "maxsize-stage2", "metric": "max_layers", "value": 3, "unit": "layers"}
    _write(tmp_path / "s", [row, {**row, "metric": "max_params", "value": 1e5, "unit": "params"}])
    _check_search_dir(tmp_path / "s", None)
    _write(tmp_path / "s" / "probes" / "stage2" / "L3", read_rows(BASELINE)[:2])  # the probes' runs, --probes inside
    _check_search_dir(tmp_path / "s", str(tmp_path / "s" / "probes"))
    with pytest.raises(ConfigError, match=r"holds rows other than max-size searches' \(.*L3/rows.jsonl: run "):
        _check_search_dir(tmp_path / "s", None)
    (tmp_path / "sweep-plan.json").write_text("[]")
    with pytest.raises(ConfigError, match="is in the sweep"):
        _check_search_dir(tmp_path / "new", None)
