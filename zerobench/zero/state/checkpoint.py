"""A sharded checkpoint directory of a ``ZeroEngine``: saved on N ranks, loaded on M ranks or into one process.

``path/`` holds one ``shard-XXXXX.pt`` per DP shard (``zero/state/shards.py``: segments with their fp32 master and
Adam moments, counters), a ``meta.json`` (the parameters' names and shapes, the number of shards, the save id) and
the commit record ``manifest.json``. Under tensor parallelism each TP rank writes its own ``path/tp-XX/``
(Megatron's ``mp_rank_XX``): TP ranks hold different slices of a parameter under the same name and shape.

A save is a transaction (``zero/state/transaction.py``): the directory appears, or replaces an earlier checkpoint,
whole or not at all. Loading refuses what is not whole: no manifest (a save that never finished), a shard of
another save (every shard records its save's id), segments that leave an element of a parameter unwritten.
Checkpoints written before manifests existed load if their shards agree on their step and shard count.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

from zerobench.config import ConfigError
from zerobench.zero.protocols import Engine
from zerobench.zero.state.gathered import check_outside
from zerobench.zero.state.reading import MANIFEST, CheckpointMismatch, check_digest, load_file, read_json
from zerobench.zero.state.shards import CHECK, FORMAT, load_shard_state_dicts, shard_state_dict, union_length
from zerobench.zero.state.transaction import refuse_staged, transaction, write_entry, write_json


def _tp(engine: Engine) -> tuple[int, int]:
    """(TP size, this rank's TP rank); (1, 0) without tensor parallelism."""
    tp = engine.tp_group
    return (1, 0) if tp is None else (tp.size, tp.rank)


def rank_dir(engine: Engine, path: str | os.PathLike) -> Path:
    """The directory this rank's shard goes to: ``path``, or its TP rank's ``path/tp-XX``."""
    size, rank = _tp(engine)
    return Path(path) if size == 1 else Path(path) / f"tp-{rank:02d}"


def saved_tp(path: str | os.PathLike) -> int:
    """The TP degree a checkpoint at ``path`` was saved with."""
    path = Path(path)
    for meta in (path / "meta.json", path / "tp-00" / "meta.json"):
        if meta.exists():
            return int(read_json(meta).get("tp", 1))
    raise FileNotFoundError(f"no zerobench checkpoint at {path} (meta.json missing)")


def write_shard(engine: Engine, root: Path, save_id: str) -> None:
    """This rank's shard (and, from shard 0, ``meta.json``) into ``root`` (stage 0: DP rank 0 only). Refused inside
    an accumulation window: the gradients of its micro-batches are no part of a checkpoint (as in DeepSpeed's and
    torch's), so a run resumed from it would lose them and start its windows elsewhere, silently. Raised inside the
    save's transaction, so every rank refuses."""
    run = engine.window.open
    if run:
        raise RuntimeError(
            f"checkpoint saved inside an accumulation window ({run} of {engine.config.grad_accum_steps} "
            "micro-batches run): their gradients are not saved, so a resumed run would lose them and its windows "
            "would start elsewhere; save after the step() that ends the window"
        )
    path = rank_dir(engine, root)
    path.mkdir(parents=True, exist_ok=True)
    if engine.layout.shards == 1 and engine.group.rank != 0:
        return
    sd = shard_state_dict(engine)
    sd["save_id"] = save_id
    write_entry(path / f"shard-{sd['shard']:05d}.pt", lambda f: torch.save(sd, f))
    if sd["shard"] == 0:
        meta = {
            "format": FORMAT,
            "num_shards": sd["num_shards"],
            "step": sd["step"],
            "tp": _tp(engine)[0],
            "params": sd["params"],
            "aliases": sd["aliases"],
            "save_id": save_id,
        }
        write_json(path / "meta.json", meta)


def check_dir_arg(value, call: str, name: str) -> None:
    """Refuse a checkpoint directory of None or the empty string (DeepSpeed's engine raises ``ValueError``):
    ``Path("")`` is the current directory, so an unset variable would save a checkpoint into wherever the job
    happened to start, and load one from there. ``ConfigError`` is a ``ValueError``."""
    if value is None or (isinstance(value, (str, bytes)) and not value.strip()):
        raise ConfigError(f"{call}: {name} is {value!r}: give the checkpoint directory's path")


def save_sharded(engine: Engine, path: str | os.PathLike) -> Path:
    """Save the engine's state as the checkpoint ``path`` (collective over DP and TP: call it on every rank).
    An existing checkpoint at ``path`` is replaced whole; a directory holding anything else is refused."""
    check_dir_arg(path, "save_sharded", "path")
    with transaction(engine, path) as staged:
        write_shard(engine, staged.dir, staged.save_id)
    return Path(path)


def _commit_record(d: Path, meta: dict) -> tuple[list[str], str | None]:
    """The shard files of shard directory ``d`` and their save id from the checkpoint's manifest; (the files
    ``meta.json`` implies, None) for a checkpoint saved before manifests."""
    top, key = (d.parent, d.name) if d.name.startswith("tp-") and not (d / MANIFEST).exists() else (d, ".")
    refuse_staged(top)
    if not (top / MANIFEST).exists():
        if "save_id" in meta:
            raise CheckpointMismatch(
                f"checkpoint {top} is not whole: its save never finished (no {MANIFEST}); load an earlier checkpoint"
            )
        return _files_of(d, meta), None
    man = read_json(top / MANIFEST)
    mine = [f for f in man.get("files", []) if "/" not in f or f.startswith(f"{key}/")]  # top level's, and d's
    lost = [f for f in mine if not (top / f).is_file()]  # ("files": in manifests of later saves)
    if lost:
        raise CheckpointMismatch(f"checkpoint {top} is torn: it lacks {', '.join(lost[:4])}, which its save wrote")
    files = man.get("dirs", {}).get(key)
    if man.get("save_id") != meta.get("save_id") or not isinstance(files, list):
        raise CheckpointMismatch(f"checkpoint {d} is torn: its meta.json is not the save its {MANIFEST} records")
    if len(files) != _num_shards(d, meta):
        raise CheckpointMismatch(
            f"checkpoint {d} is torn: meta.json names {meta['num_shards']} shards, {MANIFEST} {len(files)}"
        )
    return files, man["save_id"]


def _num_shards(d: Path, meta: dict) -> int:
    n = meta.get("num_shards")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise CheckpointMismatch(f"checkpoint file {d / 'meta.json'} is damaged: num_shards {n!r}")
    return n


def _files_of(d: Path, meta: dict) -> list[str]:
    """A manifest-less checkpoint's shard files, as many as ``meta.json`` says (counted before they are named)."""
    n = _num_shards(d, meta)
    present = {p.name for p in d.glob("shard-*.pt")}
    files = [f"shard-{i:05d}.pt" for i in range(n)] if n <= len(present) else []
    missing = [f for f in files if f not in present]
    if n > len(present) or missing:
        raise FileNotFoundError(
            f"checkpoint {d} is incomplete: meta.json names {n} shards, the directory holds "
            f"{len(present)}" + (f" (missing {', '.join(missing[:4])})" if missing else "")
        )
    return files


def _meta(d: Path) -> dict:
    _refuse_staged(d)
    if not (d / "meta.json").exists():
        raise FileNotFoundError(f"no zerobench checkpoint at {d} (meta.json missing)")
    meta = read_json(d / "meta.json")
    if not isinstance(meta.get("params"), dict):
        raise CheckpointMismatch(f"checkpoint file {d / 'meta.json'} is damaged: it has no 'params' object")
    return meta


def iter_shards(path: str | os.PathLike, deferred: bool = False):
    """The shards of the checkpoint directory ``path`` (one ``tp-XX`` directory under TP), each checked to belong
    to the save its manifest records (one loaded at a time), and its file's bytes against the manifest's digest:
    before it is yielded, or, ``deferred``, by the caller through the shard's ``CHECK`` (``load_shard_state_dicts``
    checks the shards it copies from, so a rank hashes its own shards, not every rank's)."""
    d = Path(path)
    files, save_id = _commit_record(d, _meta(d))
    first = None
    for name in files:
        try:
            # memory-mapped, so read as copied: a load checks every shard before it copies any
            sd = load_file(d / name, mmap=True, check=not deferred)
            mark = _mark(d, name, sd, save_id, first, files[0])
        except CheckpointMismatch:
            if deferred:  # a damaged file is named as damaged, not as the torn or foreign one it now looks like
                for f in dict.fromkeys([files[0], name]):
                    check_digest(d / f)
            raise
        first = mark
        if deferred:
            sd[CHECK] = functools.partial(check_digest, d / name)
        yield sd


def _refuse_staged(d: Path) -> None:
    """A save's staging directory (or a TP rank's directory in one) is refused by its name before any file of it is
    read: its files are not the checkpoint's, whatever they hold."""
    refuse_staged(d)
    if d.name.startswith("tp-"):
        refuse_staged(d.parent)


def _mark(d: Path, name: str, sd, save_id: str | None, first: tuple | None, first_name: str) -> tuple:
    """Shard ``name``'s (save id, step, global steps, shard count), refused where it is not a shard or not of the
    save the manifest (``save_id``) or the first shard (``first``) records."""
    if not isinstance(sd, dict) or sd.get("format") != FORMAT:
        raise CheckpointMismatch(f"checkpoint file {d / name} is not a zerobench ZeRO shard")
    mark = (sd.get("save_id"), sd.get("step"), sd.get("global_steps"), sd.get("num_shards"))
    if save_id is not None and mark[0] != save_id:
        raise CheckpointMismatch(f"checkpoint {d} is torn: {name} is from another save ({mark[0]}, not {save_id})")
    if first is not None and mark != first:
        raise CheckpointMismatch(
            f"checkpoint {d} is torn: {name} is from another save than {first_name} (step {mark[1]}, not {first[1]})"
        )
    return mark


def load_sharded(
    engine: Engine, path: str | os.PathLike, optimizer_states: bool = True, also_check=None, by_name=None
) -> dict:
    """Fill this rank's partition from the checkpoint at ``path`` (any DP size; the TP degree it was saved with);
    returns its counters. ``optimizer_states=False`` loads the fp32 master only (``by_name``: by name, whatever the
    saved trained set); a transaction over the ranks, with ``also_check()`` among its checks
    (``load_shard_state_dicts``). A load that took effect restarts the accumulation window
    (``engine.restart_window()``): gradients accumulated before it are dropped, as the checkpoint holds none."""
    check_dir_arg(path, "load_sharded", "path")
    check_outside(engine, "load_checkpoint()", "the loaded values")
    _refuse_staged(Path(path))
    saved, size = saved_tp(path), _tp(engine)[0]
    if saved != size:
        raise CheckpointMismatch(
            f"checkpoint {path} was saved with TP {saved}, this engine has TP {size}: load it "
            f"with the TP degree it was saved with (DP may differ)"
        )
    shards = iter_shards(rank_dir(engine, path), deferred=True)
    counters = load_shard_state_dicts(engine, shards, optimizer_states, also_check, by_name)
    engine.restart_window()
    return counters


def consolidate(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Full fp32 parameters ``{name: tensor}`` from a checkpoint, for ``model.load_state_dict``; every element of
    every parameter must come from the checkpoint's shards.

    Tied parameters appear under every name the model registers them by. A checkpoint saved under TP holds
    one TP rank's slices per ``tp-XX`` directory: consolidate that directory for that rank's parameters.
    """
    if not (Path(path) / "meta.json").exists():  # saved_tp raises where there is no checkpoint at all
        raise CheckpointMismatch(
            f"checkpoint {path} was saved with TP {saved_tp(path)}: each of its tp-XX directories "
            f"holds one TP rank's slices of the parameters; consolidate one of them (e.g. "
            f"{path}/tp-00)"
        )
    meta = _meta(Path(path))
    out = {n: torch.zeros(torch.Size(shape)).reshape(-1) for n, shape in meta["params"].items()}
    covered: dict[str, list[tuple[int, int]]] = {n: [] for n in out}
    for sd in iter_shards(path):
        off = 0
        for name, start, end in sd["segments"]:
            if name not in out or not 0 <= start < end <= out[name].numel():
                raise CheckpointMismatch(f"damaged shard {sd.get('shard')}: segment [{start}, {end}) of {name!r}")
            out[name][start:end] = sd["master"][off : off + end - start]
            covered[name].append((start, end))
            off += end - start
    for name, t in out.items():
        if union_length(covered[name]) != t.numel():
            raise CheckpointMismatch(
                f"checkpoint {path} leaves {t.numel() - union_length(covered[name])} of "
                f"{name!r}'s {t.numel()} elements unwritten: a shard is missing"
            )
    full = {n: t.view(meta["params"][n]) for n, t in out.items()}
    for alias, name in meta.get("aliases", {}).items():
        full[alias] = full[name]
    return full
