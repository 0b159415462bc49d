"""The NVMe tier (ZeRO-Infinity style): optimizer-state chunks swapped to a file, read ahead, written behind.

One file per rank and engine (under a fresh directory inside the configured path, removed by ``destroy()`` or
when the engine is collected; one left by a process that died is removed by the next store under the path) holds every chunk's encoded state (``zerobench.zero.optim.states``) back to back. During a
step the optimizer acquires chunk i — waiting for its read, and starting the read of chunk i+1 on a
background thread — updates it, and releases it, which queues its write. One chunk is read ahead and at
most two writes are pending, so host memory holds a few chunks of state, not the partition. Reads and writes go
through ``os.preadv``/``os.pwritev`` on a thread pool (the GIL is released during the I/O); the page cache
is not bypassed: correctness over speed.

A write that fails (a full disk, a quota, an I/O error) is a ``RunFailed`` in one line naming the NVMe path,
the space the states need and the space free there; a store that fails while writing its initial state
removes its file first.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import shutil
import socket
import tempfile
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from zerobench.config import ConfigError, RunFailed
from zerobench.zero.optim.states import State


def _io(fn, fd: int, buf: memoryview, offset: int) -> None:
    done = 0
    while done < len(buf):
        n = fn(fd, [buf[done:]], offset + done)
        if n <= 0:
            raise OSError(
                f"short {'read' if fn is os.preadv else 'write'} on the NVMe state file at byte {offset + done}"
            )
        done += n


def _bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.numpy()).cast("B")


def _size(n: int | None) -> str:
    if n is None:
        return "an unknown amount"
    return f"{n / 2**30:.3g} GiB ({n} bytes)" if n >= 2**30 else f"{n / 2**20:.3g} MiB ({n} bytes)"


def _free(directory: str) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


OWNER = "owner.lock"
"""In each store's directory: the owner's pid and host, under an ``flock`` the owner holds for its life."""


def _cleanup(fd: int, directory: str, pool: ThreadPoolExecutor, owner: int, creator: int) -> None:
    """Close and remove the store, in the process that made it only: a forked child inherits the store's finalizer
    and runs it at its exit, where it would remove the parent's live state file (multiprocessing's ``Finalize``
    skips other pids the same way)."""
    if os.getpid() != creator:
        return
    pool.shutdown(wait=True)
    os.close(fd)
    shutil.rmtree(directory, ignore_errors=True)
    os.close(owner)


def _own(directory: str) -> int:
    """Lock ``directory`` for this process (its ``OWNER`` file, recording pid and host); the descriptor."""
    fd = os.open(os.path.join(directory, OWNER), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode())
    return fd


def reclaim(root: str) -> list[str]:
    """Remove what stores of dead processes left under ``root`` (a rank killed, or forked and ended with
    ``os._exit``, never runs its cleanup): a directory is removed only where its ``OWNER`` file names this host and a
    pid no longer running, and its lock can be taken. Anything else is left alone (another host's, a live one's, a
    look-alike without the file). Returns what was removed."""
    removed = []
    for d in sorted(glob.glob(os.path.join(glob.escape(root), "zerobench-states-rank*-*"))):
        path = os.path.join(d, OWNER)
        try:
            with open(path, "rb") as f:
                owner = json.loads(f.read() or b"{}")
            if owner.get("host") != socket.gethostname() or _alive(int(owner.get("pid", 0))):
                continue
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (OSError, ValueError, TypeError, AttributeError):
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held after all (a forked child of the owner lives on)
            os.close(fd)
            continue
        shutil.rmtree(d, ignore_errors=True)
        os.close(fd)
        removed.append(d)
    return removed


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True  # no pid recorded: not known to be dead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


class NvmeStore:
    """Encoded optimizer-state chunks in a file under ``directory``; see the module docstring."""

    def __init__(self, codec, sizes: list[int], directory: str, rank: int = 0):
        self.codec = codec
        self.sizes = sizes
        self.root = directory
        try:
            os.makedirs(directory, exist_ok=True)
            reclaim(directory)
            self.dir = tempfile.mkdtemp(prefix=f"zerobench-states-rank{rank}-", dir=directory)
            try:
                owner = _own(self.dir)
            except OSError:
                shutil.rmtree(self.dir, ignore_errors=True)
                raise
        except OSError as e:
            what = "it is a file" if os.path.isfile(directory) else e.strerror
            raise ConfigError(
                f"cannot use NVMe path {directory!r} for optimizer states: {what}: give a writable directory"
            ) from None
        self.path = os.path.join(self.dir, "optimizer_states.bin")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="zerobench-nvme")
        self._finalizer = weakref.finalize(self, _cleanup, self.fd, self.dir, self.pool, owner, os.getpid())
        self.offsets: list[int] = []
        self.total = 0
        for i, n in enumerate(sizes):  # each chunk's place in the file: its encoded tensors back to back
            self.offsets.append(self.total)
            enc = codec.alloc(n, torch.device("meta"), chunk=i)
            self.total += sum(t.numel() * t.element_size() for t in enc.values())
        try:
            for i, n in enumerate(sizes):  # write every chunk's initial (zero) state
                self._write(i, codec.alloc(n, torch.device("cpu"), chunk=i))
        except RunFailed:
            self._finalizer()  # the file and its directory go: a failed engine leaves no partial state behind
            raise
        self.reads: dict[int, Future] = {}
        self.writes: dict[int, Future] = {}
        self.broken: str | None = None
        """Why a write or a read failed, once one has: the file (or the master and the moments beside it, updated for
        the chunks a step had read) then holds chunks of two steps, so nothing reads it again."""

    def _read(self, i: int) -> State:
        enc = self.codec.alloc(self.sizes[i], torch.device("cpu"), chunk=i)
        off = self.offsets[i]
        try:
            for t in enc.values():
                _io(os.preadv, self.fd, _bytes(t), off)
                off += t.numel() * t.element_size()
        except OSError as e:  # EIO, a short read: a step reading chunk by chunk has updated the chunks before it
            self.broken = f"cannot read optimizer states under NVMe path {self.root!r}: {e.strerror or e}"
            raise RunFailed(self.broken) from None
        return enc

    def _write(self, i: int, enc: State) -> None:
        off = self.offsets[i]
        try:
            for t in enc.values():
                _io(os.pwritev, self.fd, _bytes(t.contiguous()), off)
                off += t.numel() * t.element_size()
        except OSError as e:  # ENOSPC, EIO, a quota: one line that says how much room the states need
            self.broken = (
                f"cannot write optimizer states under NVMe path {self.root!r}: {e.strerror or e}: they "
                f"need {_size(self.total)} there, {_size(_free(self.root))} is free: give a path on a "
                "disk with room for them"
            )
            raise RunFailed(self.broken) from None

    def _check(self) -> None:
        """Refuse every use of a store a write or a read failed in: its chunks are of two steps (the step that failed
        updated some, not others: wrote them, or had read and updated them before the read that failed), and the
        master beside them was already updated, so a later step, save or load would go on from a torn state, as no
        checkpoint was."""
        if self.broken is not None:
            raise RunFailed(
                f"{self.broken}; the optimizer states on NVMe are torn since (the failed step updated some chunks, "
                "not others): this engine cannot go on; restart from the last checkpoint"
            )

    def _start_read(self, i: int) -> None:
        if i < len(self.sizes) and i not in self.reads:
            w = self.writes.pop(i, None)
            if w is not None:
                w.result()  # never read a chunk whose previous write is still in flight
            self.reads[i] = self.pool.submit(self._read, i)

    def acquire(self, i: int) -> State:
        self._check()
        self._start_read(i)
        enc = self.reads.pop(i).result()
        self._start_read(i + 1)  # read ahead while chunk i is updated
        return enc

    def release(self, i: int, enc: State) -> None:
        self._check()
        self.writes[i] = self.pool.submit(self._write, i, enc)
        if len(self.writes) > 2:  # bound the state held in memory by pending writes
            oldest = next(iter(self.writes))
            self.writes.pop(oldest).result()

    def flush(self) -> None:
        """Wait for every pending read and write (all of them, a failed one too) and drop read-ahead (e.g. at the end
        of a step); then raise if any write has ever failed (``_check``)."""
        pending = [*self.reads.values(), *self.writes.values()]
        self.reads.clear()
        self.writes.clear()
        for f in pending:
            f.exception()  # waits; a failure is recorded by the write itself
        self._check()
        for f in pending:
            f.result()  # a failed read

    def read_all(self) -> list[State]:
        """Every chunk's encoded state (checkpoints, tests)."""
        self.flush()
        return [self._read(i) for i in range(len(self.sizes))]

    def close(self) -> None:
        """Remove the file and its directory now (``engine.destroy()``), not when the store is collected."""
        self.reads.clear()
        self.writes.clear()
        self._finalizer()

    def tensors(self) -> list[torch.Tensor]:
        return []

    def file_bytes(self) -> int:
        return self.total
