"""Writing a whole checkpoint as a transaction (``zero/state/reading.py`` reads its files back).

A checkpoint is either whole or absent: a reader never loads half of a save. Every rank writes
its files into a staging directory beside the target (``.<name>.saving-<save id>``), then every rank of the DP and
TP groups agrees that its writes succeeded (one integer all-reduce); only then does the first rank write the
manifest (``manifest.json``: the save id and every shard file) and put the staging directory in the target's place
with one rename (or, when the target exists, one atomic exchange of the two directories). A rank that fails or is
killed before that point leaves the target untouched: the other ranks raise ``CheckpointSaveError`` (or time out in
the agreement, as any collective), and what was staged is never loaded. Each shard records the save id, so a shard
from another save is refused on load.

The manifest also records every file's SHA-256, hashed by the rank that wrote it as it wrote it (a sidecar
``.<name>.sha256`` in the staging directory, folded into the manifest at the commit), and a load checks each file it
reads against it: ``torch.load`` checks no checksum of a tensor's bytes, so a bit flipped on disk, or a file
overwritten in place, would otherwise load as different weights without a word (``reading.check_digest``).
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from zerobench.config import ConfigError
from zerobench.files import file_digest, fsync_dir, write_file
from zerobench.zero.protocols import Engine
from zerobench.zero.state.reading import MANIFEST, CheckpointMismatch, read_json

STAGING = ".saving-"
SUM = ".sha256"
"""A staged file's digest beside it, ``.<name>.sha256``: written by the rank that wrote the file, folded into the
manifest (and removed) at the commit."""


class CheckpointSaveError(RuntimeError):
    """A save that did not complete on every rank: nothing was written where the checkpoint goes."""


def write_json(path: Path, obj) -> None:
    """A checkpoint's JSON file, written as ``write_entry`` writes."""
    write_entry(path, json.dumps(obj, indent=1).encode())


def write_entry(path: Path, data: bytes | Callable[[object], None]) -> None:
    """Write a file of a save into its staging directory (``files.write_file``), and its SHA-256 beside it
    (``.<name>.sha256``) for the manifest: the digest of the bytes as they were written, by the rank that wrote them,
    so no rank reads another's files back to hash them."""
    digest = write_file(path, data)
    write_file(path.parent / f".{path.name}{SUM}", digest.encode())


def _is_sum(path: Path) -> bool:
    return path.name.startswith(".") and path.name.endswith(SUM)


def _groups(engine: Engine):
    return [g for g in (engine.group, engine.tp_group) if g is not None and g.size > 1]


def agree(engine: Engine, value: int) -> int:
    """The largest ``value`` over the engine's DP and TP groups (a 62-bit integer), the same on every rank."""
    groups = _groups(engine)
    if not groups:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=engine.device)
    for g in groups:
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g.pg)
    return int(t.item())


def _global_rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _checkpoint_files(path: Path) -> set[str] | None:
    """The files a checkpoint at ``path`` consists of, from its own records: its manifest's list (this format), or
    for a checkpoint saved before manifests each shard directory's ``meta.json`` and the shards it names; None where
    ``path`` holds no such record, or a damaged one (a file that merely has the name is not a checkpoint)."""
    try:
        if (path / MANIFEST).is_file():
            man = read_json(path / MANIFEST, check=False)
            files = man.get("files")
            if not str(man.get("format", "")).startswith("zerobench-checkpoint/") or not isinstance(files, list):
                return None
            return {str(f) for f in files} | {MANIFEST}
        dirs = [path] if (path / "meta.json").is_file() else sorted(d for d in path.glob("tp-*") if d.is_dir())
        owned: set[str] = set()
        for d in dirs:
            meta = read_json(d / "meta.json", check=False)
            if not isinstance(meta.get("params"), dict) or not isinstance(meta.get("num_shards"), int):
                return None
            prefix = "" if d == path else f"{d.name}/"
            owned |= {f"{prefix}meta.json", *(f"{prefix}shard-{i:05d}.pt" for i in range(meta["num_shards"]))}
        return owned or None
    except (OSError, CheckpointMismatch):
        return None


def foreign_files(path: Path) -> list[str]:
    """The files under directory ``path`` that are not a checkpoint's (``_checkpoint_files``): all of them where it
    holds no checkpoint. A save replaces ``path`` whole, so it may only where this is empty."""
    present = sorted(str(f.relative_to(path)) for f in path.rglob("*") if f.is_file() or f.is_symlink())
    owned = _checkpoint_files(path) if present else set()
    return [f for f in present if owned is None or f not in owned]


def refuse_staged(path: Path) -> None:
    """Refuse a save's staging directory (``.<name>.saving-<id>``) by its name, even when it holds a whole
    checkpoint: a save stopped between its manifest and its rename, or, after an exchange, the checkpoint it replaced
    while it is being removed. Either is whole but was never (or is no longer) the checkpoint at ``<name>``, and a
    reader must not be able to load it by path."""
    name = Path(path).name
    if name.startswith(".") and STAGING in name:
        target = Path(path).parent / name[1 : name.rindex(STAGING)]
        raise CheckpointMismatch(
            f"{path} is a save's staging directory, not a checkpoint (a save that stopped before its commit, or the "
            f"checkpoint a commit replaced); load {target}"
        )


def check_target(path: Path) -> None:
    """Refuse, before anything is written, a target that is a file or a directory holding something else."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        raise ConfigError(f"cannot save a checkpoint to {path}: it is a file; give a directory")
    other = foreign_files(path) if path.is_dir() else []
    if other:
        raise ConfigError(
            f"cannot save a checkpoint to {path}: it holds files that are not a checkpoint's ({', '.join(other[:3])}"
            f"{' ...' if len(other) > 3 else ''}); give a new or empty directory (a checkpoint is replaced whole, "
            "never merged into other files)"
        )


@dataclass(frozen=True)
class Staging:
    """Where one save's files go before it is committed, and the id every file of that save records."""

    dir: Path
    save_id: str


@contextlib.contextmanager
def transaction(
    engine: Engine, path: str | os.PathLike, after_commit: Callable[[], None] | None = None
) -> Iterator[Staging]:
    """Collective over the engine's DP and TP groups: yields the staging directory every rank writes its files
    into; on exit, commits them to ``path`` as one checkpoint or raises on every rank. ``after_commit`` runs on the
    first rank once the checkpoint is in place (e.g. to move ``latest``)."""
    path = Path(path)
    check_target(path)
    save_id = f"{agree(engine, secrets.randbits(62)):016x}"
    staging = path.parent / f".{path.name}{STAGING}{save_id}"
    failed: BaseException | None = None
    try:
        staging.mkdir(parents=True, exist_ok=True)
        yield Staging(staging, save_id)
    except BaseException as e:  # noqa: BLE001 - every rank must take part in the agreement before it re-raises
        failed = e
    first = engine.group.rank == 0 and (engine.tp_group is None or engine.tp_group.rank == 0)
    _settle(
        engine,
        staging,
        failed,
        f"could not write its files of checkpoint {path}: nothing was saved there (a "
        "checkpoint already there is unchanged)",
    )
    if first:
        try:
            write_file(staging / MANIFEST, json.dumps(manifest(staging, save_id), indent=1).encode())
            for side in [f for f in staging.rglob(f"*{SUM}") if _is_sum(f)]:  # folded into the manifest
                side.unlink()
            for d in [*sorted(staging.glob("tp-*")), staging]:  # every file's entry on disk before the commit's rename
                fsync_dir(d)
            _put_in_place(staging, path)
            _sweep_stale(path)
            if after_commit is not None:
                after_commit()
        except BaseException as e:  # noqa: BLE001 - the other ranks learn of it in the agreement below
            failed = e
    _settle(engine, staging, failed, f"failed while committing checkpoint {path}")


def _settle(engine: Engine, staging: Path, failed: BaseException | None, what: str) -> None:
    """Every rank learns whether any rank failed; each raises (the failed rank its own error) if one did."""
    bad = agree(engine, _global_rank() + 1 if failed is not None else 0)
    if not bad:
        return
    if engine.group.rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
    if failed is not None:
        raise failed
    raise CheckpointSaveError(f"rank {bad - 1} {what}; see that rank's error")


def manifest(staging: Path, save_id: str) -> dict:
    """The commit record of what every rank staged: each shard directory's ``meta.json`` and shard files, all of
    this save (a shard directory without its ``meta.json`` or one of its shards fails the commit), and every file
    of the save (``files``: the shards and what lies beside them, e.g. a scheduler's state), which a reader checks
    are all there, with its SHA-256 (``sha256``: from the sidecar its writer left, else hashed here)."""
    dirs = sorted(staging.glob("tp-*")) or [staging]
    listing = {}
    for d in dirs:
        meta = read_json(d / "meta.json", check=False)
        if meta.get("save_id") != save_id or int(meta.get("tp", 1)) != (len(dirs) if d != staging else 1):
            raise CheckpointSaveError(f"{d} holds another save's meta.json")
        files = [f"shard-{i:05d}.pt" for i in range(int(meta["num_shards"]))]
        missing = [f for f in files if not (d / f).exists()]
        if missing:
            raise CheckpointSaveError(f"{d} lacks {', '.join(missing[:4])} after every rank wrote its files")
        listing["." if d == staging else d.name] = files
    every = sorted(
        f.relative_to(staging).as_posix()
        for f in staging.rglob("*")
        if f.is_file() and f.name != MANIFEST and not _is_sum(f)
    )
    sums = {}
    for rel in every:
        side = (staging / rel).parent / f".{Path(rel).name}{SUM}"
        sums[rel] = side.read_text().strip() if side.is_file() else file_digest(staging / rel)
    return {"format": "zerobench-checkpoint/1", "save_id": save_id, "dirs": listing, "files": every, "sha256": sums}


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where that is unsupported."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def _put_in_place(staging: Path, path: Path) -> None:
    """``staging`` becomes ``path``: a rename, or, over an existing checkpoint, an atomic exchange and the old one
    removed. Where the file system cannot exchange, the old one is renamed aside first (``.<name>.replaced-<id>``):
    a crash between the two renames leaves no ``path`` but the previous checkpoint whole under that name, which
    ``replaced_copy`` finds."""
    if not path.exists():
        os.rename(staging, path)
    elif _exchange(staging, path):
        shutil.rmtree(staging)
    else:
        aside = path.parent / f".{path.name}.replaced-{staging.name.rsplit('-', 1)[-1]}"
        os.rename(path, aside)
        os.rename(staging, path)
        shutil.rmtree(aside)
    fsync_dir(path.parent)


def _sweep_stale(path: Path) -> None:
    """Remove, once a save to ``path`` is committed, what earlier saves to it left when a rank died: staging
    directories (never loadable) and previous checkpoints set aside by a replacement that stopped (``path`` now
    holds a newer one, and a copy left half-removed must not be offered by ``replaced_copy`` later)."""
    name = glob.escape(path.name)  # a tag is a name, never a pattern: "*" must not reach another tag's copies
    for d in [*path.parent.glob(f".{name}{STAGING}*"), *path.parent.glob(f".{name}.replaced-*")]:
        shutil.rmtree(d, ignore_errors=True)


def sweep_staged(root: Path) -> list[str]:
    """Remove the staging directories (``.<tag>.saving-<id>``) that saves stopped under other tags left in a tagged
    checkpoints' directory ``root``; returns their names. DeepSpeed's default tag counts steps, so a save killed
    under ``global_step500`` is never swept by a save to the same tag, and each such leftover holds a whole save's
    bytes. Called by the first rank once a save to ``root`` is committed: saves to one ``root`` are the one job's
    saves, one after another, so any other save's staging is a stopped one. Never a set-aside copy
    (``.<tag>.replaced-<id>``): that can be the only whole copy of its tag (``replaced_copy``)."""
    gone = []
    for d in sorted(root.glob(f".*{STAGING}*")):
        if d.is_dir() and not d.is_symlink():
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d.name)
    return gone


def whole_checkpoints(root: Path) -> list[str]:
    """The names of the committed checkpoints in ``root`` (a directory holding its ``manifest.json``; staging and
    set-aside copies are hidden), the newest last."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if not p.name.startswith(".") and (p / MANIFEST).is_file()]
    return [p.name for p in sorted(found, key=lambda p: (p / MANIFEST).stat().st_mtime)]


def replaced_copy(path: Path) -> Path | None:
    """The previous checkpoint of ``path`` set aside by a replacement that stopped between its two renames."""
    return next(iter(sorted(path.parent.glob(f".{glob.escape(path.name)}.replaced-*"))), None)
