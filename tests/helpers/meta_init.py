"""The GPT built on the meta device and initialised shard by shard (``zerobench/parallel/init.py``), inside spawned
ranks, against the GPT materialised whole and then parallelised (the path every rank took before): the same fp32
master, parameters and training, bit for bit, at every stage, TP 1 and 2, fp32 and bf16, with checkpointing and
sequence parallelism, and ZeRO-Offload. The ZeroSystem that ``zerobench train`` runs takes the meta path.
"""

from __future__ import annotations

import torch

from zerobench.distributed.mesh import build_mesh
from zerobench.models.gpt import GPT
from zerobench.models.sizes import PRESETS
from zerobench.parallel.checkpointing import ActivationConfig
from zerobench.parallel.init import init_gpt
from zerobench.parallel.parallelize import ParallelSpec, parallelize
from zerobench.train.data import SyntheticTokens
from zerobench.zero import Precision, ZeroConfig
from zerobench.zero.state.shards import full_parameters

CFG = PRESETS["tiny"]


def _build(meta: bool, tp: int, spec: ParallelSpec):
    torch.manual_seed(3)
    mesh = build_mesh(tp=tp)
    if meta:
        with torch.device("meta"):
            model = GPT(CFG)
        built = parallelize(model, mesh, spec, device=torch.device("cpu"))
        init_gpt(built.engine, CFG, built.tp)
    else:
        built = parallelize(GPT(CFG), mesh, spec)
    return built, mesh


def _params(engine) -> dict[str, torch.Tensor]:
    with engine.gathered_params(writeback=False):
        return {n: p.detach().clone() for n, p in engine.module.named_parameters()}


def _diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[n].float() - b[n].float()).abs().max().item() for n in a)


def _train(built, mesh, steps: int = 2) -> list[float]:
    data, losses = SyntheticTokens(CFG.vocab, CFG.seq, seed=5), []
    for s in range(steps):
        x, y = data.micro_batch(s, mesh.dp.rank, mesh.dp.size, 0, 2)
        loss = built.model(x, y)
        built.engine.backward(loss)
        built.engine.step()
        losses.append(loss.item())
    return losses


CASES = {
    f"tp{tp}-s{stage}-{prec.value}{suffix}": (
        tp,
        ParallelSpec(
            zero=ZeroConfig(stage=stage, precision=prec, bucket_numel=20_000, **zkw),
            activation=ac,
            sequence_parallel=sp,
        ),
    )
    for tp in (1, 2)
    for stage in (0, 1, 2, 3)
    for prec in (Precision.FP32, Precision.BF16)
    for suffix, ac, sp, zkw in (("", ActivationConfig(), False, {}),)
} | {
    "tp2-s3-fp32-ckpt-sp": (
        2,
        ParallelSpec(
            zero=ZeroConfig(stage=3, bucket_numel=20_000),
            activation=ActivationConfig(checkpoint=True),  # P_a with SP is refused (validate_sp)
            sequence_parallel=True,
        ),
    ),
    "tp1-s2-bf16-offload": (
        1,
        ParallelSpec(zero=ZeroConfig(stage=2, precision=Precision.BF16, bucket_numel=20_000, offload_optimizer="cpu")),
    ),
    "tp1-s3-bf16-offload-params": (
        1,
        ParallelSpec(
            zero=ZeroConfig(
                stage=3, precision=Precision.BF16, bucket_numel=20_000, offload_optimizer="cpu", offload_param="cpu"
            )
        ),
    ),
}


def run_meta_init(rank: int, world: int, keys: list[str]) -> dict:
    out = {}
    for key in keys:
        tp, spec = CASES[key]
        if world % tp:
            continue
        (meta, mesh), (whole, _) = _build(True, tp, spec), _build(False, tp, spec)
        res = {
            "master": _diff(full_parameters(meta.engine), full_parameters(whole.engine)),
            "params": _diff(_params(meta.engine), _params(whole.engine)),
            "meta_left": [n for n, p in meta.model.named_parameters() if p.is_meta],
            "checksum": sum(v.double().sum().item() for v in full_parameters(meta.engine).values()),
        }
        res["losses"] = (_train(meta, mesh), _train(whole, mesh))
        res["trained_master"] = _diff(full_parameters(meta.engine), full_parameters(whole.engine))
        out[key] = res
    return out


def run_user_meta(rank: int, world: int) -> dict:
    """A user's model built under ``torch.device("meta")``, ``apply_zero(..., device=cpu)``, then initialised inside
    ``engine.gathered_params()``: exactly the engine built from the materialised model, and the same training."""
    from tests.helpers.gathered_writeback import _copy_in, _same_as, target_model
    from tests.helpers.user_models import ADAM, MLP, engine_for
    from zerobench.distributed.collectives import Group
    from zerobench.zero import apply_zero

    group = Group.of(None, "dp")
    target = target_model()
    values = {n: p.detach().clone() for n, p in target.named_parameters()}
    out = {}
    for stage in (0, 1, 2, 3):
        for prec in (Precision.FP32, Precision.BF16):
            with torch.device("meta"):
                model = MLP()
            cfg = ZeroConfig(stage=stage, bucket_numel=5000, optimizer=ADAM, precision=prec)
            engine = apply_zero(model, group, cfg, device="cpu")
            before = {n: float(v.abs().sum()) for n, v in full_parameters(engine).items()}
            with engine.gathered_params():
                _copy_in(engine, values)
            built = engine_for(target_model(), group, stage, precision=prec)
            out[f"s{stage}-{prec.value}"] = {
                "zero_before": max(before.values()),
                **_same_as(engine, built, rank, world),
            }
    try:
        apply_zero(MLP(), group, ZeroConfig(stage=3), device="meta")
        out["placed"] = None
    except Exception as e:  # noqa: BLE001 - the message is the result
        out["placed"] = f"{type(e).__name__}: {e}"
    return out
