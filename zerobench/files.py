"""Durable file writes shared by checkpoints (``zero/state``) and results (``results``): a file flushed to the disk,
a directory's entries flushed, and a file replaced atomically. A reader, or a machine that loses power, sees a
replaced file's old content or its new content, never a cut one."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path


def write_file(path: Path, data: bytes | Callable[[object], None]) -> None:
    """Write ``data`` (bytes, or a function writing to a binary file) to ``path`` and flush it to the disk."""
    with open(path, "wb") as f:
        if isinstance(data, bytes):
            f.write(data)
        else:
            data(f)
        f.flush()
        os.fsync(f.fileno())


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
