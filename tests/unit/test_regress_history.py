"""``zerobench regress --history`` on synthetic rows of several commits, without processes: commits in parent
order whatever the directories' order, the planted commit flagged against the noise band and its revert flagged
as an improvement, a plot per configuration, the flagged commits as a table and as rows."""

from __future__ import annotations

import json
import math
import random

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
    dirs = _history(run_rows, tmp_path)
    for d in dirs[4:]:
        path = tmp_path / d / "rows.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({**r, "config_hash": "0123456789abcdef"}) + "\n" for r in rows))
    out = tmp_path / "history"
    assert run_history(dirs, out, metrics="instructions") == 0
    plots = sorted(p.name for p in out.glob("history-*.png"))
    assert len(plots) == 2 and all(p.startswith("history-stage-2-") for p in plots), plots
    assert "| stage=2 [" in (out / "history.md").read_text()
