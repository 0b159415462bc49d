"""A sweep stopped before some of its runs (a time limit, scancel) leaves no row of them: ``results show`` and the
report name them from the sweep's plan, where before they showed the runs that ran as if they were the suite."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from zerobench.cli import main
from zerobench.results.outdir import SWEEP_PLAN_FILE, stopped_before
from zerobench.results.rows import read_rows

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def stopped(tmp_path):
    """The quick suite's reference rows with its last two runs' directories gone, and a plan listing all of them."""
    d = tmp_path / "sweep"
    shutil.copytree(REPO / "results/reference/quick-cpu-2core", d)
    status = sorted((r for r in read_rows(d) if r["metric"] == "run_status"), key=lambda r: r["run_id"])
    plan = {"suite": "quick", "runs": [{"label": r["label"], "config_hash": r["config_hash"]} for r in status]}
    (d / SWEEP_PLAN_FILE).write_text(json.dumps(plan))
    for r in status[-2:]:
        shutil.rmtree(d / r["run_id"])
    return d, [r["label"] for r in status[-2:]]


def test_stopped_before_names_the_planned_runs_without_rows(stopped):
    d, gone = stopped
    assert stopped_before(d) == gone
    assert stopped_before(d.parent) == [f"sweep/{label}" for label in gone]  # a sweep below the path read
    assert stopped_before(next(d.rglob("rows.jsonl"))) == []  # one run's rows file: no sweep to speak of


def test_results_show_names_the_runs_never_run(stopped, capsys):
    d, gone = stopped
    assert main(["results", "show", str(d)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"not run: 2 planned runs (the sweep stopped before them): {', '.join(gone)}"


def test_the_report_names_the_runs_never_run(stopped, tmp_path):
    d, gone = stopped
    assert main(["report", str(d), "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "summary.md").read_text()
    html = (tmp_path / "r" / "index.html").read_text()
    names = ", ".join(f"{d.as_posix()}/{label}" for label in gone)
    assert "**Not run:** 2 planned runs (the sweep stopped before them" in md and names in md
    assert "<td>not run</td><td>2 planned runs" in html and names in html


def test_a_finished_sweep_has_no_not_run_line(stopped, tmp_path, capsys):
    d, _ = stopped
    plan = json.loads((d / SWEEP_PLAN_FILE).read_text())
    plan["runs"] = plan["runs"][:-2]  # the plan of a sweep that ran all its runs
    (d / SWEEP_PLAN_FILE).write_text(json.dumps(plan))
    assert main(["results", "show", str(d)]) == 0
    assert "not run" not in capsys.readouterr().out
    assert main(["report", str(d), "--out", str(tmp_path / "r")]) == 0
    assert "Not run" not in (tmp_path / "r" / "summary.md").read_text()


def test_a_damaged_plan_is_one_line_not_a_silent_table(stopped, capsys):
    d, _ = stopped
    (d / SWEEP_PLAN_FILE).write_text("{")
    assert main(["results", "show", str(d)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sweep-plan.json is damaged" in err[0], err


def test_a_run_killed_mid_way_is_incomplete_not_unstarted(stopped, capsys):
    """A run that left rows but no status row was started (and killed): ``results show`` calls it ``incomplete``; the
    not-run line does not name it as well."""
    d, gone = stopped
    status = [r for r in read_rows(REPO / "results/reference/quick-cpu-2core") if r["metric"] == "run_status"]
    killed = max(status, key=lambda r: r["run_id"])  # the last of the two removed runs: its rows back, not its status
    src = REPO / "results/reference/quick-cpu-2core" / killed["run_id"]
    (d / killed["run_id"]).mkdir()
    kept = [line for line in (src / "rows.jsonl").read_text().splitlines() if '"run_status"' not in line]
    (d / killed["run_id"] / "rows.jsonl").write_text("\n".join(kept) + "\n")
    assert stopped_before(d) == [label for label in gone if label != killed["label"]]
    assert main(["results", "show", str(d)]) == 0
    out = capsys.readouterr().out
    assert "incomplete" in out and out.strip().splitlines()[-1].endswith(f"stopped before them): {gone[0]}")


def test_a_sweep_still_running_is_not_called_stopped(stopped, tmp_path, capsys):
    """A writer holds its lock: the runs it has not reached are named as not yet run, and the gate will not take it as
    a baseline until it ends. A lock file left by a killed writer is held by no one: a stopped sweep."""
    import os

    from zerobench.results.lock import claim
    from zerobench.results.outdir import LOCK_FILE

    d, gone = stopped
    with claim(d):  # this process is the sweep's writer
        assert main(["results", "show", str(d)]) == 0
        last = capsys.readouterr().out.strip().splitlines()[-1]
        assert (
            last
            == f"not run: 2 planned runs (not yet: the sweep is still running, pid {os.getpid()}): " + ", ".join(gone)
        )
        code = main(["regress", "--write-baseline", str(tmp_path / "b.jsonl"), "--candidate", str(d)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and f"a writer holds the sweep's lock (pid {os.getpid()})" in err[0], err
        assert main(["report", str(d), "--out", str(tmp_path / "r")]) == 0
        md = (tmp_path / "r" / "summary.md").read_text()
        assert "the sweep is still running" in md and "--resume" not in md
    # a killed writer's record stays behind, naming a pid: nobody holds the lock
    (d / LOCK_FILE).write_text(json.dumps({"pid": os.getpid(), "host": "elsewhere", "command": "zb"}))
    assert main(["results", "show", str(d)]) == 0
    assert "(the sweep stopped before them)" in capsys.readouterr().out


def test_two_labels_of_one_configuration_are_told_apart_by_run_id(stopped):
    """A suite may hold one configuration under two labels (warned, then measured twice). The plan records each run's
    id, so the one that never started is named even though the other left rows of the same config hash; matching by
    hash alone counted the one that ran for both."""
    d, gone = stopped
    status = sorted((r for r in read_rows(d) if r["metric"] == "run_status"), key=lambda r: r["run_id"])
    twin = status[0]
    plan = {
        "suite": "quick",
        "runs": [{"label": r["label"], "config_hash": r["config_hash"], "run_id": r["run_id"]} for r in status]
        + [{"label": label, "config_hash": "x", "run_id": f"09{i}-{label}"} for i, label in enumerate(gone)]
        + [{"label": f"{twin['label']} #2", "config_hash": twin["config_hash"], "run_id": "099-twin"}],
    }
    (d / SWEEP_PLAN_FILE).write_text(json.dumps(plan))
    assert stopped_before(d) == [*gone, f"{twin['label']} #2"]
    # recorded by hash alone (a plan of before run ids), the twin's rows hide it: the fallback keeps that reading
    for r in plan["runs"]:
        r.pop("run_id")
    (d / SWEEP_PLAN_FILE).write_text(json.dumps(plan))
    assert f"{twin['label']} #2" not in stopped_before(d)


def test_a_retried_attempt_s_rows_count_for_its_run(stopped):
    """A run's later attempts write under ``<run id>-r<k>`` (``sweep_state.attempt_id``): a killed retry's rows make
    the run incomplete, not unstarted. A run id that merely begins like another's is another run."""
    d, gone = stopped
    status = sorted(
        (r for r in read_rows(REPO / "results/reference/quick-cpu-2core") if r["metric"] == "run_status"),
        key=lambda r: r["run_id"],
    )
    killed = status[-1]
    src = REPO / "results/reference/quick-cpu-2core" / killed["run_id"]
    retry = d / f"{killed['run_id']}-r2"
    retry.mkdir()
    kept = [json.loads(line) for line in (src / "rows.jsonl").read_text().splitlines() if '"run_status"' not in line]
    retry.joinpath("rows.jsonl").write_text("".join(json.dumps({**r, "run_id": retry.name}) + "\n" for r in kept))
    plan = json.loads((d / SWEEP_PLAN_FILE).read_text())
    by_label = {r["label"]: r["run_id"] for r in status}
    for r in plan["runs"]:
        r["run_id"] = by_label[r["label"]]
    plan["runs"].append({"label": "prefix", "config_hash": "y", "run_id": killed["run_id"][:-1]})
    (d / SWEEP_PLAN_FILE).write_text(json.dumps(plan))
    assert stopped_before(d) == [label for label in gone if label != killed["label"]] + ["prefix"]
