"""SIGTERM (Slurm's time limit, ``scancel``) and SIGINT as a request to stop cleanly.

While a ``Cancellation`` is active the signal only sets a flag; the launcher polling its ranks sees it,
forwards SIGTERM to them, waits for them to exit and records the run as ``cancelled``; a sweep then
stops instead of starting its next run. Ranks are also started so that they receive SIGTERM if their
launcher dies without cleaning up (Linux ``PR_SET_PDEATHSIG``, set by the rank itself from
``ZEROBENCH_LAUNCHER_PID``): no orphans keep writing rows.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading

EXIT_CANCELLED = 143
"""128 + SIGTERM, what a process killed by SIGTERM reports to Slurm."""


class Cancelled(Exception):
    """A multi-run command (``zerobench peers``) stopped on SIGTERM/SIGINT; the runs so far keep their rows."""


class Cancellation:
    """Context manager: SIGTERM/SIGINT set ``requested`` (main thread only; elsewhere it does nothing)."""

    def __init__(self):
        self.requested: str | None = None
        self._old: dict[int, object] = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.requested = signal.Signals(signum).name

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()


@contextlib.contextmanager
def sigterm_raises():
    """Inside, SIGTERM raises ``Cancelled`` in the main thread, so ``finally`` blocks run (a temporary git worktree
    removed, child processes killed) where the default action would end the process at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum, frame):
        raise Cancelled("cancelled (SIGTERM)")

    old = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def die_with_parent(parent_pid: int | None) -> None:
    """Called first thing in a launched rank: receive SIGTERM when the launcher (``parent_pid``) dies
    (Linux ``PR_SET_PDEATHSIG``; elsewhere nothing), and stop at once if it already has."""
    if parent_pid is None or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGTERM)
