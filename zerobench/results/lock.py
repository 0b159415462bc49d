"""An output directory belongs to one writer at a time: ``claim`` holds an exclusive lock on it.

``zerobench sweep``, ``train`` and ``maxsize`` hold the lock for their whole life, and check what the
directory already holds only once they hold it. Two writers started together into one directory would
otherwise both find it empty and both write: duplicate rows and two status rows per run.

The lock is ``flock(2)`` on ``DIR/.zerobench.lock``, which records the holder's pid, host and command so
that a second writer is refused in one line naming it. The kernel releases an ``flock`` when its holder
exits, however it exits (SIGKILL included): a lock file left behind by a killed holder is taken over, never
obeyed. A holder that ends normally removes the file (while still holding the lock, and a claimant checks
that the file it locked is still the one at the path, so that no two writers can each lock a different
file). Where the file system has no locks (some network mounts), the claim goes on without one after a
warning.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Self

from zerobench.config import ConfigError
from zerobench.results.outdir import LOCK_FILE, check_writable_dir, read_holder, writer_of

HOLDER_WAIT_S = 2.0
"""How long a refused claimant waits for a holder that has just taken the lock to record its pid."""


class DirLock:
    """The claim on one directory: release it with ``release()`` (or leave the ``with`` block)."""

    def __init__(self, path: Path, fd: int | None):
        self.path, self._fd = path, fd

    def release(self) -> None:
        """Remove the lock file while still holding the lock, then drop the lock."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path / LOCK_FILE)
        os.close(self._fd)  # closing the last descriptor drops the flock
        self._fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def claim(path: str | os.PathLike, flag: str = "--out") -> DirLock:
    """Create ``path`` if needed and lock it for this process, or raise a one-line ``ConfigError`` naming
    the process that holds it. The lock is not inherited by launched ranks (the descriptor is close-on-exec)."""
    path = Path(path)
    check_writable_dir(path, flag)
    lock = path / LOCK_FILE
    while True:
        try:  # never through a link: its target, outside the directory perhaps, would be overwritten
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            why = "it is a symbolic link; remove it" if lock.is_symlink() else f"{e.strerror}: choose a writable {flag}"
            raise ConfigError(f"cannot create the lock file {lock}: {why}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or device planted under the name
            os.close(fd)
            raise ConfigError(f"the lock file {lock} is not a regular file: remove it")
        try:
            _lock_exclusive(fd)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise ConfigError(_in_use(path, flag, holder)) from None
        except OSError as e:  # ENOLCK, EOPNOTSUPP: a file system without locks
            os.close(fd)
            print(
                f"zerobench: warning: cannot lock {flag} {path} ({e.strerror}): a second writer into it "
                "would not be refused",
                file=sys.stderr,
            )
            return DirLock(path, None)
        if _same_file(fd, lock):
            break
        os.close(fd)  # its holder removed it as we locked it: lock the file now at the path
    _record(fd)
    return DirLock(path, fd)


def _in_use(path: Path, flag: str, holder: str) -> str:
    return f"{flag} {path} is in use by another zerobench ({holder}): wait for it to end, or choose another {flag}"


def check_unclaimed(path: str | os.PathLike, flag: str = "--out") -> None:
    """Refuse, as ``claim`` would, a ``path`` another zerobench holds now, without claiming it or creating anything:
    the check of a command that does not run it (``sweep --check``)."""
    holder = writer_of(path, command=True)
    if holder is not None:
        raise ConfigError(_in_use(Path(path), flag, holder))


READER_PROBE_WAIT_S = 0.5
"""How long a claimant retries a lock it found held before refusing: a reader asking whether a writer holds the
directory (``outdir.writer_of``) holds a shared lock for the moment of its probe."""


def _lock_exclusive(fd: int) -> None:
    """``flock(LOCK_EX | LOCK_NB)``, retried for ``READER_PROBE_WAIT_S`` while held (``BlockingIOError`` after)."""
    deadline = time.monotonic() + READER_PROBE_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _same_file(fd: int, lock: Path) -> bool:
    try:
        st = os.stat(lock)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino)


def _record(fd: int) -> None:
    """Write this process's pid, host and command into the lock file (read by a refused claimant)."""
    argv = list(sys.argv)
    if Path(argv[0]).name in ("zerobench", "__main__.py"):  # the console script, or python -m zerobench
        argv[0] = "zerobench"
    me = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(shlex.join(argv).split())[:300]}
    data = (json.dumps(me) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _holder(fd: int) -> str:
    """Who holds the lock, from the lock file (waiting briefly for a holder that has not written it yet)."""
    deadline = time.monotonic() + HOLDER_WAIT_S
    while (who := read_holder(fd)) is None:
        if time.monotonic() > deadline:
            return "pid unknown: its lock file records none"
        time.sleep(0.05)
    return who.describe(command=True)
