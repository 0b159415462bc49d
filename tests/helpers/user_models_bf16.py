"""Users' own models trained by the engine under bf16, inside spawned ranks, against a single-process bf16 recipe:
the model in bf16 (frozen layers too, as DeepSpeed converts the whole module), fp32 masters of the trained
parameters updated by ``torch.optim.AdamW`` from the bf16 gradients of the mean over DP slices.

Before, a frozen fp32 layer met the bf16 activations of the layer before it, inside ``F.linear``
(``mat1 and mat2 must have the same dtype``): the engine cast only the parameters it trains. And BatchNorm's
fp32 running statistics met its bf16 weight inside ``F.batch_norm`` (``expected scalar type BFloat16 but found
Float``): floating-point buffers are now converted too, as ``model.bfloat16()`` converts them.
"""

from __future__ import annotations

import copy

import torch

from tests.helpers.reference import make_adamw
from tests.helpers.user_models import ADAM, batches, compare, engine_for, make_model, reference_loss, slice_of
from zerobench.distributed.collectives import Group
from zerobench.zero import Precision

VARIANTS = ("mlp", "frozen", "tied_root", "user_ckpt", "batchnorm")


def reference_bf16(model, data, world: int) -> dict[str, torch.Tensor]:
    work = copy.deepcopy(model).bfloat16()
    trained = [(n, p) for n, p in work.named_parameters() if p.requires_grad]
    master = [p.detach().float().clone().requires_grad_(True) for _, p in trained]
    opt = make_adamw(master, ADAM)
    for x, y in data:
        reference_loss(work, x, y, world).backward()
        for m, (_, p) in zip(master, trained):
            m.grad = p.grad.float()
            p.grad = None
        opt.step()
        with torch.no_grad():
            for m, (_, p) in zip(master, trained):
                p.copy_(m)
    out = {n: m.detach() for m, (n, _) in zip(master, trained)}
    out.update({n: p.detach().float() for n, p in work.named_parameters() if not p.requires_grad})
    return out


def run_bf16_user_cases(rank: int, world: int) -> dict[str, dict]:
    group = Group.of(None, "dp")
    out = {}
    for variant in VARIANTS:
        model = make_model(variant)
        data = batches(3, 6)
        ref = reference_bf16(model, data, world)
        for stage in (0, 1, 2, 3):
            engine = engine_for(copy.deepcopy(model), group, stage, precision=Precision.BF16)
            losses = []
            for x, y in data:
                loss = engine.module(slice_of(x, rank, world), slice_of(y, rank, world))
                losses.append(loss.item())
                engine.backward(loss)
                engine.step()
            res = compare(engine, model, ref)
            res["frozen_dtypes"] = sorted({str(p.dtype) for p in engine.module.parameters() if not p.requires_grad})
            res["buffer_dtypes"] = sorted({str(b.dtype) for b in engine.module.buffers() if b.is_floating_point()})
            out[f"{variant}-s{stage}"] = res
    return out
