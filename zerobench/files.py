"""Durable file writes shared by checkpoints (``zero/state``) and results (``results``): a file flushed to the disk,
a directory's entries flushed, and a file replaced atomically. A reader, or a machine that loses power, sees a
replaced file's old content or its new content, never a cut one."""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path


def write_file(path: Path, data: bytes | Callable[[object], None]) -> str:
    """Write ``data`` (bytes, or a function writing to a binary file) to ``path`` and flush it to the disk; returns
    the SHA-256 (hex) of the bytes written, hashed as they are written rather than read back."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        out = _Hashing(f, digest)
        if isinstance(data, bytes):
            out.write(data)
        else:
            data(out)
        f.flush()
        os.fsync(f.fileno())
    return digest.hexdigest()


class _Hashing:
    """A binary file that hashes what is written to it (``torch.save`` needs ``write`` and ``flush``)."""

    def __init__(self, f, digest) -> None:
        self._f, self._digest = f, digest

    def write(self, b) -> int:
        self._digest.update(b)
        return self._f.write(b)

    def flush(self) -> None:
        self._f.flush()


def file_digest(path: str | os.PathLike) -> str:
    """The SHA-256 (hex) of the file ``path``, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (a rename into it, a new file) to the disk."""
    with contextlib.suppress(OSError):  # not every file system lets a directory be opened for fsync
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def replace_file(path: str | os.PathLike, data: str | bytes | Callable[[object], None]) -> None:
    """Write ``data`` (text, bytes, or a function writing to a binary file) as the file ``path``, replacing it
    atomically: a temporary file of its own beside it, flushed, renamed over it, the directory flushed. Writing in
    place (``write_text``) would empty the old file first; a fixed temporary name would be shared by two writers."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{secrets.token_hex(4)}"
    try:
        write_file(tmp, data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
