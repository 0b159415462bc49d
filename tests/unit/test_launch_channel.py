"""The local launcher's hold on its ranks, without training: a port no other process is given, and the pipe on
which a rank says it finished (or why not), so that an early exit 0 is named and a failure's line survives a
log that cannot be written."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys

import pytest

from zerobench.launch.cancel import Cancellation
from zerobench.launch.channel import ENV, LauncherEnds
from zerobench.launch.local import _watch, reserved_port


def test_a_reserved_port_is_refused_to_other_binds_and_open_to_a_reusing_listener():
    with reserved_port() as port:
        other = socket.socket()
        with pytest.raises(OSError) as e:
            other.bind(("127.0.0.1", port))
        assert e.value.errno == errno.EADDRINUSE
        other.close()
        store = socket.socket()  # as rank 0's store binds: SO_REUSEADDR, then listen
        store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        store.bind(("127.0.0.1", port))
        store.listen(1)
        store.close()


RANK = """
import os, sys
from zerobench.launch.channel import RankChannel
ch = RankChannel(int(os.environ["{env}"]))
{body}
"""


def start(ends: LauncherEnds, rank: int, body: str) -> subprocess.Popen:
    w = ends.open_for(rank)
    try:
        return subprocess.Popen(
            [sys.executable, "-c", RANK.format(env=ENV, body=body)], pass_fds=(w,), env={**os.environ, ENV: str(w)}
        )
    finally:
        os.close(w)


def watch(bodies: list[str], exited_first: bool = False) -> tuple[str, str, int | None, list[subprocess.Popen]]:
    """``_watch`` over ranks running ``bodies``; with ``exited_first`` every rank has exited before it looks."""
    ends = LauncherEnds()
    try:
        procs = [start(ends, r, b) for r, b in enumerate(bodies)]
        if exited_first:
            for p in procs:
                p.wait(timeout=60)
        with Cancellation() as cancel:
            status, reason, blamed = _watch(procs, ends, 60, cancel, None)
        return status, reason, blamed, procs
    finally:
        ends.close()


def test_ranks_that_say_they_finished_are_ok():
    status, reason, blamed, _ = watch(["ch.done()", "ch.done()"])
    assert (status, reason, blamed) == ("ok", "", None)


def test_a_rank_that_exits_0_without_finishing_is_named_and_the_others_stopped():
    status, reason, blamed, procs = watch(["import time; time.sleep(60)", "os._exit(0)"])
    assert status == "failed" and blamed == 1, reason
    assert reason == "rank 1 exited (code 0) before the run finished"
    assert procs[0].returncode is not None  # stopped, not left waiting in a collective


def test_an_early_exit_0_is_the_cause_before_a_rank_that_failed_for_want_of_it():
    # rank 1 left; rank 0 then failed (its collective's peer was gone), both before the launcher looked
    status, reason, blamed, _ = watch(["sys.exit(1)", "os._exit(0)"], exited_first=True)
    assert (status, blamed) == ("failed", 1)
    assert reason == "rank 1 exited (code 0) before the run finished; then rank 0 exited with code 1"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_failing_rank_line_reaches_the_launcher_when_its_stderr_cannot_be_written():
    ends = LauncherEnds()
    try:
        w = ends.open_for(0)
        code = (
            "import os, sys\nfrom zerobench.launch.channel import RankChannel\nfrom zerobench.launch.worker import _say\n"
            f"sys.exit(_say(RankChannel({w}), 'error: rank 0: No space left on device writing /x', 74))"
        )
        with open("/dev/full", "w") as full:  # every write to stderr: ENOSPC
            p = subprocess.run([sys.executable, "-c", code], pass_fds=(w,), stderr=full, timeout=120)
        os.close(w)
        assert p.returncode == 74
        assert ends.report(0).error == "rank 0: No space left on device writing /x"
        assert not ends.report(0).done
    finally:
        ends.close()


def test_a_requeued_task_s_report_starts_afresh(tmp_path, monkeypatch):
    """A requeued ``--launcher slurm`` job keeps its id and its run directory: the task appended to the earlier
    attempt's ``ranks/rank0``, and the step was blamed on that attempt's error (a helper's review). The task's report
    now starts with this attempt."""
    import json

    from zerobench.launch import channel, task, worker
    from zerobench.launch.channel import read_rank_files

    ranks = tmp_path / "ranks"
    ranks.mkdir()
    (ranks / "rank0").write_text("1.0 error RuntimeError: the earlier attempt's\n2.0 exit 1\n")
    spec = tmp_path / "run.json"
    spec.write_text(json.dumps({"config": {}, "run_id": "r", "out": str(tmp_path)}))
    monkeypatch.setenv(channel.FILE_ENV, str(ranks))
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setattr(worker, "run", lambda *args: 17)  # this attempt's own end, with no error line
    assert task.main([str(spec)]) == 17
    (end,) = read_rank_files(ranks)
    assert end.error is None and end.code == 17, end
