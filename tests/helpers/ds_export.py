"""Rank workers for the trained model taken out of the engine, as DeepSpeed's users take it: ``save_16bit_model``,
``zero_to_fp32``'s functions on a ``save_checkpoint`` directory, and ``safe_get_full_*``/``safe_set_full_*`` per
parameter (``zerobench/zero/export.py``, ``zerobench/zero/tensor_fragment.py``).

Every figure is checked against an independent path: the parameters against ``full_parameters`` (itself tested
against one process), a plain model loaded from the file against the engine's own forward, the moments against
the segments in the checkpoint's shard files, a set value against an engine built from a model holding it.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from tests.helpers.ds import ds_apply_zero
from tests.helpers.ds_checkpoint import ADAM
from tests.helpers.scenarios import dp_groups
from zerobench.distributed.mesh import build_mesh
from zerobench.models.gpt import GPT
from zerobench.models.sizes import PRESETS
from zerobench.parallel.parallelize import ParallelSpec, parallelize
from zerobench.zero import ZeroConfig, as_deepspeed
from zerobench.zero.compat.deepspeed.tensor_fragment import (
    safe_get_full_fp32_param,
    safe_get_full_grad,
    safe_get_full_optimizer_state,
    safe_set_full_fp32_param,
    safe_set_full_optimizer_state,
)
from zerobench.zero.compat.deepspeed.zero_to_fp32 import (
    convert_zero_checkpoint_to_fp32_state_dict,
    get_fp32_state_dict_from_zero_checkpoint,
    load_state_dict_from_zero_checkpoint,
)
from zerobench.zero.config import LossScaleConfig
from zerobench.zero.state.checkpoint import iter_shards
from zerobench.zero.state.export import full_state_dict
from zerobench.zero.state.shards import full_gradients, full_parameters

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class TiedNet(nn.Module):
    """A tied embedding and head, BatchNorm's statistics and a frozen layer: every kind of entry a state dict holds."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(24, 16)
        self.bn = nn.BatchNorm1d(16)
        self.frozen = nn.Linear(16, 16)
        self.frozen.requires_grad_(False)
        self.mid = nn.Linear(16, 16)
        self.head = nn.Linear(16, 24, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        h = self.bn(self.emb(x).mean(1))
        return self.head(torch.relu(self.mid(self.frozen(h)))).logsumexp(-1).mean()


def _batch(step: int, rank: int) -> torch.Tensor:
    return torch.randint(0, 24, (8, 5), generator=torch.Generator().manual_seed(100 * step + rank))


FP16_SCALE = LossScaleConfig(init_scale=2.0**8)
"""Under fp16, a scale at which this model's gradients stay finite on every rank: at the default 2^16 a rank's own
gradient (which carries the whole scale) overflows, and the steps the test trains are skipped."""


def _engine(group, stage: int, precision: str, model: nn.Module | None = None):
    if model is None:
        torch.manual_seed(0)
        model = TiedNet()
    config = ZeroConfig(stage=stage, precision=precision, optimizer=ADAM, bucket_numel=300, loss_scale=FP16_SCALE)
    return ds_apply_zero(model, group, config)


def _train(engine, rank: int, steps: range) -> None:
    for s in steps:
        engine.backward(engine(_batch(s, rank)))
        engine.step()


def _trained(engine) -> dict[str, nn.Parameter]:
    return {n: p for n, p in engine.module.named_parameters() if p.requires_grad}


def _moment_from_shards(path, name: str, shape) -> torch.Tensor:
    """``exp_avg`` of parameter ``name`` assembled from the checkpoint's shard files (segments, not the engine)."""
    out = torch.zeros(shape).reshape(-1)
    for sd in iter_shards(path):
        off = 0
        for n, start, end in sd["segments"]:
            if n == name:
                out[start:end] = sd["exp_avg"][off : off + end - start]
            off += end - start
    return out.view(shape)


def _files(engine, rank: int, stage: int, precision: str, save_dir: str) -> dict:
    """save_16bit_model and zero_to_fp32 against full_parameters and the engine's own forward."""
    out: dict = {}
    dtype = DTYPES[precision]
    assert engine.save_16bit_model(f"{save_dir}/export", "model.bin") is True
    out["visible_on_return"] = Path(f"{save_dir}/export/model.bin").exists()  # on every rank, as a barrier ensures
    assert engine.save_16bit_model(f"{save_dir}/export", "nofrozen.bin", exclude_frozen_parameters=True)
    engine.save_checkpoint(f"{save_dir}/ckpt")
    master = full_parameters(engine)
    with engine.gathered_params():
        module_state = {k: v.clone() for k, v in engine.module.state_dict().items()}
    x = _batch(99, 0)
    engine.eval()
    with torch.no_grad():
        engine_loss = engine(x).float()
    engine.train()
    if rank == 0:
        sd = torch.load(f"{save_dir}/export/model.bin", weights_only=True)
        plain = TiedNet()
        keys = list(plain.state_dict())
        plain.load_state_dict(sd)  # strict
        trained = {n: sd[n] for n in master}
        out["keys"] = (list(sd) == keys, sorted(set(keys) - set(sd)))
        out["dtypes"] = sorted({str(sd[n].dtype) for n in trained}) == [str(dtype)]
        out["params_exact"] = all(torch.equal(sd[n], master[n].to(dtype)) for n in master)
        out["tied_exact"] = torch.equal(sd["head.weight"], sd["emb.weight"])
        out["state_exact"] = all(torch.equal(sd[k], module_state[k]) for k in keys if k not in master)
        plain.eval()
        with torch.no_grad():
            out["forward"] = (plain.to(dtype)(x).float() - engine_loss).abs().item()
        nofrozen = torch.load(f"{save_dir}/export/nofrozen.bin", weights_only=True)
        out["nofrozen"] = sorted(set(sd) - set(nofrozen))
        fp32 = get_fp32_state_dict_from_zero_checkpoint(f"{save_dir}/ckpt")
        tied = {**master, "head.weight": master["emb.weight"]}
        want = {
            k: tied[k]
            if k in tied
            else module_state[k].float()
            if module_state[k].is_floating_point()
            else module_state[k]
            for k in keys
        }
        out["fp32_mismatch"] = sorted(set(fp32) ^ set(keys)) + [k for k in keys if not torch.equal(fp32[k], want[k])]
        out["fp32_nofrozen"] = sorted(
            set(fp32)
            - set(get_fp32_state_dict_from_zero_checkpoint(f"{save_dir}/ckpt", exclude_frozen_parameters=True))
        )
        loaded = load_state_dict_from_zero_checkpoint(TiedNet(), f"{save_dir}/ckpt")
        out["loaded_exact"] = all(torch.equal(loaded.state_dict()[n], master[n]) for n in master)
        path = convert_zero_checkpoint_to_fp32_state_dict(f"{save_dir}/ckpt", f"{save_dir}/converted")
        conv = torch.load(path, weights_only=True)
        out["converted"] = path.name == "pytorch_model.bin" and all(torch.equal(conv[k], fp32[k]) for k in fp32)
        out["sharded"] = _sharded_and_safe(f"{save_dir}/ckpt", Path(save_dir), fp32)
    dist.barrier()
    out["export_files"] = sorted(p.name for p in Path(f"{save_dir}/export").iterdir())
    return out


def _per_param(engine, group, rank: int, stage: int, precision: str, save_dir: str) -> dict:
    """safe_get_full_* against full_parameters / full_gradients / the shard files; safe_set_full_* round trips."""
    out: dict = {}
    params = _trained(engine)
    master = full_parameters(engine)
    out["fp32"] = all(torch.equal(safe_get_full_fp32_param(p), master[n]) for n, p in params.items())
    out["frozen_none"] = safe_get_full_fp32_param(engine.module.frozen.weight) is None
    out["moments"] = all(
        torch.equal(
            safe_get_full_optimizer_state(p, "exp_avg"),
            _moment_from_shards(f"{save_dir}/ckpt/global_step2", n, master[n].shape),
        )
        for n, p in params.items()
    )
    out["no_grad_after_step"] = safe_get_full_grad(params["mid.weight"]) is None
    engine.backward(engine(_batch(50, rank)))
    reduced = full_gradients(engine)
    out["grads"] = all(torch.equal(safe_get_full_grad(p), reduced[n]) for n, p in params.items())
    out["grad_nonzero"] = reduced["mid.weight"].abs().sum().item() > 0
    engine.step()
    # A value set through the parameter is the engine's from then on: training on from it equals an engine built
    # from a model holding it (bf16-exact, so the bf16 engine's master starts from the same value either way).
    value = torch.randn(16, 16, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16).float()
    fresh = _engine(group, stage, precision)
    safe_set_full_fp32_param(fresh.module.mid.weight, value)
    out["set_read_back"] = torch.equal(safe_get_full_fp32_param(fresh.module.mid.weight), value)
    torch.manual_seed(0)
    model = TiedNet()
    with torch.no_grad():
        model.mid.weight.copy_(value)
    built = _engine(group, stage, precision, model)
    _train(fresh, rank, range(2))
    _train(built, rank, range(2))
    a, b = full_parameters(fresh), full_parameters(built)
    out["set_then_trained"] = all(torch.equal(a[n], b[n]) for n in a)
    out["trained_moved"] = (a["mid.weight"] - value).abs().max().item()  # the two steps were taken
    m = torch.full((24, 16), 0.25)
    safe_set_full_optimizer_state(fresh.module.emb.weight, m, "exp_avg")
    out["moment_read_back"] = torch.equal(safe_get_full_optimizer_state(fresh.module.emb.weight, "exp_avg"), m)
    out["other_moment_kept"] = torch.equal(
        safe_get_full_optimizer_state(fresh.module.mid.weight, "exp_avg"),
        safe_get_full_optimizer_state(built.module.mid.weight, "exp_avg"),
    )
    try:
        safe_get_full_optimizer_state(fresh.module.mid.weight, "momentum_buffer")
    except KeyError as e:
        out["bad_key"] = str(e)
    return out


def ds_export(rank: int, world: int, precision: str, save_dir: str) -> dict:
    group = dp_groups(rank, world, [world])[world]
    out = {}
    for stage in range(4):
        engine = _engine(group, stage, precision)
        _train(engine, rank, range(2))
        surface = (
            engine.dp_world_size,
            engine.mp_world_size,
            engine.global_rank,
            engine.world_size,
            engine.fp16_enabled(),
            engine.bfloat16_enabled(),
        )
        out[stage] = {
            "surface": surface,
            **_files(engine, rank, stage, precision, f"{save_dir}/s{stage}"),
            **_per_param(engine, group, rank, stage, precision, f"{save_dir}/s{stage}"),
        }
    torch.manual_seed(0)
    window = ds_apply_zero(
        TiedNet(), group, ZeroConfig(stage=2, precision=precision, optimizer=ADAM, grad_accum_steps=2)
    )
    window.backward(window(_batch(0, rank)))  # the first of two micro-batches: nothing reduced yet
    try:
        safe_get_full_grad(window.module.mid.weight)
    except RuntimeError as e:
        out["mid_window"] = str(e)
    return out


def tp_export(rank: int, world: int) -> tuple:
    """Under TP a state dict of the whole model is one line, not one TP rank's slices under the full names."""
    mesh = build_mesh(2, world // 2)
    torch.manual_seed(0)
    engine = as_deepspeed(
        parallelize(GPT(PRESETS["tiny"]), mesh, ParallelSpec(zero=ZeroConfig(stage=1, optimizer=ADAM))).engine
    )
    master = full_parameters(engine)  # this TP rank's slices
    slices = all(
        torch.equal(safe_get_full_fp32_param(p), master[n])
        for n, p in engine.module.named_parameters()
        if p.requires_grad
    )
    sizes = (engine.dp_world_size, engine.mp_world_size, slices, tuple(master["wte.weight"].shape))
    try:
        full_state_dict(engine)
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        return sizes, f"{type(e).__name__}: {e}"
    return sizes, "exported"


def saved_checkpoint(rank: int, world: int, save_dir: str) -> dict[str, float]:
    """A stage-3 bf16 engine's ``save_checkpoint`` (tag ``t``), for ``zerobench zero-to-fp32``; its master sums."""
    group = dp_groups(rank, world, [world])[world]
    engine = _engine(group, 3, "bf16")
    _train(engine, rank, range(2))
    engine.save_checkpoint(save_dir, tag="t")
    return {n: float(v.double().sum()) for n, v in full_parameters(engine).items()}


def _sharded_and_safe(ckpt: str, root: Path, fp32: dict) -> dict:
    """DeepSpeed 0.19's other two outputs of ``convert_zero_checkpoint_to_fp32_state_dict``: shards of at most
    ``max_shard_size`` bytes (as a number, third positional as DeepSpeed's) with Hugging Face's index naming each
    tensor's file, and one ``model.safetensors`` (``safe_serialization``, tied weights written under each name):
    each read back whole and equal to the fp32 state dict."""
    import json

    from safetensors.torch import load_file

    index = convert_zero_checkpoint_to_fp32_state_dict(ckpt, root / "sharded", 600)
    files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    merged: dict = {}
    for f in files:
        merged.update(torch.load(index.parent / f, weights_only=True))
    safe = convert_zero_checkpoint_to_fp32_state_dict(ckpt, root / "safe", safe_serialization=True)
    read = load_file(safe)
    return {
        "index": index.name,
        "files": len(files),
        "sharded_equal": set(merged) == set(fp32) and all(torch.equal(merged[k], fp32[k]) for k in fp32),
        "safe": safe.name,
        "safe_equal": set(read) == set(fp32) and all(torch.equal(read[k], fp32[k]) for k in fp32),
    }
