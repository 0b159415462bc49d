"""A ``ZeroEngine``'s state as shards, and shards back into any engine (``zero/state/checkpoint.py`` writes them to
disk).

Each rank's shard holds the pieces of parameters it owns as (name, start, end) segments of the flattened
parameter with their fp32 master values and Adam moments (and the step counts, the loss scale and the
param groups' hyperparameters and members: a schedule's current learning rate resumes with them), so a checkpoint
does not depend on bucket sizes, padding or the number of ranks that wrote it. Loading copies, for every
local segment, the overlapping parts of every saved segment (shards are memory-mapped, so their data is read as it
is copied), and refuses, before anything changes, shards that leave an element of this rank's partition unwritten.
Shards hold only tensors and plain data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from zerobench.distributed import collectives as C
from zerobench.zero.protocols import Engine
from zerobench.zero.state.reading import CheckpointMismatch
from zerobench.zero.state.transaction import agree

FORMAT = "zerobench-zero-shard/1"
CHECK = "_check_file"
"""In a shard read from a file (``checkpoint.iter_shards(deferred=True)``): checks the file's bytes against its
manifest's digest; ``load_shard_state_dicts`` runs it for every shard it takes anything from, before it copies."""


def shard_state_dict(engine: Engine) -> dict:
    """This rank's shard: segments with master/exp_avg/exp_avg_sq values and engine counters."""
    segs = engine.layout.segments(engine.rank_in_shards)
    engine.storage.adopt_edits()  # parameters changed in place since the last step are what is saved
    opt = engine.adamw
    ms, vs = opt.moments()
    empty = torch.empty(0, dtype=torch.float32)
    master = torch.cat([empty] + [segment_view(opt.master, engine.layout, s).float().cpu() for s in segs])
    m = torch.cat([empty] + [segment_view(ms, engine.layout, s).cpu() for s in segs])
    v = torch.cat([empty] + [segment_view(vs, engine.layout, s).cpu() for s in segs])
    return {
        "format": FORMAT,
        "shard": engine.rank_in_shards,
        "num_shards": engine.layout.shards,
        "stage": engine.stage,
        "step": opt.step_count,
        "global_steps": engine.global_steps,
        "groups": _groups(engine),
        "scaler": engine.scaler.state_dict(),
        "params": {zp.name: list(zp.slot.shape) for zp in engine.zparams},
        "aliases": _aliases(engine),
        "segments": [[engine.zparams[s.param].name, s.param_start, s.param_end] for s in segs],
        "master": master.float().cpu(),
        "exp_avg": m.cpu(),
        "exp_avg_sq": v.cpu(),
    }


def _members(engine: Engine, i: int) -> list[str]:
    """The names of param group ``i``'s parameters, sorted."""
    return sorted(zp.name for zp in engine.zparams if zp.group == i)


def _groups(engine: Engine) -> list[dict]:
    """Each param group's hyperparameters as plain data (a schedule's current lr, its ``initial_lr``, ...) and
    the names of its parameters."""
    return [
        {
            "hyper": {
                k: (v.item() if torch.is_tensor(v) else list(v) if isinstance(v, tuple) else v)
                for k, v in group.items()
                if k != "params" and isinstance(v, (int, float, bool, tuple, list, torch.Tensor))
            },
            "params": _members(engine, i),
        }
        for i, group in enumerate(engine.optimizer.param_groups)
    ]


def _saved_groups(meta: dict) -> list[dict]:
    """The shard's param groups (shards before param groups hold one group's ``hyper``)."""
    return meta.get("groups") or ([{"hyper": meta["hyper"], "params": None}] if "hyper" in meta else [])


def _check_groups(engine: Engine, meta: dict) -> None:
    """Refuse param groups other than the saved ones (``_restore_groups`` then changes nothing but values)."""
    saved = _saved_groups(meta)
    groups = engine.optimizer.param_groups
    if saved and len(saved) != len(groups):
        raise CheckpointMismatch(
            f"checkpoint has {len(saved)} param group(s), this engine {len(groups)}: "
            f"build the engine with the same param_groups"
        )
    for i, s in enumerate(saved):
        names = _members(engine, i)
        if s["params"] is not None and s["params"] != names:
            raise CheckpointMismatch(
                f"param_groups[{i}] holds other parameters than the checkpoint's (saved "
                f"{len(s['params'])}, here {len(names)}): build the engine with the same "
                f"param_groups"
            )


def _restore_groups(engine: Engine, meta: dict) -> None:
    """Put the saved hyperparameters back into ``param_groups``, as ``torch.optim``'s ``load_state_dict``."""
    for s, group in zip(_saved_groups(meta), engine.optimizer.param_groups):
        group.update({k: tuple(v) if isinstance(group.get(k), tuple) else v for k, v in s["hyper"].items()})


def _aliases(engine: Engine) -> dict[str, str]:
    """Names under which a tied parameter appears again (e.g. ``lm_head.weight`` -> ``wte.weight``)."""
    canonical = {id(zp.param): zp.name for zp in engine.zparams}
    return {
        n: canonical[id(p)]
        for n, p in engine.module.named_parameters(remove_duplicate=False)
        if id(p) in canonical and canonical[id(p)] != n  # frozen parameters are not the engine's
    }


def segment_view(chunks: list[torch.Tensor], layout, seg) -> torch.Tensor:
    """Segment ``seg``'s elements in this rank's per-bucket ``chunks`` (master, moments, shards)."""
    base = layout.local_offset(seg.bucket)
    lo = seg.local_start - base
    return chunks[seg.bucket][lo : lo + seg.numel]


@dataclass
class ByName:
    """A load of the weights alone, by name, whatever the checkpoint's trained set and param groups were: what
    DeepSpeed's ``load_module_only`` and ``load_optimizer_states=False`` load (the module's state dict). The caller
    (``zero/compat/deepspeed/checkpoints.py``) has matched the names, and says where each value comes from:

    - a parameter trained here takes the shards' values saved under its own name, or under ``sources[its name]``
      (weights tied otherwise when saved), or, where the checkpoint holds it whole beside its shards (frozen when
      it was saved), ``whole[its name]``; one the checkpoint lacks keeps its value (``load_module_strict=False``);
    - a parameter the shards hold that is not trained here (frozen now) is named in ``gather``: the load assembles
      it whole from every shard into ``gathered`` (filled by the load), for the caller to copy."""

    whole: dict[str, torch.Tensor] = field(default_factory=dict)
    sources: dict[str, str | None] = field(default_factory=dict)
    """Trained parameter -> the shards' name its values come from; None: none (``whole``'s, or its own kept)."""
    gather: frozenset[str] = frozenset()
    gathered: dict[str, torch.Tensor] = field(default_factory=dict)


@torch.no_grad()
def load_shard_state_dicts(
    engine: Engine,
    shards,
    optimizer_states: bool = True,
    also_check=None,
    by_name: Callable[[], ByName] | None = None,
) -> dict:
    """Fill this rank's partition from saved shards (any number, any order, any source world size); returns the
    last shard's counters. ``optimizer_states=False``: the fp32 master only (moments, step count, loss scale and
    param-group hyperparameters stay this engine's: DeepSpeed's ``load_optimizer_states=False``). ``by_name``
    (with ``optimizer_states=False``) returns a ``ByName``: the weights are loaded by name, and the checkpoint's
    trained set and param groups may differ from this engine's.

    A transaction, collective over the DP and TP groups: ``by_name()`` runs, every shard is read and checked, and
    ``also_check()`` (a caller's own checks) runs, before anything changes, and the ranks agree on the outcome; a load
    refused on any rank changes nothing on any rank (each raises: the refusing rank its reason)."""
    if by_name is not None and optimizer_states:
        raise ValueError("a load by name loads the weights alone: pass optimizer_states=False")
    failed: Exception | None = None
    try:
        spec = by_name() if by_name is not None else None
        plan, first, meta = _plan(engine, shards, spec)
        if also_check is not None:
            also_check()
    except Exception as e:  # noqa: BLE001 - every rank must reach the agreement below, whatever went wrong here
        failed = e
    if agree(engine, int(failed is not None)):
        if failed is not None:
            raise failed
        raise CheckpointMismatch("another rank refused this checkpoint (its error says why): nothing was loaded")
    if spec is not None:  # what the load leaves (a new layer's init, edited in place) is the module's, not the master's
        engine.storage.adopt_edits()
    opt = engine.adamw
    ms, vs = opt.moments() if optimizer_states else ([], [])
    keys = ((opt.master, "master"), (ms, "exp_avg"), (vs, "exp_avg_sq"))[: 3 if optimizer_states else 1]
    for sd, src, s, lo, hi in plan:
        for chunks, key in keys:
            segment_view(chunks, engine.layout, s)[lo - s.param_start : hi - s.param_start].copy_(sd[key][src])
    if optimizer_states:
        _restore_groups(engine, first)
        opt.load_moments(ms, vs)
        opt.step_count = int(meta["step"])
        # DeepSpeed's counter (optimizer steps, overflow-skipped ones included); older shards have only the step
        engine.global_steps = int(meta.get("global_steps", meta["step"]))
        engine.scaler.load_state_dict(meta["scaler"])
    engine.params_from_master()
    return {
        "step": int(meta["step"]),
        "global_steps": int(meta.get("global_steps", meta["step"])),
        "skipped_steps": int(meta.get("scaler", {}).get("skipped_steps", 0)),
    }


def _plan(engine: Engine, shards, spec: ByName | None = None) -> tuple[list, dict, dict]:
    """Read and check every shard, and list what each copies where: (shard, its slice, the local segment, the
    segment's range); with the shard the counters and param groups are taken from (twice: every shard holds the
    same), one this rank copies from, so that its file is among the ones checked (``CHECK``) and no rank reads
    another's shard whole. Under ``spec`` (a load by name) the copies from ``spec.whole`` too, and
    ``spec.gathered`` filled. Changes nothing of the engine's."""
    segs = engine.layout.segments(engine.rank_in_shards)
    source = {zp.name: zp.name for zp in engine.zparams} | (spec.sources if spec else {})
    segments_of: dict[str | None, list] = {}  # a saved name -> this rank's segments that load from it
    for k, s in enumerate(segs):
        segments_of.setdefault(source[engine.zparams[s.param].name], []).append((k, s))
    covered: list[list[tuple[int, int]]] = [[] for _ in segs]
    gathered: dict[str, list[tuple[int, int]]] = {}
    first = meta = None
    expected = {zp.name: list(zp.slot.shape) for zp in engine.zparams}
    plan = []
    used_by_name = []
    seen = []
    try:  # a refusal checks the files read so far first: it names a damaged one, not what its bytes now look like
        for sd in shards:
            seen.append(sd)
            if sd.get("format") != FORMAT:
                raise ValueError(f"not a zerobench ZeRO shard (format {sd.get('format')!r})")
            check_compatible(sd, expected if spec is None else {}, check_params=first is None)
            if first is None:
                if spec is not None:
                    _start_by_name(engine, spec, sd, source)
                first = sd
            meta = sd
            off = 0
            for name, start, end in sd["segments"]:
                for k, s in segments_of.get(name, ()):
                    lo, hi = max(start, s.param_start), min(end, s.param_end)
                    if lo < hi:
                        plan.append((sd, slice(off + lo - start, off + hi - start), s, lo, hi))
                        covered[k].append((lo, hi))
                if spec is not None and name in spec.gathered:
                    used_by_name.append(sd)
                    spec.gathered[name][start:end] = sd["master"][off : off + end - start]
                    gathered.setdefault(name, []).append((start, end))
                off += end - start
    except Exception:
        _check_files(seen)
        raise
    ref = plan[0][0] if plan else first
    _check_files([ref, *(sd for sd, *_ in plan), *used_by_name])
    if spec is None and ref is not None:
        _check_groups(engine, ref)
    saved = set(ref["params"]) if ref is not None else set()  # (a checked shard's: what must be loaded)
    needed = [
        k for k, s in enumerate(segs) if spec is None or ref is None or source[engine.zparams[s.param].name] in saved
    ]
    filled, total = sum(union_length(covered[k]) for k in needed), sum(segs[k].numel for k in needed)
    holes = [n for n, t in (spec.gathered.items() if spec else ()) if union_length(gathered.get(n, [])) != t.numel()]
    if meta is None or filled != total or holes:
        _check_files(seen)
        raise CheckpointMismatch(
            f"checkpoint covers {filled} of this rank's {total} elements"
            + (f" and leaves {holes[:3]} unwritten" if holes else "")
            + _partition_note(engine, meta)
            + " (each rank loads its own engine.optimizer.state_dict(), into the same partition; "
            "save_sharded / load_sharded, or DeepSpeed's save_checkpoint / load_checkpoint, load any DP size and stage)"
        )
    return plan + (_whole_copies(engine, segs, spec) if spec is not None else []), ref, ref


def _check_files(shards: list) -> None:
    """Run the file check (``CHECK``) of each shard a load takes values or counters from, once."""
    for sd in {id(sd): sd for sd in shards if sd is not None}.values():
        check = sd.get(CHECK)
        if check is not None:
            check()


def _partition_note(engine: Engine, meta: dict | None) -> str:
    """Why a shard may not cover this rank's partition: another rank's shard, or another partition."""
    if meta is None:
        return ": no shard given"
    stage, shards, index = meta.get("stage"), meta.get("num_shards"), meta.get("shard")
    if shards == engine.layout.shards and index is not None and index != engine.rank_in_shards:
        return f": it is shard {index}'s state and this rank holds shard {engine.rank_in_shards}, a state dict another rank saved"
    if stage is not None and (stage, shards) != (engine.stage, engine.layout.shards):
        return (
            f": it is shard {index} of {shards} of a stage-{stage} partition, and this engine's "
            f"stage-{engine.stage} partition has {engine.layout.shards} shard(s)"
        )
    return ": shards missing, or a state dict another rank saved"


def _start_by_name(engine: Engine, spec: ByName, sd: dict, source: dict[str, str]) -> None:
    """Check a load by name against the first shard (the shapes of what each trained parameter loads from, in the
    shards or ``spec.whole``; what is to be gathered), and make ``spec.gathered``'s buffers."""
    saved = sd["params"]
    for zp in engine.zparams:
        src = source[zp.name]
        shape = saved[src] if src in saved else spec.whole[zp.name].shape if zp.name in spec.whole else None
        if shape is not None and list(shape) != list(zp.slot.shape):
            raise CheckpointMismatch(
                f"checkpoint holds {src or zp.name!r} as {tuple(shape)}, this model's {zp.name!r} is "
                f"{tuple(zp.slot.shape)}: it was saved from another model size"
            )
    lost = sorted(n for n in spec.gather if n not in saved)
    if lost:
        raise CheckpointMismatch(f"checkpoint's shards lack {lost[:3]}: its meta.json and shards disagree")
    spec.gathered = {n: torch.zeros(math.prod(saved[n])) for n in spec.gather}


def _whole_copies(engine: Engine, segs, spec: ByName) -> list:
    """The copies, in ``_plan``'s form, of this rank's segments of the parameters ``spec.whole`` holds."""
    plan = []
    for s in segs:
        zp = engine.zparams[s.param]
        value = spec.whole.get(zp.name)  # (its shape checked by _start_by_name)
        if value is None:
            continue
        flat = {"master": value.detach().reshape(-1).float()}
        plan.append((flat, slice(s.param_start, s.param_end), s, s.param_start, s.param_end))
    return plan


def union_length(intervals: list[tuple[int, int]]) -> int:
    """How many elements the half-open ``intervals`` cover together (an element covered twice counts once)."""
    total, reach = 0, None
    for lo, hi in sorted(intervals):
        start = lo if reach is None else max(lo, reach)
        if hi > start:
            total += hi - start
            reach = hi
    return total


def check_compatible(sd: dict, expected: dict[str, list[int]], check_params: bool = True) -> None:
    """The checkpoint holds exactly this model's parameters (``expected``; none given: any) with the same shapes,
    and its segments and tensors agree with each other; else one line naming the first difference."""
    saved = {n: list(shape) for n, shape in sd["params"].items()}
    missing, extra = sorted(set(expected) - set(saved)), sorted(set(saved) - set(expected))
    if check_params and expected and (missing or extra):
        what = f"lacks {missing[:3]}" if missing else f"has parameters this model does not: {extra[:3]}"
        raise CheckpointMismatch(f"checkpoint is of another model: it {what}")
    for name, shape in expected.items() if check_params else ():
        if saved[name] != shape:
            raise CheckpointMismatch(
                f"checkpoint shape of {name!r} is {tuple(saved[name])}, this model's is "
                f"{tuple(shape)}: it was saved from another model size"
            )
    total = 0
    for name, start, end in sd["segments"]:
        if name not in saved:
            raise CheckpointMismatch(f"damaged shard {sd.get('shard')}: a segment of {name!r}, which it does not list")
        numel = math.prod(saved[name])
        if not 0 <= start < end <= numel:
            raise CheckpointMismatch(
                f"damaged shard: segment [{start}, {end}) of {name!r} outside its {numel} elements"
            )
        total += end - start
    for key in ("master", "exp_avg", "exp_avg_sq"):
        if sd[key].numel() != total:
            raise CheckpointMismatch(
                f"damaged shard {sd.get('shard')}: {key} holds {sd[key].numel()} elements, its segments {total}"
            )


def iter_full(engine: Engine, chunks: list[torch.Tensor]):
    """(parameter index, its full fp32 value) from this rank's per-bucket ``chunks``, one bucket all-gathered at a
    time (collective over the DP group; the values are views of that bucket's buffer)."""
    layout = engine.layout
    for b, chunk in zip(layout.buckets, chunks):
        full = torch.empty(b.numel, dtype=torch.float32, device=engine.device)
        if layout.shards == 1:
            full.copy_(chunk)
        else:  # collectives run on the engine's device (chunks may live in host memory under offload)
            C.all_gather(full, chunk.float().to(engine.device).contiguous(), engine.group)
        for i in b.params:
            s = layout.params[i]
            yield i, full[s.start - b.start : s.end - b.start].view(s.shape)


@torch.no_grad()
def full_parameters(engine: Engine) -> dict[str, torch.Tensor]:
    """Every parameter's fp32 master value, gathered onto every rank (collective over the DP group)."""
    engine.storage.adopt_edits()
    return {engine.layout.params[i].name: full.clone() for i, full in iter_full(engine, engine.adamw.master)}


@torch.no_grad()
def full_gradients(engine: Engine) -> dict[str, torch.Tensor]:
    """The reduced gradient (averaged over DP ranks, loss scale removed) of every parameter, on every
    rank. Call between ``backward`` of the last micro-batch and ``step`` (collective over DP)."""
    unscale = 1.0 / engine.scaler.scale
    return {engine.layout.params[i].name: full * unscale for i, full in iter_full(engine, engine.grad_chunks())}
