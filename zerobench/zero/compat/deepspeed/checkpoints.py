"""DeepSpeed's checkpoint directory on a ``ZeroEngine``: ``engine.save_checkpoint(save_dir, tag, client_state)``
and ``engine.load_checkpoint(load_dir, tag)``, called on every rank, as DeepSpeed's.

``save_dir/<tag>/`` holds the engine's sharded checkpoint (``zero/state/checkpoint.py``: parameters, fp32 master,
moments, step count, loss scale, the param groups' hyperparameters; any DP size can load it), plus, from the
first rank, ``module_extra.pt`` (the model's state the engine does not hold: persistent buffers such as
BatchNorm's running statistics, and frozen parameters, named in ``frozen.json``; under TP one file per TP rank)
and ``client_state.pt`` (the caller's dict; where the ranks' differ, each rank's own beside it), and ``lr_scheduler.pt`` (``engine.lr_scheduler``'s state, where the engine
has one). The tag's directory is written as one transaction (``zero/state/transaction.py``): every rank stages its
files, all agree, and the directory appears, or replaces an earlier one under the same tag, whole; only then does
``save_dir/latest`` move to it, so it never names a half-written or torn checkpoint. The default tag counts the
optimizer steps taken, skipped ones included (``global_step<engine.global_steps>``), as DeepSpeed's. Every file
loads with ``weights_only=True``: ``client_state`` must hold tensors and plain Python data, checked when saving.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from zerobench.config import ConfigError
from zerobench.files import replace_file
from zerobench.zero.compat.deepspeed.module_load import (
    Gathered,
    check_extras,
    engine_extras,
    module_extra_file,
    route_by_name,
)
from zerobench.zero.protocols import Engine
from zerobench.zero.state.checkpoint import check_dir_arg, load_sharded, rank_dir, write_shard
from zerobench.zero.state.export import extra_states
from zerobench.zero.state.reading import CheckpointMismatch, load_file, read_json
from zerobench.zero.state.transaction import (
    replaced_copy,
    sweep_staged,
    transaction,
    whole_checkpoints,
    write_entry,
    write_json,
)

LATEST = "latest"
SCHEDULER = "lr_scheduler.pt"
COUNTERS = "counters.json"
"""DeepSpeed's counters no shard holds: ``global_samples`` (samples at the batch size each step ran with)."""
PER_GROUP = ("base_lrs", "_last_lr", "min_lrs", "max_lrs", "lr_lambdas")
"""Keys of torch's schedulers' states that hold one entry per param group."""
FROZEN = "frozen.json"
"""Beside ``module_extra.pt``: which of its names are frozen parameters (the rest are buffers)."""


def _plain(state: dict, what: str = "client_state") -> bytes:
    """``state`` serialised, or one line saying why it would not load back with ``weights_only=True``."""
    buf = io.BytesIO()
    try:
        torch.save(state, buf)
        torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    except (pickle.PickleError, TypeError, AttributeError) as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
        first = next((ln for ln in lines if "Unsupported global" in ln), lines[0])
        raise ConfigError(
            f"{what} must hold only tensors and plain Python data (checkpoints load with weights_only=True): {first}"
        ) from None
    return buf.getvalue()


def check_tag(tag: str) -> str:
    """``tag`` if it can name a checkpoint's directory under ``save_dir``, else one line before anything is written."""
    if not tag or tag in (LATEST, ".", "..") or tag.startswith(".") or "/" in tag or "\\" in tag or "\0" in tag:
        raise ConfigError(
            f"checkpoint tag {tag!r} must be one directory name, not {LATEST!r} and not starting with "
            "'.' (e.g. global_step100)"
        )
    if tag != tag.strip() or "\n" in tag or "\r" in tag:  # `latest` is read back stripped, as DeepSpeed reads it
        raise ConfigError(
            f"checkpoint tag {tag!r} begins or ends with whitespace or holds a line break: the 'latest' file would "
            "name another tag; give it without (e.g. global_step100)"
        )
    return tag


class CheckpointTagMismatch(ConfigError, AssertionError):
    """The ranks gave ``save_checkpoint`` different tags under ``checkpoint.tag_validation`` ``Fail``: an
    ``AssertionError``, as DeepSpeed's, and a ``ConfigError``, one line."""


def validate_tag(engine: Engine, tag: str) -> str:
    """The tag every rank saves under, by DeepSpeed's ``checkpoint.tag_validation`` (``engine.tag_validation``;
    ``WARN`` by default). A checkpoint is one transaction under one tag, so ranks that give different tags (a rank
    number in it) cannot each have theirs: ``FAIL`` refuses in one line before anything is written, ``WARN`` warns
    and saves under world rank 0's tag, ``IGNORE`` saves under it without a word.

    The check is DeepSpeed's: one all-reduce over the world of the tag's hash (its maximum and, negated, its
    minimum: equal on every rank exactly when the tags are), and rank 0's tag is sent only where they differ."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return tag
    h = int.from_bytes(hashlib.sha1(tag.encode()).digest()[:7], "big")
    seen = torch.tensor([h, -h], dtype=torch.int64, device=getattr(engine, "device", None))
    dist.all_reduce(seen, op=dist.ReduceOp.MAX)
    if int(seen[0]) == -int(seen[1]):
        return tag
    box = [tag]
    dist.broadcast_object_list(box, src=0)
    msg = (
        f"checkpoint tag {tag!r} differs across ranks: a checkpoint is one tag for every rank; leave the rank out "
        "of the tag"
    )
    mode = getattr(engine, "tag_validation", "WARN")
    if mode == "FAIL":
        raise CheckpointTagMismatch(msg)
    if mode == "WARN":
        warnings.warn(f"{msg} (saving under rank 0's tag {box[0]!r})", stacklevel=4)
    return box[0]


def save_tagged(
    engine: Engine,
    save_dir: str | os.PathLike,
    tag: str | None = None,
    client_state: dict | None = None,
    save_latest: bool = True,
    exclude_frozen_parameters: bool = False,
) -> Path:
    """Save into ``save_dir/<tag>`` (default tag ``global_step<N>``, N the optimizer steps taken, skipped ones
    included) and point ``save_dir/latest`` at it (not with ``save_latest=False``); returns the tag's directory.
    Collective over the DP and TP groups. As DeepSpeed's, ``exclude_frozen_parameters=True`` leaves the frozen
    parameters out (load it with ``load_module_strict=False``)."""
    check_dir_arg(save_dir, "save_checkpoint", "save_dir")
    # the tag is agreed before it is checked, so every rank checks the same one and refuses alike
    tag = check_tag(validate_tag(engine, str(tag) if tag is not None else f"global_step{engine.global_steps}"))
    if Path(save_dir).exists() and not Path(save_dir).is_dir():
        raise ConfigError(f"save_checkpoint: save_dir {save_dir} is a file: give a directory")
    blob, own = _client_blobs(client_state)
    sched = (
        None if engine.lr_scheduler is None else _plain(engine.lr_scheduler.state_dict(), "lr_scheduler.state_dict()")
    )
    states = _extra_states(engine)
    per_rank = _per_rank_module_state(engine, states)
    path = Path(save_dir) / tag

    def committed() -> None:
        if save_latest:
            replace_file(Path(save_dir) / LATEST, tag)
        sweep_staged(Path(save_dir))  # what saves stopped under other tags left

    with transaction(engine, path, after_commit=committed) as staged:
        write_shard(engine, staged.dir, staged.save_id)
        if own is not None:
            write_entry(staged.dir / own[0], own[1])
        if per_rank is not None:
            write_entry(rank_dir(engine, staged.dir) / module_extra_file(engine.group.rank), per_rank)
        if engine.group.rank == 0:
            _write_extras(engine, staged.dir, blob, sched, exclude_frozen_parameters, states)
    return path


def _per_rank_module_state(engine: Engine, states: dict) -> bytes | None:
    """This DP rank's buffers and modules' extra states, serialised, where any DP rank's differ from the others'
    (BatchNorm's running statistics, which evolve per rank); None where they are equal. Each rank then also writes
    ``module_extra-dp<NNNNN>.pt``, which its load takes over the first rank's ``module_extra.pt``, so a resumed run
    continues with every rank's own statistics, as an uninterrupted one does. DeepSpeed gives each rank its own
    back at stage 3 (every rank writes its own model-states file) and the first rank's at stages 0-2. The ranks
    compare digests in one gather over the DP group."""
    group = engine.group
    if group.size == 1 or not dist.is_initialized():
        return None
    mine = {n: t.detach().cpu() for n, t in engine_extras(engine).items() if not isinstance(t, nn.Parameter)}
    blob = _plain({**mine, **states}, "the model's buffers and extra state")
    seen: list = [None] * group.size
    dist.all_gather_object(seen, hashlib.sha256(blob).hexdigest(), group=group.pg)
    return None if len(set(seen)) == 1 else blob


def _client_blobs(client_state: dict | None) -> tuple[bytes, tuple[str, bytes] | None]:
    """This rank's ``client_state`` serialised, and, where the ranks' differ, the file of its own: (name, bytes).

    DeepSpeed gives each rank its own client state back at stage 3 (every rank writes its own model-states file)
    and the first rank's at stages 0-2; here ``client_state.pt`` is the first rank's, and where any rank's differs
    (a data position per rank) every rank also writes ``client_state-rank<NNNNN>.pt``, which its load returns. The
    ranks compare digests in one gather over the world, which also carries a rank's refusal of its state (not
    loadable with ``weights_only=True``), so every rank refuses alike instead of leaving the others waiting."""
    try:
        blob, err = _plain(dict(client_state or {})), None
    except ConfigError as e:
        blob, err = b"", str(e)
    if not dist.is_initialized() or dist.get_world_size() == 1:
        if err:
            raise ConfigError(err)
        return blob, None
    seen: list = [None] * dist.get_world_size()
    dist.all_gather_object(seen, (err, hashlib.sha256(blob).hexdigest()))
    if err:
        raise ConfigError(err)
    bad = next((r for r, (e, _) in enumerate(seen) if e), None)
    if bad is not None:
        raise ConfigError(f"rank {bad}'s client_state cannot be saved: {seen[bad][0]}")
    if len({d for _, d in seen}) == 1:
        return blob, None
    return blob, (_client_file(dist.get_rank()), blob)


def _client_file(rank: int) -> str:
    return f"client_state-rank{rank:05d}.pt"


def _read_client(path: Path):
    """The client state this rank saved (its own file, where the ranks' differed), else the first rank's; a world
    of another size than the one that saved per-rank states is warned about (ranks beyond it get the first's)."""
    per_rank = sorted(path.glob("client_state-rank*.pt"))
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    own = path / _client_file(rank)
    if per_rank and len(per_rank) != world:
        gets = "the one it saved" if own.is_file() else "rank 0's"
        warnings.warn(
            f"checkpoint {path} holds a client_state per rank, saved by {len(per_rank)} ranks, and this run has "
            f"{world}: rank {rank} gets {gets}",
            stacklevel=4,
        )
    return load_file(own if own.is_file() else path / "client_state.pt")


def _extra_states(engine: Engine) -> dict:
    """Each module's ``get_extra_state()`` by ``state_dict`` key, refused in one line (on every rank, before a
    save starts) when it would not load back with ``weights_only=True``."""
    states = {key: mod.get_extra_state() for key, mod in extra_states(engine.module).items()}
    for key, value in states.items():
        _plain({key: value}, f"{key} (the module's get_extra_state())")
    return states


def _write_extras(
    engine: Engine, root: Path, blob: bytes, sched: bytes | None, exclude_frozen: bool, states: dict
) -> None:
    """DP rank 0's files beside the shards: the buffers, frozen parameters and extra states (per TP rank), the client
    state and the scheduler's (once)."""
    extra = engine_extras(engine, not exclude_frozen)
    d = rank_dir(engine, root)
    saved = {**{n: t.detach().cpu().clone() for n, t in extra.items()}, **states}
    write_entry(d / "module_extra.pt", lambda f: torch.save(saved, f))
    write_json(d / FROZEN, sorted(n for n, t in extra.items() if isinstance(t, nn.Parameter)))
    if engine.tp_group is None or engine.tp_group.rank == 0:
        write_entry(root / "client_state.pt", blob)
        if getattr(engine, "micro_batch", None) is not None:  # (no batch size given: no sample count)
            write_json(root / COUNTERS, {"global_samples": int(engine.global_samples)})
        if sched is not None:
            write_entry(root / SCHEDULER, sched)


def tagged_path(root: str | os.PathLike, tag: str | None) -> Path | None:
    """``root/<tag>`` (default: the tag ``root/latest`` names); None when no tag is given and there is no
    ``latest``; a tag with no directory is one line."""
    root = Path(root)
    if tag is None:
        if not (root / LATEST).exists():
            if whole := whole_checkpoints(root):  # a first save stopped before naming its tag: not "nothing to load"
                raise CheckpointMismatch(
                    f"{root} holds whole checkpoint(s) {', '.join(map(repr, whole[-4:]))} but no {LATEST} naming one "
                    f"(a save stopped before writing it): load one by its tag (load_checkpoint(dir, "
                    f"tag={whole[-1]!r})), or move them away to start afresh"
                )
            return None
        if not (root / LATEST).is_file():
            raise CheckpointMismatch(f"{root / LATEST} is not a file naming a tag: remove it, or give the tag to load")
        tag = (root / LATEST).read_text(errors="replace").strip()
    path = root / check_tag(str(tag))
    if not path.is_dir():
        aside = replaced_copy(path)
        if aside is not None:
            raise CheckpointMismatch(
                f"checkpoint {tag!r} in {root} was being replaced when its save stopped: the "
                f"previous one is whole in {aside}; rename it to {path} to load it"
            )
        raise FileNotFoundError(f"no checkpoint {tag!r} in {root}")
    return path


@torch.no_grad()
def load_tagged(
    engine: Engine,
    load_dir: str | os.PathLike,
    tag: str | None = None,
    load_module_strict: bool = True,
    load_optimizer_states: bool = True,
    load_lr_scheduler_states: bool = True,
    load_module_only: bool = False,
) -> tuple[str | None, dict | None]:
    """Load ``load_dir/<tag>`` (default: the tag ``load_dir/latest`` names); returns (its path, the client
    state). With no tag given and no ``latest``, warns and returns (None, None), as DeepSpeed does. DeepSpeed's
    options: ``load_optimizer_states=False`` loads the weights and the counters (``global_steps``,
    ``skipped_steps``), and keeps this engine's moments, step count, loss scale and learning rates;
    ``load_module_only=True`` loads the weights alone; ``load_module_strict=False`` skips the buffers and frozen
    parameters that the checkpoint or the model lacks; ``load_lr_scheduler_states=False`` leaves
    ``engine.lr_scheduler`` where it is (it loads otherwise, unless ``load_module_only``; a checkpoint saved
    without one warns that the schedule starts from its beginning).

    The two weights-only loads read the weights by name, as DeepSpeed loads the module's state dict for them: the
    parameters trained here need not be the ones trained when it was saved (a layer unfrozen since, new param
    groups), and with ``load_module_strict=False`` a model with layers the checkpoint lacks keeps their values
    (a warm start), as ``load_state_dict(strict=False)`` does. A full load needs the saved trained set and groups."""
    check_dir_arg(load_dir, "load_checkpoint", "load_dir")
    path = tagged_path(load_dir, tag)
    if path is None:
        warnings.warn(f"no checkpoint to load: {Path(load_dir) / LATEST} does not exist", stacklevel=3)
        return None, None
    # Everything is read and checked before anything changes (load_sharded's transaction), so a refused load, on
    # any rank, leaves every rank's engine, model and scheduler as they were.
    read: dict = {}
    weights_only = load_module_only or not load_optimizer_states

    def check() -> None:
        if not weights_only:
            read["extras"] = check_extras(engine, path, load_module_strict)
        read["client"] = _read_client(path)
        read["samples"] = read_json(path / COUNTERS).get("global_samples") if (path / COUNTERS).exists() else None
        if load_lr_scheduler_states and not load_module_only and engine.lr_scheduler is not None:
            read["scheduler"] = _read_scheduler(path)
            _check_scheduler(engine.lr_scheduler, read["scheduler"], path)

    def by_name():
        read["spec"], read["extras"] = route_by_name(engine, path, load_module_strict)
        return read["spec"]

    counters = load_sharded(engine, path, not weights_only, also_check=check, by_name=by_name if weights_only else None)
    if not load_module_only:  # DeepSpeed's counters come back with the weights, optimizer states or not
        _set_counters(engine, counters, read["samples"])
    for target, saved in read["extras"]:  # in state_dict order (of a frozen tied weight's keys, the last wins)
        value = read["spec"].gathered[saved.name].view(target.shape) if isinstance(saved, Gathered) else saved
        if torch.is_tensor(target):
            target.copy_(value)
        else:
            target.set_extra_state(value)
    if read.get("scheduler") is not None:
        engine.lr_scheduler.load_state_dict(read["scheduler"])
    return str(path), read["client"]


def _set_counters(engine: Engine, counters: dict, samples) -> None:
    engine.global_steps = counters["global_steps"]
    engine.scaler.skipped_steps = counters["skipped_steps"]
    if getattr(engine, "micro_batch", None) is not None:  # without a count saved, DeepSpeed's fallback
        if not isinstance(samples, int) or isinstance(samples, bool):
            samples = engine.global_steps * engine.train_batch_size()
        engine._samples_at = (engine.global_steps, samples)


def _check_scheduler(scheduler, state: dict | None, path: Path) -> None:
    """Refuse, before anything is loaded, a saved schedule state that is not this scheduler's kind: it lacks a key of
    the state this scheduler gives (a torch ``StepLR`` saved, a DeepSpeed ``WarmupDecayLR`` loading). Loading it
    would fail half way, after the weights and counters were loaded, or (a torch scheduler's ``__dict__`` update)
    silently restart the schedule."""
    if state is None:
        return
    if not isinstance(state, dict):
        raise CheckpointMismatch(f"{path / SCHEDULER} holds no scheduler state: a damaged checkpoint")
    # the schedule's own (public) keys: torch's private bookkeeping keys come and go between versions
    mine = scheduler.state_dict()
    lacks = sorted(k for k in mine if not str(k).startswith("_") and k not in state)
    if lacks:
        raise CheckpointMismatch(
            f"checkpoint {path} holds the state of another learning-rate schedule than this engine's "
            f"{type(scheduler).__name__} (it lacks {lacks[:3]}): build the engine with the scheduler it was saved "
            "with, or load with load_lr_scheduler_states=False"
        )
    # per-group lists: a schedule saved for other param groups would leave a group undriven
    other = next(
        (
            k
            for k in PER_GROUP
            if isinstance(mine.get(k), list) and isinstance(state.get(k), list) and len(mine[k]) != len(state[k])
        ),
        None,
    )
    if other is not None:
        raise CheckpointMismatch(
            f"checkpoint {path} holds a learning-rate schedule of {len(state[other])} param group(s) ({other}), this "
            f"engine's drives {len(mine[other])}: load with load_lr_scheduler_states=False, or build the engine with "
            "the param groups it was saved with"
        )


def _read_scheduler(path: Path) -> dict | None:
    """The saved schedule state; None, with a warning, for a checkpoint without one (DeepSpeed's would fail)."""
    if not (path / SCHEDULER).exists():
        warnings.warn(
            f"checkpoint {path} holds no learning-rate scheduler state (saved by an engine without one): "
            "the scheduler starts from its beginning",
            stacklevel=7,
        )
        return None
    return load_file(path / SCHEDULER)
