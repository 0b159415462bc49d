"""A user's model whose batch and output are dataclasses (``Batch(x, y, feats)`` in, ``Output(loss, logits)``
out), trained by the engine inside spawned ranks at stages 0-3, fp32 and bf16, against one process.

Before, stage 3 failed in the first backward inside torch (the output's tensors were not seen, so the root unit
was not gathered again for its backward), and under bf16 the fp32 ``feats`` in the batch were not cast.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.nn.functional as F

from tests.helpers.reference import make_adamw
from tests.helpers.user_models import ADAM, MLP, VOCAB, WIDTH, batches, compare, engine_for, slice_of
from tests.helpers.user_models_bf16 import reference_bf16
from zerobench.distributed.collectives import Group
from zerobench.zero import Precision


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor
    feats: torch.Tensor


@dataclasses.dataclass(frozen=True)
class Output:
    loss: torch.Tensor
    logits: torch.Tensor


class DataclassModel(MLP):
    def forward(self, batch, y=None, skip=None):
        if not isinstance(batch, Batch):  # the references call it as the other user models: (x, y)
            batch = Batch(batch, y, _feats(batch).to(self.emb.weight.dtype))
        h = self.emb(batch.x) + batch.feats
        for b in self.blocks:
            h = b(h)
        logits = self.head(h * self.pair[0] + self.pair[1]) * self.scale
        return Output(F.cross_entropy(logits.reshape(-1, VOCAB), batch.y.reshape(-1)), logits)


class _LossOnly(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y, skip=None):
        return self.model(x, y).loss


def _feats(x: torch.Tensor) -> torch.Tensor:
    """fp32 features per token, a function of the ids (so every rank and the reference agree)."""
    return torch.sin(x.unsqueeze(-1).float() * torch.arange(1, WIDTH + 1, dtype=torch.float32) / 7)


def _reference_fp32(model, data, world: int) -> dict[str, torch.Tensor]:
    ref = copy.deepcopy(model)
    opt = make_adamw(ref.parameters(), ADAM)
    for x, y in data:
        torch.stack([ref(slice_of(x, r, world), slice_of(y, r, world)).loss for r in range(world)]).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {n: p.detach().clone() for n, p in ref.named_parameters()}


def run_dataclass_io(rank: int, world: int) -> dict[str, dict]:
    group = Group.of(None, "dp")
    torch.manual_seed(0)
    model, data = DataclassModel(), batches(3, 6)
    refs = {
        "fp32": _reference_fp32(model, data, world),
        "bf16": {k.removeprefix("model."): v for k, v in reference_bf16(_LossOnly(model), data, world).items()},
    }
    out = {}
    for prec in (Precision.FP32, Precision.BF16):
        for stage in (0, 1, 2, 3):
            engine = engine_for(copy.deepcopy(model), group, stage, precision=prec)
            for x, y in data:
                xs = slice_of(x, rank, world)
                o = engine.module(Batch(xs, slice_of(y, rank, world), _feats(xs)))
                engine.backward(o.loss)
                engine.step()
            out[f"s{stage}-{prec.value}"] = {**compare(engine, model, refs[prec.value]), "logits": str(o.logits.dtype)}
    return out
