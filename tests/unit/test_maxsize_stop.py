"""``zerobench maxsize`` stopped part-way: SIGTERM/SIGINT end it with 143 (as ``sweep`` and ``peers``) in one
line, a failed probe ends it with 1; every path a line names exists, and the stages found before the stop keep
their rows. Probes are planted (``launch_local`` replaced): no processes."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from tests.unit.test_bad_inputs import run
from zerobench.bench.maxsize import search_max_layers
from zerobench.bench.spec import RunSpec
from zerobench.config import RunFailed
from zerobench.launch.base import LaunchResult
from zerobench.launch.cancel import EXIT_CANCELLED, Cancelled
from zerobench.results.rows import read_rows


def sigterm() -> None:
    """SIGTERM to this process, as Slurm's time limit sends it; only while maxsize holds a handler (else the
    test session itself would end)."""
    assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None), "no SIGTERM handler while probing"
    os.kill(os.getpid(), signal.SIGTERM)


def planted_probes(monkeypatch, outcome):
    """Probes whose status is ``outcome(layers)``; each writes its log as a real one does. Returns the logs."""
    logs = []

    def launch_local(cfg, out_dir, run_id, timeout_s, log_path, cancel=None):
        Path(log_path).write_text(f"probe {cfg.model.layers}\n")
        logs.append(Path(log_path))
        status = outcome(cfg.model.layers)
        if status == "signal":  # SIGTERM arrives as this probe ends well
            sigterm()
            status = "ok"
        reason = {
            "ok": "",
            "oom": "rank 0 ran out of memory: tracked memory 9.0 MiB would exceed the budget of 8.0 MiB",
            "host-oom": "rank 0 ran out of memory: DefaultCPUAllocator: can't allocate memory",
            "failed": "rank 0 exited with code 1",
            "cancelled": f"cancelled ({cancel.requested}): the ranks were stopped" if cancel else "",
        }[status]
        return LaunchResult(status == "ok", reason, status.removeprefix("host-"), [0], 0.1)

    monkeypatch.setattr("zerobench.bench.maxsize.launch_local", launch_local)
    return logs


def cancel_at(layers):
    """A SIGTERM while the probe with ``layers`` runs: the launcher stops its ranks and reports ``cancelled``."""

    def outcome(n):
        if n == layers:
            sigterm()  # the handler records it; the launcher stops the ranks
            return "cancelled"
        return "ok"

    return outcome


def cited_paths(line: str) -> list[Path]:
    return [Path(p) for p in re.findall(r"(/[^\s;)]+)", line)]


def test_a_cancelled_probe_stops_the_search_and_cites_no_deleted_log(monkeypatch):
    logs = planted_probes(monkeypatch, cancel_at(2))
    with pytest.raises(Cancelled, match=r"cancelled \(SIGTERM\) during the probe with 2 layers") as e:
        search_max_layers(RunSpec(preset="tiny", dp=1), "8MiB")
    assert all(p.exists() for p in cited_paths(str(e.value))), str(e.value)
    assert not logs[0].parent.parent.exists(), "the temporary probe directory is removed"


def test_a_cancelled_probe_under_probes_cites_its_kept_log(monkeypatch, tmp_path):
    planted_probes(monkeypatch, cancel_at(2))
    with pytest.raises(Cancelled) as e:
        search_max_layers(RunSpec(preset="tiny", dp=1), "8MiB", work_dir=tmp_path)
    assert cited_paths(str(e.value)) == [tmp_path / "probe-2" / "run.log"]
    assert (tmp_path / "probe-2" / "run.log").exists()


def test_a_signal_between_probes_stops_before_the_next(monkeypatch):
    logs = planted_probes(monkeypatch, lambda n: "signal" if n == 2 else "ok")
    with pytest.raises(Cancelled, match=r"cancelled \(SIGTERM\) before the probe with 4 layers"):
        search_max_layers(RunSpec(preset="tiny", dp=1), "8MiB")
    assert len(logs) == 2


def test_a_failed_probe_is_a_run_failure_whose_log_is_kept(monkeypatch):
    logs = planted_probes(monkeypatch, lambda n: "failed" if n == 2 else "ok")
    with pytest.raises(RunFailed, match="probe with 2 layers failed") as e:
        search_max_layers(RunSpec(preset="tiny", dp=1), "8MiB")
    assert cited_paths(str(e.value)) == [logs[-1]] and logs[-1].read_text() == "probe 2\n"


def test_sigterm_exits_143_in_one_line_keeping_the_finished_stages_rows(monkeypatch, tmp_path, capsys):
    planted_probes(monkeypatch, lambda n: "oom" if n > 1 else "ok")  # stage 0: 1 layer fits, 2 do not
    real = search_max_layers

    def cancelled_at_stage_3(spec, *args, **kwargs):
        if spec.stage == 3:
            planted_probes(monkeypatch, cancel_at(1))
        return real(spec, *args, **kwargs)

    monkeypatch.setattr("zerobench.bench.maxsize.search_max_layers", cancelled_at_stage_3)
    code, err = run(
        [
            "maxsize",
            "--budget",
            "8MiB",
            "--preset",
            "tiny",
            "--dp",
            "1",
            "--stage",
            "0",
            "3",
            "--out",
            str(tmp_path / "out"),
        ],
        capsys,
    )
    lines = err.strip().splitlines()
    assert code == EXIT_CANCELLED == 143, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "maxsize stopped at stage 3: cancelled (SIGTERM) during the probe with 1 layers" in lines[0], lines[0]
    assert all(p.exists() for p in cited_paths(lines[0])), lines[0]
    rows = {(r["run_id"], r["metric"]): r["value"] for r in read_rows(tmp_path / "out")}
    assert (
        rows
        == {
            ("maxsize-stage0", "max_layers"): 1,
            ("maxsize-stage0", "max_params"): rows[("maxsize-stage0", "max_params")],
        }
        and rows[("maxsize-stage0", "max_params")] > 0
    )


def test_a_search_whose_limit_fits_says_at_least_and_its_rows_say_so(monkeypatch, tmp_path, capsys):
    """Every probe fits up to ``--max-layers``: the maximum is beyond the search, so the answer is a lower bound,
    printed and recorded as one (it was printed as "at most"); a start above the limit is refused up front."""
    from zerobench.cli import main
    from zerobench.report.maxsize import maxsize_table
    from zerobench.results import load

    def zb(*argv):
        code = main(["maxsize", "--budget", "8MiB", *argv])
        got = capsys.readouterr()
        return code, got.out, got.err

    planted_probes(monkeypatch, lambda n: "ok")
    code, out, err = zb("--max-layers", "6", "--out", str(tmp_path))
    assert code == 0, err
    assert "stage 0: at least 6 layers" in out and "the --max-layers limit fits: raise it" in out, out
    assert {r["bound"] for r in read_rows(tmp_path) if r["metric"] in ("max_layers", "max_params")} == {"at least"}
    from zerobench.bench.maxsize import PROBE_STEPS

    # the rows say what each probe ran (they said the spec's 6 steps and 2 of warm-up)
    assert {(r["config"]["steps"], r["config"]["warmup"]) for r in read_rows(tmp_path)} == {(PROBE_STEPS, 0)}
    assert maxsize_table(load(tmp_path))["at_least"].tolist() == [True, True]  # stages 0 and 3, the default
    planted_probes(monkeypatch, lambda n: "ok" if n <= 3 else "oom")
    code, out, err = zb("--max-layers", "6")
    assert code == 0 and "stage 0: at most 3 layers" in out and "raise it" not in out, out
    code, out, err = zb("--max-layers", "10", "--start-layers", "300")
    assert code == 2 and "--start-layers 300 is above --max-layers 10" in err, err


def test_a_probe_that_ran_out_of_host_memory_is_no_answer(monkeypatch, tmp_path):
    """A probe whose host allocator failed (the host ran out, not the emulated budget) was counted as "does not
    fit", and the search reported the host's limit as the budget's answer (a helper's review, under ulimit -v)."""
    planted_probes(monkeypatch, lambda layers: "ok" if layers <= 3 else "host-oom")
    spec = RunSpec(preset="tiny", dp=1, memory_budget="8MiB")
    with pytest.raises(RunFailed, match=r"ran out of this host's memory, not of the 8MiB budget"):
        search_max_layers(spec, "8MiB", limit=16, work_dir=tmp_path)
