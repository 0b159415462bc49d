"""Issue 62's bar, from the rows of independent attempts at the simulator's quick path (``scripts/sim_attempts.sh``):
on a quiet 2-core VM, README's three commands (a fresh profile, the sweep, ``simulate --validate --fit``) reach
median ≤ 10 % and worst ≤ 25 % over the suite's runs in at least 4 of 5 attempts, each with a new profile.

The attempts are committed under ``results/reference/sim-validation-cpu-2core-attempts/attempt-K/{profile,runs}``
(five, none meeting the bar: the bar's test is a strict expected failure); the summary is also checked
on the layout built from an earlier recording's rounds (each round is a profile taken right before its runs: an
attempt).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from zerobench.results.rows import read_rows
from zerobench.sim import attempts as A
from zerobench.sim import validate as V
from zerobench.sim.profile import Profile

REFS = Path(__file__).resolve().parents[2] / "results" / "reference"
ATTEMPTS = REFS / "sim-validation-cpu-2core-attempts"
ROUNDS = REFS / "sim-validation-cpu-2core-xeon-5"


@pytest.fixture(scope="module")
def rounds_as_attempts(tmp_path_factory):
    root = tmp_path_factory.mktemp("attempts")
    for k in (1, 2, 3):
        for part in ("profile", "runs"):
            shutil.copytree(ROUNDS / part / f"round-{k}", root / f"attempt-{k}" / part)
    return root


def test_each_attempt_is_validated_alone_from_its_rows(rounds_as_attempts):
    got = [A.summarize_attempt(d) for d in A.attempt_dirs(rounds_as_attempts)]
    assert [a["attempt"] for a in got] == ["attempt-1", "attempt-2", "attempt-3"]
    for k, a in enumerate(got, 1):
        rows = read_rows(ROUNDS / "runs" / f"round-{k}")
        prof = Profile.from_rows(read_rows(ROUNDS / "profile" / f"round-{k}"))
        prof.interference = V.fit_interference(rows, prof)
        s = V.summarize(V.validate(rows, prof))
        assert (a["runs"], a["median_abs_error"], a["worst_abs_error"]) == (
            34,
            s["median_abs_error"],
            s["worst_abs_error"],
        )
        assert a["meets_bar"] == (s["median_abs_error"] <= 0.10 and s["worst_abs_error"] <= 0.25)
        assert a["inside_interval"] is None  # profiles of this recording carry no spreads


def test_the_summary_prints_every_attempt_and_the_count(rounds_as_attempts, capsys):
    assert A.main([str(rounds_as_attempts)]) == 0
    out = capsys.readouterr().out
    assert out.count("attempt-") == 3 and "attempts meet median <= 10% and worst <= 25%" in out
    assert A.main([str(rounds_as_attempts / "nothing")]) == 2


def test_trimming_keeps_what_the_validation_reads(rounds_as_attempts, tmp_path):
    root = tmp_path / "t"
    shutil.copytree(rounds_as_attempts / "attempt-1", root / "attempt-1")
    before = A.summarize_attempt(root / "attempt-1")
    A.trim(root)
    assert A.summarize_attempt(root / "attempt-1") == before
    assert {r["metric"] for r in read_rows(root / "attempt-1" / "runs")} <= {"step_time_s", "run_status"}


def _attempts(root: Path) -> list[dict]:
    """Every attempt under ``root`` summarised, after checking each had a profile of its own, taken before its
    runs."""
    dirs = A.attempt_dirs(root)
    stamps = [min(r["provenance"]["timestamp"] for r in read_rows(d / "profile")) for d in dirs]
    assert len(set(stamps)) == len(dirs)  # a new profile each attempt
    for d, stamp in zip(dirs, stamps):  # each taken before its own runs
        assert stamp < min(r["provenance"]["timestamp"] for r in read_rows(d / "runs") if r["metric"] == "step_time_s")
    return [A.summarize_attempt(d) for d in dirs]


def test_the_bars_test_reads_a_directory_of_attempts(rounds_as_attempts):
    got = _attempts(rounds_as_attempts)
    assert len(got) == 3 and all(a["runs"] == 34 for a in got)


RECORDED = {  # attempt -> (median, worst, worst run, inside the interval), as the dataset's README tables them
    "attempt-1": ("16.1%", "48.7%", "023-small4-dp4-s0", 23),
    "attempt-2": ("13.5%", "32.6%", "000-tiny-dp1-s0", 23),
    "attempt-3": ("7.5%", "25.1%", "008-tiny-dp4-s3", 28),
    "attempt-4": ("14.2%", "41.5%", "003-tiny-dp2-s2", 30),
    "attempt-5": ("10.2%", "32.2%", "005-tiny-dp4-s0", 28),
}


def test_the_recorded_attempts_are_independent_and_their_figures_come_from_their_rows():
    """Each committed attempt had a profile of its own, taken before its runs, and validated all 34 runs; the
    figures the dataset's README tables are recomputed from the rows."""
    got = _attempts(ATTEMPTS)
    assert [a["attempt"] for a in got] == list(RECORDED) and all(a["runs"] == 34 for a in got)
    for a in got:
        want = RECORDED[a["attempt"]]
        assert (f"{a['median_abs_error']:.1%}", f"{a['worst_abs_error']:.1%}", a["worst_run"]) == want[:3], a
        assert a["inside_interval"] == want[3], a
    readme = (ATTEMPTS / "README.md").read_text()
    for name, (median, worst, run, inside) in RECORDED.items():
        assert f"| {name} | {median} | {worst} | {run} | {inside} of 34 |" in readme, name


@pytest.mark.xfail(
    strict=True,
    reason="issue 62's bar is not met: 0 of 5 attempts meet median <= 10% and worst <= 25% (medians 7.5-16.1%, "
    "worst 25.1-48.7%): the single-process runs, with no collective and no fitted factor, already span 0.67-1.30 "
    "of their profiled pieces' sum, and the fitted interference moved between 0.00 and 1.90 from one attempt to "
    "the next; and the runs themselves, predicted by the median of the same runs in the other attempts, meet "
    "the bar in 2 of 5 (results/reference/sim-validation-cpu-2core-attempts/README.md)",
)
def test_issue_62_bar_holds_in_four_of_five_attempts():
    got = _attempts(ATTEMPTS)
    assert len(got) == 5 and all(a["runs"] == 34 for a in got)
    seen = "\n".join(
        f"{a['attempt']}: median {a['median_abs_error']:.1%}, worst {a['worst_abs_error']:.1%} "
        f"({a['worst_run']}), inside {a['inside_interval']}"
        for a in got
    )
    assert sum(a["meets_bar"] for a in got) >= 4, seen


CURRENT = ("sim-validation-cpu-2core-xeon-insitu", "sim-validation-cpu-2core-xeon-4", "sim-validation-cpu-2core-xeon-5")
"""The recordings of the profiler before issue 62 that docs/simulator.md reads round by round."""


def test_one_round_of_the_earlier_recordings_alone_meets_the_bar_in_two_of_nine(tmp_path):
    """docs/simulator.md's "One profile, as a user takes it": each round of the three recordings of the profiler
    before replicates, as an attempt of its own (a profile taken right before its runs)."""
    for ref in CURRENT:
        for k in (1, 2, 3):
            for part in ("profile", "runs"):
                shutil.copytree(REFS / ref / part / f"round-{k}", tmp_path / ref / f"attempt-{k}" / part)
    got = [A.summarize_attempt(d) for ref in CURRENT for d in A.attempt_dirs(tmp_path / ref)]
    assert len(got) == 9 and sum(a["meets_bar"] for a in got) == 2
    medians, worsts = sorted(a["median_abs_error"] for a in got), sorted(a["worst_abs_error"] for a in got)
    assert (f"{medians[0]:.1%}", f"{medians[-1]:.1%}") == ("6.3%", "12.2%")
    assert (f"{worsts[0]:.1%}", f"{worsts[-1]:.1%}") == ("22.5%", "81.1%")


def _sweep_copy(src: Path, dst: Path, scale: dict[str, float]) -> Path:
    """A copy of one sweep's rows with some runs' step times scaled."""
    import json

    for rows in src.glob("*/rows.jsonl"):
        (dst / rows.parent.name).mkdir(parents=True)
        lines = []
        for line in rows.read_text().splitlines():
            r = json.loads(line)
            if r.get("metric") == "step_time_s":
                r["value"] *= scale.get(r["run_id"], 1.0)
            lines.append(json.dumps(r))
        (dst / rows.parent.name / "rows.jsonl").write_text("\n".join(lines) + "\n")
    return dst


def test_reproducibility_predicts_each_sweep_by_the_median_of_the_others(tmp_path, capsys):
    """Scored as the simulator is, |prediction ÷ measured − 1|, with the other sweeps' median as the prediction; a
    run some sweep lacks is left out and named."""
    src = ROUNDS / "runs" / "round-1"
    run = "000-tiny-dp1-s0"
    a = _sweep_copy(src, tmp_path / "a", {})
    b = _sweep_copy(src, tmp_path / "b", {})
    c = _sweep_copy(src, tmp_path / "c", {run: 2.0})
    got = A.reproducibility([a, b, c])
    assert [g["runs"] for g in got] == [34, 34, 34] and got[0]["dropped"] == []
    # c's run took twice a's and b's: predicted by their median, 1 / 2 - 1 = -50 %; every other run exact
    assert got[2]["worst_run"] == run and got[2]["worst_abs_error"] == pytest.approx(0.5)
    assert got[2]["median_abs_error"] == 0.0 and not got[2]["meets_bar"]
    # a's run predicted by the median of 1x and 2x: 1.5 / 1 - 1 = +50 %
    assert got[0]["worst_abs_error"] == pytest.approx(0.5) and not got[0]["meets_bar"]
    d = _sweep_copy(src, tmp_path / "d", {run: 1.2})
    pair = A.reproducibility([a, d])
    assert pair[0]["worst_abs_error"] == pytest.approx(0.2)  # a's run predicted by d's: 1.2 / 1 - 1
    assert pair[1]["worst_abs_error"] == pytest.approx(1 - 1 / 1.2)  # d's run predicted by a's: 1 / 1.2 - 1
    shutil.rmtree(d / run)
    short = A.reproducibility([a, d])
    assert short[0]["runs"] == 33 and short[0]["dropped"] == [run]
    assert A.main(["--floor", str(a), str(d)]) == 0
    assert f"left out: {run}" in capsys.readouterr().err
    with pytest.raises(ValueError, match="at least two sweeps"):
        A.reproducibility([a])


def test_the_floor_command_prints_each_sweep_and_refuses_one(tmp_path, capsys):
    sweeps = [str(ROUNDS / "runs" / f"round-{k}") for k in (1, 2, 3)]
    assert A.main(["--floor", *sweeps]) == 0
    out = capsys.readouterr().out
    assert out.count("round-") == 3
    assert "2 of 3 sweeps are predicted within median <= 10% and worst <= 25% by the median of the others" in out
    assert A.main(["--floor", sweeps[0]]) == 2
    assert "at least two sweeps" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # --trim rewrites attempts: not the sweeps --floor reads
        A.main(["--floor", "--trim", *sweeps])
    assert e.value.code == 2 and "--trim" in capsys.readouterr().err


SAME_SESSION = {  # recording -> each round's (median, worst), predicted by the median of its session's other rounds
    "sim-validation-cpu-2core": [("6.8%", "44.9%"), ("5.6%", "45.1%"), ("5.8%", "36.5%")],
    "sim-validation-cpu-2core-xeon": [("8.1%", "30.4%"), ("7.5%", "39.8%"), ("12.3%", "28.9%")],
    "sim-validation-cpu-2core-xeon-insitu": [("4.1%", "79.0%"), ("3.6%", "192.4%"), ("6.0%", "183.4%")],
    "sim-validation-cpu-2core-xeon-4": [("3.7%", "31.7%"), ("2.5%", "27.4%"), ("2.9%", "19.1%")],
    "sim-validation-cpu-2core-xeon-5": [("3.1%", "14.9%"), ("3.0%", "19.0%"), ("3.5%", "26.3%")],
}
ACROSS_ATTEMPTS = [("14.5%", "43.7%"), ("6.7%", "20.3%"), ("5.4%", "24.0%"), ("23.2%", "81.2%"), ("7.0%", "46.8%")]
"""Each committed attempt's runs predicted by the median of the same runs in the other four attempts."""


def test_the_runs_own_reproducibility_misses_the_bar_in_most_sweeps():
    """What issue 62's bar asks of one sweep, asked of the runs themselves: a predictor that knew each run's
    time from the same session's other rounds meets median <= 10 % and worst <= 25 % in 3 of 15 rounds, and
    from the other attempts in 2 of 5 (docs/simulator.md, the attempts' README)."""
    meets = 0
    for ref, want in SAME_SESSION.items():
        got = A.reproducibility([REFS / ref / "runs" / f"round-{k}" for k in (1, 2, 3)])
        assert [(f"{g['median_abs_error']:.1%}", f"{g['worst_abs_error']:.1%}") for g in got] == want, ref
        meets += sum(g["meets_bar"] for g in got)
    assert meets == 3
    got = A.reproducibility([d / "runs" for d in A.attempt_dirs(ATTEMPTS)])
    assert [(f"{g['median_abs_error']:.1%}", f"{g['worst_abs_error']:.1%}") for g in got] == ACROSS_ATTEMPTS
    assert sum(g["meets_bar"] for g in got) == 2
    readme = (ATTEMPTS / "README.md").read_text()
    for (name, (median, worst, _, _)), (o_median, o_worst) in zip(RECORDED.items(), ACROSS_ATTEMPTS):
        assert f"| {name} | {median} / {worst} | {o_median} / {o_worst} |" in readme, name


def test_two_back_to_back_sweeps_do_not_repeat_within_the_bar():
    """results/reference/sim-validation-cpu-2core-repeats: the suite swept twice in a row, nothing changed; each
    sweep against the other misses median <= 10 % and worst <= 25 % (its README's table)."""
    repeats = REFS / "sim-validation-cpu-2core-repeats"
    got = A.reproducibility([repeats / "sweep-1", repeats / "sweep-2"])
    table = [(f"{g['median_abs_error']:.1%}", f"{g['worst_abs_error']:.1%}", g["worst_run"]) for g in got]
    assert table == [("11.2%", "38.0%", "002-tiny-dp2-s1"), ("10.4%", "40.7%", "007-tiny-dp4-s2")]
    assert not any(g["meets_bar"] for g in got) and all(g["runs"] == 34 for g in got)
    readme = (repeats / "README.md").read_text()
    for k, (median, worst, run) in enumerate(table, 1):
        assert f"| sweep-{k} | {median} | {worst} | {run} |" in readme
    mini = [V.step_times(repeats / s)["009-mini-dp1-s0"] for s in ("sweep-1", "sweep-2")]
    assert [f"{t * 1e3:.1f}" for t in mini] == ["56.2", "40.0"]


def test_validate_says_how_closely_the_measured_sweeps_repeat(tmp_path, capsys):
    """``simulate --validate`` on a directory of sweeps prints their repeatability under its summary (each sweep
    against the median of the others: the closest a prediction of one sweep can be held); on one sweep it says
    that is unknown and how to find out."""
    from zerobench.cli import main

    profile = ROUNDS / "profile" / "round-1"
    assert main(["simulate", "--profile", str(profile), "--validate", str(ROUNDS / "runs")]) == 0
    out = capsys.readouterr().out
    assert "the 3 sweeps, each predicted by the median of the others over 34 runs: median 3.0%-3.5%, worst " in out
    assert "26.3% (" in out
    assert main(["simulate", "--profile", str(profile), "--validate", str(ROUNDS / "runs" / "round-1")]) == 0
    assert "one sweep: how closely its runs repeat is unknown" in capsys.readouterr().out
    # sweeps are found at any depth, and --json carries the figures
    for k in (1, 2):
        shutil.copytree(ROUNDS / "runs" / f"round-{k}", tmp_path / f"day-{k}" / f"round-{k}")
    assert main(["simulate", "--profile", str(profile), "--validate", str(tmp_path), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["sweeps_repeat"]
    assert [Path(g["sweep"]).name for g in got] == ["round-1", "round-2"] and got[0]["runs"] == 34
