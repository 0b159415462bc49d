"""A checkpoint's files as a load reads them: ``torch.load`` with ``weights_only=True``, its JSON records, and each
file checked first against the SHA-256 its manifest records (``transaction.py`` writes them, and the manifest)."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import torch

from zerobench.files import file_digest

MANIFEST = "manifest.json"
"""The commit record: written last, into the staging directory, by the first rank once every rank has written."""


class CheckpointMismatch(ValueError):
    """A checkpoint of another model (names, shapes), a damaged file, or one that is not whole."""


def load_file(path: str | os.PathLike, mmap: bool = False, check: bool = True):
    """``torch.load(path)`` on the CPU, ``weights_only=True``; a damaged file is a one-line ``CheckpointMismatch``.
    ``mmap``: the tensors are mapped from the file and read as they are used (a file ``torch.save`` wrote before
    torch 2.1's aligned format is read whole instead). ``check``: its bytes are checked against the digest its
    checkpoint's manifest records first (``check_digest``); a caller that passes False checks them itself."""
    if check:
        check_digest(path)
    try:
        if mmap:
            try:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # not mappable (an older torch.save format); damaged ones fail again below
                pass
        return torch.load(path, map_location="cpu", weights_only=True)
    except OSError:  # missing, unreadable: the caller's message says which checkpoint lacks it
        raise
    except Exception as e:  # noqa: BLE001 - truncated, overwritten, not torch.save's: the unpickler raises anything
        raise CheckpointMismatch(f"checkpoint file {path} is damaged: {_load_failure(e)}") from None


def _load_failure(e: Exception) -> str:
    """The one line of ``e`` that says why the file did not load. A refusal of ``weights_only``'s unpickler opens
    with torch's advice to load again without it, which would run whatever code the file holds and which does not
    apply to a file that is not ``torch.save``'s at all; the cause is on the line after ``WeightsUnpickler error:``."""
    text = str(e)
    _, marker, rest = text.partition("WeightsUnpickler error:")
    if marker:
        cause = next((line.strip() for line in rest.splitlines() if line.strip()), "")
        if cause and not cause.startswith("Check the documentation"):
            return f"torch.load(weights_only=True) refused it: {cause}"
    return (text.strip().splitlines() or [type(e).__name__])[0]


def read_json(path: Path, check: bool = True) -> dict:
    """A small JSON file of a checkpoint (``meta.json``, ``manifest.json``) as a dict; damaged is one line (and,
    with ``check``, so is one whose bytes are not what its save wrote: ``check_digest``)."""
    if check:
        check_digest(path)
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointMismatch(f"checkpoint file {path} is damaged: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointMismatch(f"checkpoint file {path} is damaged: not a JSON object")
    return data


def _record_of(path: Path) -> tuple[Path, str] | None:
    """(the committed checkpoint directory whose manifest lists ``path``, ``path`` relative to it); None for a file
    of no such checkpoint (one saved before manifests, a loose file)."""
    for top in (path.parent, path.parent.parent):
        if (top / MANIFEST).is_file():
            return top, path.relative_to(top).as_posix()
    return None


def check_digest(path: str | os.PathLike) -> None:
    """Refuse, in one line, a checkpoint file whose bytes are not those its save wrote: the SHA-256 its checkpoint's
    manifest records differs (a bit flipped on disk, a file overwritten or cut in place), or the manifest records
    digests and none for this file (a file its save did not write: one left by another copy of the checkpoint
    synced over it). A checkpoint whose manifest records no digests (saved before it did) is not checked."""
    path = Path(path)
    found = _record_of(path)
    if found is None:
        return
    top, rel = found
    sums = _digests(top / MANIFEST)
    if sums is None or rel == MANIFEST:
        return
    want = sums.get(rel)
    if want is None:
        raise CheckpointMismatch(
            f"checkpoint file {path} is not one its save wrote ({top / MANIFEST} lists no such file): remove it, "
            "or load the checkpoint it came from"
        )
    got = file_digest(path)
    if got != want:
        raise CheckpointMismatch(
            f"checkpoint file {path} is damaged: its SHA-256 is {got[:16]}..., its save recorded {str(want)[:16]}... "
            f"in {top / MANIFEST} (changed on disk since it was written); load an earlier checkpoint"
        )


def _digests(manifest_path: Path) -> dict | None:
    """The manifest's ``sha256`` record (None where it has none), parsed once per version of the file: a load of a
    checkpoint of many shards checks each against it."""
    st = manifest_path.stat()
    return _parsed_digests(str(manifest_path), st.st_mtime_ns, st.st_size, st.st_ino)


@functools.lru_cache(maxsize=8)
def _parsed_digests(manifest_path: str, mtime_ns: int, size: int, inode: int) -> dict | None:
    sums = read_json(Path(manifest_path), check=False).get("sha256")
    return dict(sums) if isinstance(sums, dict) else None
