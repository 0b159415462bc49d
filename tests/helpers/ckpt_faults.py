"""Rank workers that save checkpoints and are killed (SIGKILL) while saving, for the transaction tests.

Each worker trains a small MLP, saves (``engine.save_checkpoint``), trains on, and saves again with one rank killed
at a chosen point of the second save. Before each save, rank 0 records the values that save must hold (the full
fp32 master, gathered) in ``<dir>/expected-<k>.pt``, written with torch's own ``save`` before any is patched, so the
test can compare whatever checkpoint survives with the saves, bit for bit, from the parent process.
"""

from __future__ import annotations

import os
import signal
import sys

import torch
from torch import nn

from tests.helpers.ds import ds_apply_zero
from tests.helpers.scenarios import dp_groups
from zerobench.zero import ZeroConfig
from zerobench.zero.config import AdamWConfig
from zerobench.zero.state.shards import full_parameters

ADAM = AdamWConfig(lr=1e-2, weight_decay=0.1)
_save = torch.save


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))


def engine_for(group, stage: int):
    return ds_apply_zero(mlp(), group, ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=150))


def train(engine, rank: int, world: int, steps: range) -> None:
    """Steps on a global batch of 8 split over the ranks (the same global batch at any world size)."""
    for s in steps:
        x = torch.randn(8, 12, generator=torch.Generator().manual_seed(s))
        per = 8 // world
        loss = engine(x[rank * per : (rank + 1) * per]).pow(2).mean()
        engine.backward(loss)
        engine.step()


def record(engine, rank: int, out: str, k: int) -> None:
    values = full_parameters(engine)
    if rank == 0:
        _save(values, os.path.join(out, f"expected-{k}.pt"))


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def kill_inside_torch_save() -> None:
    """From now on, ``torch.save`` writes a few bytes of its file and the process dies (SIGKILL)."""

    def save(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)):
            with open(f, "wb") as fh:
                fh.write(b"PK\x03\x04")
        else:
            f.write(b"PK\x03\x04")
            f.flush()
        _die()

    torch.save = save


def kill_at_event(n: int) -> None:
    """Die at the ``n``-th Python call event from now on (calls into Python and C functions alike)."""
    count = [0]

    def profile(frame, event, arg):
        count[0] += 1
        if count[0] >= n:
            _die()

    sys.setprofile(profile)


def count_events(fn, mark: str | None = None) -> dict[str, int | None]:
    """How many call events ``kill_at_event`` would count while ``fn()`` runs (``total``), and, for the function
    named ``mark``, the events at which its first call begins (``start``) and returns (``end``); None where it is
    not called on this rank."""
    count = [0]
    span: dict[str, int | None] = {"start": None, "end": None}

    def profile(frame, event, arg):
        count[0] += 1
        if mark is not None and frame.f_code.co_name == mark:
            if event == "call" and span["start"] is None:
                span["start"] = count[0]
            elif event == "return" and span["end"] is None:
                span["end"] = count[0]

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return {"total": count[0], **span}


def resave_killed(
    rank: int, world: int, out: str, stage: int, victim: int, first_world: int | None = None, tag2: str | None = "final"
) -> None:
    """Save ``final`` at step 2, train 2 more steps, save again (tag ``tag2``) with ``victim`` killed inside
    ``torch.save``. With ``first_world``, the first save was made by ``save_first`` at that world size instead."""
    group = dp_groups(rank, world, [world])[world]
    engine = engine_for(group, stage)
    if first_world is None:
        train(engine, rank, world, range(2))
        record(engine, rank, out, 1)
        engine.save_checkpoint(os.path.join(out, "ckpt"), tag="final")
    train(engine, rank, world, range(2 if first_world is None else 0, 4))
    record(engine, rank, out, 2)
    torch.distributed.barrier()
    if rank == victim:
        kill_inside_torch_save()
    engine.save_checkpoint(os.path.join(out, "ckpt"), tag=tag2)


def save_first(rank: int, world: int, out: str, stage: int) -> None:
    group = dp_groups(rank, world, [world])[world]
    engine = engine_for(group, stage)
    train(engine, rank, world, range(2))
    record(engine, rank, out, 1)
    engine.save_checkpoint(os.path.join(out, "ckpt"), tag="final")


def measure_save(rank: int, world: int, out: str, stage: int, tag2: str | None) -> dict[str, int | None]:
    """The call events of the second save on this rank, for choosing a kill point within it, with the span of the
    commit (the staged directory put in place, ``_put_in_place``: on the first rank only)."""
    group = dp_groups(rank, world, [world])[world]
    engine = engine_for(group, stage)
    train(engine, rank, world, range(2))
    engine.save_checkpoint(os.path.join(out, "ckpt"), tag="final")
    train(engine, rank, world, range(2, 4))
    return count_events(lambda: engine.save_checkpoint(os.path.join(out, "ckpt"), tag=tag2), "_put_in_place")


def killed_at_random(rank: int, world: int, out: str, stage: int, tag2: str | None, victim: int, event: int) -> None:
    """As ``measure_save``, with ``victim`` killed at call event ``event`` of the second save."""
    group = dp_groups(rank, world, [world])[world]
    engine = engine_for(group, stage)
    train(engine, rank, world, range(2))
    record(engine, rank, out, 1)
    engine.save_checkpoint(os.path.join(out, "ckpt"), tag="final")
    train(engine, rank, world, range(2, 4))
    record(engine, rank, out, 2)
    torch.distributed.barrier()
    if rank == victim:
        kill_at_event(event)
    engine.save_checkpoint(os.path.join(out, "ckpt"), tag=tag2)
    sys.setprofile(None)


def resave_with_a_full_disk(rank: int, world: int, out: str, victim: int) -> str:
    """The second save's shard write fails on ``victim`` (ENOSPC): every rank must raise, none may hang."""
    import errno

    import zerobench.zero.state.transaction as staged_files

    group = dp_groups(rank, world, [world])[world]
    engine = engine_for(group, 2)
    train(engine, rank, world, range(2))
    record(engine, rank, out, 1)
    engine.save_checkpoint(os.path.join(out, "ckpt"), tag="final")
    train(engine, rank, world, range(2, 4))
    record(engine, rank, out, 2)
    if rank == victim:

        def full(path, data):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))

        staged_files.write_file = full  # (every file of a save is written through it: write_entry)
    try:
        engine.save_checkpoint(os.path.join(out, "ckpt"), tag="final")
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        return f"{type(e).__name__}: {e}"
    return "saved"


def _tp_engine(world: int, tp: int, stage: int):
    """A tiny GPT under TP ``tp`` x DP ``world // tp`` (``parallelize``), with DeepSpeed's engine names; the same
    initialisation on every call."""
    from zerobench.distributed.mesh import build_mesh
    from zerobench.models.gpt import GPT
    from zerobench.models.sizes import PRESETS
    from zerobench.parallel.parallelize import ParallelSpec, parallelize
    from zerobench.zero import as_deepspeed

    mesh = build_mesh(tp, world // tp)
    torch.manual_seed(0)
    spec = ParallelSpec(zero=ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=5_000))
    return as_deepspeed(parallelize(GPT(PRESETS["tiny"]), mesh, spec).engine), mesh


def _tp_train(engine, mesh, steps: range) -> None:
    from zerobench.models.sizes import PRESETS
    from zerobench.train.data import SyntheticTokens

    cfg = PRESETS["tiny"]
    data = SyntheticTokens(cfg.vocab, cfg.seq, seed=5)
    for s in steps:
        x, y = data.micro_batch(s, mesh.dp.rank, mesh.dp.size, 0, 2)
        engine.backward(engine(x, y))
        engine.step()


def _tp_record(engine, mesh, out: str, k: int) -> None:
    """DP rank 0 of each TP rank records that TP rank's slices, as ``expected-<k>-tp<t>.pt``."""
    values = full_parameters(engine)
    if mesh.dp.rank == 0:
        _save(values, os.path.join(out, f"expected-{k}-tp{mesh.tp.rank:02d}.pt"))


def tp_measure_save(rank: int, world: int, out: str, tp: int, stage: int, tag2: str | None) -> dict[str, int | None]:
    """``measure_save`` under TP ``tp`` x DP ``world // tp``."""
    engine, mesh = _tp_engine(world, tp, stage)
    _tp_train(engine, mesh, range(2))
    engine.save_checkpoint(os.path.join(out, "ckpt"), tag="final")
    _tp_train(engine, mesh, range(2, 4))
    return count_events(lambda: engine.save_checkpoint(os.path.join(out, "ckpt"), tag=tag2), "_put_in_place")


def tp_killed_at_random(
    rank: int, world: int, out: str, tp: int, stage: int, tag2: str | None, victim: int, event: int
) -> None:
    """``killed_at_random`` under TP ``tp`` x DP ``world // tp``: each TP rank's two saves recorded."""
    engine, mesh = _tp_engine(world, tp, stage)
    _tp_train(engine, mesh, range(2))
    _tp_record(engine, mesh, out, 1)
    engine.save_checkpoint(os.path.join(out, "ckpt"), tag="final")
    _tp_train(engine, mesh, range(2, 4))
    _tp_record(engine, mesh, out, 2)
    torch.distributed.barrier()
    if rank == victim:
        kill_at_event(event)
    engine.save_checkpoint(os.path.join(out, "ckpt"), tag=tag2)
    sys.setprofile(None)
