"""What a rank tells its local launcher as it ends, on a pipe of its own: that it finished the run, or the one
line that says why it did not.

An exit code alone cannot carry either. A rank that exits 0 in the middle of the run (a stray ``sys.exit(0)``, a
library's ``os._exit(0)``) looks like one that finished, and leaves its peers waiting in a collective; and the
line that names a failure, printed to the rank's stderr, is lost when that stderr is a log on a full disk. The
pipe needs no disk: the launcher reads it after the rank has exited (what was written stays in the pipe).

Messages are lines: ``done`` or ``error <text>``. A rank started by anything else (torchrun, srun) has no pipe.
Under zerobench's srun launcher each rank writes the same lines, each with the wall-clock time, to a file of its
own instead (``RankFile``, in the run's directory), and its exit code last: srun's own exit code says only that
some task failed (``--kill-on-bad-exit`` ends the others with SIGTERM), and the launcher blames the rank whose
failure came first, as torchelastic's error files do.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

ENV = "ZEROBENCH_REPORT_FD"
"""The rank's end of its pipe (a file descriptor number), set by the local launcher."""
MAX_LINE = 1000
"""Characters of an error line sent (the pipe's buffer holds many times more: the rank never blocks)."""


class RankChannel:
    """A rank's end: ``done()`` once the run finished, ``error(line)`` for the line that ends it otherwise.
    With no pipe (``fd`` None) both do nothing; a launcher gone away is not the rank's failure."""

    def __init__(self, fd: int | None):
        self.fd = fd

    def done(self) -> None:
        self._send("done")

    def error(self, line: str) -> None:
        self._send("error " + " ".join(line.split())[:MAX_LINE])

    def _send(self, message: str) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(self.fd, (message + "\n").encode(errors="replace"))


FILE_ENV = "ZEROBENCH_REPORT_DIR"
"""The directory each srun task writes its ``RankFile`` into, set by the srun launcher."""


class RankFile(RankChannel):
    """A rank's end under srun: ``done``, ``error <text>`` and ``exit <code>`` lines, each after the time it was
    written, appended to ``<dir>/rank<N>`` (a line per write: what was written before a kill stays)."""

    def __init__(self, directory: str | os.PathLike, rank: int):
        super().__init__(None)
        self.path = os.path.join(directory, f"rank{rank}")

    def exited(self, code: int) -> None:
        self._send(f"exit {code}")

    def started(self) -> None:
        """Where this rank runs: its host and process id, so a peer on the same host can tell whether it is alive. The
        file's first line: what an earlier run in the same directory left there is dropped."""
        self._send(f"start {socket.gethostname()} {os.getpid()}", mode="w")

    def lost(self, line: str) -> None:
        """The rank failed because a peer did (a lost connection, a collective that timed out): not a cause."""
        self._send("lost " + " ".join(line.split())[:MAX_LINE])

    def stopped(self) -> None:
        """The launcher above the rank stopped it (SIGTERM): not a cause."""
        self._send("stopped")

    def _send(self, message: str, mode: str = "a") -> None:
        with contextlib.suppress(OSError), open(self.path, mode) as f:
            f.write(f"{time.time():.6f} {message}\n")


@dataclass(frozen=True)
class RankEnd:
    """What a ``RankFile`` says: the rank, when it first failed (None: it did not say), why, and its exit code."""

    rank: int
    failed_at: float | None
    error: str | None
    code: int | None
    done: bool
    secondary: bool = False
    """It failed only because a peer did (``RankFile.lost``) or was stopped (``RankFile.stopped``)."""
    host: str | None = None
    pid: int | None = None
    """Where it runs (``RankFile.started``), where it said."""


def read_rank_files(directory: str | os.PathLike) -> list[RankEnd]:
    """Every ``rank<N>`` file under ``directory``, in rank order."""
    ends = []
    for path in sorted(Path(directory).glob("rank*"), key=lambda p: (len(p.name), p.name)):
        if not path.name[4:].isdigit():
            continue
        failed_at = error = code = host = pid = None
        done = secondary = False
        with contextlib.suppress(OSError):
            for line in path.read_text(errors="replace").splitlines():
                when, _, message = line.partition(" ")
                if message == "done":
                    done = True
                elif message == "stopped" or message.startswith("lost "):
                    secondary = True
                elif message.startswith("start "):
                    words = message.split()
                    if len(words) == 3 and words[2].isdigit():
                        host, pid = words[1], int(words[2])
                elif message.startswith("error ") and failed_at is None:
                    failed_at, error = float(when), message.removeprefix("error ")
                elif message.startswith("exit ") and message[5:].lstrip("-").isdigit():
                    code = int(message[5:])
                    if code != 0 and failed_at is None:
                        failed_at = float(when)
        ends.append(RankEnd(int(path.name[4:]), failed_at, error, code, done, secondary, host, pid))
    return ends


@dataclass
class RankReport:
    """What one rank said before it exited."""

    done: bool = False
    """It finished its run (a rank that exits 0 without saying so stopped early)."""
    error: str | None = None
    """The last line it gave for failing."""


@dataclass
class LauncherEnds:
    """The launcher's ends of every rank's pipe: ``open_for`` before starting rank r, ``report(r)`` once it
    has exited, ``close()`` at the end."""

    reads: dict[int, int] = field(default_factory=dict)
    reports: dict[int, RankReport] = field(default_factory=dict)

    def open_for(self, rank: int) -> int:
        """A new pipe for ``rank``; returns the write end to hand to the rank (``pass_fds``; close it here
        once the rank is started)."""
        r, w = os.pipe()
        os.set_blocking(r, False)  # a rank's child that inherited the write end must not block the launcher
        self.reads[rank] = r
        return w

    def report(self, rank: int) -> RankReport:
        """What ``rank`` has sent so far (call once it has exited: then nothing more comes)."""
        rep = self.reports.setdefault(rank, RankReport())
        fd = self.reads.get(rank)
        if fd is None:
            return rep
        chunks = []
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        for line in b"".join(chunks).decode(errors="replace").splitlines():
            if line == "done":
                rep.done = True
            elif line.startswith("error "):
                rep.error = line.removeprefix("error ")
        return rep

    def close(self) -> None:
        for fd in self.reads.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.reads.clear()
