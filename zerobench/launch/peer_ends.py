"""How a run's end is recorded where no zerobench launcher is above its ranks: torchrun, or a user's own srun.

Rank 0 writes the run's ``run_status`` row. When a peer ends the run, rank 0 learns it only as a lost connection, a
collective that timed out, or a SIGTERM (torchrun stops every rank once one exits with an error), and none of these
names the peer. So each rank appends how it ends to ``<out>/ranks/rank<N>`` (``channel.RankFile``): where it runs
(host and process id) when it starts; its own failure's line and exit code; ``lost`` and the line where it failed
because a peer did; ``stopped`` where the launcher stopped it; ``done`` where it finished. A rank killed outright
(SIGKILL, ``os._exit``, the OOM killer) writes no end. Whoever records the run names the rank whose own failure came
first; else the ranks on its host whose process is gone without an end written; else, after ``REPORT_WAIT_S``, the
ranks that have not said (stuck, or on another host whose files it may not see). A run in which no rank failed on
its own and every rank was stopped was stopped from outside: ``cancelled``.

Where rank 0 itself is the rank that died, the first surviving rank to see it (its process gone, no end written)
takes the recording over (``claim``), so the run never reads as incomplete for want of its recorder. This is what
torchelastic's error files do for a Python exception, and it also names a rank that died without one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from zerobench.launch.base import first_failure_of
from zerobench.launch.channel import RankEnd, RankFile, read_rank_files

REPORT_WAIT_S = 5.0
"""How long the recorder waits for its peers' reports before naming the ranks that have said nothing (torchrun
gives a stopped rank 30 s before SIGKILL)."""
RECORDER = ".recorder"


class LauncherStopped(BaseException):
    """SIGTERM from the launcher above the ranks (torchrun stopping the survivors, scancel, a time limit). A
    ``BaseException``, so that no ``except Exception`` of a training loop swallows it."""


def alive(pid: int) -> bool:
    """Whether process ``pid`` of this host is running (a zombie, exited but not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] not in "ZX"
    return True


@dataclass
class PeerEnds:
    """This rank's report file, and the recorder's reading of its peers'."""

    file: RankFile
    dir: Path
    rank: int
    world: int
    armed: bool = field(default=False, init=False)

    @classmethod
    def for_run(cls, rank: int, world: int, out_dir) -> PeerEnds | None:
        """The reports of a run of ``world`` > 1 ranks with an output directory (its rank starting now); None
        otherwise."""
        if out_dir is None or world < 2:
            return None
        where = Path(out_dir) / "ranks"
        where.mkdir(parents=True, exist_ok=True)
        ends = cls(RankFile(where, rank), where, rank, world)
        ends.file.started()  # before the rendezvous: once training starts, no rank's file is an earlier run's
        if rank == 0:  # an earlier run's claim would stop this run's survivors from recording it
            with contextlib.suppress(FileNotFoundError):
                (where / RECORDER).unlink()
        return ends

    @contextlib.contextmanager
    def stopping(self):
        """Inside, SIGTERM is this object's: during ``training`` the first one raises ``LauncherStopped`` in the main
        thread; outside it (a failure or the run's end being recorded) and after the first, it does nothing, so the
        record is written before the launcher's SIGKILL."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handle(signum, frame):
            if self.armed:
                self.armed = False
                raise LauncherStopped("stopped by SIGTERM")

        old = signal.signal(signal.SIGTERM, handle)
        try:
            yield
        finally:
            self.armed = False
            signal.signal(signal.SIGTERM, old)

    @contextlib.contextmanager
    def training(self):
        """The span in which SIGTERM stops the rank (``stopping``): it ends, also by an exception, before that
        exception's handler records anything."""
        self.armed = True
        try:
            yield
        finally:
            self.armed = False

    def _gone(self, e: RankEnd | None) -> bool:
        """A rank on this host whose process ended without writing its end."""
        return e is not None and e.code is None and e.host == socket.gethostname() and e.pid and not alive(e.pid)

    def recorder_gone(self, wait_s: float = REPORT_WAIT_S) -> bool:
        """Whether rank 0, the run's recorder, died without writing its end (seen from its host). A rank that lost
        its connection to rank 0 may look before rank 0's process has ended: it waits until rank 0 has written its
        end (False) or is gone (True), at most ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while True:
            zero = next((e for e in read_rank_files(self.dir) if e.rank == 0), None)
            if zero is not None and zero.code is not None:
                return False
            if self._gone(zero):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def claim(self) -> bool:
        """Take the recording over from a rank 0 that died: True for the one rank that claims it first."""
        try:
            os.close(os.open(self.dir / RECORDER, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def blame(self, wait_s: float = REPORT_WAIT_S) -> tuple[str, str] | None:
        """(status, reason) naming the rank that ended the run from the peers' reports, or None where every peer
        reported and none failed on its own."""
        others = [r for r in range(self.world) if r != self.rank]
        deadline = time.monotonic() + wait_s
        while True:
            ends = {e.rank: e for e in read_rank_files(self.dir) if e.rank != self.rank}
            pending = [r for r in others if r not in ends or ends[r].code is None]
            primary = first_failure_of(ends.values())
            dead = [r for r in pending if self._gone(ends.get(r))]
            if primary or dead or not pending or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        if primary:
            return primary[:2]
        if dead:
            return (
                "failed",
                f"{_ranks(dead)} ended without a report (killed, or exited abruptly: see {_its(dead)} output)",
            )
        if pending:
            it = "they" if len(pending) > 1 else "it"
            said = (
                f"did not report how {it} ended within {wait_s:g}s (stuck, or on a host whose files are not seen here)"
            )
            return "failed", f"{_ranks(pending)} {said}: see {_its(pending)} output"
        return None


def _its(ranks: list[int]) -> str:
    return "their" if len(ranks) > 1 else "its"


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
