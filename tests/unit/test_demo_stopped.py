"""The demo's answer to a sweep that did not finish: an error line naming how to finish it, the exit status of
what stopped it, and no table or report that would read a part of the suite as the demo's result."""

from __future__ import annotations

import json

import pytest

from zerobench.bench.sweep_state import SweepSummary
from zerobench.cli import main


@pytest.mark.parametrize(
    "why, code",
    [
        ("cancelled (SIGTERM) during '003-dp2-z1'", 143),
        ("cancelled (SIGINT) before '004-dp2-z2'", 130),
        ("results could not be written, the sweep stopped: [Errno 28] No space left on device", 1),
    ],
)
def test_a_stopped_demo_fails_with_no_report(tmp_path, monkeypatch, capsys, why, code):
    seen = {}

    def stopped_sweep(suite, out, **kw):
        seen["runs"] = len(suite.runs)
        return SweepSummary(ran=["001-dp1-z0"], stopped=why)

    def no_render(*a, **k):
        raise AssertionError("a stopped demo rendered a report")

    monkeypatch.setattr("zerobench.demo.run_sweep", stopped_sweep)
    monkeypatch.setattr("zerobench.demo.print_stage_table", no_render)
    monkeypatch.setattr("zerobench.report.render.render", no_render)
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out)]) == code
    io = capsys.readouterr()
    assert seen["runs"] > 1
    if code == 1:  # the sweep itself said why (a full disk): the demo adds where the rows are, not a second error
        assert "zerobench: error" not in io.err and "zerobench: note: its rows so far" in io.err
    else:
        assert f"zerobench: error: demo stopped: {why}" in io.err
    assert f"zerobench sweep cpu/quick --out {out} --resume" in io.err
    assert "report:" not in io.out
    assert not (out / "report").exists()


def test_a_demo_into_a_directory_with_rows_names_the_resume(tmp_path, monkeypatch, capsys):
    """The directory's rows are an earlier demo's: the demo does not start over them, and its one line says how to
    continue that sweep instead; where they are another suite's or a single run's, continuing them as the quick
    suite would be refused too, so the line names no resume."""
    monkeypatch.setattr("zerobench.demo.run_sweep", lambda *a, **k: pytest.fail("the demo swept over held rows"))
    for suite, resumable in (("quick", True), ("fig2", False), (None, False)):
        out = tmp_path / f"demo-{suite}"
        (out / "001-dp1-z0").mkdir(parents=True)
        (out / "001-dp1-z0" / "rows.jsonl").write_text("{}\n")
        if suite is not None:
            (out / "sweep-plan.json").write_text(json.dumps({"suite": suite, "runs": []}))
        assert main(["demo", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert err[0].startswith("zerobench: error: --out") and "already holds result rows" in err[0]
        assert (f"zerobench sweep cpu/quick --out {out} --resume" in err[0]) == resumable, err[0]
