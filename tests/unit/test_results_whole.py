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


def test_an_out_inside_a_run_s_directory_is_refused(tmp_path, capsys):
    """A run's directory holds its rows file itself and no sweep plan (a ``zerobench train`` run, a run of rows from
    before plans): an --out below it would read as part of that run. Found by a CLI audit: train, sweep and
    simulate all wrote there, and ``results show`` of the run listed four runs, one of them all NaN."""
    from zerobench.bench.sweep_state import check_out

    run_dir = _write(tmp_path / "tr1", read_rows(BASELINE)[:3])
    for inside in (run_dir / "sub", run_dir / "a" / "b"):
        with pytest.raises(ConfigError, match=r"is inside the run directory .*tr1 \(it holds rows.jsonl\)"):
            check_fresh_run_dir(inside)
        with pytest.raises(ConfigError, match=r"is inside the run directory .*tr1"):
            check_out(inside, resume=False, suite="s")
    code, err = run(["simulate", "--paper", "--out", str(run_dir / "sim")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "inside the run directory" in err, err
    assert sorted(p.name for p in run_dir.iterdir()) == ["rows.jsonl"]
    check_fresh_run_dir(tmp_path / "beside")  # a directory beside it is fine


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


def _two_row_table(tmp_path: Path) -> Path:
    """The published table cut to the V100 calibration row and one held-out row (a few seconds to predict)."""
    from zerobench.sim.published import TABLE

    lines = TABLE.read_text().splitlines()
    keep = [lines[0]] + [ln for ln in lines[1:] if ln.startswith(("meg19-1.2b-1gpu,", "meg19-1.2b-tp2,"))]
    table = tmp_path / "t.csv"
    table.write_text("\n".join(keep) + "\n")
    return table


def test_an_interrupted_simulate_out_leaves_no_rows_that_read_as_whole(tmp_path, monkeypatch):
    """``simulate --validate-published --out`` (as ``--paper`` and ``--validate``) wrote its rows one at a time into
    ``rows.jsonl``: stopped at the third row, two ``ok`` rows stayed and read as the whole result, and the next run
    into the directory was refused. Its rows now appear all at once, or none do, and the rerun writes them whole."""
    from zerobench.cli import main
    from zerobench.results.rows import RowWriter

    table, out = _two_row_table(tmp_path), tmp_path / "out"
    real, calls = RowWriter.write, []

    def stopped(self, *a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, *a, **kw)

    monkeypatch.setattr(RowWriter, "write", stopped)
    assert main(["simulate", "--validate-published", str(table), "--out", str(out)]) == 130  # Ctrl-C's status
    assert read_rows(out) == []
    monkeypatch.setattr(RowWriter, "write", real)
    assert main(["simulate", "--validate-published", str(table), "--out", str(out)]) == 0
    got = [r for r in read_rows(out) if r["metric"] == "sim_published_ratio"]
    assert {r["row_id"] for r in got} == {"meg19-1.2b-1gpu", "meg19-1.2b-tp2"}


@pytest.mark.parametrize(
    "cmd",
    [
        ["profile", "--suite", "cpu/sim_validation"],
        ["simulate", "--paper"],
        ["simulate", "--validate-published"],
    ],
    ids=["profile", "paper", "published"],
)
def test_a_second_writer_into_one_out_is_refused_before_any_work(cmd, tmp_path, capsys):
    """``profile`` and ``simulate --out`` took no lock on ``--out``: two profiles into one directory both staged
    their rows in its one partial file, and the last to finish kept part of its own rows, with both reporting
    success. Each now holds the directory's lock, as ``sweep`` and ``train`` do, and a second is refused in one
    line naming the first."""
    from zerobench.results.lock import claim

    out = tmp_path / "out"
    with claim(out):
        code, err = run([*cmd, "--out", str(out)], capsys)
    assert code == 2 and f"--out {out} is in use by another zerobench" in err, err
    assert not (out / "rows.jsonl").exists()


def test_a_profile_s_partial_rows_file_is_refused_by_name(tmp_path, capsys):
    """The staged part of a profile stopped while writing (``.rows.jsonl.partial``), given to ``--profile`` as a
    file, was read as a profile and crashed with a ``KeyError`` traceback."""
    partial = tmp_path / ".rows.jsonl.partial"
    partial.write_text(json.dumps({"metric": "profile_op_s", "value": 1.0}) + "\n")
    code, err = run(["simulate", "--profile", str(partial), "--suite", "cpu/ci"], capsys)
    assert code == 2 and "the part of a profile's rows written before it stopped" in err and "Traceback" not in err
