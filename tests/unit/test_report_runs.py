"""What the report and ``results show`` count as one run, from real rows (the committed ``cpu-2core`` baseline's
sweep, copied and changed): a run is its rows file's (run id, config hash), so the same suite swept into two
directories is two repeats, each with its own status; a configuration is drawn per hardware class; rows of runs
under a measuring tool (``instrumented``) are not a training run's figures; and the HTML escapes what rows say.

Before, runs of one id in two directories were merged into one (the last directory's value, spread 0, one repeat),
and a failed copy could take an ok one's place or the reverse; a CPU and a GPU run of one configuration were averaged
under the first one's label; callgrind's peak RSS and losses were mixed into the timed run's; a suite name of
``<script>`` went into index.html as markup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerobench.report import aggregate
from zerobench.results import load
from zerobench.results.show import summarize

BASELINE = Path(__file__).resolve().parents[2] / "results" / "baselines" / "cpu-2core.jsonl"
ROWS = [json.loads(line) for line in BASELINE.read_text().splitlines() if line.strip()]
STAGE0 = "000-stage-0"


def _write(d: Path, change=None) -> Path:
    d.mkdir(parents=True)
    rows = [json.loads(json.dumps(r)) for r in ROWS]
    for r in rows:
        if change is not None:
            change(r)
    (d / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def _times(scale: float):
    def change(r):
        if r["metric"] == "step_time_s":
            r["value"] *= scale

    return change


def _frame(*dirs: Path):
    import pandas as pd

    return pd.concat([load(d) for d in dirs], ignore_index=True)


def _stage0(table):
    """zerobench's stage-0 run (the suite also has torch-ddp's)."""
    return table[(table["stage"] == 0) & (table["tp"] == 1) & (table["system"] == "zerobench")]


def test_the_same_suite_in_two_directories_is_two_repeats(tmp_path):
    a, b = _write(tmp_path / "a"), _write(tmp_path / "b", _times(3.0))
    one = _stage0(aggregate.runs_table(load(a))).iloc[0]
    both = _stage0(aggregate.runs_table(_frame(a, b))).iloc[0]
    assert both["repeats"] == 2
    assert both["step_time_s"] == pytest.approx(2.0 * one["step_time_s"])  # the median of 1x and 3x
    assert both["step_time_s_spread"] == pytest.approx(2.0 * one["step_time_s"])


def test_one_directory_given_twice_is_one_measurement(tmp_path, monkeypatch):
    """``report base /abs/path/base``: the same rows file in two spellings was two repeats of one run with a spread
    of 0 (a helper's review: "18 runs" from a sweep of 9); so was a directory given with one inside it."""
    from zerobench.report.render import render

    a = _write(tmp_path / "a")
    monkeypatch.chdir(tmp_path)
    render(["a", str(a), str(a / "rows.jsonl")], str(tmp_path / "r"))
    runs = len({r["run_id"] for r in ROWS})
    assert f"suites ci · {runs} runs" in (tmp_path / "r" / "summary.md").read_text()
    b = _write(tmp_path / "b")  # a copy is another measurement, as before
    render([str(a), str(b)], str(tmp_path / "r2"))
    assert f"suites ci · {2 * runs} runs" in (tmp_path / "r2" / "summary.md").read_text()


def test_a_failed_copy_neither_hides_nor_joins_an_ok_one(tmp_path):
    def fail(r):
        if r["run_id"] == STAGE0 and r["metric"] == "run_status":
            r["status"], r["reason"] = "failed", "rank 1 exited with code 1 (RuntimeError: boom)"

    ok, failed = _write(tmp_path / "ok"), _write(tmp_path / "failed", fail)
    for order in ((ok, failed), (failed, ok)):
        df = _frame(*order)
        assert aggregate.run_statuses(df) == {"failed": [STAGE0]}
        assert _stage0(aggregate.runs_table(df)).iloc[0]["repeats"] == 1
    lines = summarize(tmp_path)
    mine = lines[lines["run"] == STAGE0].sort_values("status")
    assert list(mine["status"]) == ["failed", "ok"]
    assert list(mine["reason"].fillna("-")) == ["rank 1 exited with code 1 (RuntimeError: boom)", "-"]


def test_each_hardware_class_is_its_own_record(tmp_path):
    def gpu(r):
        r["provenance"]["hardware"]["class"] = "nvidia-h100"
        _times(0.01)(r)

    table = _stage0(aggregate.runs_table(_frame(_write(tmp_path / "cpu"), _write(tmp_path / "gpu", gpu))))
    assert sorted(table["hardware"]) == ["cpu-2core", "nvidia-h100"]
    assert list(table["repeats"]) == [1, 1]


def test_runs_under_a_measuring_tool_are_not_figures(tmp_path):
    def counted(r):
        r["instrumented"] = "callgrind"
        _times(100.0)(r)

    timed = _write(tmp_path / "timed")
    alone = _stage0(aggregate.runs_table(load(timed))).iloc[0]
    mixed = _stage0(aggregate.runs_table(_frame(timed, _write(tmp_path / "counted", counted)))).iloc[0]
    assert mixed["repeats"] == 1 and mixed["step_time_s"] == alone["step_time_s"]
    losses = aggregate.losses_table(_frame(timed, tmp_path / "counted"))
    assert len(losses) == len(aggregate.losses_table(load(timed)))


def test_loss_curves_name_each_run_once(tmp_path):
    """Two directories' runs of one id are two curves, each named so; an id only one run has keeps its plain name
    (before, seaborn drew them as one line by run id, with the other's losses as its band)."""

    def shift(r):
        if r["metric"] == "loss":
            r["value"] += 1.0

    losses = aggregate.losses_table(_frame(_write(tmp_path / "a"), _write(tmp_path / "b", shift)))
    mine = losses[losses["run_id"] == STAGE0]
    assert mine.groupby("run")["value"].mean().diff().dropna().round(6).tolist() == [1.0]
    assert sorted(n.split(" (")[1][0] for n in mine["run"].unique()) == ["a", "b"]
    alone = aggregate.losses_table(load(tmp_path / "a"))
    assert set(alone["run"]) == set(alone["run_id"])


def test_the_html_report_escapes_what_rows_say(tmp_path):
    from zerobench.report.render import render

    def hostile(r):
        r["suite"] = "<script>alert(1)</script>"

    html = render([str(_write(tmp_path / "x", hostile))], str(tmp_path / "report")).read_text()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_resumed_sweep_of_one_kind_does_not_skip_the_others_runs(tmp_path):
    """``sweep --resume --instructions`` into a directory holding the timed sweep (docs: each directory may hold
    both) took the timed runs as done, ran nothing and recorded no instructions; and the reverse."""
    from zerobench.bench.sweep_state import completed_runs

    timed = _write(tmp_path / "timed")
    labels = {r.get("label") for r in ROWS if r["metric"] == "run_status"}
    assert {label for label, _ in completed_runs(timed)} == labels
    assert completed_runs(timed, instructions=True) == set()
    counted = _write(tmp_path / "counted", lambda r: r.update(instrumented="callgrind"))
    assert completed_runs(counted) == set() and len(completed_runs(counted, instructions=True)) == len(labels)


def test_a_resume_at_another_commit_is_refused(tmp_path, monkeypatch):
    """``sweep --resume`` skipped the runs another commit completed and ran the rest at this one: one directory, read
    as one sweep by the report and the gate, held two commits' measurements. Resuming at the runs' own commit
    goes on."""
    from zerobench.bench import sweep_state
    from zerobench.config import ConfigError

    suite = next(r["suite"] for r in ROWS if r.get("suite"))
    theirs = next(r["provenance"]["commit"] for r in ROWS if r["metric"] == "run_status")
    out = _write(tmp_path / "x")
    monkeypatch.setattr(sweep_state, "source_version", lambda: "f" * 40)
    with pytest.raises(
        ConfigError, match=f"holds runs measured at commit {theirs[:12]} and this checkout is at f{{12}}"
    ):
        sweep_state.check_out(out, True, suite)
    # the same commit with uncommitted changes is other code (before, only the commit was compared)
    monkeypatch.setattr(sweep_state, "source_version", lambda: f"{theirs}+0a1b2c3d4e5f")
    with pytest.raises(ConfigError, match=r"this checkout is at .{12} with uncommitted changes \(0a1b2c3d4e5f\)"):
        sweep_state.check_out(out, True, suite)
    monkeypatch.setattr(sweep_state, "source_version", lambda: theirs)
    sweep_state.check_out(out, True, suite)
    monkeypatch.setattr(sweep_state, "source_version", lambda: None)  # not a git checkout: nothing to compare
    sweep_state.check_out(out, True, suite)


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda r: r["provenance"].update(hardware=None), "'provenance.hardware' must be an object, got None"),
        (lambda r: r["provenance"].update(hardware="cpu-2core"), "'provenance.hardware' must be an object"),
        (lambda r: r["config"].update(zero=None), "'config.zero' must be an object, got None"),
    ],
)
def test_malformed_rows_are_one_line_naming_the_line(tmp_path, change, words):
    """Typed right at the top level and wrong inside, they reached the gate and the report as tracebacks
    (``'NoneType' object has no attribute 'get'``)."""
    from zerobench.config import ConfigError

    d = _write(tmp_path / "bad", change)
    with pytest.raises(ConfigError, match=r"rows\.jsonl:\d+: not a zerobench result row: ") as e:
        load(d)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_rows_without_hardware_provenance_render_as_their_own_class(tmp_path):
    """Before, the measured Fig 2 asked matplotlib for zero panels and the report died with a ValueError."""
    from zerobench.report.render import render

    html = render([str(_write(tmp_path / "x", lambda r: r["provenance"].pop("hardware")))], str(tmp_path / "r"))
    assert aggregate.UNKNOWN_HARDWARE in html.read_text()


def test_a_slow_legend_placement_is_not_a_warning_at_the_user(tmp_path, monkeypatch):
    """Matplotlib warns when placing a legend at loc="best" took over a second, which a busy machine makes happen:
    the report under a noisy neighbour failed its no-warnings check on unchanged code."""
    import warnings

    import matplotlib.pyplot as plt
    from matplotlib import _api
    from matplotlib.legend import Legend

    from zerobench.report.figures import _save

    real = Legend._find_best_position

    def slow(self, *args, **kwargs):
        _api.warn_external('Creating legend with loc="best" can be slow with large amounts of data.')
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Legend, "_find_best_position", slow)
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1], label="a")
    ax.legend()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert _save(fig, tmp_path, "f").is_file()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_run_with_a_figure_that_is_no_number_is_named_not_counted(tmp_path, bad):
    """A NaN step time was dropped from the frame without a word (NaN and null merge once loaded): stage 1 showed
    the clean copy's value as two repeats with a spread of 0 (a helper's review). Named and left out, as an inf."""
    from zerobench.report.aggregate import NON_FINITE, run_statuses

    def change(r):
        if r["run_id"] == "001-stage-1" and r["metric"] in ("step_time_s", "tflops_per_gpu"):
            r["value"] = bad

    df = _frame(_write(tmp_path / "a"), _write(tmp_path / "b", change))
    assert run_statuses(df)[NON_FINITE] == ["001-stage-1"]
    table = aggregate.runs_table(df)
    one = table[(table["stage"] == 1) & (table["tp"] == 1)].iloc[0]
    assert one["repeats"] == 1

    def unmeasured(r):
        if r["metric"] == "tflops_per_gpu":
            r["value"] = None

    null = _frame(_write(tmp_path / "c", unmeasured))
    assert NON_FINITE not in run_statuses(null)  # a null is a figure not measured, drawn as missing


def test_a_dirty_tree_s_runs_are_not_their_commit_s(tmp_path):
    """A copy measured with uncommitted changes at the same commit was averaged with the clean runs into a median
    no run measured (stage 0: 4.18 MiB of 2.09 and 6.27; a helper's review). It is a record of its own, named."""

    def dirty(r):
        r["provenance"].update(dirty=True, dirty_diff="0a1b2c3d4e5f")
        if r["metric"] == "model_state_bytes":
            r["value"] *= 3

    table = aggregate.runs_table(_frame(_write(tmp_path / "a"), _write(tmp_path / "b", dirty)))
    stage0 = _stage0(table)
    assert len(stage0) == 2 and set(stage0["repeats"]) == {1}, stage0
    assert sorted(stage0["variant"].str.endswith("+0a1b2c3")) == [False, True], stage0["variant"].tolist()


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("phase", ["forward_backward"], "a string or null"),
        ("of", ["loss"], "a string, an integer or null"),
        ("of", True, "a string, an integer or null"),
        ("instrumented", ["callgrind"], "a string or null"),
    ],
)
def test_a_row_keyed_by_a_value_that_is_no_key_is_one_line(tmp_path, capsys, field, value, expected):
    """``phase``, ``of`` and ``instrumented`` key a run's figures; a list there reached ``results show``, the report
    and the gate, which hash them, as 'TypeError: unhashable type: list'."""
    from tests.unit.test_bad_inputs import assert_one_line, run

    d = _write(tmp_path / "bad", lambda r: r.update({field: value}))
    for argv in (
        ["results", "show", str(d)],
        ["report", str(d), "--out", str(tmp_path / "r")],
        ["regress", "--baseline", str(BASELINE), "--candidate", str(d)],
    ):
        assert_one_line(*run(argv, capsys), f"not a zerobench result row: '{field}' must be {expected}, got {value!r}")
