"""Every reader of rows tells a run's status the same way (``results/status.py``), from synthetic rows built on the
committed CPU baseline (a sweep of ``suites/cpu/ci.yaml``):

- a training run with no ``run_status`` row (its launcher killed before writing it, the disk full) is
  ``incomplete`` in ``results show``, is not a data point of the report (which names it), and is listed by the
  regression gate and fails it as missing, never compared or passed; before, all three read it as ``ok``;
- rows from before every launcher wrote a status row (no suite, no ``schema``) read ``unrecorded``, counted as
  they always were;
- what the candidate has and the baseline lacks (a gated metric, a whole configuration) is listed as "not in the
  baseline", failing only under ``strict``; before, it passed without a word;
- a proposed baseline keeps only the rows of ``ok`` runs.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pandas as pd
import pytest

from zerobench.bench.regress import run_gate, write_baseline
from zerobench.config import ConfigError
from zerobench.report import aggregate
from zerobench.results.show import show
from zerobench.results.status import INCOMPLETE, UNRECORDED, status_of

BASELINE = Path(__file__).resolve().parents[2] / "results" / "baselines" / "cpu-2core.jsonl"


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return [json.loads(line) for line in BASELINE.read_text().splitlines()]


def _without_status(rows: list[dict], run: str) -> list[dict]:
    out = [copy.deepcopy(r) for r in rows if not (r["run_id"] == run and r["metric"] == "run_status")]
    assert len(out) == len(rows) - 1
    return out


def _write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _lines(text: str) -> dict[str, str]:
    return {line.split()[0]: line for line in text.splitlines()[1:]}


def test_show_names_a_run_without_a_status_row_incomplete(tmp_path, rows):
    _write(tmp_path / "rows.jsonl", _without_status(rows, "001-stage-1"))
    lines = _lines(show(tmp_path))
    assert lines["001-stage-1"].split()[1] == INCOMPLETE, lines["001-stage-1"]
    assert "no run_status row" in lines["001-stage-1"]
    assert all(lines[r].split()[1] == "ok" for r in lines if r != "001-stage-1"), lines


def test_rows_from_before_status_rows_read_unrecorded_not_ok(tmp_path, rows):
    legacy = [  # a row of before status rows: no suite, no schema stamp
        {**{k: v for k, v in r.items() if k != "schema"}, "suite": None}
        for r in _without_status(rows, "002-stage-2")
        if r["run_id"] == "002-stage-2"
    ]
    assert status_of(legacy)[0] == UNRECORDED
    assert status_of([dict(r, schema=2) for r in legacy])[0] == INCOMPLETE  # a current writer always records one
    _write(tmp_path / "rows.jsonl", legacy)
    assert _lines(show(tmp_path))["002-stage-2"].split()[1] == UNRECORDED


def _one_incomplete_one_failed(rows: list[dict]) -> list[dict]:
    cand = _without_status(rows, "001-stage-1")
    failed = next(r for r in cand if r["run_id"] == "002-stage-2" and r["metric"] == "run_status")
    failed.update(status="failed", reason="training diverged")
    return cand


def test_the_report_does_not_count_an_incomplete_or_failed_run(rows):
    df = pd.json_normalize(_one_incomplete_one_failed(rows), sep=".")
    table = aggregate.runs_table(df)
    assert table["repeats"].sum() == len({r["run_id"] for r in rows}) - 2 and not (
        {1, 2} & set(table[table["dp"] == 2]["stage"])
    ), table
    assert set(aggregate.losses_table(df)["run_id"]) == {r["run_id"] for r in rows} - {"001-stage-1", "002-stage-2"}
    assert aggregate.run_statuses(df) == {"failed": ["002-stage-2"], "incomplete": ["001-stage-1"]}


@pytest.mark.slow
def test_the_report_names_the_runs_it_did_not_count(tmp_path, rows):
    from zerobench.report.render import render

    cand = _one_incomplete_one_failed(rows)
    render([str(_write(tmp_path / "in" / "rows.jsonl", cand).parent)], str(tmp_path / "report"))
    md = (tmp_path / "report" / "summary.md").read_text()
    assert "**Incomplete, not counted:** 1 run (no run_status row" in md and "001-stage-1" in md, md
    assert "**Failed, not counted:** 1 run: 002-stage-2" in md, md


def _gate(tmp_path, baseline, candidate, capsys, strict=False) -> tuple[int, str]:
    base = _write(tmp_path / "base.jsonl", baseline)
    cand = _write(tmp_path / "cand.jsonl", candidate)
    code = run_gate(str(base), str(cand), 0.05, str(tmp_path / "proposed.jsonl"), timing="report", strict=strict)
    return code, capsys.readouterr().out


def test_the_gate_fails_an_incomplete_candidate_run_and_says_so(tmp_path, rows, capsys):
    code, out = _gate(tmp_path, rows, _without_status(rows, "003-stage-3"), capsys)
    assert code == 1, out
    assert "missing: stage=3 (in the baseline, not completed in the candidate)" in out, out
    assert "not completed: stage=3 (run 003-stage-3: incomplete: no run_status row" in out, out
    table = out.split("\n  missing:")[0].splitlines()
    assert [x for x in table if x.split()[:1] == ["stage=2"]] and not [x for x in table if x.split()[:1] == ["stage=3"]]


def test_a_metric_the_baseline_lacks_is_listed_and_fails_only_when_strict(tmp_path, rows, capsys):
    base = [r for r in rows if not (r["run_id"] == "003-stage-3" and r["metric"] == "peak_memory_bytes")]
    code, out = _gate(tmp_path, base, rows, capsys)
    assert code == 0 and "not in the baseline: stage=3: peak_memory_bytes" in out, out
    code, out = _gate(tmp_path, base, rows, capsys, strict=True)
    assert code == 1 and "not in the baseline: stage=3: peak_memory_bytes (fails: --strict)" in out, out


def test_a_configuration_the_baseline_lacks_is_listed(tmp_path, rows, capsys):
    base = [r for r in rows if r["run_id"] != "003-stage-3"]
    code, out = _gate(tmp_path, base, rows, capsys)
    assert code == 0 and "not in the baseline: stage=3 (no run of this configuration in the baseline)" in out, out
    code, _ = _gate(tmp_path, base, rows, capsys, strict=True)
    assert code == 1


def test_a_proposed_baseline_keeps_only_ok_runs(tmp_path, rows):
    cand = _without_status(copy.deepcopy(rows), "001-stage-1")
    next(r for r in cand if r["run_id"] == "002-stage-2" and r["metric"] == "run_status")["status"] = "failed"
    n = write_baseline(cand, tmp_path / "b.jsonl")
    kept = {json.loads(line)["run_id"] for line in (tmp_path / "b.jsonl").read_text().splitlines()}
    assert kept == {r["run_id"] for r in rows} - {"001-stage-1", "002-stage-2"} and n > 0


def test_write_baseline_refuses_a_configuration_with_no_completed_run(tmp_path, rows, capsys):
    """``regress --write-baseline`` from a sweep with an incomplete or failed configuration wrote the rest without
    a word, and the gate then listed that configuration as "not in the baseline" and passed, for good."""
    from zerobench.cli import main

    cand = _without_status(copy.deepcopy(rows), "001-stage-1")
    (tmp_path / "cand").mkdir()
    (tmp_path / "cand" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in cand))
    code = main(["regress", "--write-baseline", str(tmp_path / "b.jsonl"), "--candidate", str(tmp_path / "cand")])
    err = capsys.readouterr().err
    assert code == 2 and "1 configuration(s) with no completed run: 001-stage-1 (incomplete)" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "b.jsonl").exists()


def test_write_baseline_refuses_a_sweep_stopped_before_some_of_its_runs(tmp_path, rows, capsys):
    """A sweep killed before its last runs left no row of them, so no check saw them missing: ``--write-baseline``
    wrote the rest and the gate then listed those configurations as "not in the baseline" and passed (a helper's
    review). The sweep's plan (``sweep-plan.json``, written as it starts) names them."""
    from zerobench.bench.sweep_state import PLAN_FILE
    from zerobench.cli import main

    status = [r for r in rows if r["metric"] == "run_status"]
    plan = {"suite": "ci", "runs": [{"label": r["label"], "config_hash": r["config_hash"]} for r in status]}
    last = status[-1]["run_id"]
    stopped = [r for r in rows if r["run_id"] != last]  # its directory never written
    _write(tmp_path / "cand" / "rows.jsonl", stopped)
    (tmp_path / "cand" / PLAN_FILE).write_text(json.dumps(plan))
    code = main(["regress", "--write-baseline", str(tmp_path / "b.jsonl"), "--candidate", str(tmp_path / "cand")])
    err = capsys.readouterr().err
    assert code == 2 and f"the sweep stopped before 1 of its planned runs ({status[-1]['label']})" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "b.jsonl").exists()
    _write(tmp_path / "cand" / "rows.jsonl", rows)  # the sweep finished (--resume)
    assert main(["regress", "--write-baseline", str(tmp_path / "b.jsonl"), "--candidate", str(tmp_path / "cand")]) == 0
    (tmp_path / "cand" / PLAN_FILE).write_text("{")
    code = main(["regress", "--write-baseline", str(tmp_path / "c.jsonl"), "--candidate", str(tmp_path / "cand")])
    assert code == 2 and "sweep-plan.json is damaged" in capsys.readouterr().err


def test_the_gate_refuses_a_candidate_of_two_code_versions(tmp_path, rows, capsys):
    """A candidate whose stage-0 rows came from another commit (or the same one with uncommitted changes) was
    gated without a word: step-time ratios taken across code versions, verdicts stamped with one (a helper's
    review)."""
    for change in ({"commit": "f" * 40}, {"dirty": True, "dirty_diff": "0a1b2c3d4e5f"}):
        cand = copy.deepcopy(rows)
        for r in cand:
            if r["run_id"] == "000-stage-0":
                r["provenance"].update(change)
        path = _write(tmp_path / "c.jsonl", cand)
        with pytest.raises(ConfigError, match=r"the candidate mixes runs of code .* and .*: a gate run judges one"):
            run_gate(str(BASELINE), str(path), 0.05, str(tmp_path / "p.jsonl"))


def test_the_gate_notes_another_processor_of_the_same_class(tmp_path, rows, capsys):
    """Instruction counts, CPU time and their noise model hold for the processor they were measured on; a candidate
    on another processor of the same class was gated without a word (a helper's review), as a torch version is not."""
    cand = copy.deepcopy(rows)
    for r in cand:
        r["provenance"]["hardware"]["device"] = "Intel Xeon Gold 6338"
    path = _write(tmp_path / "c.jsonl", cand)
    run_gate(str(BASELINE), str(path), 0.05, str(tmp_path / "p.jsonl"))
    out = capsys.readouterr().out
    assert "note: the baseline ran on AMD EPYC, the candidate on Intel Xeon Gold 6338 (one hardware class)" in out
    run_gate(str(BASELINE), str(BASELINE), 0.05, str(tmp_path / "q.jsonl"))
    assert "note: the baseline ran on" not in capsys.readouterr().out
