"""Rendezvous and launch faults, end to end: a port held by another process, a rank that exits 0 in mid-run,
and a rank whose disk fills. Each ends in one line that names the cause, a ``failed`` status row (where a
launcher records one) and no rank left running."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_cli_train import zb
from tests.e2e.test_faults import TINY, one_line, ranks_running, status_rows

pytestmark = pytest.mark.dist


@pytest.fixture
def held_port():
    """A port another process serves: it accepts connections and never answers (not a zerobench store)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield s.getsockname()[1]
    s.close()


def torchrun_env(rank: int, port: int, **extra: str) -> dict[str, str]:
    """The environment torchrun gives rank ``rank`` of two, rendezvous on 127.0.0.1:``port``."""
    return {
        **os.environ,
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "LOCAL_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        **extra,
    }


def test_a_port_in_use_is_one_line_on_every_rank_and_none_hangs(tmp_path, held_port):
    # Two ranks started by hand with torchrun's variables, MASTER_PORT taken by another process.
    procs = []
    for rank in (0, 1):
        env = torchrun_env(rank, held_port)
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "zerobench",
                    "train",
                    *TINY,
                    "--steps",
                    "2",
                    "--collective-timeout",
                    "1",
                    "--out",
                    str(tmp_path / f"rank{rank}"),
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    errs = []
    try:
        for p in procs:
            errs.append(p.communicate(timeout=120)[1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    where = f"127.0.0.1:{held_port}"
    line0, line1 = one_line(errs[0]), one_line(errs[1])
    assert [p.returncode for p in procs] == [1, 1], errs
    assert f"rank 0 cannot listen on {where}" in line0 and "choose another MASTER_PORT" in line0, line0
    assert f"rank 1 could not reach rank 0 at {where} within 1 s" in line1 and "MASTER_PORT" in line1, line1


@pytest.mark.slow  # the fast tier's port in use: the test above
def test_a_launcher_port_taken_before_rank_0_binds_it_is_one_line(tmp_path, held_port):
    # The window between the launcher picking a port and rank 0 listening on it, forced open.
    out = tmp_path / "run"
    code = (
        "import contextlib, sys\nimport zerobench.launch.local as local\n"
        f"local.free_port = lambda: {held_port}\n"
        f"local.reserved_port = lambda: contextlib.nullcontext({held_port})\n"
        "from zerobench.cli import main\n"
        f"sys.exit(main(['train', *{TINY!r}, '--dp', '2', '--steps', '2', '--collective-timeout', '5', "
        f"'--out', {str(out)!r}]))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    line = one_line(r.stderr)
    assert r.returncode == 1, r.stderr
    assert f"rank 0 cannot listen on 127.0.0.1:{held_port}" in line and "EADDRINUSE" in line, line
    rows = status_rows(out)
    assert [x["status"] for x in rows] == ["failed"] and "EADDRINUSE" in rows[0]["reason"]
    assert not ranks_running(str(out))


def _torchrun_pair(out, fault: str, stagger_s: float = 0.0):
    """Two ranks of ``zerobench train --out out`` started as torchrun starts them, with ``fault`` planted; both waited
    for (rank 0 first: rank 1 may hang until it is killed), rank 1 started ``stagger_s`` after rank 0. Returns the
    processes and their standard errors."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs, errs = [], []
    try:
        for rank in (0, 1):
            if rank:
                time.sleep(stagger_s)
            env = torchrun_env(rank, port, ZEROBENCH_FAULT=fault)
            cmd = [sys.executable, "-m", "zerobench", "train", *TINY, "--steps", "4", "--collective-timeout", "20"]
            procs.append(
                subprocess.Popen(
                    [*cmd, "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
            )
        errs.append(procs[0].communicate(timeout=240)[1])
    finally:
        for p in procs[len(errs) :]:
            if p.poll() is None:
                p.kill()
            errs.append(p.communicate()[1])
    return procs, errs


@pytest.mark.parametrize("kind", ["exit", pytest.param("stop", marks=pytest.mark.slow)])  # stop: a hang to time out
def test_a_peer_that_dies_or_hangs_under_torchrun_leaves_a_failed_status_not_an_incomplete_run(tmp_path, kind):
    """Ranks started as torchrun starts them (no zerobench launcher above them to record the run's end): rank 1
    dies (``exit``, as a crash) or hangs (``stop``) at step 1. Rank 0 ends in one line naming the dead or stuck
    peer (from the ranks' reports: rank 1's process is gone without an end written, or it has said nothing) and
    what rank 0 saw, and writes the run's one ``failed`` status row with that reason; the run does not read
    ``incomplete``. Before, the line said only that a peer died."""
    out = tmp_path / "run"
    procs, errs = _torchrun_pair(out, f"1:1:{kind}")
    err0 = errs[0]
    line = one_line(err0)
    named = "rank 1 ended without a report" if kind == "exit" else "rank 1 did not report how it ended"
    assert procs[0].returncode != 0 and line.startswith(f"zerobench: error: {named}"), err0
    assert ("rank 0 lost its connection to a peer rank" in line) or ("a peer rank is stuck or dead" in line), line
    (row,) = status_rows(out)
    assert row["status"] == "failed" and row["reason"] == line.removeprefix("zerobench: error: "), row


def test_a_peer_out_of_memory_under_torchrun_stays_the_runs_status(tmp_path):
    """Rank 1 runs out of memory and records the run as ``oom``; rank 0 then loses its connection to it. Rank 0's
    ``failed`` row came last and the run read failed (the last status row wins): it now leaves the peer's row."""
    out = tmp_path / "run"
    procs, errs = _torchrun_pair(out, "1:1:oom")
    assert [p.returncode for p in procs] != [0, 0], errs
    (row,) = status_rows(out)
    assert row["status"] == "oom" and row["reason"].startswith("rank 1 ran out of memory"), row


def test_ranks_started_seconds_apart_write_one_runs_rows(tmp_path):
    """Each rank named the run by its own clock (``train-YYYYmmdd-HHMMSS``): ranks started across a second wrote the
    peer's ``oom`` row and rank 0's rows under two run ids, so the run read incomplete beside a run of one row (the
    peer test above failed so on a loaded machine). Every rank now takes rank 0's id through the job's store."""
    out = tmp_path / "run"
    procs, errs = _torchrun_pair(out, "1:1:oom", stagger_s=1.5)
    assert [p.returncode for p in procs] != [0, 0], errs
    (row,) = status_rows(out)
    assert row["status"] == "oom" and row["run_id"].startswith("train-"), row
    ids = {json.loads(line)["run_id"] for f in out.rglob("rows.jsonl") for line in f.read_text().splitlines()}
    assert ids == {row["run_id"]}, ids


@pytest.mark.slow
def test_a_rank_that_exits_0_early_is_named_as_the_cause(tmp_path):
    out = tmp_path / "run"
    r = zb(
        "train",
        *TINY,
        "--dp",
        "2",
        "--steps",
        "20",
        "--collective-timeout",
        "30",
        "--out",
        str(out),
        env={"ZEROBENCH_FAULT": "1:2:exit0"},
        timeout=180,
    )
    line = one_line(r.stderr)
    assert r.returncode == 1, r.stderr
    assert "rank 1 exited (code 0) before the run finished" in line, line
    rows = status_rows(out)
    assert [x["status"] for x in rows] == ["failed"]
    assert rows[0]["reason"].startswith("rank 1 exited (code 0) before the run finished"), rows[0]["reason"]
    assert not ranks_running(str(out))


def test_a_rank_out_of_disk_space_is_named_in_the_line_the_status_and_the_log(tmp_path):
    out = tmp_path / "run"
    r = zb("train", *TINY, "--dp", "2", "--steps", "20", "--out", str(out), env={"ZEROBENCH_FAULT": "1:2:nospace"})
    line = one_line(r.stderr)
    assert r.returncode == 1, r.stderr
    assert "rank 1" in line and "No space left on device writing" in line and "planted-rank1-step2" in line, line
    rows = status_rows(out)
    assert [x["status"] for x in rows] == ["failed"] and "No space left on device" in rows[0]["reason"]
    assert "No space left on device" in (out / "run.log").read_text()
    assert not ranks_running(str(out))


LIMIT = 16 * 1024


def _limit_file_size():
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


@pytest.mark.slow
def test_a_file_size_limit_reaches_the_one_line_when_neither_log_nor_status_can_be_written(tmp_path):
    # A real OSError from the kernel (EFBIG): every file of the run stops at LIMIT bytes, and run.log is
    # already there, so neither the ranks' output nor the status row can be written.
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.log").write_bytes(b"#" * LIMIT)
    with contextlib.suppress(FileNotFoundError):
        Path(out / "rows.jsonl").unlink()
    r = subprocess.run(
        [sys.executable, "-m", "zerobench", "train", *TINY, "--dp", "2", "--steps", "3", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        preexec_fn=_limit_file_size,
    )
    line = one_line(r.stderr)
    assert r.returncode == 1, r.stderr
    assert "rank 0 could not write its results" in line and "File too large" in line, line
    assert "status row could not be written" in line, line
    assert (out / "run.log").stat().st_size == LIMIT  # nothing reached the log
    assert not ranks_running(str(out))


@pytest.mark.slow
@pytest.mark.parametrize("dead", [0, 2])
def test_under_real_torchrun_the_status_row_names_the_rank_that_died(tmp_path, dead):
    """torchrun SIGTERMs the survivors once a rank exits with an error, often before rank 0 sees the lost connection:
    rank 0 died by the signal and the run had no status row at all, nor any row naming the rank that died (rank 2
    here); with rank 0 itself dead, nobody recorded the run. Each rank now reports how it ended, rank 0 (or, where
    rank 0 died, the first survivor to see it) names the rank whose process ended without a report."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-port", str(port)]
    cmd += ["-m", "zerobench", "train", *TINY, "--steps", "4", "--collective-timeout", "30", "--out", str(out)]
    env = {**os.environ, "ZEROBENCH_FAULT": f"{dead}:2:exit"}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0, r.stderr[-3000:]
    (row,) = status_rows(out)
    assert row["status"] == "failed", row
    assert row["reason"].startswith(f"rank {dead} ended without a report (killed, or exited abruptly"), row
