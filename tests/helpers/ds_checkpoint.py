"""Rank workers for DeepSpeed's engine surface (``engine(x)``, ``train()``/``eval()``, tagged
``save_checkpoint``/``load_checkpoint``) and for checkpoints under tensor parallelism.

Each worker trains, saves, trains on (the uninterrupted run), then builds a second engine from a
*different* initialisation, loads and trains the same steps: the resumed run must equal the uninterrupted
one exactly, which holds only if everything the step depends on came back (master, moments, step count,
learning rate, buffers, frozen parameters, and under TP each TP rank's own slices).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from tests.helpers.ds import ds_apply_zero
from tests.helpers.scenarios import dp_groups
from zerobench.distributed.mesh import build_mesh
from zerobench.models.gpt import GPT
from zerobench.models.sizes import PRESETS
from zerobench.parallel.parallelize import ParallelSpec, parallelize
from zerobench.train.data import SyntheticTokens
from zerobench.zero import ZeroConfig, as_deepspeed
from zerobench.zero.config import AdamWConfig
from zerobench.zero.state.shards import full_parameters

ADAM = AdamWConfig(lr=1e-2, weight_decay=0.1)


class BNNet(nn.Module):
    """A model with state outside the engine: BatchNorm's running statistics and a frozen projection."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 16)
        self.bn = nn.BatchNorm1d(16)
        self.frozen = nn.Linear(16, 16)
        self.frozen.requires_grad_(False)
        self.out = nn.Linear(16, 1)

    def forward(self, x):
        return self.out(self.frozen(torch.relu(self.bn(self.inp(x))))).pow(2).mean()


def _bn_state(model: BNNet) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if not k.startswith(("inp.", "out."))}


def _bn_train(engine, rank: int, steps: range) -> list[float]:
    losses = []
    for s in steps:
        x = torch.randn(8, 6, generator=torch.Generator().manual_seed(100 * s + rank))
        loss = engine(x)  # DeepSpeed's engine(batch)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def ds_resume(rank: int, world: int, stage: int, save_dir: str) -> dict:
    """DeepSpeed's loop and checkpoint calls on a model with buffers and a frozen layer."""
    group = dp_groups(rank, world, [world])[world]
    torch.manual_seed(0)
    a = ds_apply_zero(BNNet(), group, ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=200))
    a.train()
    _bn_train(a, rank, range(3))
    sched_state = {"lr_history": [1e-2, 5e-3], "epoch": 3, "t": torch.arange(3)}
    a.optimizer.param_groups[0]["lr"] = 5e-3
    path = a.save_checkpoint(save_dir, client_state=sched_state)
    at_save = full_parameters(a)
    with a.gathered_params():
        saved_state = _bn_state(a.module)  # this rank's own: BatchNorm statistics evolve per rank
    first = [saved_state]
    dist.broadcast_object_list(first, src=dist.get_global_rank(group.pg, 0), group=group.pg)
    after = _bn_train(a, rank, range(3, 5))
    uninterrupted = full_parameters(a)
    a.eval()
    eval_mode = (a.module.training, a.module.bn.training)
    probe = torch.randn(8, 6, generator=torch.Generator().manual_seed(999))
    with torch.no_grad():
        eval_uninterrupted = a(probe).item()  # eval mode normalises with the running statistics

    torch.manual_seed(1)  # another init and other buffers: everything must come from the checkpoint
    b = ds_apply_zero(BNNet(), group, ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=200))
    b.module.bn.running_mean.fill_(7.0)
    loaded_path, client = b.load_checkpoint(save_dir)
    step_after_load = b.adamw.step_count
    global_after_load = b.global_steps
    with b.gathered_params():
        loaded_state = _bn_state(b.module)
    resumed_losses = _bn_train(b.train(), rank, range(3, 5))
    resumed = full_parameters(b)
    with torch.no_grad():
        eval_resumed = b.eval()(probe).item()
    return {
        "per_rank_files": sorted(f.name for f in path.glob("module_extra*.pt")),
        "from_first": max((saved_state[k].float() - first[0][k].float()).abs().max().item() for k in saved_state),
        "eval_diff": abs(eval_uninterrupted - eval_resumed),
        "tag": path.name,
        "latest": (path.parent / "latest").read_text(),
        "loaded_path": loaded_path,
        "saved_path": str(path),
        "client": {**client, "t": client["t"].tolist()},
        "lr": b.get_lr(),
        "step": step_after_load,
        "global_steps": (global_after_load, a.global_steps, b.global_steps),
        "eval_mode": eval_mode,
        "state_diff": max((saved_state[k].float() - loaded_state[k].float()).abs().max().item() for k in saved_state),
        "loss_diff": max(abs(x - y) for x, y in zip(after, resumed_losses)),
        "param_diff": max((uninterrupted[n] - resumed[n]).abs().max().item() for n in resumed),
        "moved": max((uninterrupted[n] - at_save[n]).abs().max().item() for n in resumed),
    }


def ds_resume_other_world(rank: int, world: int, stage: int, save_dir: str) -> dict:
    """A save holding buffers per DP rank (``ds_resume``'s, by 2 ranks) loaded by another number of ranks: a
    warning, and each rank the buffers of the rank it was (those beyond the saved ones get the first rank's)."""
    group = dp_groups(rank, world, [world])[world]
    b = ds_apply_zero(BNNet(), group, ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=200))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        b.load_checkpoint(save_dir)
    own = torch.load(Path(save_dir) / "global_step3" / f"module_extra-dp{rank:05d}.pt", weights_only=True)
    with b.gathered_params():
        loaded = _bn_state(b.module)
    return {
        "warned": [str(w.message) for w in caught if "buffers per DP rank" in str(w.message)],
        "diff": max((own[k].float() - loaded[k].float()).abs().max().item() for k in own),
    }


def ds_bad_input(rank: int, world: int, save_dir: str) -> dict:
    """What DeepSpeed's callers get wrong: a client state that would not load back, a missing tag, no ``latest``."""
    group = dp_groups(rank, world, [world])[world]
    engine = ds_apply_zero(BNNet(), group, ZeroConfig(stage=2, optimizer=ADAM))
    out = {}
    try:
        engine.save_checkpoint(save_dir, tag="t1", client_state={"fn": BNNet()})
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        out["client"] = f"{type(e).__name__}: {e}"
    try:
        engine.load_checkpoint(save_dir, tag="nope")
    except Exception as e:  # noqa: BLE001
        out["tag"] = f"{type(e).__name__}: {e}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out["none"] = engine.load_checkpoint(save_dir + "-empty")
    out["warned"] = [str(w.message) for w in caught]
    # A file beside the shards cut short (a job killed while saving, a full disk): one line naming it, on every rank.
    for name in ("client_state.pt", "module_extra.pt"):
        path = engine.save_checkpoint(save_dir, tag=f"cut-{name}", client_state={"epoch": 3})
        if rank == 0:
            f = next(path.rglob(name))
            f.write_bytes(f.read_bytes()[:100])
        torch.distributed.barrier()
        try:
            engine.load_checkpoint(save_dir, tag=f"cut-{name}")
        except Exception as e:  # noqa: BLE001
            out[name] = f"{type(e).__name__}: {e}"
    return out


def _tp_train(engine, data, dp_rank: int, dp: int, steps: range) -> None:
    for s in steps:
        x, y = data.micro_batch(s, dp_rank, dp, 0, 2)
        engine.backward(engine(x, y))
        engine.step()


def tp_resume(rank: int, world: int, dp: int, stage: int, save_dir: str) -> dict:
    """DP x TP: save, train on; a fresh engine (another init) loads and trains the same steps."""
    cfg = PRESETS["tiny"]
    data = SyntheticTokens(cfg.vocab, cfg.seq, seed=5)
    mesh = build_mesh(world // dp, dp)
    spec = ParallelSpec(zero=ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=5_000))
    torch.manual_seed(0)
    a = as_deepspeed(parallelize(GPT(cfg), mesh, spec).engine)
    _tp_train(a, data, mesh.dp.rank, dp, range(2))
    a.save_checkpoint(save_dir, tag="mid")
    at_save = full_parameters(a)
    _tp_train(a, data, mesh.dp.rank, dp, range(2, 4))
    uninterrupted = full_parameters(a)
    torch.manual_seed(1)
    b = as_deepspeed(parallelize(GPT(cfg), mesh, spec).engine)
    b.load_checkpoint(save_dir)
    loaded = full_parameters(b)
    _tp_train(b, data, mesh.dp.rank, dp, range(2, 4))
    resumed = full_parameters(b)
    tp_rank = mesh.tp.rank
    dist.barrier()
    return {
        "tp_rank": tp_rank,
        "load_diff": max((loaded[n] - at_save[n]).abs().max().item() for n in at_save),
        "resume_diff": max((uninterrupted[n] - resumed[n]).abs().max().item() for n in resumed),
        "moved": max((uninterrupted[n] - at_save[n]).abs().max().item() for n in at_save),
        "checksum": sum(float(t.double().sum()) for t in at_save.values()),
    }


def tp_mismatch(rank: int, world: int, save_dir: str) -> str:
    """A TP 2 checkpoint loaded by an engine without TP: one line, not another rank's slices."""
    cfg = PRESETS["tiny"]
    mesh = build_mesh(2, world // 2)
    torch.manual_seed(0)
    a = as_deepspeed(parallelize(GPT(cfg), mesh, ParallelSpec(zero=ZeroConfig(stage=1, optimizer=ADAM))).engine)
    a.save_checkpoint(save_dir, tag="tp2")
    group = dp_groups(rank, world, [world])[world]
    b = ds_apply_zero(GPT(cfg), group, ZeroConfig(stage=1, optimizer=ADAM))
    try:
        b.load_checkpoint(save_dir)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return "loaded"


def ds_client_per_rank(rank: int, world: int, save_dir: str, stage: int) -> dict:
    """Each rank's own ``client_state`` back (DeepSpeed's at stage 3; a data position per rank), one shared state
    written once, and a state one rank alone cannot save refused on every rank in one line, none left waiting."""
    group = dp_groups(rank, world, [world])[world]
    engine = ds_apply_zero(BNNet(), group, ZeroConfig(stage=stage, optimizer=ADAM))
    out: dict = {}
    engine.save_checkpoint(save_dir, tag="own", client_state={"rank": rank, "offset": 1000 + rank})
    out["own"] = engine.load_checkpoint(save_dir, tag="own")[1]
    path = engine.save_checkpoint(save_dir, tag="shared", client_state={"epoch": 3})
    out["shared"] = engine.load_checkpoint(save_dir, tag="shared")[1]
    out["shared_files"] = sorted(p.name for p in path.glob("client_state*"))
    out["own_files"] = sorted(p.name for p in (path.parent / "own").glob("client_state*"))
    try:
        engine.save_checkpoint(save_dir, tag="bad", client_state={"fn": BNNet()} if rank == 1 else {"epoch": 3})
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        out["bad"] = f"{type(e).__name__}: {e}"
    out["bad_saved"] = (path.parent / "bad").exists()
    with warnings.catch_warnings(record=True):  # a tag only rank 1 gets wrong: rank 0's is agreed, then checked
        warnings.simplefilter("always")
        out["agreed"] = engine.save_checkpoint(save_dir, tag="t2" if rank == 0 else "../x").name
    return out
