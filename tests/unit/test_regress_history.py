"""``zerobench regress --history`` on synthetic rows of several commits, without processes: commits in parent
order whatever the directories' order, the planted commit flagged against the noise band and its revert flagged
as an improvement, a plot per configuration, the flagged commits as a table and as rows."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest

from tests.unit.test_gate_noise import _host
from zerobench.bench.regress import noise_rows
from zerobench.config import ConfigError
from zerobench.report.history import collect, order, run_history, tolerance


@pytest.fixture(scope="module")
def run_rows() -> list[dict]:
    from tests.unit.test_gate_noise import BASELINE

    rows = [json.loads(line) for line in BASELINE.read_text().splitlines()]
    drawn = ("host_cpu_s", "ops_dispatched", "instructions", "py_calls")  # _host draws its own host-work rows
    return [r for r in rows if r["run_id"] == "002-stage-2" and r["metric"] not in drawn]


def _commit(i: int) -> str:
    return f"{i:x}" * 40 if i else "f" * 40


def _history(run_rows, tmp_path, planted: int = 4, n: int = 8) -> list[str]:
    rng = random.Random(21)
    dirs = []
    for i in range(1, n + 1):
        rows = _host(run_rows, rng, instr=2e8 * (1.10 if i == planted else 1.0))
        for r in rows:
            r["provenance"] = {
                **r["provenance"],
                "commit": _commit(i),
                "parent": _commit(i - 1),
                "dirty": False,
                "commit_time": f"2026-11-{10 + i:02d}T12:00:00+00:00",
            }
        d = tmp_path / f"c{i}"
        d.mkdir()
        (d / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        dirs.append(str(d))
    return dirs


def test_commits_follow_their_parents(run_rows, tmp_path):
    dirs = _history(run_rows, tmp_path, n=5)
    points = collect(list(reversed(dirs)))
    assert [p.commit for p in points] == [_commit(i) for i in range(1, 6)]
    # a parent recorded later than its child (a rebase) still goes first
    points[0].time, points[1].time = points[1].time, points[0].time
    assert [p.commit for p in order(points[::-1])] == [_commit(i) for i in range(1, 6)]


def test_the_planted_commit_and_its_revert_are_flagged(run_rows, tmp_path, capsys):
    dirs = _history(run_rows, tmp_path)
    out = tmp_path / "history"
    assert run_history(dirs[::-1], out, metrics="instructions,ops_dispatched,host_cpu_s") == 0
    flags = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    got = {(f["of"], f["commit"], f["verdict"]) for f in flags}
    assert {("instructions", _commit(4), "regression"), ("instructions", _commit(5), "improvement")} <= got, got
    assert not [f for f in flags if f["of"] in ("ops_dispatched", "host_cpu_s")], flags  # counts still, CPU noisy
    assert (out / "history-stage-2.png").stat().st_size > 10_000
    table = (out / "history.md").read_text()
    assert f"| stage=2 | instructions | {_commit(4)[:8]} |" in table and "regression" in table


def test_a_baseline_noise_model_sets_the_band(run_rows, tmp_path):
    dirs = _history(run_rows, tmp_path, planted=0)  # nothing planted
    rng = random.Random(4)
    samples = [_host(run_rows, rng) for _ in range(5)]
    base = tmp_path / "base.jsonl"
    base.write_text("".join(json.dumps(r) + "\n" for r in samples[0] + noise_rows(samples)[0]))
    out = tmp_path / "h"
    run_history(dirs, out, baseline=str(base), metrics="instructions")
    assert (out / "history.md").read_text().rstrip().endswith("No commit was flagged.")
    # with a commit planted, its flag says the band came from the baseline's noise model: the change between
    # two commits has sigma * sqrt 2, judged two-sided at the gate's rate
    out = tmp_path / "planted"
    (tmp_path / "p").mkdir()
    run_history(_history(run_rows, tmp_path / "p", planted=4), out, baseline=str(base), metrics="instructions")
    flags = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    (model,) = [r for r in noise_rows(samples)[0] if r["of"] == "instructions"]
    want = tolerance("instructions", model["value"] * math.sqrt(2), model["n"], 0.001 / 2)
    assert flags and {(f["noise_source"], f["sigma"]) for f in flags} == {("baseline noise model", model["value"])}
    assert all(f["tolerance"] == pytest.approx(want) for f in flags), (flags, want)


def test_bad_history_input_is_refused(run_rows, tmp_path):
    dirs = _history(run_rows, tmp_path, n=2)
    with pytest.raises(ConfigError, match="not a gated metric"):
        run_history(dirs, tmp_path / "o", metrics="nonsense")
    with pytest.raises(ConfigError, match="at least two commits"):
        run_history(dirs[:1], tmp_path / "o")


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["regress", "--history", "a", "b"], "--history needs --out DIR"),
        (["regress", "--baseline", "b.jsonl", "--candidate", "x", "y"], "the gate compares one candidate, got 2"),
        (["regress", "--candidate", "x", "--false-alarm", "1"], "--false-alarm is a probability from 1e-12 to below 1"),
    ],
)
def test_bad_gate_arguments_are_one_line(argv, msg, capsys):
    from zerobench.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0], err


def test_a_configuration_whose_hash_moved_keeps_both_plots(run_rows, tmp_path):
    """From commit 5 on the configuration's hash changes (a default that moved) and its label does not: both keep
    a plot and a table label of their own. Before, both drew to history-stage-2.png and the second plot replaced the
    one that showed the planted regression."""
    dirs = _history(run_rows, tmp_path, n=12)  # six commits a hash: enough to judge each without a baseline
    for d in dirs[6:]:
        path = tmp_path / d / "rows.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({**r, "config_hash": "0123456789abcdef"}) + "\n" for r in rows))
    out = tmp_path / "history"
    assert run_history(dirs, out, metrics="instructions") == 0
    plots = sorted(p.name for p in out.glob("history-*.png"))
    assert len(plots) == 2 and all(p.startswith("history-stage-2-") for p in plots), plots
    assert "| stage=2 [" in (out / "history.md").read_text()


def _edit(d: str, fn) -> None:
    path = Path(d) / "rows.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(fn(r)) + "\n" for r in rows))


def test_a_deterministic_metric_is_exact_in_the_history_as_in_the_gate(run_rows, tmp_path):
    """Five commits, the third with model states +10%, the fourth reverting it: the history took its noise from its
    own commit-to-commit changes (this one among them), drew a band of +-64% and flagged nothing, where the gate
    calls the same change a regression (a helper's review)."""
    dirs = _history(run_rows, tmp_path, planted=0, n=5)
    _edit(dirs[2], lambda r: {**r, "value": r["value"] * 1.1} if r["metric"] == "model_state_bytes" else r)
    out = tmp_path / "h"
    run_history(dirs, out, metrics="model_state_bytes")
    flags = {(f["commit"], f["verdict"], f["tolerance"]) for f in _flags(out)}
    assert flags == {(_commit(3), "regression", 0.0), (_commit(4), "improvement", 0.0)}, flags


def _flags(out) -> list[dict]:
    path = out / "rows.jsonl"  # written with the first flag
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_noisy_metric_over_few_commits_is_drawn_not_judged(run_rows, tmp_path, capsys):
    dirs = _history(run_rows, tmp_path, n=5)  # commit 4 planted: +10% instructions
    out = tmp_path / "h"
    run_history(dirs, out, metrics="instructions")
    md = (out / "history.md").read_text()
    assert not _flags(out) and "## Not judged" in md and "- stage=2: instructions" in md, md
    assert (out / "history-stage-2.png").exists() and "1 series not judged" in capsys.readouterr().out


def test_a_failed_run_is_listed_not_skipped(run_rows, tmp_path):
    """A configuration that failed at one commit was left out of its series without a word ("No commit was
    flagged"); it is listed with its status."""
    dirs = _history(run_rows, tmp_path, planted=0, n=3)
    _edit(dirs[1], lambda r: {**r, "value": 0, "status": "failed", "reason": "x"} if r["metric"] == "run_status" else r)
    out = tmp_path / "h"
    run_history(dirs, out, metrics="model_state_bytes")
    assert f"| stage=2 | {_commit(2)[:8]} | failed |" in (out / "history.md").read_text()


def test_results_of_two_machine_classes_or_two_commits_in_one_directory_are_refused(run_rows, tmp_path):
    dirs = _history(run_rows, tmp_path, planted=0, n=3)
    hw = lambda r: {**r, "provenance": {**r["provenance"], "hardware": {"class": "nvidia-h100"}}}  # noqa: E731
    _edit(dirs[1], hw)
    with pytest.raises(ConfigError, match=r"mixes hardware cpu-2core \(.*c1\) and nvidia-h100 \(.*c2\)"):
        run_history(dirs, tmp_path / "o")
    (tmp_path / "b").mkdir()
    dirs = _history(run_rows, tmp_path / "b", planted=0, n=3)
    first = [True]

    def other_commit(r):
        if first[0]:
            first[0] = False
            return {**r, "provenance": {**r["provenance"], "commit": "e" * 40}}
        return r

    _edit(dirs[1], other_commit)
    with pytest.raises(ConfigError, match=r"c2 holds the results of .* and .*: a history takes one directory per"):
        run_history(dirs, tmp_path / "o2")


def test_labels_that_share_a_file_name_keep_a_plot_each(run_rows, tmp_path):
    """``stage=2`` and ``stage 2`` both drew to history-stage-2.png, the second replacing the first (a helper's
    review); labels whose file names collide take the configuration's hash, as equal labels do."""
    dirs = _history(run_rows, tmp_path, planted=0, n=6)
    for d in dirs:
        path = Path(d) / "rows.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        twin = [{**r, "config_hash": "feedfacefeedface", "label": "stage 2"} for r in rows]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows + twin))
    out = tmp_path / "h"
    run_history(dirs, out, metrics="model_state_bytes")
    assert len(list(out.glob("history-*.png"))) == 2


def test_a_second_history_into_one_directory_is_refused_and_a_stopped_one_leaves_no_rows(
    run_rows, tmp_path, monkeypatch
):
    """A second history into the same ``--out`` appended its flags to the first's (two histories read as one); a
    history stopped while drawing left the flags of the configurations drawn so far, read as the whole."""
    dirs = _history(run_rows, tmp_path)
    out = tmp_path / "h"
    assert run_history(dirs, out, metrics="instructions") == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert "rows.jsonl" in before
    with pytest.raises(ConfigError, match=r"--out .*h already holds result rows .*give each history its own directory"):
        run_history(dirs, out, metrics="instructions")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before

    from zerobench.results.rows import RowWriter

    write, calls = RowWriter.write, []

    def stop_at_the_second_flag(self, *args, **kwargs):
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return write(self, *args, **kwargs)

    monkeypatch.setattr(RowWriter, "write", stop_at_the_second_flag)
    with pytest.raises(KeyboardInterrupt):
        run_history(dirs, tmp_path / "stopped", metrics="instructions")
    assert len(calls) == 2 and not (tmp_path / "stopped" / "rows.jsonl").exists()


@pytest.mark.parametrize(("field", "value"), [("device", "Intel Xeon Gold 6338"), ("torch_version", "2.99.0+cpu")])
def test_a_history_over_two_processors_or_torch_versions_says_so(run_rows, tmp_path, capsys, field, value):
    """One hardware class, but the second commit measured on another processor (or torch): drawn, with a note on
    stderr naming both and where each was first seen, since a commit flagged there may be flagged for the machine."""
    dirs = _history(run_rows, tmp_path, planted=0, n=3)

    def moved(r):
        prov = r["provenance"]
        if field == "device":
            return {**r, "provenance": {**prov, "hardware": {**prov["hardware"], "device": value}}}
        return {**r, "provenance": {**prov, "torch_version": value}}

    _edit(dirs[1], moved)
    assert run_history(dirs, tmp_path / "h", metrics="model_state_bytes") == 0
    err = capsys.readouterr().err
    kind = "processors" if field == "device" else "torch versions"
    first = "AMD EPYC" if field == "device" else "2.13.0+cpu"
    assert f"zerobench: note: the history mixes {kind} {first} ({dirs[0]}) and {value} ({dirs[1]})" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_refused_directory_of_a_history_is_named(run_rows, tmp_path):
    """A history reads many directories: a row measured twice in one of them is refused naming it."""
    dirs = _history(run_rows, tmp_path, planted=0, n=3)
    path = Path(dirs[1]) / "rows.jsonl"
    path.write_text(path.read_text() * 2)
    with pytest.raises(ConfigError, match="^" + re.escape(dirs[1]) + ": run 002-stage-2: .* is measured twice"):
        run_history(dirs, tmp_path / "h")
