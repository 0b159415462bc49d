"""``zerobench peers --summarize DIR``: a comparison that stopped before its summary (the H200's 400 s limit cut
one at its 30th of 31 runs) is tabled from the runs it finished, with what is missing said, and bad input is one
line."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.e2e.test_cli_train import zb
from zerobench.bench.peers import COMPARISON_FILE
from zerobench.cli import main
from zerobench.results.rows import read_rows

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # a whole peers comparison (about 25 s) to stop


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("peers") / "full"
    r = zb(
        "peers",
        "--systems",
        "torch-ddp",
        "zerobench-0",
        "zerobench-3",
        "--dp",
        "1",
        "--rounds",
        "1",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--no-memory-run",
        "--out",
        str(out),
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    return out


def _summary(out) -> dict:
    return {(r["candidate"], r["metric"]): r for r in read_rows(out / "summary")}


def test_a_stopped_comparison_is_tabled_from_the_runs_it_finished(finished, tmp_path, capsys):
    stopped = tmp_path / "stopped"  # as if stopped during its third run: no zerobench-3 run, no reference, no summary
    shutil.copytree(finished, stopped, ignore=shutil.ignore_patterns("summary", "reference", "r0-zerobench-3"))
    assert main(["peers", "--summarize", str(stopped)]) == 1  # a candidate did not run
    printed = capsys.readouterr().out
    assert "zerobench-3" in printed and "failed" in printed and f"rows: {stopped}" in printed
    got, full = _summary(stopped), _summary(finished)
    assert (
        got[("zerobench-0", "peer_time_vs_torch_ddp")]["value"]
        == full[("zerobench-0", "peer_time_vs_torch_ddp")]["value"]
    )
    assert got[("zerobench-3", "peer_step_time_s")]["status"] == "failed"
    assert (
        got[("zerobench-3", "peer_step_time_s")]["reason"]
        == "not run: the comparison stopped before any of its timed runs"
    )
    assert ("zerobench-0", "peer_loss_max_abs_diff") not in got  # the reference run is missing: no parity claimed
    assert ("zerobench-0", "peer_loss_max_abs_diff") in full
    hardware = {r["provenance"]["hardware"]["class"] for r in read_rows(stopped / "summary")}
    assert hardware == {r["provenance"]["hardware"]["class"] for r in read_rows(finished / "r0-torch-ddp")}


def test_a_run_that_failed_makes_its_candidate_failed_in_a_stopped_summary(finished, tmp_path, capsys):
    """``--summarize`` looked only for a rows file: a candidate whose run crashed after writing rows read "ok",
    with no figures, and the command exited 0."""
    stopped = tmp_path / "stopped"
    shutil.copytree(finished, stopped, ignore=shutil.ignore_patterns("summary"))
    rows = stopped / "r0-zerobench-3" / "rows.jsonl"
    lines = rows.read_text().splitlines()
    status = [json.loads(x) for x in lines if json.loads(x)["metric"] == "run_status"][-1]
    status.update(status="failed", value=0, reason="rank 0 exited with code 17")
    rows.write_text("\n".join([*lines, json.dumps(status)]) + "\n")
    assert main(["peers", "--summarize", str(stopped)]) == 1
    got = _summary(stopped)[("zerobench-3", "peer_step_time_s")]
    assert got["status"] == "failed" and got["reason"] == "r0-zerobench-3 failed: rank 0 exited with code 17"


def test_bad_summarize_input_is_one_line(finished, tmp_path, capsys):
    def refused(path) -> str:
        assert main(["peers", "--summarize", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        return err

    assert refused(finished).endswith(
        f"{finished} is summarised already ({finished / 'summary'}): remove that directory to summarise again"
    )
    assert refused(tmp_path).endswith(
        f"{tmp_path} holds no comparison (comparison.json is missing): give the --out "
        "directory of a zerobench peers run"
    )
    damaged = tmp_path / "damaged"
    shutil.copytree(finished, damaged, ignore=shutil.ignore_patterns("summary"))
    (damaged / COMPARISON_FILE).write_text(json.dumps({"peers": {"dp": 1}}))
    assert "comparison.json is damaged (KeyError: 'candidates')" in refused(damaged)
